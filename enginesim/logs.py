"""Log lines in the running engine's own format, written to stdout (the role redirects it to a file).

The format is the flavour's (flavours/*.py `format`): SGLang `[2026-06-08 19:59:37] msg` (scheduler
ranks add ` TP0`, ` TP8` ... when TP > 1); vLLM `(EngineCore_DP0 pid=164) INFO 01-23 15:50:06
[kv_cache_utils.py:1087] msg`.
"""

from __future__ import annotations

import os
import sys
from typing import Any

CORE = "EngineCore_DP0"  # vLLM's engine-core process name (SGLang lines ignore it)


class Logger:
    def __init__(self, flavour: Any, tp_suffix: str = "") -> None:
        from . import flavours

        self.flavour = flavours.get(flavour) if isinstance(flavour, str) else flavour
        self.tp_suffix = tp_suffix
        self.pid = os.getpid()
        self.out = sys.stdout

    def _write(self, line: str) -> None:
        try:
            self.out.write(line + "\n")
            self.out.flush()
        except (OSError, ValueError):
            pass

    def line(
        self,
        msg: str,
        rank: bool = False,
        level: str = "INFO",
        src: str = "api_server.py:1000",
        proc: str = "APIServer",
    ) -> None:
        """One line in the engine's format; `rank=True` marks scheduler (TP) lines, `src`/`proc` name
        the source file and process where the engine's format shows them."""
        suffix = self.tp_suffix if rank else ""
        self._write(self.flavour.format(msg, level, suffix, self.pid, src, proc))

    def raw(self, line: str) -> None:
        self._write(line)

    def info(self, msg: str, src: str = "scheduler.py:1000", rank: bool = True) -> None:
        """One informational line of the engine core."""
        self.line(msg, rank=rank, src=src, proc=CORE)

    def warning(self, msg: str, src: str = "scheduler.py:1000", rank: bool = True) -> None:
        self.line(msg, rank=rank, level="WARNING", src=src, proc=CORE)

    def error(self, msg: str, src: str = "core.py:700", rank: bool = True) -> None:
        self.line(msg, rank=rank, level="ERROR", src=src, proc=CORE)


class NullLogger(Logger):
    """Swallows every line: the replay runs the scheduler's code, log lines included, silently."""

    def _write(self, line: str) -> None:
        del line
