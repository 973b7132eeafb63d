"""Start and stop a truthserver process for a benchmark or a test, and read back what it reports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
READY = "truthserver: listening on http://"
STOPPED = "truthserver: stopped "


class TruthServer:
    """``with TruthServer(log, ttft_ms=50, itl_ms=10) as srv:`` → ``srv.port``; ``srv.report`` after.

    The server runs in its own process (``python -m benchmarks.truthserver``) on a port the kernel
    picks, so parallel runs never race for a port. Leaving the block stops it with SIGINT and keeps
    its final report (totals, CPU seconds, busy seconds).
    """

    def __init__(
        self,
        log: str,
        ttft_ms: float = 50.0,
        itl_ms: float = 10.0,
        tokens_per_event: int = 1,
        output_len: int = 0,
        python: str = sys.executable,
        extra: list[str] | None = None,
    ) -> None:
        self.cmd = [
            python, "-m", "benchmarks.truthserver", "--port", "0", "--log", log,
            "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms),
            "--tokens-per-event", str(tokens_per_event), "--output-len", str(output_len),
            *(extra or []),
        ]  # fmt: skip
        self.log = log
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.report: dict = {}

    def start(self) -> TruthServer:
        self.proc = subprocess.Popen(
            self.cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        line = self.proc.stdout.readline()
        if not line.startswith(READY):
            self.proc.kill()
            rest = self.proc.communicate(timeout=10)[0]
            raise RuntimeError(f"truthserver did not start: {line}{rest}")
        self.port = int(line[len(READY) :].split()[0].rsplit(":", 1)[1])
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> dict:
        p = self.proc
        if p is None or p.returncode is not None:
            return self.report
        p.send_signal(signal.SIGINT)
        try:
            out = p.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            p.kill()
            out = p.communicate()[0]
        for line in out.splitlines():
            if line.startswith(STOPPED):
                self.report = json.loads(line[len(STOPPED) :])
        return self.report

    def __enter__(self) -> TruthServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def proc_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a running process has used so far (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")
