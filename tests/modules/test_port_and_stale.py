"""port_free and server_stale: real sockets and real processes on 127.0.0.1, a fake docker on PATH."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from ansible.module_utils.net_probe import parse_proc_net_tcp


@contextlib.contextmanager
def listening(host: str = "127.0.0.1", family: int = socket.AF_INET):
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
        sock.listen(1)
        yield sock.getsockname()[1]
    finally:
        sock.close()


def free_port() -> int:
    with listening() as port:
        return port


def test_free_port_passes(run):
    port = free_port()
    kind, res = run("port_free", {"port": port})
    assert kind == "exit", res["msg"]
    assert res["free"] is True and res["ports"][0]["in_use"] is False and res["changed"] is False


def test_port_in_use_fails_naming_port_and_owner(run):
    with listening() as port:
        kind, res = run("port_free", {"ports": [free_port(), port]})
    assert kind == "fail"
    assert f"port {port} for 0.0.0.0 is already in use: 127.0.0.1:{port} (pid {os.getpid()}:" in res["msg"]
    assert "rule:" in res["msg"]
    assert [p["in_use"] for p in res["ports"]] == [False, True]


def test_listener_on_another_address_does_not_collide_with_a_specific_host(run):
    with listening("127.0.0.1") as port:
        kind, res = run("port_free", {"port": port, "host": "127.0.0.2"})
        assert kind == "exit", res["msg"]
        kind, res = run("port_free", {"port": port, "host": "127.0.0.1"})
        assert kind == "fail"


def test_ipv6_listener_is_seen(run):
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this host")
    try:
        ctx = listening("::1", socket.AF_INET6)
        port = ctx.__enter__()
    except OSError as exc:
        pytest.skip(f"cannot listen on ::1: {exc}")
    try:
        kind, res = run("port_free", {"port": port})
    finally:
        ctx.__exit__(None, None, None)
    assert kind == "fail" and f"::1:{port}" in res["msg"]


def test_bad_port_is_refused_with_the_rule(run):
    kind, res = run("port_free", {"port": 70000})
    assert kind == "fail" and res["msg"] == "port_free: port=70000 (rule: a TCP port is 1-65535)"


def test_proc_net_tcp_parsing():
    text = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 0100007F:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000 0 4242 1 0\n"
        "   1: 0100007F:7531 0100007F:9C40 01 00000000:00000000 00:00000000 00000000  1000 0 4243 1 0\n"
    )
    assert parse_proc_net_tcp(text) == [{"addr": "127.0.0.1", "port": 30000, "inode": 4242}]
    v6 = (
        "  sl  local_address                         remote_address                        st\n"
        "   0: 00000000000000000000000001000000:7530 00000000000000000000000000000000:0000 0A "
        "00000000:00000000 00:00000000 00000000  1000 0 777 1 0\n"
    )
    assert parse_proc_net_tcp(v6, ipv6=True) == [{"addr": "::1", "port": 30000, "inode": 777}]


# --- server_stale -------------------------------------------------------------------------------

SERVER = (
    "import socket, sys, time\n"
    "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(4)\n"
    "print(s.getsockname()[1], flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.fixture
def stale_server(tmp_path):
    """A real process listening on 127.0.0.1 with a pid file, stopped by PID afterwards."""
    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        pid_file = tmp_path / "server.pid"
        pid_file.write_text(f"{proc.pid}\n")
        yield proc, port, pid_file
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_running_server_from_earlier_run_is_detected(run, stale_server):
    proc, port, pid_file = stale_server
    kind, res = run("server_stale", {"port": port, "pid_file": str(pid_file)})
    assert kind == "fail"
    assert res["stale"] is True and len(res["evidence"]) == 2
    assert f"port {port} is listening: 127.0.0.1:{port} (pid {proc.pid}:" in res["msg"]
    assert f"pid file {pid_file} names live pid {proc.pid}" in res["msg"]
    assert {p["pid"] for p in res["pids"]} == {proc.pid}
    kind, res = run("server_stale", {"port": port, "fail_on_stale": False})
    assert kind == "exit" and res["stale"] is True


def test_dead_pid_file_is_a_leftover_not_a_server(run, tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()
    pid_file = tmp_path / "server.pid"
    pid_file.write_text(str(gone.pid))
    kind, res = run("server_stale", {"port": free_port(), "pid_file": str(pid_file)})
    assert kind == "exit", res["msg"]
    assert res["stale"] is False and f"names pid {gone.pid}, which is not running" in res["leftovers"][0]


def test_start_record_names_its_run_while_the_process_is_the_one_started(run, stale_server, tmp_path):
    """A record (server_process) counts only while PID, start time and command line all match."""
    import json

    from module_utils.proc_identity import cmdline, start_ticks

    proc, _port, _pid_file = stale_server
    rec = {"run_id": "run-7", "runtime": "process", "pid": proc.pid, "start_ticks": start_ticks(proc.pid),
           "cmdline": cmdline(proc.pid), "started_at": "2026-01-01T00:00:00Z"}  # fmt: skip
    record = tmp_path / "node.json"
    record.write_text(json.dumps(rec))
    kind, res = run("server_stale", {"record": str(record)})
    assert kind == "fail" and "the server of run run-7" in res["msg"] and str(proc.pid) in res["msg"]
    record.write_text(json.dumps(dict(rec, start_ticks=rec["start_ticks"] - 5)))  # the PID was reused
    kind, res = run("server_stale", {"record": str(record)})
    assert kind == "exit" and res["stale"] is False and "PID was reused" in res["leftovers"][0]


def fake_docker(bin_dir: Path, stdout: str, rc: int = 0) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "docker"
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$1 $2 $3" != "ps -a --filter" ]; then echo "fake docker: bad args: $*" >&2; exit 64; fi\n'
        'if [ "$4" != "name=qm-server" ]; then echo "fake docker: bad filter $4" >&2; exit 65; fi\n'
        f"printf '{stdout}'\n"
        f"exit {rc}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


@pytest.mark.parametrize(
    ("state", "stale"),
    [("running", True), ("exited", False)],
)
def test_container_state_decides(run, tmp_path, state, stale):
    # docker's name filter also returns qm-server-old: only the exact name may count.
    docker = fake_docker(
        tmp_path / "bin", f"99ffeedd\\tqm-server-old\\trunning\\n0123abcd\\tqm-server\\t{state}\\n"
    )
    kind, res = run("server_stale", {"container_name": "qm-server", "docker": str(docker)})
    assert res["container"] == {"id": "0123abcd", "name": "qm-server", "state": state}
    if stale:
        assert kind == "fail" and "container qm-server (0123abcd) is running" in res["msg"]
    else:
        assert kind == "exit" and "exists in state exited" in res["msg"]


def test_docker_error_fails_closed_and_missing_docker_is_reported(run, tmp_path):
    docker = fake_docker(tmp_path / "bin", "", rc=1)
    kind, res = run("server_stale", {"container_name": "qm-server", "docker": str(docker)})
    assert kind == "fail" and "cannot list containers" in res["msg"] and res["rc"] == 1
    kind, res = run("server_stale", {"container_name": "qm-server", "docker": str(tmp_path / "nodocker")})
    assert (
        kind == "exit" and res["container_checked"] is False and "no container can be running" in res["msg"]
    )
