"""Log lines in each engine's own prefix format, written to stdout (the role redirects it to a file).

SGLang: `[2026-06-08 19:59:37] msg` (scheduler ranks add ` TP0`, ` TP8` ... when TP > 1).
vLLM:   `(EngineCore_DP0 pid=164) INFO 01-23 15:50:06 [kv_cache_utils.py:1087] msg`.
"""

from __future__ import annotations

import os
import sys
import time


class Logger:
    def __init__(self, flavour: str, tp_suffix: str = "") -> None:
        self.flavour = flavour
        self.tp_suffix = tp_suffix
        self.pid = os.getpid()
        self.out = sys.stdout

    def _write(self, line: str) -> None:
        try:
            self.out.write(line + "\n")
            self.out.flush()
        except (OSError, ValueError):
            pass

    def sgl(self, msg: str, rank: bool = False, level: str = "INFO") -> None:
        """SGLang line; `rank=True` marks scheduler (TP) lines."""
        del level
        suffix = self.tp_suffix if rank else ""
        self._write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}{suffix}] {msg}")

    def vllm(
        self, msg: str, src: str = "api_server.py:1000", proc: str = "APIServer", level: str = "INFO"
    ) -> None:
        self._write(f"({proc} pid={self.pid}) {level} {time.strftime('%m-%d %H:%M:%S')} [{src}] {msg}")

    def raw(self, line: str) -> None:
        self._write(line)

    def info(self, msg: str, src: str = "scheduler.py:1000", rank: bool = True) -> None:
        """One informational line in the running engine's format."""
        if self.flavour == "sglang":
            self.sgl(msg, rank=rank)
        else:
            self.vllm(msg, src=src, proc="EngineCore_DP0")

    def warning(self, msg: str, src: str = "scheduler.py:1000", rank: bool = True) -> None:
        if self.flavour == "sglang":
            self.sgl(msg, rank=rank, level="WARNING")
        else:
            self.vllm(msg, src=src, proc="EngineCore_DP0", level="WARNING")

    def error(self, msg: str, src: str = "core.py:700", rank: bool = True) -> None:
        if self.flavour == "sglang":
            self.sgl(msg, rank=rank, level="ERROR")
        else:
            self.vllm(msg, src=src, proc="EngineCore_DP0", level="ERROR")


class NullLogger(Logger):
    """Swallows every line: the replay runs the scheduler's code, log lines included, silently."""

    def _write(self, line: str) -> None:
        del line
