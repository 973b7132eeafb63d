"""Per-request evidence in a loadgen result, and n-gram acceptance from either engine.

Why here: cached tokens and speculative acceptance are read from what the server itself reported
(SGLang `meta_info`, OpenAI `usage.prompt_tokens_details`, vLLM's spec-decode counters), never
inferred from latency.

Acceptance length counts the bonus token in both engines. SGLang: `spec_accept_length` =
completion_tokens / verify steps (its own comment: "includes bonus token"). vLLM: mean acceptance
length = 1 + accepted / drafts (its metrics docstring). So 1.0 means no draft was ever accepted, and
an accept length of 3 is 2 accepted drafts plus the token every verify step yields anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from analysis.errors import InputError

LOADGEN_SCHEMA = "quickmap.loadgen/1"


def read_result(path: str | Path) -> dict[str, Any] | None:
    """A loadgen result file (None when missing); bad JSON or another schema is an InputError."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        obj = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise InputError(path, None, f"not JSON ({exc.msg})") from None
    if not isinstance(obj, dict) or obj.get("schema") != LOADGEN_SCHEMA:
        raise InputError(path, "schema", f"expected {LOADGEN_SCHEMA!r}")
    return obj


def ok_requests(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Successful main-phase requests, in index order."""
    return sorted((r for r in result.get("requests", []) if r.get("success")), key=lambda r: r["index"])


def cached_tokens(result: dict[str, Any]) -> list[int | None]:
    """Cached prompt tokens per successful request as the server reported them (None: not reported)."""
    return [r.get("cached_tokens") for r in ok_requests(result)]


@dataclass
class Acceptance:
    """N-gram (or any) speculative acceptance over some requests."""

    accept_length: float | None  # tokens per verify step, bonus token included
    accept_rate: float | None  # accepted drafts / proposed drafts (no bonus)
    accepted_drafts: float | None
    proposed_drafts: float | None
    verify_steps: float | None
    source: str

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def sglang_acceptance(requests: list[dict[str, Any]]) -> Acceptance | None:
    """Pooled over requests from their `spec` fields (newer or older SGLang key names)."""
    tokens = verify = correct = proposed = 0.0
    seen = False
    for r in requests:
        spec = r.get("spec") or {}
        v = spec.get("spec_verify_ct")
        if not v:
            continue
        seen = True
        verify += v
        tokens += r.get("output_tokens") or 0
        correct += spec.get("spec_num_correct_drafts", spec.get("spec_accept_token_num", 0)) or 0
        proposed += spec.get("spec_num_proposed_drafts", spec.get("spec_draft_token_num", 0)) or 0
    if not seen:
        return None
    return Acceptance(
        accept_length=tokens / verify if verify else None,
        accept_rate=correct / proposed if proposed else None,
        accepted_drafts=correct,
        proposed_drafts=proposed,
        verify_steps=verify,
        source="sglang meta_info spec_* (completion_tokens / spec_verify_ct)",
    )


def vllm_acceptance(deltas: dict[str, float | None]) -> Acceptance | None:
    """From counter deltas of vllm:spec_decode_num_{drafts,draft_tokens,accepted_tokens}_total."""
    drafts = deltas.get("vllm:spec_decode_num_drafts_total")
    draft_tokens = deltas.get("vllm:spec_decode_num_draft_tokens_total")
    accepted = deltas.get("vllm:spec_decode_num_accepted_tokens_total")
    if not drafts:
        return None
    return Acceptance(
        accept_length=1.0 + (accepted or 0.0) / drafts,
        accept_rate=(accepted or 0.0) / draft_tokens if draft_tokens else None,
        accepted_drafts=accepted,
        proposed_drafts=draft_tokens,
        verify_steps=drafts,
        source="vllm:spec_decode_* counter deltas (1 + accepted / drafts)",
    )
