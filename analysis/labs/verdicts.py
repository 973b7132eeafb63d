"""Each lab's verdict as a pure function of its figures: supported, not supported or inconclusive.

Why pure: a verdict is the claim a team will repeat, so each rule is written once, here, and
unit-tested on figures (tests/labs/test_labs_verdicts.py), including the cases that must come out
inconclusive rather than supported (a KV cache that never filled, a flush that was not proven,
an emulator that could not keep time, a run that failed).

Vocabulary: a comparison holds a baseline and a treatment variant that differ in one variable;
`expect` ("higher" or "lower") says which way the treatment's primary figure should move. A move
smaller than the margin (default 10%) is "no effect", and a claim whose effect is absent is
"not supported"; "inconclusive" is kept for evidence that is missing or cannot be trusted.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

SUPPORTED = "supported"
NOT_SUPPORTED = "not supported"
INCONCLUSIVE = "inconclusive"

DEFAULTS = {
    "margin": 0.1,  # relative change below which two figures count as equal
    "kv_full": 0.9,  # KV usage fraction that counts as "full"
    "prefix_min_cached": 2048,  # cached tokens the second identical request must report
    "ngram_min_accept": 1.5,  # accept length (bonus included) on the repetitive prompt
    "fp8_min_ratio": 1.3,  # FP8 / auto capacity that counts as "more tokens"
    "stall_ratio_min": 3.0,  # max gap during the injection vs the median gap before it
    "min_valid_reps": 2,  # injection repetitions that must have overlapped
}


@dataclass
class Verdict:
    verdict: str
    reason: str
    observations: list[str] = field(default_factory=list)
    comparisons: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def thresholds(given: dict[str, Any] | None) -> dict[str, Any]:
    return DEFAULTS | {k: v for k, v in (given or {}).items() if v is not None}


def direction(base: float | None, treat: float | None, margin: float) -> str | None:
    """ "higher" / "lower" / "same" (within ±margin of the baseline); None when a figure is missing."""
    if base is None or treat is None:
        return None
    if base == 0:
        return "same" if treat == 0 else "higher" if treat > 0 else "lower"
    r = treat / base
    if r >= 1 + margin:
        return "higher"
    if r <= 1 - margin:
        return "lower"
    return "same"


def _fmt(x: float | None, unit: str = "", nd: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{nd}f}{unit}"


def _ratio(base: float | None, treat: float | None) -> str:
    return f"{treat / base:.2f}x" if base and treat is not None else "n/a"


# Labs whose verdict rests on time (latency, gaps, throughput): an emulator that could not keep its
# schedule makes them inconclusive. kv_pressure (counters and KV usage) and fp8_kv (start-up capacity)
# rest on what the server counted, which a late emulator still counts right; there it is a pitfall.
TIMED_LABS = (
    "eager_vs_graph",
    "prefill_sweep",
    "decode_sweep",
    "prefix_cache",
    "chunk_interference",
    "token_budget",
    "ngram_spec",
)


def precheck(status: dict[str, dict[str, Any]], timed: bool = True) -> Verdict | None:
    """Evidence that cannot be trusted ends a lab as inconclusive before any figure is read.

    ``status``: variant -> {"failed": reason or None, "runs_failed": [run: reason], "realtime": ok|degraded|
    saturated|unknown|None, "realtime_reason": str}; ``timed``: the lab's verdict rests on time
    (TIMED_LABS): there a saturated or unknown emulator makes the lab inconclusive, never supported.
    """
    problems = []
    for name, st in status.items():
        if st.get("failed"):
            problems.append(f"variant {name} did not run: {st['failed']}")
        for run in st.get("runs_failed", []):
            problems.append(f"variant {name}: run {run}")
        if timed and st.get("realtime") == "saturated":
            problems.append(f"variant {name}: the emulator was saturated ({st.get('realtime_reason', '')})")
        if timed and st.get("realtime") == "unknown":
            # an emulated variant whose timing could not be checked proves nothing about time
            why = st.get("realtime_reason", "")
            problems.append(f"variant {name}: the emulator's realtime verdict is unknown ({why})")
    if problems:
        return Verdict(INCONCLUSIVE, "; ".join(problems))
    return None


def _compare(
    comps: list[dict[str, Any]], value: Any, margin: float, what: str, unit: str
) -> list[dict[str, Any]]:
    """Judge every comparison on one figure; ``value(variant)`` reads it."""
    out = []
    for c in comps:
        a, b = value(c["baseline"]), value(c["treatment"])
        d = direction(a, b, margin)
        expect = c.get("expect", "lower")
        if d is None:
            v, why = INCONCLUSIVE, f"{what} missing for {c['baseline'] if a is None else c['treatment']}"
        elif d == expect:
            v, why = (
                SUPPORTED,
                f"{what} {d} with {c['treatment']} ({_fmt(b, unit)}) than {c['baseline']} "
                f"({_fmt(a, unit)}), {_ratio(a, b)}",
            )
        else:
            v, why = (
                NOT_SUPPORTED,
                (
                    f"{what} {'within ±' + format(margin, '.0%') + ' of' if d == 'same' else d + ' than'} "
                    f"{c['baseline']} with {c['treatment']}: {_fmt(b, unit)} vs {_fmt(a, unit)} "
                    f"({_ratio(a, b)}); "
                    f"expected {expect}"
                ),
            )
        out.append(
            {
                "baseline": c["baseline"],
                "treatment": c["treatment"],
                "variable": c.get("variable"),
                "differs": c.get("differs"),
                "baseline_value": a,
                "treatment_value": b,
                "direction": d,
                "expect": expect,
                "verdict": v,
                "reason": why,
            }
        )
    return out


def _combine(
    comparisons: list[dict[str, Any]], extra: list[tuple[str, str]] | None = None
) -> tuple[str, str]:
    """All comparisons (and extra checks) supported -> supported; any inconclusive -> inconclusive;
    otherwise not supported, naming what failed."""
    items = [(c["verdict"], f"{c['baseline']} vs {c['treatment']}: {c['reason']}") for c in comparisons]
    items += extra or []
    if not items:
        return INCONCLUSIVE, "nothing to compare"
    bad = [why for v, why in items if v == INCONCLUSIVE]
    if bad:
        return INCONCLUSIVE, "; ".join(bad)
    bad = [why for v, why in items if v == NOT_SUPPORTED]
    if bad:
        return NOT_SUPPORTED, "; ".join(bad)
    return SUPPORTED, "; ".join(why for _, why in items)


# ---------------------------------------------------------------- labs


def _lowest_c(rows: dict[str, Any]) -> str | None:
    keyed = [(r.get("concurrency") or 0, k) for k, r in rows.items()]
    return min(keyed)[1] if keyed else None


def eager_vs_graph(
    fig: dict[str, Any], comps: list[dict[str, Any]], wl: dict[str, Any], th: dict[str, Any]
) -> Verdict:
    vs = fig["variants"]
    obs = []
    for name, rows in vs.items():
        parts = [
            f"C={r['concurrency']}: {_fmt(r['tpot_p50_ms'], ' ms')} / {_fmt(r['tpot_p99_ms'], ' ms')}"
            for r in sorted(rows.values(), key=lambda r: r.get("concurrency") or 0)
        ]
        obs.append(
            f"{name}: TPOT p50 / p99 (ISL {wl.get('isl')}, OSL {wl.get('osl')}, {wl.get('num_prompts')} "
            f"prompts per concurrency) " + "; ".join(parts)
        )
    key = _lowest_c(next(iter(vs.values()))) if vs else None
    c = next(iter(vs.values()))[key]["concurrency"] if key else None
    cmp = _compare(
        comps,
        lambda n: (vs.get(n, {}).get(key) or {}).get("tpot_p50_ms"),
        th["margin"],
        f"TPOT p50 at C={c}",
        " ms",
    )
    verdict, reason = _combine(cmp)
    return Verdict(verdict, reason, obs, cmp)


def decode_sweep(
    fig: dict[str, Any], comps: list[dict[str, Any]], wl: dict[str, Any], th: dict[str, Any]
) -> Verdict:
    ((name, rows),) = fig["variants"].items()
    ordered = sorted(rows.values(), key=lambda r: r.get("concurrency") or 0)
    obs = [
        f"{name}, ISL {wl.get('isl')} / OSL {wl.get('osl')}, {wl.get('num_prompts')} prompts: "
        + "; ".join(
            f"C={r['concurrency']}: TPOT p50 {_fmt(r['tpot_p50_ms'], ' ms')}, ITL p99 "
            f"{_fmt(r['itl_p99_ms'], ' ms')}, {_fmt(r['output_tok_s'], ' tok/s', 0)}"
            for r in ordered
        )
    ]
    tps = [r["output_tok_s"] for r in ordered]
    tpots = [r["tpot_p50_ms"] for r in ordered]
    cs = [r["concurrency"] for r in ordered]
    if len(ordered) < 2 or None in tps or None in tpots:
        return Verdict(INCONCLUSIVE, "fewer than two concurrencies with throughput and TPOT", obs)
    rising = all(direction(a, b, th["margin"]) == "higher" for a, b in itertools.pairwise(tps))
    tpot_growth = tpots[-1] / tpots[0] if tpots[0] else None
    sub_linear = tpot_growth is not None and tpot_growth < cs[-1] / cs[0]
    why = (
        f"output tok/s {' -> '.join(_fmt(t, '', 0) for t in tps)} over C={cs}; TPOT p50 grew "
        f"{_fmt(tpot_growth, 'x')} while concurrency grew {cs[-1] / cs[0]:.0f}x"
    )
    if rising and sub_linear:
        return Verdict(SUPPORTED, "batching raises decode throughput: " + why, obs)
    return Verdict(
        NOT_SUPPORTED,
        "throughput did not rise with every concurrency step, or TPOT grew as fast as concurrency: " + why,
        obs,
    )


def prefill_sweep(
    fig: dict[str, Any], comps: list[dict[str, Any]], wl: dict[str, Any], th: dict[str, Any]
) -> Verdict:
    ((name, rows),) = fig["variants"].items()
    ordered = sorted(rows.values(), key=lambda r: r.get("isl") or 0)
    obs = [
        f"{name}, C={wl.get('concurrency')}, OSL {wl.get('osl')}, {wl.get('num_prompts')} unique prompts "
        "per ISL: "
        + "; ".join(
            f"ISL {r['isl']}: TTFT p50 {_fmt(r['ttft_p50_ms'], ' ms')}, prefill "
            f"{_fmt(r['prefill_tok_s_p50'], ' tok/s', 0)} (p50)"
            for r in ordered
        )
    ]
    cached = [r["isl"] for r in ordered if (r.get("max_cached_tokens") or 0) > 0]
    if cached:
        return Verdict(
            INCONCLUSIVE, f"prompts of ISL {cached} reported cached tokens: the sweep was not cold", obs
        )
    ttft = [r["ttft_p50_ms"] for r in ordered]
    if len(ordered) < 2 or None in ttft:
        return Verdict(INCONCLUSIVE, "fewer than two prompt lengths with a TTFT", obs)
    rising = all(direction(a, b, th["margin"]) == "higher" for a, b in itertools.pairwise(ttft))
    why = "TTFT p50 " + " -> ".join(_fmt(t, " ms") for t in ttft) + f" for ISL {[r['isl'] for r in ordered]}"
    if rising:
        return Verdict(SUPPORTED, "prefill time grows with the prompt: " + why, obs)
    return Verdict(NOT_SUPPORTED, "TTFT did not rise with every ISL step: " + why, obs)


def prefix_cache(
    fig: dict[str, Any], comps: list[dict[str, Any]], wl: dict[str, Any], th: dict[str, Any]
) -> Verdict:
    vs = fig["variants"]
    min_cached = th.get("prefix_min_cached", 2048)
    obs = []
    for name, row in vs.items():
        f, s, chat = row.get("identical_first", {}), row.get("identical_second", {}), row.get("chat", {})
        obs.append(
            f"{name}: two identical {wl.get('identical_len')}-token requests after a flush: cached "
            f"{f.get('cached_tokens')} -> {s.get('cached_tokens')} tokens, TTFT "
            f"{_fmt(f.get('ttft_ms'), ' ms')} -> "
            f"{_fmt(s.get('ttft_ms'), ' ms')}; chat ({wl.get('chat_system_len')}-token system prompt, "
            f"{chat.get('n')} measured after 1 warm): TTFT p50/p95/p99 {_fmt(chat.get('ttft_p50_ms'))}/"
            f"{_fmt(chat.get('ttft_p95_ms'))}/{_fmt(chat.get('ttft_p99_ms'))} ms, cached median "
            f"{chat.get('cached_tokens_median')}, counters {fig['counters']['hits']} "
            f"+{chat.get('hit_delta')} / "
            f"{fig['counters']['queries']} +{chat.get('query_delta')}"
        )
    extra: list[tuple[str, str]] = []
    for name, row in vs.items():
        f = row.get("identical_first", {})
        flush = f.get("flush") or {}
        if not flush.get("endpoint_ok"):
            extra.append(
                (
                    INCONCLUSIVE,
                    f"{name}: the flush before the first request was not confirmed by the endpoint",
                )
            )
        elif (f.get("cached_tokens") or 0) > 0 or (f.get("hit_delta") or 0) > 0:
            extra.append(
                (
                    INCONCLUSIVE,
                    f"{name}: the first request after the flush reported cached tokens "
                    f"({f.get('cached_tokens')}, hit counter +{f.get('hit_delta')}): the flush did not "
                    "empty the cache",
                )
            )
        if f.get("cached_tokens") is None:
            extra.append(
                (
                    INCONCLUSIVE,
                    f"{name}: the server reported no cached_tokens (vLLM needs "
                    "--enable-prompt-tokens-details)",
                )
            )
    cmp = _compare(
        comps,
        lambda n: (vs.get(n, {}).get("identical_second") or {}).get("cached_tokens"),
        th["margin"],
        "cached tokens of the second identical request",
        "",
    )
    for c in comps:
        on = vs.get(c["baseline"], {})
        f, s = on.get("identical_first", {}), on.get("identical_second", {})
        got = s.get("cached_tokens")
        if got is not None and got < min_cached:
            extra.append(
                (
                    NOT_SUPPORTED,
                    f"{c['baseline']}: the second identical request reported {got} cached tokens "
                    f"(< {min_cached})",
                )
            )
        elif got is not None:
            d = direction(f.get("ttft_ms"), s.get("ttft_ms"), th["margin"])
            if d == "lower":
                extra.append(
                    (
                        SUPPORTED,
                        f"{c['baseline']}: {got} cached tokens and TTFT "
                        f"{_fmt(f.get('ttft_ms'), ' ms')} -> {_fmt(s.get('ttft_ms'), ' ms')}",
                    )
                )
            else:
                extra.append(
                    (
                        NOT_SUPPORTED,
                        f"{c['baseline']}: {got} cached tokens but TTFT did not drop "
                        f"({_fmt(f.get('ttft_ms'), ' ms')} -> {_fmt(s.get('ttft_ms'), ' ms')})",
                    )
                )
    verdict, reason = _combine(cmp, extra)
    return Verdict(verdict, reason, obs, cmp)


def chunk_interference(
    fig: dict[str, Any], comps: list[dict[str, Any]], wl: dict[str, Any], th: dict[str, Any]
) -> Verdict:
    vs = fig["variants"]
    obs = [
        f"{name}: max gap during the injection {_fmt(r['max_gap_during_ms_median'], ' ms')} (median of "
        f"{r['valid_reps']} reps) vs median gap before {_fmt(r['median_gap_before_ms'], ' ms')} "
        f"(stall {_fmt(r['stall_ratio'], 'x')}); injection E2E {_fmt(r['injection_e2e_ms_median'], ' ms')} "
        f"({wl.get('inject_isl')}-token prompt after event {wl.get('inject_after_events')} of a "
        f"{wl.get('stream_osl')}-token stream)"
        for name, r in vs.items()
    ]
    extra = []
    for name, r in vs.items():
        if r["valid_reps"] < th["min_valid_reps"]:
            why = "; ".join(x["why"] for x in r["reps"].values() if not x["valid"])
            extra.append(
                (
                    INCONCLUSIVE,
                    f"{name}: {r['valid_reps']} repetition(s) overlapped (need "
                    f"{th['min_valid_reps']}): {why}",
                )
            )
    base = {c["baseline"] for c in comps} - {c["treatment"] for c in comps}
    for name in sorted(base):
        r = vs.get(name, {})
        ratio = r.get("stall_ratio")
        if ratio is not None and ratio < th["stall_ratio_min"]:
            extra.append(
                (
                    NOT_SUPPORTED,
                    f"{name}: the injection stalled the stream only {ratio:.1f}x its median gap "
                    f"(< {th['stall_ratio_min']:g}x)",
                )
            )
        elif ratio is not None:
            extra.append((SUPPORTED, f"{name}: the injection stalled the stream {ratio:.1f}x its median gap"))
    cmp = _compare(
        comps,
        lambda n: vs.get(n, {}).get("max_gap_during_ms_median"),
        th["margin"],
        "max gap during the injection",
        " ms",
    )
    verdict, reason = _combine(cmp, extra)
    return Verdict(verdict, reason, obs, cmp)


def chunk_conclusion(
    fig: dict[str, Any], comps: list[dict[str, Any]], engine: str, margin: float
) -> str | None:
    """What chunk_interference's comparisons showed, in words, from the figures only.

    Why: the verdict's reason lists each comparison; a reader wants the mechanism's story, e.g. "prefill
    chunk size (chunk512) made the stall longer 25.75→57.86 ms (2.25x); mixed chunk (chunk512_mixed)
    cut it 12.6x (57.86→4.58 ms)". When smaller chunks alone did not shorten the stall on SGLang and
    mixed chunk did, it says why (SGLang without --enable-mixed-chunk runs a long prompt's chunks back
    to back). None when no comparison has both figures.
    """
    vs = fig.get("variants") or {}
    parts = []
    moved: dict[str, str] = {}
    for c in comps:
        a = (vs.get(c["baseline"]) or {}).get("max_gap_during_ms_median")
        b = (vs.get(c["treatment"]) or {}).get("max_gap_during_ms_median")
        d = direction(a, b, margin)
        if d is None:
            continue
        what = f"{c.get('variable') or 'the change'} ({c['treatment']} vs {c['baseline']})"
        it = "it" if parts else "the stall"
        moved[c.get("variable") or ""] = d
        if d == "higher":
            parts.append(f"{what} made {it} longer {a:.2f}→{b:.2f} ms ({b / a:.2f}x)")
        elif d == "lower" and b:
            parts.append(f"{what} cut {it} {a / b:.1f}x ({a:.2f}→{b:.2f} ms)")
        elif d == "lower":
            parts.append(f"{what} removed {it} ({a:.2f}→{b:.2f} ms)")
        else:
            parts.append(f"{what} left {it} within ±{margin:.0%} ({a:.2f}→{b:.2f} ms)")
    if not parts:
        return None
    said = "; ".join(parts)
    chunk_alone = moved.get("prefill chunk size")
    if engine == "sglang" and chunk_alone in ("higher", "same") and moved.get("mixed chunk") == "lower":
        said += (
            ". Smaller chunks alone did not bound the stall and mixed chunk did: SGLang without "
            "--enable-mixed-chunk runs a long prompt's chunks back to back, the stream's decode waiting "
            "behind all of them"
        )
    return said


def token_budget(
    fig: dict[str, Any], comps: list[dict[str, Any]], wl: dict[str, Any], th: dict[str, Any]
) -> Verdict:
    vs = fig["variants"]
    obs = [
        f"{name}: short requests TPOT p99 {_fmt(r['short_tpot_p99_ms'], ' ms')}, largest gap "
        f"{_fmt(r['short_max_gap_ms_median'], ' ms')} (median over {r['reps']} reps), TTFT p99 "
        f"{_fmt(r['short_ttft_p99_ms'], ' ms')}; long request E2E {_fmt(r['long_e2e_ms_median'], ' ms')} "
        "(median) "
        f"({wl.get('short_count')} x {wl.get('short_isl')}/{wl.get('short_osl')} + 1 x {wl.get('long_isl')}/"
        f"{wl.get('long_osl')}, sent together)"
        for name, r in vs.items()
    ]
    # Sent together, the long prompt's prefill lands in the short requests' TTFT when one step takes it
    # whole, and in their inter-token gaps when it is cut into chunks beside their decode: the budget
    # moves the stall. The claim judged: a smaller budget stops short requests waiting behind it.
    cmp = _compare(
        comps,
        lambda n: vs.get(n, {}).get("short_ttft_p99_ms"),
        th["margin"],
        "TTFT p99 of the short requests",
        " ms",
    )
    verdict, reason = _combine(cmp)
    return Verdict(verdict, reason, obs, cmp)


def kv_pressure(
    fig: dict[str, Any], comps: list[dict[str, Any]], wl: dict[str, Any], th: dict[str, Any]
) -> Verdict:
    vs = fig["variants"]
    obs, extra = [], []
    for name, v in vs.items():
        cap = (v.get("capacity") or {}).get("tokens")
        for rname, r in v["runs"].items():
            obs.append(
                f"{name}/{rname} ({r['expected']} requests, KV {cap} tokens): preempted/retracted "
                f"{r['preemptions']}, max KV usage {_fmt(r['max_kv_usage'])}, max running/waiting "
                f"{r['max_running']}/{r['max_waiting']}, server queue time mean "
                f"{_fmt(r['server_queue_time_mean_ms'], ' ms')}"
            )
        proofs = v["kv_full_proofs"]
        moved = [(rn, r["preemptions"]) for rn, r in v["runs"].items() if (r["preemptions"] or 0) > 0]
        unknown = [rn for rn, r in v["runs"].items() if r["preemptions"] is None]
        incomplete = [rn for rn, r in v["runs"].items() if r["n"] != r["expected"]]
        if incomplete:
            extra.append((INCONCLUSIVE, f"{name}: runs {incomplete} did not complete every request"))
        if moved and proofs:
            extra.append(
                (
                    SUPPORTED,
                    f"{name}: {', '.join(f'{rn} +{n:g}' for rn, n in moved)} preemptions/"
                    f"retractions with the KV proven full ({proofs[0]})",
                )
            )
        elif moved:
            extra.append(
                (
                    INCONCLUSIVE,
                    f"{name}: counters moved ({moved}) but no sample or log line proves the KV was full",
                )
            )
        elif unknown:
            extra.append(
                (INCONCLUSIVE, f"{name}: no preemption/retraction counter in the metrics of {unknown}")
            )
        elif proofs:
            extra.append((NOT_SUPPORTED, f"{name}: the KV was full ({proofs[0]}) and nothing was preempted"))
        else:
            extra.append(
                (
                    INCONCLUSIVE,
                    f"{name}: nothing was preempted, but nothing proves the KV was ever full "
                    f"(max sampled usage {[r['max_kv_usage'] for r in v['runs'].values()]}, threshold "
                    f"{fig.get('full_threshold')}): no 'no preemption' verdict without a full KV",
                )
            )
    verdict, reason = _combine([], extra)
    return Verdict(verdict, reason, obs)


def fp8_kv(
    fig: dict[str, Any], comps: list[dict[str, Any]], wl: dict[str, Any], th: dict[str, Any]
) -> Verdict:
    vs = fig["variants"]
    obs = [
        f"{name} (--kv-cache-dtype {v['kv_dtype_flag']}): {((v.get('capacity') or {}).get('tokens'))} KV "
        "tokens, "
        f"from {((v.get('capacity') or {}).get('line'))!r}"
        for name, v in vs.items()
    ]
    extra = []
    for name, v in vs.items():
        if v.get("capacity") is None:
            extra.append((INCONCLUSIVE, f"{name}: no KV capacity line in its start-up log"))
        if v.get("capacity_capped_by_flag"):
            extra.append(
                (
                    INCONCLUSIVE,
                    f"{name}: capacity capped by a flag (--max-total-tokens or "
                    "--num-gpu-blocks-override): it does not follow the dtype",
                )
            )
    cmp = _compare(
        comps,
        lambda n: ((vs.get(n) or {}).get("capacity") or {}).get("tokens"),
        th["margin"],
        "KV capacity",
        " tokens",
    )
    for c in cmp:
        if c["verdict"] == SUPPORTED and c["baseline_value"]:
            ratio = c["treatment_value"] / c["baseline_value"]
            obs.append(
                f"capacity ratio {c['treatment']}/{c['baseline']} = {ratio:.3f} (measured from the logs)"
            )
            if ratio < th["fp8_min_ratio"]:
                c["verdict"], c["reason"] = NOT_SUPPORTED, f"{c['reason']}; below {th['fp8_min_ratio']}x"
    verdict, reason = _combine(cmp, extra)
    return Verdict(verdict, reason, obs, cmp)


def ngram_spec(
    fig: dict[str, Any], comps: list[dict[str, Any]], wl: dict[str, Any], th: dict[str, Any]
) -> Verdict:
    vs = fig["variants"]
    obs = []
    for name, v in vs.items():
        parts = []
        for kind, p in v["prompts"].items():
            acc = p.get("acceptance") or {}
            parts.append(
                f"{kind}: E2E p50 {_fmt(p['e2e_p50_ms'], ' ms')} over {p['ok']} samples, accept length "
                f"{_fmt(acc.get('accept_length'))} (bonus token included), accept rate "
                f"{_fmt(acc.get('accept_rate'))}"
            )
        tp = v.get("throughput_output_tok_s")
        obs.append(
            f"{name} (greedy, {wl.get('osl')} forced tokens): "
            + "; ".join(parts)
            + (f"; throughput run {_fmt(tp, ' tok/s', 0)}" if tp is not None else "")
        )
    extra = []
    for name, v in vs.items():
        for kind, p in v["prompts"].items():
            if p["flushes_proven"] < p["samples"]:
                extra.append(
                    (
                        INCONCLUSIVE,
                        f"{name}/{kind}: {p['samples'] - p['flushes_proven']} sample(s) whose flush was not "
                        "proven by the endpoint's answer and the server's cache counters",
                    )
                )
    for c in comps:
        spec = vs.get(c["treatment"], {}).get("prompts", {})
        rep = (spec.get("repetitive", {}).get("acceptance") or {}).get("accept_length")
        prose = (spec.get("prose", {}).get("acceptance") or {}).get("accept_length")
        if rep is None or prose is None:
            extra.append(
                (
                    INCONCLUSIVE,
                    f"{c['treatment']}: the server reported no acceptance (spec_* fields or "
                    "spec_decode counters)",
                )
            )
        elif rep <= th["ngram_min_accept"] or rep <= prose:
            extra.append(
                (
                    NOT_SUPPORTED,
                    f"{c['treatment']}: accept length {rep:.2f} on the repetitive prompt vs "
                    f"{prose:.2f} on prose (needs > {th['ngram_min_accept']} and above prose)",
                )
            )
        else:
            extra.append(
                (
                    SUPPORTED,
                    f"{c['treatment']}: accept length {rep:.2f} on the repetitive prompt vs {prose:.2f} "
                    "on prose (bonus token included)",
                )
            )
    cmp = _compare(
        comps,
        lambda n: vs.get(n, {}).get("prompts", {}).get("repetitive", {}).get("e2e_p50_ms"),
        th["margin"],
        "E2E p50 on the repetitive prompt",
        " ms",
    )
    verdict, reason = _combine(cmp, extra)
    return Verdict(verdict, reason, obs, cmp)


JUDGES = {
    "eager_vs_graph": eager_vs_graph,
    "prefill_sweep": prefill_sweep,
    "decode_sweep": decode_sweep,
    "prefix_cache": prefix_cache,
    "chunk_interference": chunk_interference,
    "token_budget": token_budget,
    "kv_pressure": kv_pressure,
    "fp8_kv": fp8_kv,
    "ngram_spec": ngram_spec,
}


def judge(
    lab: str,
    fig: dict[str, Any],
    comps: list[dict[str, Any]],
    wl: dict[str, Any],
    th: dict[str, Any] | None = None,
) -> Verdict:
    return JUDGES[lab](fig, comps, wl, thresholds(th))
