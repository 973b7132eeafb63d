"""JSON in and out of the HTTP surfaces, and the error every route may raise.

orjson when importable (the venv has it); the standard library otherwise.
"""

from __future__ import annotations

from typing import Any

try:
    import orjson

    def dumps(obj: Any) -> bytes:
        return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS)

    def loads(b: bytes) -> Any:
        return orjson.loads(b)

except ImportError:  # pragma: no cover - the venv has orjson; plain stdlib also works
    import json

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

    def loads(b: bytes) -> Any:
        return json.loads(b)


DONE = b"data: [DONE]\n\n"


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
