"""server_process: a server start is recorded (PID + start time + command line), stop signals only that.

Real processes (``sleep``) stand in for the engine; the start scripts have the shape the engine role's
templates render (a detached job, its PID printed last). A fake ``docker`` (a shell script on PATH that
records its calls) stands in for the docker CLI.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

from module_utils.proc_identity import alive, start_ticks


def start_script(log_line: str = "engine up") -> str:
    """A start script shaped like run_process.sh.j2: a detached sleep, its PID printed last."""
    return (
        "set -euo pipefail\nlog=$1\n"
        f"setsid nohup sh -c 'echo {log_line}; exec sleep 300' > \"$log\" 2>&1 < /dev/null &\n"
        'echo "$!"\n'
    )


def args(tmp: Path, state: str, **extra: object) -> dict:
    base = {
        "state": state,
        "name": "node1",
        "server_dir": str(tmp / "run" / "server"),
        "state_dir": str(tmp / ".state"),
        "run_id": "run",
    }
    base.update(extra)
    return base


@pytest.fixture
def cleanup():
    pids: list[int] = []
    yield pids
    for pid in pids:
        if alive(pid):
            os.killpg(pid, signal.SIGKILL)


def test_start_records_pid_start_time_and_command_line(run, tmp_path: Path, cleanup) -> None:
    kind, res = run("server_process", args(tmp_path, "started", script=start_script()))
    assert kind == "exit", res["msg"]
    pid = res["pid"]
    cleanup.append(pid)
    rec = json.loads((tmp_path / "run/server/node1.start1.server.json").read_text())
    assert rec["pid"] == pid and rec["start_ticks"] == start_ticks(pid)
    assert rec["cmdline"] == ["sleep", "300"], "recorded before the exec chain settled"
    assert rec["run_id"] == "run" and rec["start"] == 1
    assert json.loads((tmp_path / ".state/node1.json").read_text())["pid"] == pid
    assert (tmp_path / "run/server/node1.start1_server_cmd.txt").read_text() == start_script()
    # A second start never overwrites the first one's files.
    first_log = (tmp_path / "run/server/node1.start1.log").read_text()
    kind, res2 = run("server_process", args(tmp_path, "started", script=start_script("second")))
    cleanup.append(res2["pid"])
    assert res2["start"] == 2 and res2["files"]["log"].endswith("node1.start2.log")
    assert (tmp_path / "run/server/node1.start1.log").read_text() == first_log


def test_stop_signals_only_the_recorded_process(run, tmp_path: Path, cleanup) -> None:
    kind, res = run("server_process", args(tmp_path, "started", script=start_script()))
    pid = res["pid"]
    cleanup.append(pid)
    kind, stopped = run("server_process", args(tmp_path, "stopped", grace_s=5))
    assert kind == "exit" and stopped["changed"], stopped["msg"]
    assert f"pid {pid}" in stopped["stopped"][0]
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)
    assert not (tmp_path / ".state/node1.json").exists()


def test_a_reused_pid_is_left_alone_and_named(run, tmp_path: Path, cleanup) -> None:
    """The record names a PID that now belongs to another process (other start time): no signal."""
    victim = subprocess.Popen(["sleep", "300"], start_new_session=True)
    cleanup.append(victim.pid)
    server = tmp_path / "run/server"
    server.mkdir(parents=True)
    record = {
        "runtime": "process",
        "run_id": "run",
        "start": 1,
        "pid": victim.pid,
        "start_ticks": start_ticks(victim.pid) - 1,  # the server that had this PID started earlier
        "cmdline": ["sleep", "300"],
    }
    (server / "node1.start1.server.json").write_text(json.dumps(record))
    kind, res = run("server_process", args(tmp_path, "stopped", grace_s=1))
    assert kind == "exit" and not res["changed"]
    assert victim.poll() is None, "an unrelated process was signalled"
    assert "left alone" in res["left_alone"][0] and "PID was reused" in res["left_alone"][0]
    # Same start time, other command line: also left alone.
    record.update(start_ticks=start_ticks(victim.pid), cmdline=["python3", "-m", "enginesim"])
    (server / "node1.start1.server.json").write_text(json.dumps(record))
    kind, res = run("server_process", args(tmp_path, "stopped", grace_s=1))
    assert victim.poll() is None and "not the recorded" in res["left_alone"][0]


def test_stop_of_another_run_touches_nothing(run, tmp_path: Path, cleanup) -> None:
    kind, res = run("server_process", args(tmp_path, "started", script=start_script()))
    cleanup.append(res["pid"])
    other = args(tmp_path, "stopped", run_id="other", server_dir=str(tmp_path / "other/server"))
    kind, res2 = run("server_process", other)
    assert kind == "exit" and not res2["changed"] and "nothing to stop" in res2["msg"]
    assert alive(res["pid"])
    assert (tmp_path / ".state/node1.json").exists()


def test_secrets_reach_the_process_environment_only(run, tmp_path: Path, cleanup) -> None:
    canary, flag_canary = "CANARY-env-4242", "CANARY-flag-4343"
    # A process that keeps the secret flag in its argv, as an engine given --api-key does.
    script = (
        "set -euo pipefail\nlog=$1\n"
        "setsid nohup python3 -c 'import time; time.sleep(300)' --api-key \"${QUICKMAP_SECRET_API_KEY}\" "
        '> "$log" 2>&1 < /dev/null &\n'
        'echo "$!"\n'
    )
    kind, res = run(
        "server_process",
        args(
            tmp_path,
            "started",
            script=script,
            secret_env={"HF_TOKEN": canary},
            secret_args_env={"QUICKMAP_SECRET_API_KEY": flag_canary},
        ),
    )
    assert kind == "exit", res["msg"]
    cleanup.append(res["pid"])
    environ = Path(f"/proc/{res['pid']}/environ").read_bytes()
    assert f"HF_TOKEN={canary}".encode() in environ
    for path in tmp_path.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert canary.encode() not in data and flag_canary.encode() not in data, path
    saved = (tmp_path / "run/server/node1.start1_server_cmd.txt").read_text()
    assert '--api-key "***"' in saved
    assert json.loads((tmp_path / "run/server/node1.start1.server.json").read_text())["cmdline"][-1] == "***"
    # The masked record still identifies the process: stop finds and stops it.
    kind, stopped = run("server_process", args(tmp_path, "stopped", grace_s=5))
    assert stopped["stopped"], stopped["msg"]


def test_a_script_that_holds_a_secret_value_is_refused(run, tmp_path: Path) -> None:
    kind, res = run(
        "server_process",
        args(tmp_path, "started", script="echo sekrit-value\n", secret_env={"HF_TOKEN": "sekrit-value"}),
    )
    assert kind == "fail" and "holds a secret value" in res["msg"]
    assert not (tmp_path / "run/server").exists()


def fake_docker(bin_dir: Path, calls: Path, container_id: str = "c0ffee" * 10 + "abcd") -> None:
    """A docker CLI stand-in: records argv (JSON lines), prints an ID for run, answers inspect/logs/rm."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "docker"
    script.write_text(
        "#!/usr/bin/env python3\nimport json, os, sys\n"
        f"open({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "cmd = sys.argv[1]\n"
        "env_file = [sys.argv[i + 1] for i, a in enumerate(sys.argv) if a == '--env-file']\n"
        "if cmd == 'run':\n"
        "    if env_file:\n"
        "        st = os.stat(env_file[0]); d = os.stat(os.path.dirname(env_file[0]))\n"
        "        print(oct(st.st_mode & 0o777), oct(d.st_mode & 0o777), file=sys.stderr)\n"
        "        open(os.path.join(os.path.dirname(sys.argv[0]), 'modes'), 'w').write(\n"
        "            oct(st.st_mode & 0o777) + ' ' + oct(d.st_mode & 0o777) + ' '\n"
        "            + open(env_file[0]).read())\n"
        f"    print({container_id!r})\n"
        "elif cmd == 'inspect':\n"
        f"    print({container_id!r} if '--format' in sys.argv else "
        "json.dumps([{'Config': {'Env': ['HF_TOKEN=' + os.environ.get('LEAK', '')]}}]))\n"
        "elif cmd == 'logs':\n"
        "    print('server_args api_key=' + os.environ.get('LEAK', ''))\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


def test_docker_secrets_go_through_a_private_env_file_removed_at_stop(
    run, tmp_path: Path, monkeypatch
) -> None:
    canary = "CANARY-docker-9898"
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.jsonl"
    fake_docker(bin_dir, calls)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("LEAK", canary)  # what the real daemon would echo back in inspect/logs
    env_file = tmp_path / ".state/secrets/run.node1/server.env"
    script = f"set -euo pipefail\ndocker run -d --name qm --env-file {env_file} image cmd\n"
    common = {
        "runtime": "docker",
        "container_name": "qm",
        "env_file": str(env_file),
        "secret_env": {"HF_TOKEN": canary},
    }
    kind, res = run("server_process", args(tmp_path, "started", script=script, **common))
    assert kind == "exit", res["msg"]
    mode, dir_mode, body = (bin_dir / "modes").read_text().split(" ", 2)
    assert (mode, dir_mode) == ("0o600", "0o700") and body == f"HF_TOKEN={canary}\n"
    (bin_dir / "modes").unlink()  # holds the canary only to report what docker saw
    # The engine role's stop names no container: the start record does (a stop that required the name
    # failed every docker run on the rig).
    stop_args = {k: v for k, v in common.items() if k != "container_name"}
    kind, stopped = run("server_process", args(tmp_path, "stopped", **stop_args))
    assert kind == "exit" and stopped["stopped"], stopped["msg"]
    assert not env_file.parent.exists(), "the private env-file directory outlived stop"
    assert ["rm", "-f", "qm"] in [json.loads(line) for line in calls.read_text().splitlines()]
    for path in tmp_path.rglob("*"):
        if path.is_file() and path != calls:
            assert canary.encode() not in path.read_bytes(), path
    assert "***" in (tmp_path / "run/server/node1.start1.log").read_text()


def test_docker_container_with_another_id_is_left_alone(run, tmp_path: Path, monkeypatch) -> None:
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.jsonl"
    fake_docker(bin_dir, calls, container_id="feed" * 16)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    server = tmp_path / "run/server"
    server.mkdir(parents=True)
    record = {
        "runtime": "docker",
        "run_id": "run",
        "start": 1,
        "container_name": "qm",
        "container_id": "beef" * 16,
    }
    (server / "node1.start1.server.json").write_text(json.dumps(record))
    kind, res = run("server_process", args(tmp_path, "stopped", runtime="docker"))
    assert kind == "exit" and not res["changed"]
    assert "left alone" in res["left_alone"][0]
    assert not any(json.loads(line)[0] == "rm" for line in calls.read_text().splitlines())


def test_a_docker_start_without_a_container_name_is_refused(run, tmp_path: Path) -> None:
    script = "docker run -d image cmd\n"
    kind, res = run("server_process", args(tmp_path, "started", script=script, runtime="docker"))
    assert kind == "fail" and "needs container_name" in res["msg"]
    assert not (tmp_path / "run/server/node1.start1_server_cmd.txt").exists()
