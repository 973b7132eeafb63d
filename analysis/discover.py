"""Walk a run directory and pair every rep directory with its meta.json and result file.

A directory without ``cases/`` or ``mixed/`` is taken as a flat directory of result files (any
client's, e.g. a folder of peer-client outputs): each ``*.json``/``*.jsonl``/``*.log`` file directly
in it is one entry of suite ``files``, named after the file. Our own outputs and quickmap's state
files are skipped. AIPerf writes a summary (``X_aiperf.json``) and the per-request records of the
same run (``X.jsonl``) side by side: they become one entry, the records as its ``details``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from analysis.atomic import read_json_object
from analysis.errors import InputError
from analysis.values import as_int

BENCH_NAMES = ("bench.json", "bench.jsonl")
FLAT_SUFFIXES = (".json", ".jsonl", ".log")
# Files a run directory holds that are not client results (summarize's outputs, quickmap's state).
NOT_RESULTS = ("manifest.json", "summary.jsonl", "meta.json", "phase.json", "lab.json", "run.log")
AIPERF_SUMMARY_SUFFIX = "_aiperf.json"


class Entry:
    """One rep directory: fixed ``cases/<case>/rep<N>`` or mixed ``mixed/rep<N>/<role>``."""

    __slots__ = ("bench", "case_id", "details", "dir", "meta", "rep", "role", "suite")

    def __init__(
        self, suite: str, d: Path, meta: dict[str, Any], bench: Path | None, details: Path | None = None
    ) -> None:
        self.suite = suite
        self.dir = d
        self.meta = meta
        self.bench = bench
        self.details = details
        if suite == "files":
            self.case_id = bench.name if bench is not None else d.name
            self.role = ""
            self.rep = 1
            return
        if suite == "fixed":
            self.case_id = str(meta.get("case_id") or d.parent.name)
            self.role = ""
            rep_dir = d.name
        else:
            self.role = str(meta.get("role") or d.name)
            self.case_id = str(meta.get("case_id") or "mixed")
            rep_dir = d.parent.name
        rep = as_int(meta.get("rep"))
        self.rep = rep if rep is not None else as_int(rep_dir[3:]) if rep_dir.startswith("rep") else None


def _bench_file(d: Path) -> Path | None:
    return next((d / n for n in BENCH_NAMES if (d / n).is_file()), None)


def flat_files(run_dir: Path) -> list[Entry]:
    """The result files of a flat directory (see the module docstring), sorted by name."""
    files = sorted(
        p for p in run_dir.iterdir()
        if p.is_file() and p.suffix in FLAT_SUFFIXES and p.name not in NOT_RESULTS
    )  # fmt: skip
    paired = {
        p: p.with_name(p.name[: -len(AIPERF_SUMMARY_SUFFIX)] + ".jsonl")
        for p in files
        if p.name.endswith(AIPERF_SUMMARY_SUFFIX)
    }
    paired = {summary: records for summary, records in paired.items() if records in files}
    consumed = set(paired.values())
    return [Entry("files", run_dir, {}, p, paired.get(p)) for p in files if p not in consumed]


def discover(run_dir: Path) -> list[Entry]:
    """All rep dirs; a dir with neither meta.json nor a result file is an error (exit 2)."""
    if not (run_dir / "cases").is_dir() and not (run_dir / "mixed").is_dir():
        return flat_files(run_dir)
    entries: list[Entry] = []
    layouts = (("fixed", run_dir / "cases", "*", "rep<N>"), ("mixed", run_dir / "mixed", "rep*", "<role>"))
    for suite, root, pattern, child in layouts:
        if not root.is_dir():
            continue
        for parent in sorted(p for p in root.glob(pattern) if p.is_dir()):
            kids = sorted(p for p in parent.iterdir() if p.is_dir())
            if suite == "fixed":
                kids = [k for k in kids if k.name.startswith("rep")]
            if not kids:
                raise InputError(
                    parent, None, f"holds no {child}/ directory; expected {child}/meta.json or bench.json"
                )
            for d in kids:
                meta_path = d / "meta.json"
                meta = read_json_object(meta_path) if meta_path.is_file() else {}
                bench = _bench_file(d)
                if not meta_path.is_file() and bench is None:
                    raise InputError(
                        d, None, "case directory has neither meta.json nor bench.json; expected at least one"
                    )
                entries.append(Entry(suite, d, meta, bench))
    return entries
