# Copyright: quickmap contributors
# Apache-2.0
"""The two verdicts every part of quickmap shares: is this case complete, and did the A/B overlap.

One implementation, called by the ``bench_result``/``bench_case`` modules (through ``bench_file``), by
the ``bench_case`` action plugin (which records what the module decided), and by ``analysis``
(``check-bench``, ``case-done``, ``check-overlap``, ``summarize``). Before, each caller had its own copy
and they had drifted apart; the rules below are the ones kept where they disagreed (analysis/README.md
"One judge" says what changed for whom).

Standard library only and Python 3.8-compatible: modules run on the nodes' python.
"""

from __future__ import annotations

import json

REASONS = ("incomplete", "nonfinite", "count", "short_output")


def judge_case(
    facts: dict,
    expect_requests: int | None,
    expect_output_len: int | None = None,
    min_output_fraction: float = 1.0,
) -> dict:
    """Is the case complete? ``facts`` come from :func:`bench_file.summarize`.

    Returns ``{"reason": None | one of REASONS, "problem": one line | None, "output_check": skipped |
    per_request | aggregate, "short": int}``. The rules, in this order (the first that breaks decides):

    1. ``incomplete``: the client says the run did not finish (loadgen ``complete`` is not ``true``; a
       loadgen file without the flag cannot prove it finished; AIPerf ``was_cancelled``/``is_complete``).
    2. ``nonfinite``: a measured value is NaN or Infinity (``duration``, a throughput, a latency
       statistic or a per-request latency). A figure that is not a number is no measurement. An
       SGLang result with its complete summary is judged by that summary, not its per-request
       arrays (``bench_file.sglang_summary_complete``: SGLang computes the one from the other).
    3. ``count``: ``completed`` differs from ``expect_requests`` (skipped when None: a file without a
       plan); a file without a ``completed`` count fails.
    4. ``short_output``: with ``expect_output_len``, fewer than ``min_output_fraction`` of the completed
       requests reached it (per-request lengths when the file has them, else ``total_output_tokens >=
       fraction x completed x OSL``); with neither it fails closed, since it cannot prove the OSL.
    """
    out = {"reason": None, "problem": None, "output_check": "skipped", "short": 0}
    completed = facts.get("completed")
    failed = facts.get("failed")
    if facts.get("complete") is False:
        out["reason"] = "incomplete"
        out["problem"] = (
            f"run did not complete (complete=false: interrupted or truncated; completed {completed}, "
            f"failed {failed}; the file says complete={facts.get('complete_value')!r})"
        )
        return out
    bad = facts.get("nonfinite") or []
    if bad:
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        out["reason"] = "nonfinite"
        out["problem"] = (
            f"non-finite value (NaN or Infinity) in {', '.join(bad[:5])}{more} "
            "(rule: every measured value is a finite number)"
        )
        return out
    if expect_requests is None:
        return out
    if completed is None:
        out["reason"] = "count"
        out["problem"] = "no 'completed' count in the result"
        return out
    if completed != expect_requests:
        extra = f", failed {failed}" if failed is not None else ""
        if facts.get("errors_by_class"):
            extra += f", errors_by_class {json.dumps(facts['errors_by_class'], sort_keys=True)}"
        out["reason"] = "count"
        out["problem"] = (
            f"completed {completed} != expected {expect_requests} requests{extra} "
            "(rule: every request of the case must complete)"
        )
        return out
    if expect_output_len is None:
        return out
    return _judge_output(facts, out, completed, expect_output_len, min_output_fraction)


def _judge_output(facts: dict, out: dict, completed: int, osl: int, fraction: float) -> dict:
    lens = facts.get("output_lens")
    if lens is not None:
        out["output_check"] = "per_request"
        short = [n for n in lens if n < osl] if lens and min(lens) < osl else []
        out["short"] = len(short)
        reached = (len(lens) - len(short)) / len(lens) if lens else 0.0
        if not lens or reached < fraction:
            out["reason"] = "short_output"
            out["problem"] = (
                f"{len(short)} of {len(lens)} completed requests have fewer than {osl} "
                f"output tokens (min {min(lens) if lens else 0}; "
                f"rule: at least {fraction:g} of them reach the OSL)"
            )
        return out
    total = facts.get("total_output_tokens")
    if total is None:
        out["reason"] = "short_output"
        out["problem"] = (
            "cannot verify output lengths: no per-request output_lens and no total_output_tokens "
            "in the result"
        )
        return out
    out["output_check"] = "aggregate"
    need = fraction * completed * osl
    if total < need:
        out["reason"] = "short_output"
        out["problem"] = (
            f"total_output_tokens {total} < {need:g} = {fraction:g} x {completed} requests x OSL "
            f"{osl} (outputs stopped before the OSL; is ignore_eos off?)"
        )
    return out


def judge_overlap(main_start: float | None, main_end: float | None, sent: float | None) -> dict:
    """Did the injection land inside the background's main phase? All times are unix epoch seconds.

    Returns ``{"overlap": True | False | None, "where": inside | before | after | not_sent | unknown,
    "detail": one line}``. The rule: ``main_start <= sent < main_end``. A send at the very end of the
    main phase is no overlap (the background had no request left to disturb); ``main_end`` None means
    the phase has not ended yet (asked while it runs). No send (``sent`` None) is no overlap. A missing
    ``main_start`` with a known end leaves only the end to test against; with neither, the verdict is
    ``None`` ("not verifiable": the background's client wrote no phase timestamps).
    """
    if sent is None:
        return {"overlap": False, "where": "not_sent", "detail": "no injection was sent"}
    if main_start is None and main_end is None:
        return {
            "overlap": None,
            "where": "unknown",
            "detail": "overlap not verifiable (the background's result has no main-phase timestamps)",
        }
    if main_start is not None and sent < main_start:
        return {
            "overlap": False,
            "where": "before",
            "detail": f"injection sent {main_start - sent:.3f} s before the background's main phase began",
        }
    if main_end is not None and sent >= main_end:
        return {
            "overlap": False,
            "where": "after",
            "detail": f"injection sent {sent - main_end:.3f} s after the background's main phase ended",
        }
    into = f"{sent - main_start:.3f} s into" if main_start is not None else "inside"
    span = f" a {main_end - main_start:.3f} s" if main_start is not None and main_end is not None else " the"
    return {"overlap": True, "where": "inside", "detail": f"injection sent {into}{span} main phase"}
