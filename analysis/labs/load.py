"""Read one lab directory (what the role left) into plain objects; the only I/O of the judge.

Layout (written by roles/labs): `plan.json`; per variant `<variant>/server/<host>.log` and
`<host>_server_cmd.txt`, `server_info.json`, `version.json`, `gpu_idle.json`, `gpus.txt`,
`metrics_final.prom`, `failed.json` (a variant that did not come up or whose step failed); per run
`<variant>/runs/<run>/{meta.json, bench.json, bench.log, metrics_before.prom, metrics_after.prom,
metrics_samples.prom, bench_cmd.txt}`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import orjson

from analysis.errors import InputError
from analysis.evidence import honesty, prom, requests
from analysis.labs import realtime


@dataclass
class Run:
    """One run's files. The /metrics scrapes are parsed when a figure first asks for them: most labs
    read counters of a few runs only, and parsing every scrape was a third of the judge's CPU."""

    name: str
    workload: dict[str, Any]
    status: str  # completed | failed | missing
    reason: str | None
    result: dict[str, Any] | None
    rdir: Path
    bench_log: str

    @property
    def ok(self) -> bool:
        return self.status == "completed" and self.result is not None

    @cached_property
    def before(self) -> prom.Scrape | None:
        return prom.read(self.rdir / "metrics_before.prom")

    @cached_property
    def after(self) -> prom.Scrape | None:
        return prom.read(self.rdir / "metrics_after.prom")

    @cached_property
    def samples(self) -> list[prom.Scrape]:
        return prom.read_samples(self.rdir / "metrics_samples.prom")

    def delta(self, *names: str) -> float | None:
        return prom.delta(self.before, self.after, *names)


@dataclass
class Variant:
    name: str
    args: list[str]
    engine_vars: dict[str, Any]
    runs: dict[str, Run]
    server_log: str
    server_cmd: str
    server_info: dict[str, Any] | None
    version: str | None
    gpu_idle: list[dict[str, Any]]
    gpus: str
    failed: dict[str, Any] | None
    alive: dict[str, Any] | None = None
    emulator: dict[str, Any] | None = None
    realtime: str | None = None
    realtime_reason: str = ""
    realtime_detail: dict[str, Any] = field(default_factory=dict)  # per run, and which reader judged
    time_scale: float = 1.0
    notes: list[str] = field(default_factory=list)

    @property
    def emulated(self) -> bool:
        return self.emulator is not None


def _json(path: Path) -> Any:
    if not path.is_file():
        return None
    try:
        return orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise InputError(path, None, f"not JSON ({exc.msg})") from None


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""


def read_plan(lab_dir: Path) -> dict[str, Any]:
    plan = _json(lab_dir / "plan.json")
    if not isinstance(plan, dict) or plan.get("schema") != "quickmap.labs.plan/1":
        raise InputError(lab_dir / "plan.json", None, "missing or not a quickmap.labs.plan/1 file")
    return plan


def _run(vdir: Path, spec: dict[str, Any]) -> Run:
    rdir = vdir / "runs" / spec["name"]
    meta = _json(rdir / "meta.json") or {}
    status = meta.get("status", "missing")
    result = None
    try:
        result = requests.read_result(rdir / "bench.json")
    except InputError as exc:
        status, meta["reason"] = "failed", str(exc)
    if status == "completed" and result is None:
        status, meta["reason"] = "failed", "meta says completed but bench.json is missing"
    return Run(
        name=spec["name"],
        workload=spec["workload"],
        status=status,
        reason=meta.get("reason"),
        result=result,
        rdir=rdir,
        bench_log=_text(rdir / "bench.log"),
    )


def _server_files(vdir: Path) -> tuple[str, str]:
    """The head's server log and command (the head's file names sort first is not assumed: the
    log holding the capacity announcement wins, else the longest)."""
    sdir = vdir / "server"
    if (sdir / "decode").is_dir():  # a P/D variant (pd_disagg): the decode instance's server stands for it
        sdir = sdir / "decode"
    logs = sorted(sdir.glob("*.log")) if sdir.is_dir() else []
    cmds = sorted(sdir.glob("*_server_cmd.txt")) if sdir.is_dir() else []
    texts = [_text(p) for p in logs]
    head = next((t for t in texts if "KV Cache is allocated" in t or "GPU KV cache size" in t), None)
    log = head if head is not None else max(texts, key=len, default="")
    return log, "\n".join(_text(p) for p in cmds)


def read_variant(lab_dir: Path, spec: dict[str, Any]) -> Variant:
    vdir = lab_dir / spec["name"]
    log, cmd = _server_files(vdir)
    info = _json(vdir / "server_info.json")
    version = _json(vdir / "version.json")
    gpu = _json(vdir / "gpu_idle.json")
    v = Variant(
        name=spec["name"],
        args=spec["args"],
        engine_vars=spec.get("engine_vars", {}),
        runs={r["name"]: _run(vdir, r) for r in spec.get("runs", [])},
        server_log=log,
        server_cmd=cmd,
        server_info=info if isinstance(info, dict) else None,
        version=(version or {}).get("version") if isinstance(version, dict) else None,
        gpu_idle=gpu if isinstance(gpu, list) else [],
        gpus=_text(vdir / "gpus.txt").strip(),
        failed=_json(vdir / "failed.json"),
        alive=_json(vdir / "server_alive.json"),
    )
    if v.version is None and v.server_info:
        v.version = v.server_info.get("version")
    v.emulator = honesty.emulator_evidence(v.server_info, log)
    if v.emulator is not None:
        try:
            v.time_scale = float(v.emulator.get("time_scale", 1.0) or 1.0)
        except (TypeError, ValueError):
            v.time_scale = 1.0
    # each run from its own scrapes (the quick map's judge); the server life's lag only as a fallback
    v.realtime, v.realtime_reason, v.realtime_detail = realtime.variant_verdict(
        {r.name: (r.rdir, r.ok) for r in v.runs.values()}, _emulated_lag(v)
    )
    return v


def _emulated_lag(v: Variant) -> dict[str, Any] | None:
    """The emulator's lag in emulated milliseconds (wall lag / time scale): what it does to a figure."""
    if v.emulator is None:
        return None
    lag = v.emulator.get("sched_lag_ms") or {}
    try:
        scaled = {k: float(lag[k]) / v.time_scale for k in ("p50", "p99", "max")}
    except (KeyError, TypeError, ValueError):
        return {"sched_lag_ms": None}
    return {"sched_lag_ms": scaled}


def read_lab(lab_dir: str | Path) -> tuple[dict[str, Any], dict[str, Variant]]:
    lab_dir = Path(lab_dir)
    plan = read_plan(lab_dir)
    return plan, {spec["name"]: read_variant(lab_dir, spec) for spec in plan["variants"]}
