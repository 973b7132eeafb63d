"""The scenario table: parse, validate and expand it into planned cases.

Rules (docs/README.md, "The scenario table"): exact tab-separated header, integer fields > 0
(warmup >= 0), unique case ids, known stages; ``num_prompts = max(concurrency * multiplier, minimum)``.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from analysis.errors import InputError

HEADER = ("case_id", "stage", "isl", "osl", "concurrency", "multiplier", "minimum", "warmup", "note")
STAGES = ("cold_prefill", "concurrent_prefill", "short_decode", "long_decode", "long_context_decode", "mixed")
_POSITIVE = ("isl", "osl", "concurrency", "multiplier", "minimum")
_CASE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Case:
    """One planned case (a row of the table plus the derived request count)."""

    case_id: str
    stage: str
    isl: int
    osl: int
    concurrency: int
    multiplier: int
    minimum: int
    warmup: int
    note: str
    num_prompts: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _int_field(path: Path, lineno: int, name: str, raw: str, minimum: int) -> int:
    rule = "an integer > 0" if minimum == 1 else "an integer >= 0"
    try:
        value = int(raw.strip())
    except ValueError:
        raise InputError(path, f"line {lineno} field '{name}'", f"got {raw!r}, expected {rule}") from None
    if value < minimum:
        raise InputError(path, f"line {lineno} field '{name}'", f"got {value}, expected {rule}")
    return value


def load_scenarios(path: str | Path) -> list[Case]:
    """Parse and validate the table; raise InputError naming file, line and field on any problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(path, None, "file not found; expected the scenario TSV") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(path, None, f"cannot read as UTF-8 text ({exc})") from None
    lines = text.splitlines()
    if not lines:
        raise InputError(path, "line 1", "file is empty; expected header " + "\\t".join(HEADER))
    header = tuple(lines[0].rstrip("\r").split("\t"))
    if header != HEADER:
        raise InputError(
            path,
            "line 1",
            f"header is {'|'.join(header)!r}, expected exactly (tab-separated) {'|'.join(HEADER)!r}",
        )
    cases: list[Case] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        cols = line.rstrip("\r").split("\t")
        if len(cols) != len(HEADER):
            raise InputError(
                path, f"line {lineno}", f"has {len(cols)} tab-separated fields, expected {len(HEADER)}"
            )
        row = dict(zip(HEADER, cols, strict=True))
        case_id = row["case_id"].strip()
        if not _CASE_ID.match(case_id):
            raise InputError(
                path,
                f"line {lineno} field 'case_id'",
                f"got {case_id!r}, expected letters, digits, '_', '-' or '.'",
            )
        if case_id in seen:
            raise InputError(
                path,
                f"line {lineno} field 'case_id'",
                f"duplicate {case_id!r} (first on line {seen[case_id]})",
            )
        seen[case_id] = lineno
        stage = row["stage"].strip()
        if stage not in STAGES:
            raise InputError(
                path, f"line {lineno} field 'stage'", f"got {stage!r}, expected one of {', '.join(STAGES)}"
            )
        ints = {name: _int_field(path, lineno, name, row[name], 1) for name in _POSITIVE}
        warmup = _int_field(path, lineno, "warmup", row["warmup"], 0)
        num_prompts = max(ints["concurrency"] * ints["multiplier"], ints["minimum"])
        cases.append(Case(case_id, stage, warmup=warmup, note=row["note"], num_prompts=num_prompts, **ints))
    if not cases:
        raise InputError(path, None, "no cases below the header; expected at least one")
    return cases


def select_cases(path: str | Path, cases: list[Case], case_ids: str | None) -> list[Case]:
    """Filter by a comma-separated id list, in the table's order; unknown ids are an error."""
    if case_ids is None:
        return cases
    wanted = [c.strip() for c in case_ids.split(",") if c.strip()]
    if not wanted:
        raise InputError(path, "--case-ids", "is empty; expected a comma-separated list of case ids")
    known = {c.case_id for c in cases}
    unknown = [w for w in wanted if w not in known]
    if unknown:
        raise InputError(
            path, "--case-ids", f"unknown case id(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    keep = set(wanted)
    return [c for c in cases if c.case_id in keep]


def format_table(cases: list[Case]) -> str:
    """A fixed-width plan table for humans (and Ansible's debug output)."""
    cols = ("case_id", "stage", "isl", "osl", "concurrency", "num_prompts", "warmup", "note")
    rows = [[str(getattr(c, k)) for k in cols] for c in cases]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(cols)]
    out = ["  ".join(h.ljust(w) for h, w in zip(cols, widths, strict=True)).rstrip()]
    out += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    out.append(f"{len(cases)} case(s), {sum(c.num_prompts for c in cases)} request(s) in total")
    return "\n".join(out)
