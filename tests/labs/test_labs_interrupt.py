"""Ctrl-C during a lab leaves no server behind: the stop phase finds every lab variant's start record.

The interrupt handler reruns labs.yml with --tags stop; before this test it looked only in the run's own
server/ directory, and a lab variant's server (labs/<lab>/<variant>/server/) kept running.
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
from labs_helpers import REPO

from tests.ansible.runner import ansible_env, free_port, server_still_running

pytestmark = pytest.mark.slow


def test_ctrl_c_during_a_lab_stops_the_variant_server(tmp_path: Path) -> None:
    pyz = tmp_path / "loadgen.pyz"
    subprocess.run([sys.executable, "-m", "loadgen.build_zipapp", str(pyz)], cwd=REPO, check=True)
    ev = {
        "quickmap_results_dir": str(tmp_path / "results"),
        "quickmap_loadgen_pyz": str(pyz),
        "engine_port": free_port(),
        "run_id": "labint",
    }
    ev_file = tmp_path / "ev.json"
    ev_file.write_text(json.dumps(ev))
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "labs.yml", "-i", "inventory/local"]
    proc = subprocess.Popen(
        [*cmd, "--tags", "kv_pressure", "-e", f"@{ev_file}"],
        cwd=REPO,
        env=ansible_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    labs = tmp_path / "results" / "labint" / "labs"
    record = None
    try:
        deadline = time.monotonic() + 300
        while record is None:
            assert proc.poll() is None, "the lab ended before its server was recorded"
            assert time.monotonic() < deadline, "no lab server was recorded in time"
            found = sorted(labs.glob("*/*/server/*.server.json"))
            if found:
                record = json.loads(found[0].read_text())
            time.sleep(0.2)
        time.sleep(2)  # the server settles (its record holds its identity)
        assert server_still_running(record), "nothing left to stop: the test proves nothing"
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal: the whole foreground group
        output, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        if record and record.get("runtime") == "process" and server_still_running(record):
            os.killpg(int(record["pid"]), signal.SIGKILL)
            pytest.fail(f"the lab variant's server (pid {record['pid']}) outlived the Ctrl-C stop phase")
    assert "interrupted; stopping its servers" in output, output[-3000:]
