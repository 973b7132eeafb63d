"""Attack 4: secrets reach the server through its environment only; no saved file and no output holds them.

Replays issue 11 item 4 with a canary in every way a secret comes in: HF_TOKEN in the controller's
environment (engine_secret_env), a secret-named key in engine_env, and an --api-key value in
engine_extra_args. The server must still get every one of them; then every file of the sandbox
(run dir, node state, plan) and the playbook's output are searched for the canaries. The same run
checks that the harness's own HTTP calls bypass a proxy set in the environment (issue 11 item 9).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from pathlib import Path

import pytest

from tests.ansible.runner import read_json, run_cli

from .conftest import server_pid

pytestmark = pytest.mark.slow

TOKEN = "hf_CanaryTokenFromTheEnvironment0123"
ENV_SECRET = "canary-engine-env-secret-4711"
API_KEY = "canary-api-key-value-0815"
CANARIES = (TOKEN, ENV_SECRET, API_KEY)


def _secret_extravars(box: dict, run_id: str) -> dict:
    return dict(
        box["extravars"],
        run_id=run_id,
        case_ids="short_decode_c1",
        engine_env={"ENGINESIM_TIME_SCALE": "0.02", "MY_API_TOKEN": ENV_SECRET},
        engine_extra_args=["--api-key", API_KEY],
    )


def _files_with_canaries(root: Path) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and path.suffix != ".pyz":
            data = path.read_bytes()
            found += [f"{path}: {c}" for c in CANARIES if c.encode() in data]
    return found


class _ProxyTrap:
    """A listener standing in for an operator's proxy: it only counts who connects."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


def test_secrets_reach_the_server_environment_only(sandbox: dict) -> None:
    ev = _secret_extravars(sandbox, "sec1")
    started = run_cli(ev, "--tags", "serve", env={"HF_TOKEN": TOKEN})
    assert started.rc == 0, started.output[-3000:]
    pid = server_pid(sandbox["port"])
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        leaked = _files_with_canaries(sandbox["tmp"])  # while the server runs: its log, its records
    finally:
        stopped = run_cli(ev, "--tags", "stop", env={"HF_TOKEN": TOKEN})
        if Path(f"/proc/{pid}").exists():
            os.killpg(pid, signal.SIGKILL)  # the server this test started
    assert not leaked, leaked
    assert not _files_with_canaries(sandbox["tmp"]), _files_with_canaries(sandbox["tmp"])
    for res in (started, stopped):
        assert not any(c in res.output for c in CANARIES), "a secret was printed"
    assert f"HF_TOKEN={TOKEN}".encode() in environ and f"MY_API_TOKEN={ENV_SECRET}".encode() in environ
    assert API_KEY.encode() in argv, "the server did not get its --api-key"
    assert stopped.rc == 0, stopped.output[-3000:]
    server = sandbox["results"] / "sec1" / "server"
    saved = (server / "localhost.start1_server_cmd.txt").read_text()
    assert '--api-key "***"' in saved and "HF_TOKEN=***" in saved and "MY_API_TOKEN=***" in saved
    assert "api_key='***'" in (server / "localhost.start1.log").read_text(), (
        "the engine's echo was not masked"
    )


def test_no_saved_file_and_no_output_of_a_whole_run_holds_a_secret(sandbox: dict) -> None:
    proxy = _ProxyTrap()
    try:
        env = {"HF_TOKEN": TOKEN, "http_proxy": proxy.url, "HTTP_PROXY": proxy.url, "https_proxy": proxy.url}
        res = run_cli(_secret_extravars(sandbox, "sec2"), "--tags", "fixed", env=env)
    finally:
        proxy.close()
    assert not _files_with_canaries(sandbox["tmp"]), _files_with_canaries(sandbox["tmp"])
    assert not any(c in res.output for c in CANARIES), "a secret was printed"
    assert proxy.connections == 0, "a call to the harness's own server went through the proxy"
    assert res.rc == 0, res.output[-3000:]
    run_dir = sandbox["results"] / "sec2"
    manifest = read_json(run_dir / "manifest.json")
    assert "MY_API_TOKEN" not in manifest["engine_env"] and '--api-key "***"' in manifest["engine_flags"]
    meta = read_json(run_dir / "cases/short_decode_c1/rep1/meta.json")
    assert meta["status"] == "completed", meta
    assert '--api-key "***"' in meta["fingerprint"]["server_command"]
    assert (run_dir / "cases/short_decode_c1/rep1/metrics_before.prom").stat().st_size > 0
    run_log = (run_dir / "run.log").read_text()
    assert run_log.splitlines()[0].split()[1] == "START" and '"***"' in run_log.splitlines()[0]
