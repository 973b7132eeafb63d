"""process_tree: the scheduler child of *our* server is chosen, never a look-alike elsewhere on the box.

Real processes: a stand-in "server" (python) whose child carries the scheduler's title, and a decoy
with the same title started first (the older process) by the test itself, outside the server's tree.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

from ansible.module_utils.proc_identity import identity
from ansible.module_utils.redact import mask_argv

TITLE = "sglang::scheduler_TP0"
MATCH = r"sglang::scheduler(_[A-Z0-9_]+)?"
_SLEEPER = "import time; time.sleep(60)"
# The stand-in server: starts its "scheduler" child (argv[0] = the title), prints the child's pid, waits.
_SERVER = (
    "import subprocess, sys, time\n"
    f"c = subprocess.Popen([{TITLE!r}, '-c', {_SLEEPER!r}], executable=sys.executable)\n"
    "print(c.pid, flush=True)\n"
    "time.sleep(60)\n"
)


def _titled(title: str) -> subprocess.Popen:
    return subprocess.Popen([title, "-c", _SLEEPER], executable=sys.executable)


def _record(pid: int) -> dict:
    for _ in range(100):
        ident = identity(pid, mask_argv)
        if ident is not None:
            return ident
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} never showed up")


def _stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(5)


def test_picks_the_scheduler_child_of_our_server_not_a_decoy(run, tmp_path):
    decoy = _titled(TITLE)  # same title, started first: a machine-wide search would take it
    server = subprocess.Popen([sys.executable, "-c", _SERVER], stdout=subprocess.PIPE, text=True)
    child_pid = int(server.stdout.readline())
    try:
        dest = tmp_path / "scheduler_process.json"
        kind, res = run("process_tree", {"record": _record(server.pid), "match": MATCH, "dest": str(dest)})
        assert kind == "exit", res
        # the decoy is the older process (PIDs wrap, so their order proves nothing): a search that
        # takes the first match by age would take it
        assert _record(decoy.pid)["start_ticks"] <= _record(child_pid)["start_ticks"]
        assert res["found"] is True and res["pid"] == child_pid != decoy.pid, (res, child_pid, decoy.pid)
        assert res["cmdline"][0] == TITLE
        assert [p["pid"] for p in res["tree"]] == [child_pid]
        assert res["tree"][0]["ppid"] == server.pid
        saved = json.loads(dest.read_text())
        assert saved["pid"] == child_pid and saved["root"]["pid"] == server.pid
    finally:
        _stop(server, decoy)
        subprocess.run(["kill", "-9", str(child_pid)], check=False, capture_output=True)


def test_no_matching_child_is_a_reason_not_a_guess(run, tmp_path):
    decoy = _titled(TITLE)
    server = subprocess.Popen([sys.executable, "-c", _SLEEPER])
    try:
        kind, res = run("process_tree", {"record": _record(server.pid), "match": MATCH})
        assert kind == "exit"
        assert res["found"] is False and "pid" not in res
        assert f"no process under pid {server.pid}" in res["reason"]
    finally:
        _stop(server, decoy)


def test_a_record_whose_process_is_gone_or_reused_is_refused(run):
    server = subprocess.Popen([sys.executable, "-c", _SLEEPER])
    rec = _record(server.pid)
    _stop(server)
    kind, res = run("process_tree", {"record": rec, "match": MATCH})
    assert kind == "exit" and res["found"] is False
    assert "not running as recorded" in res["reason"]
    alive = subprocess.Popen([sys.executable, "-c", _SLEEPER])
    try:
        reused = dict(_record(alive.pid), start_ticks=1)  # same pid number, another start time
        kind, res = run("process_tree", {"record": reused, "match": MATCH})
        assert res["found"] is False and "PID was reused" in res["reason"]
    finally:
        _stop(alive)


def test_check_mode_writes_nothing_and_a_bad_pattern_is_named(run, tmp_path):
    server = subprocess.Popen([sys.executable, "-c", _SLEEPER])
    try:
        dest = tmp_path / "x.json"
        kind, _ = run(
            "process_tree", {"record": _record(server.pid), "match": MATCH, "dest": str(dest)}, True
        )
        assert kind == "exit" and not dest.exists()
        kind, res = run("process_tree", {"record": _record(server.pid), "match": "sglang::(("})
        assert kind == "fail" and "match='sglang::(('" in res["msg"]
    finally:
        _stop(server)


def _fake_proc(tmp_path, state: str) -> tuple[str, int, int]:
    """A /proc with a root whose one child has no argv yet (inside execve, or a zombie)."""
    root, child = 4000, 4001
    (tmp_path / str(root) / "task" / str(root)).mkdir(parents=True)
    (tmp_path / str(root) / "task" / str(root) / "children").write_text(f"{child} ")
    (tmp_path / str(child)).mkdir()
    (tmp_path / str(child) / "cmdline").write_bytes(b"")
    (tmp_path / str(child) / "stat").write_text(f"{child} (python) {state} {root} {child} {child} 0 -1 0")
    return str(tmp_path), root, child


def test_a_child_caught_inside_execve_is_waited_for_not_dropped(tmp_path):
    """The kernel closes a child's close-on-exec pipe (its parent's Popen returns and may print the PID)
    before it sets the new argv: read in that window, /proc/<pid>/cmdline is empty. The walk used to
    take that for "exited" and found no scheduler (2 of 30 runs with 2 busy loops on this box)."""
    from ansible.module_utils.proc_tree import descendants

    proc, root, child = _fake_proc(tmp_path, "R")
    argv = b"sglang::scheduler_TP0\0-c\0"
    timer = threading.Timer(0.05, (tmp_path / str(child) / "cmdline").write_bytes, [argv])
    timer.start()
    try:
        tree = descendants(root, proc)
    finally:
        timer.cancel()
    assert tree == [{"pid": child, "ppid": root, "depth": 1, "cmdline": ["sglang::scheduler_TP0", "-c"]}]


def test_a_zombie_child_without_argv_is_skipped_at_once(tmp_path):
    from ansible.module_utils.proc_tree import descendants

    proc, root, _ = _fake_proc(tmp_path, "Z")
    t0 = time.monotonic()
    assert descendants(root, proc) == []
    assert time.monotonic() - t0 < 0.5
