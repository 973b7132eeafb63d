"""loadgen and a reference client (SGLang bench_serving, vLLM bench serve) side by side, per case.

With ``bench_client: sglang|vllm`` or ``bench_cross_check: true`` the bench role runs the reference
client after loadgen in the same case directory, on the same workload, and keeps its own file
(``bench_sglang.jsonl`` / ``bench_vllm.json``) beside loadgen's ``bench.json``. Users trust numbers
they can cross-check with the client they know; this module reads both files with the shared readers
and puts them in one table. A column whose definition differs between the two (``clients.CLIENTS``
marks other than ``=``) is printed, but marked not comparable, so no difference is read as an error
of either client. A figure here always comes from a file a client really wrote; a case where only
one client left a valid file says so instead of printing a column for the other.

On enginesim each client's run has its own /metrics window (loadgen: ``metrics_before.prom`` /
``metrics_after.prom``; the reference client: ``metrics_before_<client>.prom`` / ``..._after_...``), and
each gets the emulator's own verdict on that window (module_utils/emulation_verdict.py). A figure the
verdict does not vouch for in either window (saturated, unknown, or degraded for that figure) is marked
not comparable: a difference there is the emulator's, not a disagreement of the clients. The table
also shows the prompt length each client actually sent (its own count, and the prefill tokens the
server counted in its window), since a client that re-tokenizes text sends a different workload.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from analysis import clients
from analysis.errors import InputError
from analysis.readers import BenchData, read_bench
from module_utils import emulation_verdict
from module_utils.bench_file import judge_file

# client -> the file name it writes in the case directory (the bench role's reference_args.j2).
REFERENCE_FILES: dict[str, str] = {"sglang": "bench_sglang.jsonl", "vllm": "bench_vllm.json"}

# (label, column in clients.COLUMNS, key in BenchData.stats or .scalars)
FIGURES: tuple[tuple[str, str, str], ...] = (
    ("TTFT mean ms", "ttft", "ttft_mean_ms"),
    ("TTFT p99 ms", "ttft", "ttft_p99_ms"),
    ("TPOT mean ms", "tpot", "tpot_mean_ms"),
    ("TPOT p99 ms", "tpot", "tpot_p99_ms"),
    ("ITL p99 ms", "itl", "itl_p99_ms"),
    ("E2E mean ms", "e2e", "e2e_mean_ms"),
    ("output tok/s", "throughput", "output_throughput"),
    ("requests/s", "throughput", "request_throughput"),
)

# figure key -> what emulation_verdict's ``stands`` must vouch for in a degraded window (all of them)
_STANDS: dict[str, tuple[str, ...]] = {
    "ttft_mean_ms": ("ttft",),
    "ttft_p99_ms": ("ttft", "itl_tail"),
    "tpot_mean_ms": ("tpot",),
    "tpot_p99_ms": ("tpot",),
    "itl_p99_ms": ("itl_tail",),
    "e2e_mean_ms": ("ttft", "tpot"),
    "output_throughput": ("throughput",),
    "request_throughput": ("throughput",),
}
# two windows' prompt lengths at the server further apart than this share are two different workloads
ISL_TOLERANCE = 0.05
# the server's prefill token and request counters (enginesim writes the engine's own names)
_PROMPT_COUNTERS = ("sglang:prompt_tokens_total", "vllm:prompt_tokens_total")
_REQUEST_COUNTERS = ("sglang:num_requests_total", "vllm:request_success_total")


def reference_files(case_dir: Path) -> dict[str, Path]:
    """The reference clients' result files present in a case directory."""
    return {c: case_dir / name for c, name in REFERENCE_FILES.items() if (case_dir / name).is_file()}


def _figure(data: BenchData, key: str) -> float | None:
    value = data.stats.get(key)
    return value if value is not None else data.scalars.get(key)


def _window(case_dir: Path, client: str) -> dict[str, Any] | None:
    """The emulator's verdict on one client's /metrics window (None: not an emulated run)."""
    try:
        return emulation_verdict.read_case(str(case_dir), client)
    except ValueError as exc:  # a scrape prometheus_client cannot parse
        return {"emulated": True, "verdict": "unknown", "reasons": [f"unparsable /metrics scrape: {exc}"]}


def _counter_sum(text: str, names: tuple[str, ...]) -> float | None:
    """The sum over labels of the first counter in ``names`` that the scrape holds (None: none)."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                found[sample.name] = found.get(sample.name, 0.0) + sample.value
    for name in names:
        if name in found:
            return found[name]
    return None


def server_prompt_tokens(case_dir: Path, client: str) -> float | None:
    """Prompt tokens per request the server counted in one client's window (warm-up included).

    Why: a client reports the prompt length it planned; the server's counter shows what arrived. None
    when a scrape or a counter is missing, unparsable, or no request ran in the window."""
    texts = []
    for name in emulation_verdict.scrape_names(client):
        try:
            texts.append((case_dir / name).read_text(encoding="utf-8", errors="replace"))
        except OSError:
            return None
    try:
        prompt = [_counter_sum(t, _PROMPT_COUNTERS) for t in texts]
        requests = [_counter_sum(t, _REQUEST_COUNTERS) for t in texts]
    except ValueError:
        return None
    if None in prompt or None in requests:
        return None
    done = requests[1] - requests[0]  # type: ignore[operator]
    return (prompt[1] - prompt[0]) / done if done > 0 else None  # type: ignore[operator]


def _run(path: Path, expect: int | None, osl: int | None) -> dict[str, Any]:
    """One client's run: its verdict by the case rules, and its figures when the file passed."""
    if expect is None or expect < 1:
        return {"ok": False, "why": "the case has no planned request count", "data": None}
    verdict = judge_file(str(path), expect, osl)
    if not verdict["passed"]:
        return {"ok": False, "why": str(verdict.get("msg", "failed")).splitlines()[0], "data": None}
    try:
        data = read_bench(path)
    except InputError as exc:
        return {"ok": False, "why": f"unreadable: {exc}", "data": None}
    return {"ok": True, "why": "", "data": data}


def compare_case(case_dir: Path, meta: dict[str, Any]) -> dict[str, Any] | None:
    """Both clients' runs of one case repetition; None when no reference client ran there."""
    refs = reference_files(case_dir)
    ref_logs = [c for c in REFERENCE_FILES if (case_dir / f"bench_{c}.log").is_file()]
    if not refs and not ref_logs:
        return None
    expect, osl = meta.get("num_prompts"), meta.get("osl")
    loadgen_file = case_dir / "bench.json"
    out: dict[str, Any] = {
        "case_id": meta.get("case_id") or case_dir.parent.name,
        "rep": meta.get("rep"),
        "loadgen": _run(loadgen_file, expect, osl)
        if loadgen_file.is_file()
        else {"ok": False, "why": "no bench.json", "data": None},
        "reference": {},
    }
    out["loadgen"].update(emulation=_window(case_dir, ""), server_isl=server_prompt_tokens(case_dir, ""))
    for client in dict.fromkeys([*refs, *ref_logs]):
        path = case_dir / REFERENCE_FILES[client]
        if path.is_file():
            out["reference"][client] = _run(path, expect, osl)
        else:
            rc = (
                (case_dir / f"bench_{client}.rc").read_text().strip()
                if (case_dir / f"bench_{client}.rc").is_file()
                else "?"
            )
            out["reference"][client] = {
                "ok": False,
                "why": f"ran (exit {rc}, see bench_{client}.log) but wrote no {REFERENCE_FILES[client]}",
                "data": None,
            }
        out["reference"][client].update(
            emulation=_window(case_dir, client), server_isl=server_prompt_tokens(case_dir, client)
        )
    return out


def _cell(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _verdict_cell(emulation: dict[str, Any] | None) -> str:
    """One window's verdict as a table cell: the verdict and its realtime factor."""
    if emulation is None:
        return "n/a (not emulated)"
    rtf = emulation.get("realtime_factor")
    return f"{emulation.get('verdict')}" + (f" (realtime factor {rtf:.3f})" if rtf is not None else "")


def _step_wall(emulation: dict[str, Any] | None) -> str:
    """The emulator's busy wall per step in one window (ms): in a saturated window a client's TPOT is
    this, the speed of the emulator's loop on this machine, not the emulated hardware's step."""
    if emulation is None or not emulation.get("steps") or emulation.get("wall_s") is None:
        return "n/a"
    return f"{1000.0 * emulation['wall_s'] / emulation['steps']:.3f}"


def window_blocks(emulation: dict[str, Any] | None, key: str) -> str | None:
    """Why the emulator's verdict on a window does not vouch for one figure; None when it does.

    A real engine (no verdict) vouches for everything: the figures are its own."""
    if emulation is None:
        return None
    verdict = emulation.get("verdict")
    if verdict == "ok":
        return None
    if verdict == "degraded":
        stands = emulation.get("stands") or {}
        missing = [what for what in _STANDS.get(key, ()) if not stands.get(what)]
        return f"degraded ({', '.join(missing)} not vouched for)" if missing else None
    return str(verdict)


def _isl(data: BenchData) -> float | None:
    """A client's own mean prompt length over its completed requests."""
    total, done = data.scalars.get("total_input_tokens"), data.scalars.get("completed")
    return total / done if total is not None and done else None


def comparable(client: str, column: str, key: str, lg: dict[str, Any], ref: dict[str, Any]) -> str:
    """The comparable cell of one figure: yes, or why not (definitions first, then each window)."""
    mark, what = clients.CLIENTS[client][column]
    if mark != "=":
        return f"not comparable ({mark} {what})"
    why = [
        f"emulator: {name} window {blocked}"
        for name, run in (("loadgen", lg), (client, ref))
        if (blocked := window_blocks(run.get("emulation"), key)) is not None
    ]
    a, b = lg.get("server_isl"), ref.get("server_isl")
    if a is not None and b is not None and abs(a - b) > ISL_TOLERANCE * max(a, b):
        why.append(f"workload: the server counted {a:.0f} vs {b:.0f} prompt tokens/request")
    return f"not comparable ({'; '.join(why)})" if why else "yes"


def section(comparisons: list[dict[str, Any]]) -> list[str]:
    """report.md lines: one table per case repetition and reference client, or nothing."""
    if not comparisons:
        return []
    L = [
        "## Reference client side by side",
        "",
        "Each case below ran twice on the same workload (same lengths, prompts, concurrency, rate, seed): "
        "loadgen first, then the reference client, against the same server. Figures are wall clock as "
        "each client measured them (not scaled to emulated hardware). Columns marked **not comparable** "
        "are computed differently by the two clients (see the client table under Metric definitions): "
        "a difference there is not an error of either client. Runs differ in time as well, so two "
        "comparable figures agree only within the run-to-run spread. On the emulator each client's "
        "run is judged on its own /metrics window: a figure from a window the emulator's verdict does "
        "not vouch for (saturated, unknown, or degraded for that figure) is marked not comparable, "
        "since a difference there is the emulator's, not the clients'. The prompt rows show what each "
        "client sent: its own count, and the prompt tokens per request the server counted in its "
        "window (whole prompts, prefix-cache hits included, as the engines count them; warm-up and a "
        "client's own test request included).",
        "",
    ]
    for comp in comparisons:
        name = f"{comp['case_id']} rep{comp['rep']}"
        lg = comp["loadgen"]
        for client, ref in comp["reference"].items():
            L.append(f"### {name}: loadgen vs {client}")
            L.append("")
            if not (lg["ok"] and ref["ok"]):
                if lg["ok"]:
                    L.append(f"Only loadgen has figures: {client} {ref['why']}.")
                elif ref["ok"]:
                    L.append(f"Only {client} has figures: loadgen {lg['why']}.")
                else:
                    L.append(f"Neither client has figures: loadgen {lg['why']}; {client} {ref['why']}.")
                L.append("")
                continue
            L += ["| figure | loadgen | " + client + " | comparable |", "|---|---|---|---|"]
            lg_emu, ref_emu = lg.get("emulation"), ref.get("emulation")
            if lg_emu is not None or ref_emu is not None:
                L.append(f"| emulator verdict | {_verdict_cell(lg_emu)} | {_verdict_cell(ref_emu)} | |")
                L.append(f"| emulator busy wall ms/step | {_step_wall(lg_emu)} | {_step_wall(ref_emu)} | |")
            lg_isl, ref_isl = _cell(_isl(lg["data"])), _cell(_isl(ref["data"]))
            L.append(f"| prompt tokens/request (client) | {lg_isl} | {ref_isl} | |")
            if lg.get("server_isl") is not None or ref.get("server_isl") is not None:
                L.append(
                    f"| prompt tokens/request (server) | {_cell(lg.get('server_isl'))} | "
                    f"{_cell(ref.get('server_isl'))} | |"
                )
            for label, column, key in FIGURES:
                a, b = _figure(lg["data"], key), _figure(ref["data"], key)
                if clients.CLIENTS[client][column][0] == "—":
                    b = None
                cell = comparable(client, column, key, lg, ref)
                L.append(f"| {label} | {_cell(a)} | {_cell(b)} | {cell} |".replace("\n", " "))
            L.append("")
    return L
