"""--progress-file: a small JSON file rewritten every few seconds while the main phase runs.

Whoever watches a long case (quickmap's console callback, a person with `watch cat`) reads it; it is a
progress indication, not a result. `output_tokens_done` counts the *requested* output length of the
requests that completed without error (the server is asked for exactly that many with ignore_eos; the
measured count is in the result file only, after the stream bodies are parsed), so `output_tok_s` is
that count over the main phase's elapsed time.
"""

from __future__ import annotations

import time

from . import results

INTERVAL_S = 2.0


class ProgressFile:
    """Throttled atomic writes of {phase, completed, total, output_tokens_done, elapsed_s, output_tok_s}."""

    def __init__(self, path: str | None, total: int, interval_s: float = INTERVAL_S) -> None:
        self.path = path
        self.total = total
        self.interval_s = interval_s
        self.started = 0.0
        self.last = 0.0
        self.counts = (0, 0)

    def start(self) -> None:
        """The main phase begins now: elapsed time counts from here; a first line is written."""
        self.started = time.monotonic()
        self.update(0, 0, force=True)

    def update(self, completed: int, tokens: int, force: bool = False, phase: str = "main") -> None:
        """Write the counts when `interval_s` passed since the last write (or when forced)."""
        if not self.path:
            return
        self.counts = (completed, tokens)
        now = time.monotonic()
        if not force and now - self.last < self.interval_s:
            return
        self.last = now
        elapsed = now - self.started if self.started else 0.0
        results.write_atomic(
            self.path,
            {
                "phase": phase,
                "completed": completed,
                "total": self.total,
                "output_tokens_done": tokens,
                "elapsed_s": round(elapsed, 3),
                "output_tok_s": round(tokens / elapsed, 1) if elapsed > 0 else 0.0,
                "updated_at": time.time(),
            },
        )

    def finish(self) -> None:
        """The run is over: the last counts the workers reported, marked done (a reader stops here)."""
        if self.started:
            self.update(*self.counts, force=True, phase="done")
