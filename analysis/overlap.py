"""The A/B's overlap proof: did the injection really land inside the background's main phase?

The mixed role checks liveness just before it injects, but Ansible needs a moment between that check
and the send, and a short background can end in between. Judging from the two result files after the
fact (the background's main window against the injection's own send time) is the only proof that
cannot race; a repetition without it is recorded as BACKGROUND_FINISHED_BEFORE_INJECTION.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from analysis import state
from analysis.atomic import read_json_object, write_json
from analysis.errors import InputError
from module_utils.verdicts import judge_overlap

BACKGROUND, INJECTION = "decode_background", "prefill_injection"


def _load(path: Path) -> dict[str, Any]:
    try:
        doc = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise InputError(path, None, "file not found (written by the A/B run before this check)") from None
    except orjson.JSONDecodeError as exc:
        raise InputError(path, None, f"not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise InputError(path, None, "expected a JSON object (a loadgen result)")
    return doc


def _number(doc: dict[str, Any], key: str, path: Path) -> float:
    value = doc.get(key)
    if not isinstance(value, int | float):
        raise InputError(path, key, f"expected a number, got {value!r} (loadgen result schema)")
    return float(value)


def main_window(background: dict[str, Any], path: Path) -> tuple[float, float]:
    """The background's main phase as unix epoch seconds."""
    t0 = _number(background, "t0_epoch_s", path)
    return t0 + _number(background, "main_start_s", path), t0 + _number(background, "main_end_s", path)


def injection_sent(injection: dict[str, Any], path: Path) -> float:
    """When the injected request was handed to the socket (epoch seconds)."""
    requests = injection.get("requests")
    if not isinstance(requests, list) or not requests or not isinstance(requests[0], dict):
        raise InputError(path, "requests", "expected one request record (the injection sends one prompt)")
    return _number(injection, "t0_epoch_s", path) + _number(requests[0], "send_s", path)


def _add_evidence(case_dir: Path, fields: dict[str, Any]) -> None:
    """Merge the proof into meta.json without touching its status, times or history."""
    meta_path = case_dir / "meta.json"
    meta = read_json_object(meta_path)
    meta.update(fields)
    write_json(meta_path, state.redact(meta))


def _fail_both(rep: Path, reason: str, evidence: dict[str, Any]) -> None:
    for role in (BACKGROUND, INJECTION):
        _add_evidence(rep / role, {**evidence, "overlap_proved": False})
        state.mark_case_failed(rep / role, "BACKGROUND_FINISHED_BEFORE_INJECTION", reason)


def check_overlap(rep_dir: str | Path, not_sent: str | None = None) -> tuple[int, str]:
    """Exit code and message; on no overlap both roles' metas are marked failed with the evidence.

    ``not_sent``: the mixed role decided not to send the injection (the background had left its main
    phase when it was due) and says why; the verdict is then "no overlap" without reading any result.
    """
    rep = Path(rep_dir)
    if not_sent is not None:
        verdict = judge_overlap(None, None, None)
        reason = f"{verdict['detail']}: {not_sent}"
        _fail_both(rep, reason, {})
        return 1, f"no overlap: {reason}"
    bg_path, inj_path = rep / BACKGROUND / "bench.json", rep / INJECTION / "bench.json"
    start, end = main_window(_load(bg_path), bg_path)
    sent = injection_sent(_load(inj_path), inj_path)
    evidence = {"background_main_start_epoch_s": start, "background_main_end_epoch_s": end}
    verdict = judge_overlap(start, end, sent)
    if verdict["overlap"]:
        fields = {**evidence, "injection_sent_epoch_s": sent, "overlap_proved": True}
        for role in (BACKGROUND, INJECTION):
            _add_evidence(rep / role, fields)
        return 0, f"overlap: {verdict['detail']}"
    where = "before the background's main phase began" if verdict["where"] == "before" else "after it ended"
    reason = f"injection sent at {sent:.3f}, {where} (main phase {start:.3f} .. {end:.3f})"
    _fail_both(rep, reason, {**evidence, "injection_sent_epoch_s": sent})
    return 1, f"no overlap: {reason}"
