"""Attack 3: the stop phase signals only the server this run started, as long as it is still that process.

Replays issue 11 item 3: one PID file for all runs, TERM then KILL of whatever process group it named.
A reused PID (the record's process is gone and an unrelated process got its number) must survive, and
`--tags stop -e run_id=B` must not stop run A's server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from module_utils.proc_identity import alive, cmdline, start_ticks
from tests.ansible.conftest import port_listening
from tests.ansible.runner import recorded_servers, run_cli

from .conftest import assert_untouched, server_pid, tree_digest

pytestmark = pytest.mark.slow


def test_tags_stop_stops_only_the_named_runs_server(sandbox: dict) -> None:
    ev = dict(sandbox["extravars"], run_id="runA", case_ids="short_decode_c1")
    started = run_cli(ev, "--tags", "serve")  # starts the server and (by tag choice) leaves it up
    assert started.rc == 0, started.output[-3000:]
    pid = server_pid(sandbox["port"])
    before = tree_digest(sandbox["tmp"], skip=sandbox["results"])
    try:
        other = run_cli(dict(ev, run_id="runB"), "--tags", "stop")
        assert port_listening(sandbox["port"]) and alive(pid), "another run's stop killed run A's server"
        assert other.rc == 0, other.output[-3000:]
        assert "run runB recorded no server" in other.output

        own = run_cli(ev, "--tags", "stop")
        assert own.rc == 0, own.output[-3000:]
        assert f"pid {pid}" in own.output and "stopped" in own.output
        assert not port_listening(sandbox["port"]) and not alive(pid)
        assert_untouched(sandbox, before)
    finally:
        if alive(pid) and "enginesim" in (cmdline(pid) or []):
            os.killpg(pid, signal.SIGKILL)  # the server this test started


def test_a_reused_pid_is_left_alone_and_named(sandbox: dict) -> None:
    """Run X's server died long ago; its PID now belongs to an unrelated process group."""
    victim = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        server_dir = sandbox["results"] / "runX" / "server"
        server_dir.mkdir(parents=True)
        stale = {
            "schema": "quickmap.server/1",
            "run_id": "runX",
            "host": "localhost",
            "start": 1,
            "runtime": "process",
            "pid": victim.pid,
            "start_ticks": start_ticks(victim.pid) - 100,
            "cmdline": ["/usr/bin/python3", "-m", "enginesim", "sglang"],
        }
        (server_dir / "localhost.start1.server.json").write_text(json.dumps(stale))
        # What the old layout kept: one PID file for every run.
        (sandbox["results"] / ".state").mkdir()
        (sandbox["results"] / ".state" / "localhost.pid").write_text(f"{victim.pid}\n")
        res = run_cli(dict(sandbox["extravars"], run_id="runX"), "--tags", "stop")
        assert victim.poll() is None and cmdline(victim.pid) == ["sleep", "300"], "an unrelated process died"
        assert res.rc == 0, res.output[-3000:]
        assert f"pid {victim.pid} is not the server run runX started" in res.output
        assert "PID was reused" in res.output and "left alone" in res.output
    finally:
        victim.kill()
        victim.wait()


def test_the_start_record_holds_pid_start_time_and_command_line(sandbox: dict) -> None:
    ev = dict(sandbox["extravars"], run_id="rec", case_ids="short_decode_c1")
    started = run_cli(ev, "--tags", "serve")
    assert started.rc == 0, started.output[-3000:]
    [record] = recorded_servers(sandbox["results"])
    try:
        assert record["start_ticks"] == start_ticks(record["pid"])
        assert record["cmdline"] == cmdline(record["pid"]) and "enginesim" in record["cmdline"]
        assert Path(record["log"]).name == "localhost.start1.log"
        index = json.loads((sandbox["results"] / ".state" / "localhost.json").read_text())
        assert index["pid"] == record["pid"] and index["run_id"] == "rec"
    finally:
        assert run_cli(ev, "--tags", "stop").rc == 0
    assert not (sandbox["results"] / ".state" / "localhost.json").exists()
