"""labs/report.md: one section per lab in the template Goal · Setup · Observation · Conclusion · Pitfalls.

Why generated from lab.json only: every sentence of a section is filled from the lab's data (the
goal is the lab's question, not a result); nothing is pre-written as a finding. A lab whose verdict
is inconclusive says why in its conclusion.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from analysis.atomic import write_text
from analysis.labs.definitions import LABS


def _flags(words: list[str]) -> str:
    return "`" + " ".join(words) + "`" if words else "(none)"


def _words(value: list[str] | None) -> str:
    """A flag's words in a comparison: absent, present (a switch) or its value."""
    if value is None:
        return "absent"
    return " ".join(value) if value else "present"


def _workload(wl: dict[str, Any]) -> str:
    """The lab's workload in one line: sizes as key=value, runs as name: ISL/OSL x N at C (long texts
    such as the prose prompt are named, not quoted)."""
    parts = []
    for k, v in wl.items():
        if isinstance(v, list) and v and isinstance(v[0], dict):
            parts.append(
                "; ".join(
                    f"{r.get('name')}: {r.get('isl')}/{r.get('osl')} tokens x {r.get('num_prompts')} at "
                    f"C={r.get('concurrency')}"
                    + (f" (range ratio {r['range_ratio']})" if r.get("range_ratio", 1) != 1 else "")
                    for r in v
                )
            )
        elif isinstance(v, dict):
            parts.append(f"{k}: " + ", ".join(f"{a}={b}" for a, b in v.items()))
        elif isinstance(v, str) and len(v) > 40:
            parts.append(f"{k}: {len(v.split())} words")
        else:
            parts.append(f"{k}={v}")
    return ", ".join(parts) or "start-up only (no requests)"


def section(doc: dict[str, Any]) -> str:
    s = doc["setup"]
    took = f" ({doc['wall_s']:.0f} s wall)" if doc.get("wall_s") else ""
    lines = [f"## {doc['lab']} ({doc['engine']}) — {doc['verdict']}{took}", ""]
    lines += [f"**Goal.** {doc['goal']}", ""]
    hw = s["hardware"]
    lines.append(
        f"**Setup.** Model `{s['model']}`, engine {s['engine']} "
        f"{s.get('engine_version') or '(version not reported)'}, "
        f"hardware: {hw}. Flags common to every variant: {_flags(s['common_flags'])}."
    )
    for v in s["variants"]:
        extra = f", engine settings {v['engine_settings']}" if v["engine_settings"] else ""
        ts = (
            f", time scale {v['time_scale']:g}, realtime verdict {v['realtime']}" if v.get("emulated") else ""
        )
        cap = (
            f", KV capacity {v['kv_capacity_tokens']} tokens (start-up log)"
            if v.get("kv_capacity_tokens")
            else ""
        )
        lines.append(
            f"- variant `{v['name']}`: flags {_flags(v['flags'])}{extra}{cap}{ts}; server command in "
            f"`{v['server_cmd']}`"
        )
    for c in s["comparisons"]:
        diff = "; ".join(
            f"{k}: {_words(d['baseline'])} -> {_words(d['treatment'])}"
            for k, d in (c.get("differs") or {}).items()
        )
        lines.append(
            f"- comparison `{c['baseline']}` -> `{c['treatment']}`: one variable ({c['variable']}; {diff}); "
            f"expected the treatment's figure {c['expect']}"
        )
    lines.append(
        f"- workload: {_workload(s['workload'])}; client loadgen ({s['client']['backend']}), {s['proxies']}"
    )
    lines.append("")
    lines.append("**Observation.**")
    lines += [f"- {o}" for o in doc["observations"]] or ["- (no figures: see the conclusion)"]
    lines.append("")
    shown = f" In words: {doc['conclusion']}." if doc.get("conclusion") else ""
    lines.append(
        f"**Conclusion.** {doc['verdict'].capitalize()}: {doc['reason']}.{shown} "
        f"This holds under exactly the setup above{' (emulated hardware)' if doc['emulated'] else ''}."
    )
    lines.append("")
    lines.append("**Pitfalls.**")
    lines += [f"- {p}" for p in doc["pitfalls"]] or ["- none recorded by this run's evidence"]
    if doc.get("plots"):
        lines.append("")
        lines += [f"![{doc['lab']} {Path(p).stem}]({doc['lab']}/{p})" for p in doc["plots"]]
    lines.append("")
    return "\n".join(lines)


def build(labs_dir: str | Path) -> Path:
    """Rebuild LABS_DIR/report.md from every <lab>/lab.json present (lab order of the catalogue)."""
    labs_dir = Path(labs_dir)
    docs = []
    for lab in LABS:
        p = labs_dir / lab / "lab.json"
        if p.is_file():
            docs.append(orjson.loads(p.read_bytes()))
    out = ["# quickmap labs", ""]
    if docs:
        out.append("| lab | engine | verdict |")
        out.append("|---|---|---|")
        out += [
            f"| {d['lab']} | {d['engine']}{' (emulated)' if d['emulated'] else ''} | {d['verdict']} |"
            for d in docs
        ]
        out.append("")
    else:
        out.append("No lab has been judged in this run yet.")
    out += [section(d) for d in docs]
    path = labs_dir / "report.md"
    write_text(path, "\n".join(out) + "\n")
    return path
