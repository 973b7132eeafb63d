"""Ctrl-C in the middle of a case leaves no client behind, whichever way the case ran.

The case runs the real loadgen zipapp (two workers) under `timeout`, as the bench role's case script
does, against an in-test server slow enough that the case is mid-stream when ansible-playbook gets
SIGINT the way a terminal sends it (to its process group). `timeout` puts itself and the client in a
process group of their own inside the script's session: a stop that signals only the script's group
leaves loadgen and its workers running (orphans that keep loading the server). Both node sides are
tested: in-process (connection local) and the shipped module (the quickmap_module_local test
connection, which is what a remote head runs).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "loadgen"))

from fakeserver import FakeServer

from tests.rig.procs import alive

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK_BIN = REPO / ".venv" / "bin" / "ansible-playbook"
CONNECTION_PLUGINS = REPO / "tests" / "modules" / "connection_plugins"
MARKER = "Starting main benchmark run..."

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: the case
      bench_case:
        label: c1
        case_dir: "{{ node }}"
        controller_case_dir: "{{ ctrl }}"
        node_is_controller: false
        script: "{{ script }}"
        timeout_s: 300
        case_timeout_s: 240
        kill_after_s: 5
        expect_requests: 400
        expect_output_len: 400
"""


def _clients(marker: str) -> list[int]:
    """Live processes whose command line holds ``marker`` (loadgen and its forked workers)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                argv = handle.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if marker in argv and "bash" not in argv.split(" ", 1)[0] and alive(int(name)):
            found.append(int(name))
    return sorted(found)


def _wait_for(predicate, limit_s: float) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


@pytest.mark.skipif(not PLAYBOOK_BIN.exists(), reason=f"{PLAYBOOK_BIN} not installed (make venv)")
@pytest.mark.parametrize("connection", ["local", "quickmap_module_local"])
def test_ctrl_c_mid_case_leaves_no_loadgen_or_worker(tmp_path: Path, pyz: Path, connection: str) -> None:
    node, ctrl = tmp_path / "node", tmp_path / "ctrl"
    node.mkdir()
    out_file = node / "bench.json"  # unique to this test: it marks this case's client processes
    with FakeServer(ttft=0.01, itl=0.06) as srv:
        client = [sys.executable, str(pyz), "--backend", "sglang", "--base-url", srv.url,
                  "--num-prompts", "400", "--max-concurrency", "4", "--workers", "2",
                  "--random-input-len", "8", "--random-output-len", "400", "--random-range-ratio", "1",
                  "--warmup-requests", "0", "--output-file", str(out_file)]  # fmt: skip
        script = "timeout -k 5 240 " + " ".join(client) + " > bench.log 2>&1\n"
        (tmp_path / "play.yml").write_text(PLAY)
        (tmp_path / "vars.json").write_text(
            json.dumps({"node": str(node), "ctrl": str(ctrl), "script": script})
        )
        env = dict(
            os.environ, LC_ALL="C.UTF-8", ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1"
        )
        env.update(
            ANSIBLE_HOME=str(tmp_path / "ansible_home"), ANSIBLE_CONNECTION_PLUGINS=str(CONNECTION_PLUGINS)
        )
        env["ANSIBLE_STDOUT_CALLBACK"] = "default"
        argv = [str(PLAYBOOK_BIN), "-i", "localhost,", "-c", connection, str(tmp_path / "play.yml")]
        argv += ["-e", f"ansible_python_interpreter={sys.executable}", "-e", f"@{tmp_path / 'vars.json'}"]
        log = (tmp_path / "playbook.log").open("w")
        play = subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            bench_log = node / "bench.log"
            started = _wait_for(lambda: bench_log.exists() and MARKER in bench_log.read_text(), 120)
            assert started, (
                f"the case never reached its main phase: {(tmp_path / 'playbook.log').read_text()[-2000:]}"
            )
            time.sleep(1.0)  # requests mid-stream
            running = _clients(str(out_file))
            assert len(running) >= 3, f"expected loadgen and two workers, found {running}"
            os.killpg(play.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the foreground group
            play.wait(timeout=60)
            gone = _wait_for(
                lambda: not any(alive(pid) for pid in running) and not _clients(str(out_file)), 15
            )
        finally:
            if play.poll() is None:
                os.killpg(play.pid, signal.SIGKILL)
            leftovers = _clients(str(out_file))
            for pid in leftovers:  # never leave them to the next test
                os.kill(pid, signal.SIGKILL)
            log.close()
        assert gone, f"processes of the interrupted case still run: {leftovers or running}"
    # stopped like its timeout would: the client handed back what it measured
    assert out_file.exists(), (node / "bench.log").read_text()[-2000:]
    assert json.loads(out_file.read_text())["complete"] is False
