"""The run-directory vocabulary of docs/README.md: case statuses, error types, run statuses.

Kept apart (and import-free) so the CLI can offer the choices without loading the state code.
"""

from __future__ import annotations

STATUSES = ("planned", "running", "completed", "failed")
ERROR_TYPES = (
    "TIMEOUT",
    "OOM",
    "SERVER_DEAD",
    "TRANSPORT_ERROR",
    "BENCH_FAILED",
    "BACKGROUND_FINISHED_BEFORE_INJECTION",
    "GATE_FAILED",
)
RUN_STATUSES = ("completed", "failed", "partial", "interrupted")
