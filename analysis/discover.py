"""Walk a run directory and pair every rep directory with its meta.json and result file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from analysis.atomic import read_json_object
from analysis.errors import InputError
from analysis.formats import as_int

BENCH_NAMES = ("bench.json", "bench.jsonl")


class Entry:
    """One rep directory: fixed ``cases/<case>/rep<N>`` or mixed ``mixed/rep<N>/<role>``."""

    __slots__ = ("bench", "case_id", "dir", "meta", "rep", "role", "suite")

    def __init__(self, suite: str, d: Path, meta: dict[str, Any], bench: Path | None) -> None:
        self.suite = suite
        self.dir = d
        self.meta = meta
        self.bench = bench
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


def discover(run_dir: Path) -> list[Entry]:
    """All rep dirs; a dir with neither meta.json nor a result file is an error (exit 2)."""
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
