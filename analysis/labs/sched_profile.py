"""sched_profile: where the scheduler process's CPU goes as load grows (py-spy), and whether the
scheduler's CPU work overlaps the forward pass (the engine's profiler trace).

Why these sources: py-spy samples the real process the tree walk chose (`scheduler_process.json`,
written by the `process_tree` module from the server's recorded PID), so its share is measured, not
modelled, also on enginesim; the overlap needs both CPU and GPU timelines, which only the engine's own
profiler has. What a variant leaves: `scheduler_process.json`; per load run `pyspy.json` (py-spy's
exit codes and its error text), `flame.svg`, `profile.txt` (raw); the trace run's `trace/*.json*`.
A variant without a chosen process, a py-spy that could not attach, or a profile without samples
makes the lab inconclusive with that reason; nothing is estimated in their place. The one exception:
py-spy leaves out the samples in which the process waits, so an idle scheduler (enginesim's at 2 req/s
is on the CPU for a few ms in seconds) gives an empty profile. The run script reads the process's own
CPU time around the window (/proc/<pid>/stat); an empty profile whose process used less CPU than
IDLE_SAMPLES samples' worth in py-spy's window is a reading (busy 0), one that used more is a
failed py-spy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from analysis.errors import InputError
from analysis.evidence import trace
from analysis.labs import sched_profile_pyspy, sched_profile_trace
from analysis.labs.figures import run_stats
from analysis.labs.load import Variant
from analysis.labs.sched_profile_plan import LOADS
from analysis.labs.verdicts import INCONCLUSIVE, NOT_SUPPORTED, SUPPORTED, Verdict


def _json(path: Path) -> Any:
    try:
        return orjson.loads(path.read_bytes()) if path.is_file() else None
    except orjson.JSONDecodeError:
        return None


def _process(vdir: Path) -> dict[str, Any]:
    doc = _json(vdir / "scheduler_process.json")
    if not isinstance(doc, dict):
        return {"found": False, "reason": "no scheduler_process.json (the process-tree walk did not run)"}
    keep = ("found", "pid", "cmdline", "root", "tree", "matches", "match", "reason")
    return {k: doc[k] for k in keep if k in doc}


# An empty profile is a reading (the process idle) only when its CPU time was worth fewer samples: 10
# keeps the chance that a sampler which was working drew none at e^-10 (40 ms of CPU, 4 samples'
# worth, gave 0 samples once), while a py-spy that sampled nothing on a busy process is far above it.
IDLE_SAMPLES = 10


def _cpu(meta: dict[str, Any]) -> dict[str, Any]:
    """The process's CPU seconds over the run script's window (from its clock ticks), when it read them."""
    ticks, tck, window_ns = meta.get("cpu_ticks"), meta.get("clk_tck"), meta.get("cpu_window_ns")
    if not isinstance(ticks, int) or ticks < 0 or not isinstance(tck, int) or tck <= 0:
        return {"cpu_s": None}
    cpu_s = ticks / tck
    out: dict[str, Any] = {"cpu_s": round(cpu_s, 4)}
    if isinstance(window_ns, int) and window_ns > 0:
        out["cpu_window_s"] = round(window_ns / 1e9, 3)
        out["cpu_busy"] = round(min(cpu_s / (window_ns / 1e9), 1.0), 4)
    return out


def _pyspy(rdir: Path, engine: str) -> dict[str, Any]:
    meta = _json(rdir / "pyspy.json")
    if not isinstance(meta, dict):
        return {"status": "not run (no pyspy.json)"}
    out: dict[str, Any] = {
        "pid": meta.get("pid"),
        "rate_hz": meta.get("rate_hz"),
        "duration_s": meta.get("duration_s"),
    }
    if meta.get("error"):
        return out | {"status": f"not run: {meta['error']}"}

    def failure(kind: str) -> str | None:
        if meta.get(f"{kind}_rc") == 0:
            return None
        log = rdir / f"pyspy_{kind}.log"
        text = log.read_text(errors="replace").strip() if log.is_file() else ""
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        # py-spy's own message is its `Error: ...` line (a Rust backtrace may follow it)
        said = next((ln for ln in lines if ln.startswith("Error")), lines[-1] if lines else "no output")
        return f"py-spy ({kind}) exited {meta.get(f'{kind}_rc')}: {said} (pyspy_{kind}.log)"

    raw = rdir / "profile.txt"
    out["svg"] = "flame.svg" if (rdir / "flame.svg").is_file() and meta.get("svg_rc") == 0 else None
    out["raw"] = "profile.txt" if raw.is_file() else None
    # The shares come from the raw profile; the flame graph is its picture (a failed one is a pitfall).
    out["svg_error"] = failure("svg")
    if failure("raw"):
        return out | {"status": f"failed: {failure('raw')}"}
    if not raw.is_file():
        return out | {"status": "failed: py-spy wrote no raw profile"}
    s = sched_profile_pyspy.share(raw, engine, meta.get("rate_hz"), meta.get("duration_s"))
    out |= _cpu(meta)
    if not s["samples"]:
        cpu_s, rate = out["cpu_s"], meta.get("rate_hz")
        if cpu_s is None or not rate:
            why = "no CPU time read to tell why"
            return out | {"status": f"failed: the raw profile has no samples ({why})"} | s
        worth = cpu_s * float(rate)
        said = (
            f"the process used {cpu_s * 1e3:.0f} ms of CPU in the window, "
            f"{worth:.1f} samples' worth at {rate} Hz"
        )
        if worth >= IDLE_SAMPLES:
            return out | {"status": f"failed: the raw profile has no samples while {said}"} | s
        return out | {"status": "read", "idle": f"no py-spy sample: {said} (idle)"} | s
    return out | {"status": "read"} | s


def _trace(vdir: Path, engine: str) -> dict[str, Any]:
    files = sorted(vdir.glob("runs/trace/trace/*.json*"))
    if not files:
        return {"status": "no trace file"}
    try:
        doc = trace.load(files[-1])
    except InputError as exc:
        return {"status": f"unreadable: {exc}", "file": files[-1].name}
    a = sched_profile_trace.analyse(doc, engine)
    if not a["sched_spans"] or not a["forward_blocks"]:
        return {"status": "no scheduler spans or no forward kernels in the trace", "file": files[-1].name} | a
    return {"status": "read", "file": files[-1].name} | a


def figures(lab_dir: Path, plan: dict[str, Any], variants: dict[str, Variant], engine: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, v in variants.items():
        vdir = lab_dir / name
        loads = {}
        for load in LOADS:
            run = v.runs.get(f"load_{load}")
            st = run_stats(v, run) if run is not None else {}
            loads[load] = {
                "request_rate": (run.workload.get("request_rate") if run else None),
                "n": st.get("n"),
                "tpot_p50_ms": st.get("tpot_p50_ms"),
                "ttft_p50_ms": st.get("ttft_p50_ms"),
                "output_tok_s": st.get("output_tok_s"),
                "pyspy": _pyspy(vdir / "runs" / f"load_{load}", engine),
            }
        out[name] = {"scheduler_process": _process(vdir), "loads": loads, "trace": _trace(vdir, engine)}
    return {"variants": out, "dropped_variants": plan.get("dropped_variants", [])}


def _problems(name: str, v: dict[str, Any]) -> list[str]:
    p = v["scheduler_process"]
    if not p.get("found"):
        return [f"{name}: no scheduler process chosen ({p.get('reason')})"]
    out = [
        f"{name}/{load}: py-spy {x['pyspy']['status']}"
        for load, x in v["loads"].items()
        if x["pyspy"]["status"] != "read"
    ]
    if v["trace"]["status"] != "read":
        out.append(f"{name}: profiler trace {v['trace']['status']}")
    return out


def _load_line(name: str, load: str, x: dict[str, Any], wl: dict[str, Any]) -> str:
    s = x["pyspy"]
    if s["samples"]:
        where = (
            f"of them {s['sched_share']:.1%} in scheduling and {s['output_share']:.1%} in output processing"
        )
    else:
        where = s["idle"]
    return (
        f"{name}/{load}: scheduler process on the CPU {s['busy']:.1%} of {s['duration_s']} s "
        f"({s['samples']} py-spy samples at {s['rate_hz']} Hz); {where}, "
        f"at {x['request_rate']} req/s offered "
        f"(random {wl.get('isl')}/{wl.get('osl')}, {x['n']} requests; TPOT p50 {x['tpot_p50_ms']} ms)"
    )


def _trace_line(name: str, t: dict[str, Any], wl: dict[str, Any]) -> str:
    return (
        f"{name}: profiler trace at {wl.get('rates', {}).get('medium')} req/s: scheduler CPU "
        f"{t['sched_cpu_us'] / 1e3:.1f} ms, forward (GPU kernels) {t['forward_us'] / 1e3:.1f} ms, overlap "
        f"{t['overlap_us'] / 1e3:.1f} ms ({t['overlap_of_sched']:.0%} of the scheduler's time) in a "
        f"{t['window_us'] / 1e3:.1f} ms window"
    )


def _ab(fig: dict[str, Any], comps: list[dict[str, Any]], margin: float) -> list[dict[str, Any]]:
    """Each A/B (async scheduling): the overlap share of the scheduler's CPU time, treatment vs baseline."""
    out = []
    for c in comps:
        a, b = (fig["variants"].get(c[k], {}).get("trace", {}) for k in ("baseline", "treatment"))
        oa, ob = a.get("overlap_of_sched"), b.get("overlap_of_sched")
        if oa is None or ob is None:
            verdict = INCONCLUSIVE
        elif a.get("emulated") or b.get("emulated"):
            verdict = INCONCLUSIVE  # the emulator prices the scheduler serially: no overlap to compare
        else:
            verdict = SUPPORTED if ob > oa + margin * max(oa, 0.01) else NOT_SUPPORTED
        out.append(
            {
                "baseline": c["baseline"],
                "treatment": c["treatment"],
                "variable": c["variable"],
                "figure": "share of the scheduler's CPU time that overlaps the forward pass (trace)",
                "baseline_value": oa,
                "treatment_value": ob,
                "verdict": verdict,
                "reason": "not comparable on enginesim (no overlap modelled)"
                if verdict == INCONCLUSIVE and oa is not None and ob is not None
                else "",
            }
        )
    return out


def judge(
    fig: dict[str, Any], comps: list[dict[str, Any]], wl: dict[str, Any], th: dict[str, Any]
) -> Verdict:
    """Supported when the scheduler process is on the CPU more at high load than at low load (py-spy),
    with a readable profile at every load and a readable trace; the shares and the overlap are reported."""
    obs, problems, rises = [], [], []
    margin = float(th.get("margin", 0.1))
    for name, v in fig["variants"].items():
        problems += _problems(name, v)
        p = v["scheduler_process"]
        if p.get("found"):
            cmd = " ".join(p["cmdline"])
            obs.append(f"{name}: profiled pid {p['pid']} `{cmd}`, a child of server pid {p['root']['pid']}")
        for load, x in v["loads"].items():
            if x["pyspy"].get("status") == "read" and x["pyspy"].get("busy") is not None:
                obs.append(_load_line(name, load, x, wl))
        if v["trace"]["status"] == "read":
            obs.append(_trace_line(name, v["trace"], wl))
        lo, hi = (v["loads"][k]["pyspy"].get("busy") for k in ("low", "high"))
        if lo is not None and hi is not None:
            rises.append((name, lo, hi))
    comparisons = _ab(fig, comps, margin)
    if problems:
        return Verdict(INCONCLUSIVE, "; ".join(problems), obs, comparisons)
    if not rises:
        return Verdict(INCONCLUSIVE, "no variant has both a low- and a high-load profile", obs, comparisons)
    why = "; ".join(f"{n}: on the CPU {lo:.1%} at low load -> {hi:.1%} at high load" for n, lo, hi in rises)
    if all(hi > lo * (1 + margin) for _, lo, hi in rises):
        return Verdict(
            SUPPORTED, "the scheduler process's CPU time grows with load: " + why, obs, comparisons
        )
    return Verdict(
        NOT_SUPPORTED,
        f"the scheduler process's CPU time does not grow by more than {margin:.0%}: " + why,
        obs,
        comparisons,
    )


def pitfalls(fig: dict[str, Any], wl: dict[str, Any]) -> list[str]:
    out = [
        "py-spy samples only the scheduler process's Python stacks (--nonblocking: the process is not "
        "paused, so a stack can be torn); native and GPU time is invisible to it",
    ]
    for d in fig.get("dropped_variants", []):
        out.append(
            f"no async-scheduling A/B: variant {d['variant']} not run ({d['reason']}); "
            "the trace is described alone: no comparable baseline exists"
        )
    if not fig.get("dropped_variants") and len(fig["variants"]) == 1:
        out.append(
            "no async-scheduling A/B declared for this engine: the trace is described alone; "
            "no comparable baseline exists"
        )
    if len(fig["variants"]) > 1 and any(v["trace"].get("emulated") for v in fig["variants"].values()):
        out.append(
            "the async-scheduling A/B is not comparable on enginesim: it accepts the switch but does not "
            "model it, so both variants' traces have the same serial schedule"
        )
    for name, v in fig["variants"].items():
        if v["trace"].get("emulated"):
            out.append(
                f"{name}: the trace is enginesim's cost model: it prices the scheduler's CPU serially before "
                "each forward pass (no overlap or async scheduling modelled), so its overlap is 0 "
                "by construction, not a measurement"
            )
        for load, x in v["loads"].items():
            if x["pyspy"].get("svg_error"):
                out.append(f"{name}/{load}: no flame graph: {x['pyspy']['svg_error']}")
        p = v["scheduler_process"]
        if p.get("found") and len(p.get("matches", [])) > 1:
            out.append(
                f"{name}: {len(p['matches'])} processes matched; the first (pid {p['pid']}) was profiled"
            )
    return out
