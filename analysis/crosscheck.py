"""loadgen and a reference client (SGLang bench_serving, vLLM bench serve) side by side, per case.

With ``bench_client: sglang|vllm`` or ``bench_cross_check: true`` the bench role runs the reference
client after loadgen in the same case directory, on the same workload, and keeps its own file
(``bench_sglang.jsonl`` / ``bench_vllm.json``) beside loadgen's ``bench.json``. Users trust numbers
they can cross-check with the client they know; this module reads both files with the shared readers
and puts them in one table. A column whose definition differs between the two (``clients.CLIENTS``
marks other than ``=``) is printed, but marked not comparable, so no difference is read as an error
of either client. A figure here always comes from a file a client really wrote; a case where only
one client left a valid file says so instead of printing a column for the other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from analysis import clients
from analysis.errors import InputError
from analysis.readers import BenchData, read_bench
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


def reference_files(case_dir: Path) -> dict[str, Path]:
    """The reference clients' result files present in a case directory."""
    return {c: case_dir / name for c, name in REFERENCE_FILES.items() if (case_dir / name).is_file()}


def _figure(data: BenchData, key: str) -> float | None:
    value = data.stats.get(key)
    return value if value is not None else data.scalars.get(key)


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
    return out


def _cell(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


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
        "comparable figures agree only within the run-to-run spread.",
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
            for label, column, key in FIGURES:
                mark, what = clients.CLIENTS[client][column]
                comparable = "yes" if mark == "=" else f"not comparable ({mark} {what})"
                a, b = _figure(lg["data"], key), _figure(ref["data"], key)
                if mark == "—":
                    b = None
                L.append(f"| {label} | {_cell(a)} | {_cell(b)} | {comparable} |".replace("\n", " "))
            L.append("")
    return L
