"""Judge one lab directory: figures, evidence, verdict and pitfalls into lab.json, then the report.

Why one step after every variant stopped: the server logs are complete only then (docker logs are
saved at stop), and the verdict must see every variant at once. The verdict is the pure function in
verdicts.py; this module only gathers its inputs and words the caveats the run's own evidence shows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from analysis.atomic import write_json
from analysis.evidence import events, startup
from analysis.labs import advanced, figures, realtime, verdicts
from analysis.labs.load import Variant, read_lab, read_plan

LAB_SCHEMA = "quickmap.labs.lab/1"
# Labs with a picture (analysis/labs/plots.py); the others' judgement never imports matplotlib.
PLOTTED = (
    "eager_vs_graph",
    "decode_sweep",
    "token_budget",
    "chunk_interference",
    "kv_pressure",
    "prefill_sweep",
)


def _status(variants: dict[str, Variant]) -> dict[str, dict[str, Any]]:
    out = {}
    for name, v in variants.items():
        failed = (v.failed or {}).get("reason") if v.failed else None
        if failed is None and isinstance(v.alive, dict) and v.alive.get("running") is False:
            failed = (
                f"its server ({v.alive}) was not running when the evidence was taken: whatever answered "
                "on the port was not this variant's server"
            )
        if failed is None and v.runs and not v.server_cmd:
            failed = "no saved server command: the variant never started"
        runs_failed = (
            []
            if failed
            else [f"{r.name} {r.status}: {r.reason or 'no result'}" for r in v.runs.values() if not r.ok]
        )
        out[name] = {
            "failed": failed,
            "runs_failed": runs_failed,
            "realtime": v.realtime,
            "realtime_reason": v.realtime_reason,
        }
    return out


def _pitfalls(
    lab: str, engine: str, variants: dict[str, Variant], fig: dict[str, Any], wl: dict[str, Any]
) -> list[str]:
    """Caveats read from this run's evidence (each names what showed it)."""
    out = []
    wanted_events = wl.get("inject_after_events")
    for name, v in variants.items():
        if v.emulated:
            out.append(
                f"{name}: emulated by enginesim (hardware profile {v.emulator.get('hardware', '?')}, time "
                "scale "
                f"{v.time_scale:g}; figures de-scaled to the emulated hardware). Realtime verdict "
                f"{v.realtime}: {v.realtime_reason}. The lab shows that the mechanism and its evidence "
                "path work, "
                "not what a GPU does."
            )
        elif v.realtime is None and not v.failed:
            pass
        reads = realtime.reads_pitfall(name, v.realtime_detail)
        if reads:
            out.append(reads)
        unchecked = [g.get("host", "?") for g in v.gpu_idle if g.get("checked") is False]
        busy = [g.get("host", "?") for g in v.gpu_idle if g.get("gpus_idle") is False]
        if busy:
            out.append(f"{name}: GPU compute processes were listed before it started on {busy}")
        if unchecked:
            out.append(f"{name}: GPU idleness before start not proven on {unchecked} (no nvidia-smi there)")
        if not v.gpu_idle and not v.failed:
            out.append(f"{name}: no GPU idleness record")
        unreliable = [r.name for r in v.runs.values() if r.result and r.result.get("reliable") is False]
        if unreliable:
            out.append(f"{name}: loadgen marked runs {unreliable} unreliable (its own timing lagged)")
        for r in v.runs.values():
            if not r.ok:
                out.append(f"{name}/{r.name}: {r.status}: {r.reason or 'no result file'}")
        if v.failed:
            out.append(f"{name}: did not run: {v.failed.get('reason')}")
    if lab == "chunk_interference":
        for name, r in fig["variants"].items():
            off = [k for k in r["events_before_injection"] if k is not None and k != wanted_events]
            if off:
                out.append(
                    f"{name}: the injection went out after event(s) {off} of the stream, not "
                    f"{wanted_events} (the client's send timing on this host); each rep is judged "
                    "on its own events"
                )
            if r.get("median_gap_before_ms") == 0:
                out.append(
                    f"{name}: the median client-visible gap before the injection is 0 ms (events arrived "
                    "coalesced); the stall ratio uses the mean gap instead"
                )
    if lab == "kv_pressure":
        for name, v in fig["variants"].items():
            for rn, r in v["runs"].items():
                if r["samples"] < 3:
                    out.append(f"{name}/{rn}: only {r['samples']} metrics samples during the run")
            if engine == "sglang":
                out.append(
                    f"{name}: SGLang updates its gauges at log points (each prefill batch, every "
                    "--decode-log-interval decode steps), so sampled usage can miss the peak"
                )
    if lab == "ngram_spec":
        out.append(
            "accept length counts the bonus token (the token every verify step yields anyway): 1.0 means "
            "no draft accepted"
        )
    if lab == "fp8_kv":
        for name, v in fig["variants"].items():
            for note in v.get("fp8_platform_notes", []):
                out.append(f"{name}: platform note from its log: {note!r}")
    if lab == "prefix_cache":
        out += prefix_chat_pitfalls(fig)
        for name, v in fig["variants"].items():
            chat = v.get("chat") or {}
            if (chat.get("warm_cached_tokens") or 0) > 0:
                out.append(
                    f"{name}: the chat warm-up request already hit the cache ({chat['warm_cached_tokens']} "
                    "tokens) after its flush"
                )
    return out


def sweep_flip_pitfalls(fig: dict[str, Any], comps: list[dict[str, Any]], margin: float) -> list[str]:
    """eager_vs_graph: the concurrencies the verdict does not read whose TPOT p50 moved against it.

    Why: the verdict reads the lowest concurrency only, but the observation prints every one; a
    concurrency where the treatment went the other way must not pass unremarked (on a loaded box the
    emulator's lag can be as long as a whole short run at high concurrency).
    """
    vs = fig["variants"]
    out = []
    for c in comps:
        base, treat = vs.get(c["baseline"]) or {}, vs.get(c["treatment"]) or {}
        keyed = sorted((r.get("concurrency") or 0, k) for k, r in base.items())
        for conc, key in keyed[1:]:
            a = (base.get(key) or {}).get("tpot_p50_ms")
            b = (treat.get(key) or {}).get("tpot_p50_ms")
            d = verdicts.direction(a, b, margin)
            if d is not None and d != c.get("expect", "lower"):
                how = f"within ±{margin:.0%} of" if d == "same" else f"{d} than"
                out.append(
                    f"at C={conc} the TPOT p50 of {c['treatment']} ({b:.2f} ms) is {how} "
                    f"{c['baseline']}'s ({a:.2f} ms), not {c.get('expect', 'lower')} as expected; "
                    "the verdict reads the lowest concurrency only: check the realtime verdicts above "
                    "before reading this concurrency"
                )
    return out


def prefix_chat_pitfalls(fig: dict[str, Any]) -> list[str]:
    """The chat shape's TTFT against its server-reported cached tokens.

    Why: the chat figures are printed but not judged; when a variant that reused its system prompt is
    not faster than one that did not, the prefill it saved is smaller than the run's timing noise, and
    a reader must not take either TTFT as the cache's effect. The noise shown is what the run itself
    measured: the first identical request does the same work on every variant.
    """
    vs = fig["variants"]
    out = []
    for hit_name, hit in vs.items():
        hc = hit.get("chat") or {}
        if not hc.get("cached_tokens_median") or hc.get("ttft_p50_ms") is None:
            continue
        for miss_name, miss in vs.items():
            mc = miss.get("chat") or {}
            if miss_name == hit_name or mc.get("cached_tokens_median") != 0 or mc.get("ttft_p50_ms") is None:
                continue
            if hc["ttft_p50_ms"] < mc["ttft_p50_ms"]:
                continue
            firsts = [(r.get("identical_first") or {}).get("ttft_ms") for r in (hit, miss)]
            same_work = (
                f"; the first identical request (the same work on both) took {firsts[0]:.2f} vs "
                f"{firsts[1]:.2f} ms"
                if None not in firsts
                else ""
            )
            out.append(
                f"{hit_name}: the chat TTFT p50 ({hc['ttft_p50_ms']:.2f} ms, {hc['cached_tokens_median']:g} "
                f"cached tokens per request) is not lower than {miss_name}'s ({mc['ttft_p50_ms']:.2f} ms, "
                f"nothing cached): the prefill saved is below this run's timing noise{same_work}; do not "
                "read either chat TTFT as the cache's effect"
            )
    return out


def _setup(plan: dict[str, Any], variants: dict[str, Variant]) -> dict[str, Any]:
    base = None
    rows = []
    for spec in plan["variants"]:
        v = variants[spec["name"]]
        cap = startup.capacity(v.server_log, plan["engine"])
        rows.append(
            {
                "name": v.name,
                "flags": spec["variant_args"],
                "engine_settings": spec.get("engine_vars", {}),
                "server_cmd": f"{v.name}/server/",
                "engine_version": v.version,
                "emulated": v.emulated,
                "time_scale": v.time_scale if v.emulated else None,
                "realtime": v.realtime,
                "realtime_reason": v.realtime_reason,
                "kv_capacity_tokens": cap.tokens if cap else None,
                "gpu_idle_before_start": v.gpu_idle,
                "gpus": v.gpus or None,
            }
        )
        base = base or v
    emulated = any(v.emulated for v in variants.values())
    hw = None
    if emulated:
        e = next(v.emulator for v in variants.values() if v.emulator)
        hw = f"emulated (enginesim, hardware profile {e.get('hardware', '?')})"
    else:
        hw = next((v.gpus for v in variants.values() if v.gpus), None) or "real (GPU names not recorded)"
    return {
        "model": plan["client"].get("model"),
        "engine": plan["engine"],
        "engine_version": next((v.version for v in variants.values() if v.version), None),
        "hardware": hw,
        "emulated": emulated,
        "common_flags": plan.get("common_args", []),
        "variants": rows,
        "comparisons": [
            {k: c[k] for k in ("baseline", "treatment", "variable", "differs", "expect")}
            for c in plan["comparisons"]
        ],
        "workload": plan["workload"],
        "client": {k: plan["client"].get(k) for k in ("backend", "base_url", "model", "tokenizer")},
        "proxies": (
            "bypassed: loadgen opens raw sockets (no proxy support at all); "
            "the lab's curl calls use --noproxy '*'"
        ),
    }


def _started_at(lab_dir: Path, plan: dict[str, Any], given: float | None) -> float | None:
    """When the lab started: as the role says, else as an earlier judgement recorded, else its plan."""
    if given is not None:
        return given
    old = lab_dir / "lab.json"
    if old.is_file():
        try:
            prev = orjson.loads(old.read_bytes()).get("started_at_epoch_s")
        except orjson.JSONDecodeError:
            prev = None
        if isinstance(prev, int | float):
            return float(prev)
    return plan.get("planned_at_epoch_s")


def _wall_s(lab_dir: Path, start: float | None) -> float | None:
    """Seconds from the lab's start to the last file a variant wrote (its server log at stop): the lab's
    wall time without this judgement, the same however often the lab is judged again."""
    if not start:
        return None
    last = max(
        (
            p.stat().st_mtime
            for p in lab_dir.rglob("*")
            if p.is_file() and p.name != "lab.json" and "plots" not in p.parts
        ),
        default=None,
    )
    return round(last - start, 1) if last else None


def judge(lab_dir: str | Path, started_at: float | None = None) -> dict[str, Any]:
    """Write LAB_DIR/lab.json (and its plots) and return it."""
    lab_dir = Path(lab_dir)
    started_at = _started_at(lab_dir, read_plan(lab_dir), started_at)
    plan, variants = read_lab(lab_dir)
    lab, engine = plan["lab"], plan["engine"]
    th = verdicts.thresholds(plan.get("thresholds"))
    adv = advanced.LABS.get(lab)
    if adv is not None:
        fig = adv.figures(lab_dir, plan, variants, engine)
        decide = adv.judge
    else:
        fig = figures.compute(lab, engine, variants, th)

        def decide(f: dict[str, Any], c: list[dict[str, Any]], w: dict[str, Any], t: dict[str, Any]):
            return verdicts.judge(lab, f, c, w, t)

    timed = lab in verdicts.TIMED_LABS or (adv is not None and adv.timed)
    pre = verdicts.precheck(_status(variants), timed=timed)
    result = pre or decide(fig, plan["comparisons"], plan["workload"], th)
    if pre is not None:
        # Figures that could still be computed are reported, but the verdict stays inconclusive.
        try:
            result.observations = decide(fig, plan["comparisons"], plan["workload"], th).observations
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            result.observations = []
    emulated = any(v.emulated for v in variants.values())
    tag = "emulated: " if emulated else ""
    evidence = {
        name: {
            "capacity": (c.as_dict() if (c := startup.capacity(v.server_log, engine)) else None),
            "log_events": events.scan(v.server_log).as_dict(),
            "emulator": v.emulator,
            "realtime": v.realtime,
            "realtime_runs": v.realtime_detail,
            "runs": {
                r.name: {
                    "status": r.status,
                    "reason": r.reason,
                    "flush": figures.flush_proof(r),
                    "reliable": (r.result or {}).get("reliable"),
                }
                for r in v.runs.values()
            },
        }
        for name, v in variants.items()
    }
    pitfalls = _pitfalls(lab, engine, variants, fig, plan["workload"])
    if lab == "eager_vs_graph":
        pitfalls += sweep_flip_pitfalls(fig, plan["comparisons"], th["margin"])
    if adv is not None:
        pitfalls += adv.pitfalls(fig, plan["workload"])
    doc = {
        "schema": LAB_SCHEMA,
        "lab": lab,
        "engine": engine,
        "goal": plan["goal"],
        "verdict": result.verdict,
        "reason": tag + result.reason,
        "emulated": emulated,
        "realtime": realtime.lab_verdict({n: (v.realtime, v.realtime_detail) for n, v in variants.items()}),
        "observations": [(o + " (emulated)") if emulated else o for o in result.observations],
        "comparisons": result.comparisons,
        "conclusion": (
            verdicts.chunk_conclusion(fig, plan["comparisons"], engine, th["margin"])
            if lab == "chunk_interference"
            else None
        ),
        "setup": _setup(plan, variants),
        "figures": fig,
        "evidence": evidence,
        "pitfalls": pitfalls,
        "thresholds": th,
        "started_at_epoch_s": started_at,
        "wall_s": _wall_s(lab_dir, started_at),
    }
    doc["plots"] = []
    if lab in PLOTTED:
        from analysis.labs import plots  # matplotlib loads only for a lab that draws

        doc["plots"] = plots.draw(lab_dir, doc)
    write_json(lab_dir / "lab.json", doc)
    return doc
