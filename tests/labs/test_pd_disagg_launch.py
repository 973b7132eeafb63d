"""The P/D launcher (`ansible-playbook pd_launch.yml`, roles/pd_launch) on inventory/local with enginesim:
both flavours end to end (each instance healthy, one request through the router, the KV transfer in the
decode log, cleanup of exactly the recorded PIDs), the through-router rule, the value checks, a decoy
process whose PID sits in a record with another start time or command line, and --check."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from labs_helpers import REPO

sys.path.insert(0, str(REPO))
from tests.ansible.runner import ansible_env, free_port, server_still_running

pytestmark = [pytest.mark.timeout(900)]


def launch(tmp: Path, run_id: str, *args: str, **extra) -> tuple[subprocess.CompletedProcess, Path, dict]:
    """`ansible-playbook pd_launch.yml -i inventory/local -e run_id=.. [args]`, own results root and ports."""
    ports = {
        "pd_launch_prefill_port": free_port(),
        "pd_launch_decode_port": free_port(),
        "pd_launch_router_port": free_port(),
        "pd_launch_bootstrap_port": free_port(),
    }
    ev = {"quickmap_results_dir": str(tmp / "results"), "run_id": run_id, **ports, **extra}
    ev_file = tmp / f"{run_id}.{len(list(tmp.glob('*.json')))}.json"
    ev_file.write_text(json.dumps(ev))
    env = {**ansible_env(), "ENGINESIM_TIME_SCALE": "0.05"}
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "pd_launch.yml",
            "-i",
            "inventory/local",
            "-e",
            f"@{ev_file}",
            *args,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc, tmp / "results" / run_id / "server" / "pd", ports


def kill_leftovers(tmp: Path) -> None:
    """Safety net after a test: kill a recorded process only while it is still the one recorded."""
    for path in (tmp / "results").glob("**/server/pd/*/*.server.json"):
        record = json.loads(path.read_text())
        if record.get("runtime") == "process" and server_still_running(record):
            os.killpg(int(record["pid"]), signal.SIGKILL)


def stop(tmp: Path, run_id: str, **extra) -> subprocess.CompletedProcess:
    return launch(tmp, run_id, "--tags", "stop", **extra)[0]


def out(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout + proc.stderr


def records(pd_dir: Path) -> dict[str, dict]:
    found = {
        kind: sorted((pd_dir / kind).glob("*.start1.server.json")) for kind in ("prefill", "decode", "router")
    }
    return {kind: json.loads(paths[0].read_text()) for kind, paths in found.items() if paths}


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_launch_checks_each_instance_then_one_request_through_the_router_and_stops_only_its_pids(
    tmp_path: Path, engine: str
) -> None:
    proc, pd_dir, ports = launch(tmp_path, f"pd_{engine}", engine_name=engine)
    try:
        assert proc.returncode == 0, out(proc)[-4000:]
        rec = records(pd_dir)
        for kind in rec:
            assert server_still_running(rec[kind]), kind
        launch_json = json.loads((pd_dir / "pd_launch.json").read_text())
        assert launch_json["through_router"] is True
        assert launch_json["measured_url"].endswith(f":{ports['pd_launch_router_port']}")
        assert launch_json["check"] == {**launch_json["check"], "status": 200, "completion_tokens": 4}
        assert launch_json["prefill"]["gpus"] == [0] and launch_json["decode"]["gpus"] == [1]
        assert launch_json["prefill"]["health"].startswith("healthy")
        assert launch_json["decode"]["health"].startswith("healthy")
        prefill_cmd = (pd_dir / "prefill" / "localhost.start1_server_cmd.txt").read_text()
        decode_cmd = (pd_dir / "decode" / "localhost.start1_server_cmd.txt").read_text()
        if engine == "sglang":
            assert (
                "--disaggregation-mode prefill" in prefill_cmd
                and "--disaggregation-bootstrap-port" in prefill_cmd
            )
            assert "--disaggregation-mode decode" in decode_cmd
        else:
            assert "kv_both" in prefill_cmd and "NixlConnector" in decode_cmd
        assert "CUDA_VISIBLE_DEVICES=0" in prefill_cmd and "CUDA_VISIBLE_DEVICES=1" in decode_cmd
        router_log = (pd_dir / "router" / "localhost.start1.log").read_text()
        assert "status=200 outcome=ok" in router_log
        assert "KV received" in (pd_dir / "decode" / "localhost.start1.log").read_text()
    finally:
        st = stop(tmp_path, f"pd_{engine}", engine_name=engine)
        survivors = (
            [k for k, r in records(pd_dir).items() if server_still_running(r)] if pd_dir.exists() else []
        )
        kill_leftovers(tmp_path)
    assert st.returncode == 0, out(st)[-3000:]
    assert survivors == []
    assert out(st).count("stopped with SIGTERM") == 3


def test_a_measurement_against_the_prefill_port_is_refused_before_anything_starts(tmp_path: Path) -> None:
    prefill_port = free_port()
    proc, pd_dir, _ = launch(
        tmp_path,
        "pd_refused",
        pd_launch_prefill_port=prefill_port,
        pd_launch_measure_url=f"http://127.0.0.1:{prefill_port}",
    )
    assert proc.returncode != 0
    assert "a result measured against the prefill port alone is not a P/D result and is refused" in out(proc)
    assert not pd_dir.exists()  # nothing was started or written


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"pd_launch_prefill_gpus": [0, 1], "pd_launch_decode_gpus": [1, 2]}, "disjoint on one host"),
        ({"pd_launch_decode_gpus": [8]}, "0..7"),
        ({"pd_launch_decode_gpus": ["1;reboot"]}, "pd_launch_decode_gpus"),
        ({"pd_launch_router_port": 70000}, "70000"),
        ({"pd_launch_check_max_tokens": "4\n"}, "pd_launch_check_max_tokens 1-9999"),
        # -e engine_port outranks the port handed to each instance: both would start on it
        ({"engine_port": 30555}, "engine_port 30555 was given with -e"),
    ],
)
def test_bad_values_are_refused_before_anything_starts(tmp_path: Path, extra: dict, needle: str) -> None:
    proc, pd_dir, _ = launch(tmp_path, "pd_bad", **extra)
    assert proc.returncode != 0
    assert needle in out(proc)
    assert not pd_dir.exists()


def test_cleanup_never_signals_a_decoy_whose_pid_sits_in_a_record_that_does_not_match(tmp_path: Path) -> None:
    """A record naming a live decoy's PID, but with another start time (a reused PID) or another
    command line: the stop leaves the decoy alone and says why."""
    decoys = [subprocess.Popen(["sleep", "300"], start_new_session=True) for _ in range(2)]
    try:
        time.sleep(0.2)
        pd_dir = tmp_path / "results" / "pd_decoy" / "server" / "pd"
        for kind, decoy in zip(("router", "decode"), decoys, strict=True):
            d = pd_dir / kind
            d.mkdir(parents=True)
            ticks = int(Path(f"/proc/{decoy.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
            record = {
                "schema": "quickmap.server/1",
                "host": "localhost",
                "run_id": "pd_decoy",
                "runtime": "process",
                "start": 1,
                "pid": decoy.pid,
                "server_dir": str(d),
                "secret_dir": None,
                "boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
                "log": str(d / "localhost.start1.log"),
                "cmd_file": str(d / "localhost.start1_server_cmd.txt"),
                "started_at": "2026-01-01T00:00:00Z",
                # router: the decoy's own command line but another start time (the PID was reused);
                # decode: the right start time but another command line
                "start_ticks": ticks + 1 if kind == "router" else ticks,
                "cmdline": ["sleep", "300"] if kind == "router" else ["python", "-m", "enginesim", "sglang"],
            }
            (d / "localhost.start1.server.json").write_text(json.dumps(record))
        proc = stop(tmp_path, "pd_decoy")
        assert proc.returncode == 0, out(proc)[-3000:]
        for decoy in decoys:
            assert decoy.poll() is None, "a decoy was signalled"
        assert "stopped with" not in out(proc)
        assert out(proc).count("left alone") >= 2, out(proc)[-3000:]
    finally:
        for decoy in decoys:
            decoy.kill()
            decoy.wait(5)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_check_mode_prints_every_command_and_starts_nothing(tmp_path: Path, engine: str) -> None:
    proc, pd_dir, ports = launch(tmp_path, "pd_check", "--check", engine_name=engine)
    assert proc.returncode == 0, out(proc)[-3000:]
    text = out(proc)
    if engine == "sglang":
        assert "--disaggregation-mode prefill" in text and "--disaggregation-mode decode" in text
        assert "sglang_router --pd-disaggregation --prefill" in text
    else:
        assert text.count("kv_both") >= 2 and "vllm_proxy --host" in text
    assert f"--port {ports['pd_launch_router_port']}" in text
    assert not pd_dir.exists()


def test_a_router_that_fails_to_start_stops_both_instances_and_fails_naming_why(tmp_path: Path) -> None:
    proc, pd_dir, _ = launch(tmp_path, "pd_fail", pd_launch_router_extra_args=["--no-such-router-flag"])
    try:
        assert proc.returncode != 0
        assert "unrecognized arguments: --no-such-router-flag" in out(proc)
        rec = records(pd_dir)
        assert set(rec) == {"prefill", "decode", "router"}
        assert [k for k, r in rec.items() if server_still_running(r)] == []
        assert out(proc).count("stopped with SIGTERM") == 2  # the instances; the router had exited
    finally:
        kill_leftovers(tmp_path)
