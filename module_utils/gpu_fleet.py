# Copyright: quickmap contributors
# Apache-2.0
"""Judge a fleet of GPU calibration profiles: which GPU is slow, against its peers and its datasheet.

Pure code (no I/O): the ``gpu_health`` module reads the files and passes the parsed documents in, so
the rule is unit-tested on plain dicts. A profile is the ``profile.json`` that ``python -m
enginesim.calibrate`` writes (schema ``enginesim.hardware-profile/1``); only two of its figures are
judged, the two a sick GPU shows first: HBM read bandwidth and the bf16 GEMM rate at a prefill shape.

Fail-closed: a GPU is healthy only when its profile exists, is a GPU profile, carries both figures and
both pass both rules. A CPU profile (the calibration's no-GPU path) is recorded, never judged as a GPU.
Module code: stays Python 3.8-compatible (it runs on the nodes' python).
"""

from __future__ import annotations

import math
import re

PROFILE_SCHEMA = "enginesim.hardware-profile/1"
GPU_ID = re.compile(r"^(?:[0-9]+|cpu|all)$")

# (measured key, datasheet key in profile.profile, label, display scale, unit)
FIGURES = (
    ("mem_read_bytes_per_s", "mem_bw", "HBM read", 1e12, "TB/s"),
    ("gemm_bf16_prefill_flops_per_s", "peak_flops", "bf16 GEMM", 1e12, "TFLOP/s"),
)


class GateInputError(ValueError):
    """Gate settings or a result entry that cannot be judged (the message names the value and the rule)."""


def rule_text(tolerance: float, datasheet_margin: float) -> str:
    """The rule in one line (it goes into every failure message)."""
    return (
        f"every GPU's HBM read bandwidth and bf16 GEMM rate at most {tolerance:.0%} below the median of "
        f"its fleet (same GPU model) and at most {datasheet_margin:.0%} below its datasheet"
    )


def check_settings(tolerance: float, datasheet_margin: float, expect_device: str) -> None:
    """Refuse settings that would make the gate meaningless."""
    for name, value in (("tolerance", tolerance), ("datasheet_margin", datasheet_margin)):
        if not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 <= value < 1:
            raise GateInputError(f"{name}={value!r} (rule: a fraction in [0, 1), e.g. 0.10 for 10%)")
    if expect_device not in ("cuda", "cpu", "any"):
        raise GateInputError(f"expect_device={expect_device!r} (rule: one of cuda, cpu, any)")


def gpu_label(host: str, gpu: str) -> str:
    """``worker GPU 5`` / ``localhost CPU``: how a failure names the device."""
    if gpu == "all":
        return f"{host} (every GPU: the node failed before its GPUs were listed)"
    return f"{host} CPU" if gpu == "cpu" else f"{host} GPU {gpu}"


def fmt(value: float | None, scale: float, unit: str) -> str:
    return "n/a" if value is None else f"{value / scale:,.3g} {unit}"


def _positive(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _median(values: list[float]) -> float:
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2.0


def profile_problems(doc: object) -> list[str]:
    """Why a parsed profile.json cannot be judged (empty when it can)."""
    if not isinstance(doc, dict):
        return ["profile.json is not a JSON object"]
    if doc.get("schema") != PROFILE_SCHEMA:
        return [f"profile.json schema={doc.get('schema')!r}, expected {PROFILE_SCHEMA!r}"]
    if doc.get("device") not in ("cuda", "cpu"):
        return [f"profile.json device={doc.get('device')!r} (must be cuda or cpu)"]
    if not isinstance(doc.get("measured"), dict) or not isinstance(doc.get("profile"), dict):
        return ["profile.json has no 'measured' or 'profile' object"]
    return []


def device_name(doc: dict) -> str:
    """The GPU model a profile was measured on (the fleet groups by it)."""
    env = doc.get("environment") if isinstance(doc.get("environment"), dict) else {}
    name = env.get("device_name") or doc.get("profile", {}).get("name") or "unknown device"
    return str(name)


def judge_fleet(
    records: list[dict], tolerance: float, datasheet_margin: float, expect_device: str = "cuda"
) -> dict:
    """Judge every record; return ``{"passed", "rows", "failures", "fleet", "gated", "not_gated"}``.

    A record is ``{"host", "gpu", "profile": dict | None, "exit_code": int | str | None,
    "error": str | None, "log_tail": [str]}``. ``gpu`` is an index as a string, or ``"cpu"``.
    Why per GPU model: a mixed fleet's median would brand every GPU of the slower model as sick.
    """
    check_settings(tolerance, datasheet_margin, expect_device)
    rows: list[dict] = []
    for rec in records:
        host, gpu = str(rec.get("host") or ""), str(rec.get("gpu") or "")
        if not host or not GPU_ID.match(gpu):
            raise GateInputError(
                f"result entry host={host!r} gpu={gpu!r} (rule: a host name and a GPU index, 'cpu' or 'all')"
            )
        row: dict = {"host": host, "gpu": gpu, "label": gpu_label(host, gpu), "problems": []}
        row["exit_code"] = rec.get("exit_code")
        doc = rec.get("profile")
        if doc is None:
            why = rec.get("error") or "no profile.json"
            tail = [ln for ln in (rec.get("log_tail") or []) if ln.strip()]
            row["problems"].append(
                f"no profile ({why}; exit {rec.get('exit_code')!s}"
                + (f"; log: {tail[-1].strip()[:300]}" if tail else "")
                + ")"
            )
            row["state"] = "fail"
            rows.append(row)
            continue
        bad = profile_problems(doc)
        if bad:
            row["problems"] += bad
            row["state"] = "fail"
            rows.append(row)
            continue
        row["device"] = doc["device"]
        row["device_name"] = device_name(doc)
        row["profile_key"] = doc["profile"].get("key")
        row["datasheet"] = (doc.get("from_base") or {}).get("profile")
        for key, sheet_key, _label, _s, _u in FIGURES:
            v = doc["measured"].get(key)
            row[key] = v if _positive(v) else None
            d = doc["profile"].get(sheet_key)
            row["datasheet_" + key] = d if (_positive(d) and doc["device"] == "cuda") else None
        code = rec.get("exit_code")
        if code not in (0, "0", None):
            tail = [ln.strip() for ln in (rec.get("log_tail") or []) if "FAILED" in ln or "error" in ln]
            row["problems"].append(
                f"calibration exited with {code!s}" + (f" ({tail[-1][:300]})" if tail else "")
            )
        if doc["device"] == "cpu":
            if expect_device == "cuda":
                row["problems"].append(
                    "device=cpu where a GPU was expected (a CPU figure is never judged as a GPU)"
                )
                row["state"] = "fail"
            else:
                row["state"] = "fail" if row["problems"] else "not_gated"
            rows.append(row)
            continue
        if expect_device == "cpu":
            row["problems"].append("device=cuda where a CPU run was configured (expect_device=cpu)")
        row["state"] = "pending"
        rows.append(row)

    fleet: dict[str, dict] = {}
    gpu_rows = [r for r in rows if r.get("device") == "cuda" and r["state"] == "pending"]
    for r in gpu_rows:
        group = fleet.setdefault(r["device_name"], {"gpus": 0, "hosts": []})
        group["gpus"] += 1
        if r["host"] not in group["hosts"]:
            group["hosts"].append(r["host"])
    for name, group in fleet.items():
        members = [r for r in gpu_rows if r["device_name"] == name]
        for key, _sheet, _label, _s, _u in FIGURES:
            values = [r[key] for r in members if r[key] is not None]
            group["median_" + key] = _median(values) if values else None

    for r in gpu_rows:
        group = fleet[r["device_name"]]
        for key, _sheet, label, scale, unit in FIGURES:
            v = r[key]
            if v is None:
                r["problems"].append(f"{label}: no figure in the profile (section failed or not run)")
                continue
            med = group["median_" + key]
            r["vs_median_" + key] = v / med if med else None
            if med and v < med * (1.0 - tolerance):
                r["problems"].append(
                    f"{label} {fmt(v, scale, unit)} is {1 - v / med:.1%} below the fleet median "
                    f"{fmt(med, scale, unit)} of {group['gpus']} {r['device_name']} "
                    f"(tolerance {tolerance:.0%})"
                )
            sheet = r["datasheet_" + key]
            if sheet is None:
                r["problems"].append(f"{label}: no datasheet figure in the profile")
                continue
            r["vs_datasheet_" + key] = v / sheet
            if v < sheet * (1.0 - datasheet_margin):
                r["problems"].append(
                    f"{label} {fmt(v, scale, unit)} is {1 - v / sheet:.1%} below the datasheet "
                    f"{fmt(sheet, scale, unit)} ({r['datasheet']}; margin {datasheet_margin:.0%})"
                )
        r["state"] = "fail" if r["problems"] else "pass"
    for r in rows:
        if r["state"] == "pending":
            r["state"] = "fail" if r["problems"] else "pass"

    failures = [f"{r['label']}: {p}" for r in rows if r["state"] == "fail" for p in r["problems"]]
    gated = [r for r in rows if r["state"] in ("pass", "fail") and r.get("device") == "cuda"]
    not_gated = [r for r in rows if r["state"] == "not_gated"]
    passed = bool(rows) and not failures
    if not rows:
        failures.append("no calibration result to judge (rule: at least one GPU or CPU run)")
    return {
        "passed": passed,
        "rows": rows,
        "failures": failures,
        "fleet": fleet,
        "gated": len(gated),
        "not_gated": len(not_gated),
    }


def verdict_message(verdict: dict, tolerance: float, datasheet_margin: float, limit: int = 3) -> str:
    """One line: what passed (with the fleet medians) or each failing GPU and figure."""
    if not verdict["passed"]:
        shown = "; ".join(verdict["failures"][:limit])
        more = len(verdict["failures"]) - limit
        return f"GPU health gate failed closed (rule: {rule_text(tolerance, datasheet_margin)}): {shown}" + (
            f" (+{more} more)" if more > 0 else ""
        )
    parts = []
    for name, group in verdict["fleet"].items():
        medians = ", ".join(
            f"{label} median {fmt(group['median_' + key], scale, unit)}"
            for key, _sheet, label, scale, unit in FIGURES
        )
        vacuous = " (one GPU: the fleet comparison says nothing)" if group["gpus"] == 1 else ""
        parts.append(f"{group['gpus']} {name} on {len(group['hosts'])} node(s) pass{vacuous}: {medians}")
    if verdict["not_gated"]:
        parts.append(
            f"{verdict['not_gated']} CPU profile(s) recorded, not gated "
            "(a CPU figure is never judged as a GPU)"
        )
    if not verdict["gated"]:
        parts.insert(0, "no GPU judged")
    return "; ".join(parts)
