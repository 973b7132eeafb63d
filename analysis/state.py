"""Case and run state: meta.json / manifest.json updates, the resume test and bench checks.

These run once per case from Ansible, so they import nothing heavy (no numpy/pandas/matplotlib).
Every write goes through :mod:`analysis.atomic` and merges into the existing file, so a field a
role wrote earlier is never lost.
"""

from __future__ import annotations

import platform
import re
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from analysis.atomic import read_json_object, write_json
from analysis.errors import InputError
from analysis.rawload import Loaded, all_finite, load_result, load_sglang_summary
from analysis.values import as_int
from module_utils.bench_file import detect_format, summarize
from module_utils.bench_node import healthy
from module_utils.verdicts import judge_case

try:
    from module_utils import redact as _redact
except ImportError:  # not run from the repository root: module_utils/ sits next to this package
    sys.path.append(str(Path(__file__).resolve().parents[1]))
    from module_utils import redact as _redact

_RESERVED = {"status", "history"}
_INT_KEYS = {"rep", "isl", "osl", "concurrency", "num_prompts", "warmup"}
_FLOAT_KEYS = {"injection_sent_epoch_s", "background_main_started_epoch_s"}


def now_iso() -> str:
    """ISO-8601 UTC timestamp with milliseconds, e.g. 2026-12-02T14:30:00.123Z."""
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


# ---------------------------------------------------------------- --set parsing


def _coerce(key: str, value: str, flag: str, target: str | None) -> Any:
    if key in _INT_KEYS:
        try:
            return int(value)
        except ValueError:
            raise InputError(target, f"{flag} {key}={value}", "expected an integer value") from None
    if key in _FLOAT_KEYS:
        try:
            return float(value)
        except ValueError:
            raise InputError(
                None, f"{flag} {key}={value}", "expected a number (unix epoch seconds)"
            ) from None
    return value


def parse_assignments(
    sets: list[str] | None, set_jsons: list[str] | None, target: str | Path | None = None
) -> dict[str, Any]:
    """``--set k=v`` (string; known numeric keys coerced) and ``--set-json k=JSON`` into one dict.

    ``target`` is the file the values are for, so an error names it.
    """
    target = str(target) if target is not None else None
    out: dict[str, Any] = {}
    for flag, items in (("--set", sets or []), ("--set-json", set_jsons or [])):
        for item in items:
            key, sep, value = item.partition("=")
            key = key.strip()
            if not sep or not key:
                raise InputError(target, f"{flag} {item!r}", "expected key=value")
            if key in _RESERVED:
                raise InputError(target, f"{flag} {key}", "is managed by the subcommand; use --status")
            if flag == "--set":
                out[key] = _coerce(key, value, flag, target)
            else:
                try:
                    out[key] = orjson.loads(value)
                except orjson.JSONDecodeError as exc:
                    raise InputError(
                        target, f"{flag} {key}", f"value is not valid JSON ({exc.msg})"
                    ) from None
    return out


# ---------------------------------------------------------------- case meta


def _defaults_from_path(case_dir: Path) -> dict[str, Any]:
    """case_id/rep/role/suite guessed from the directory layout, used only when not already set."""
    parts = case_dir.resolve().parts
    out: dict[str, Any] = {}
    if len(parts) >= 3 and parts[-3] == "cases" and parts[-1].startswith("rep"):
        out = {"suite": "fixed", "case_id": parts[-2]}
        rep = as_int(parts[-1][3:])
    elif len(parts) >= 3 and parts[-3] == "mixed" and parts[-2].startswith("rep"):
        out = {"suite": "mixed", "role": parts[-1], "case_id": "mixed"}
        rep = as_int(parts[-2][3:])
    else:
        return out
    if rep is not None:
        out["rep"] = rep
    return out


def _update_meta(case_dir: Path, status: str, fields: dict[str, Any], error: dict[str, Any] | None) -> str:
    meta_path = case_dir / "meta.json"
    meta = read_json_object(meta_path)
    if meta.get("status") == "completed" and status in ("planned", "running"):
        return f"{meta_path}: status is completed; left unchanged (resume never rewrites a completed case)"
    for key, value in _defaults_from_path(case_dir).items():
        meta.setdefault(key, value)
    meta.update(fields)
    stamp = now_iso()
    entry: dict[str, Any] = {"status": status, "time": stamp}
    # Times the caller measured itself (e.g. the client's own start/end) win over "now".
    if status == "running" and "started_at" not in fields:
        meta["started_at"] = stamp
    if status in ("completed", "failed") and "ended_at" not in fields:
        meta["ended_at"] = stamp
    if error is not None:
        meta.update(error)
        entry.update(error)
    elif "error_type" in meta:
        # A new attempt: keep the old error, but not where it would contradict the new status.
        meta["last_error"] = {"error_type": meta.pop("error_type"), "reason": meta.pop("reason", None)}
    meta["status"] = status
    history = meta.get("history")
    meta["history"] = [*(history if isinstance(history, list) else []), entry]
    write_json(meta_path, redact(meta))  # bench_cmd may carry an HF_TOKEN=… or --api-key
    return f"{meta_path}: status {status}"


def write_case(case_dir: str | Path, status: str, fields: dict[str, Any]) -> str:
    """Merge ``fields`` into CASE_DIR/meta.json and move it to ``status``."""
    return _update_meta(Path(case_dir), status, fields, None)


def mark_case_failed(
    case_dir: str | Path, error_type: str, reason: str | None, fields: dict[str, Any] | None = None
) -> str:
    """Status ``failed`` with an error type (also applies to a case that said completed)."""
    return _update_meta(
        Path(case_dir), "failed", fields or {}, {"error_type": error_type, "reason": reason or error_type}
    )


# ---------------------------------------------------------------- manifest


def redact(obj: Any) -> Any:
    """Drop secret keys and mask secret-looking assignments/flags/tokens inside string values.

    The rule is quickmap's one secret rule (module_utils/redact.py), shared with the saved commands
    and run.log.
    """
    return _redact.redact(obj)


def _git_state(repo: Path) -> dict[str, Any]:
    import subprocess  # lazy: only the manifest's first write needs it

    def git(*args: str) -> str | None:
        try:
            res = subprocess.run(
                ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return res.stdout.strip() if res.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"repo": str(repo), "commit": None, "dirty": None, "note": "not a git checkout"}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"repo": str(repo), "commit": commit, "dirty": bool(status) if status is not None else None}


def _version(dist: str) -> str | None:
    import importlib.metadata  # lazy: costs ~25 ms and only the manifest needs it

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def write_manifest(
    run_dir: str | Path, fields: dict[str, Any], nccl_env: list[str] | None, status: str | None = None
) -> str:
    """Merge fields into RUN_DIR/manifest.json; the first write records provenance.

    ``status`` (``running``) reopens a run that is resumed, so a crash while it runs again is not
    left looking finished.
    """
    run_dir = Path(run_dir)
    path = run_dir / "manifest.json"
    manifest = read_json_object(path)
    env: dict[str, str] = {}
    for item in nccl_env or []:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise InputError(path, f"--nccl-env {item!r}", "expected NAME=VALUE")
        env[name.strip()] = value
    if "started_at" not in manifest:
        manifest["started_at"] = now_iso()
        manifest.setdefault("run_id", run_dir.resolve().name)
        manifest["git"] = _git_state(Path(__file__).resolve().parent.parent)
        manifest["tool_versions"] = {
            "python": platform.python_version(),
            "ansible_core": _version("ansible-core"),
            "quickmap": _version("quickmap"),
            "engine_image": None,
        }
    manifest.update(fields)
    if env:
        manifest["nccl_env"] = {**(manifest.get("nccl_env") or {}), **env}
    image = fields.get("engine_image") or fields.get("image")
    if image is not None and isinstance(manifest.get("tool_versions"), dict):
        manifest["tool_versions"]["engine_image"] = image
    manifest.setdefault("status", "running")
    if status is not None:
        manifest["status"] = status
        manifest.pop("ended_at", None)
    write_json(path, redact(manifest))
    return f"{path}: updated"


def iter_case_dirs(run_dir: Path) -> list[tuple[str, Path]]:
    """All rep directories of a run: ("fixed", cases/<case>/rep<N>) and ("mixed", mixed/rep<N>/<role>)."""
    out: list[tuple[str, Path]] = []
    cases = run_dir / "cases"
    if cases.is_dir():
        out += [("fixed", p) for p in sorted(cases.glob("*/rep*")) if p.is_dir()]
    mixed = run_dir / "mixed"
    if mixed.is_dir():
        out += [("mixed", p) for p in sorted(mixed.glob("rep*/*")) if p.is_dir()]
    return out


def case_counts(run_dir: Path) -> dict[str, Any]:
    """Count rep directories by meta status (``unknown`` = a result file but no meta.json)."""
    by_status: dict[str, int] = {}
    by_error: dict[str, int] = {}
    for _suite, d in iter_case_dirs(run_dir):
        try:
            meta = read_json_object(d / "meta.json")
        except InputError:  # counted, never fatal: the run must still close and report
            by_status["unreadable"] = by_status.get("unreadable", 0) + 1
            continue
        if meta:
            status = str(meta.get("status", "unknown"))
        elif (d / "bench.json").exists():
            status = "unknown"
        else:
            status = "empty"
        by_status[status] = by_status.get(status, 0) + 1
        if status == "failed":
            err = str(meta.get("error_type", "UNSPECIFIED"))
            by_error[err] = by_error.get(err, 0) + 1
    return {"total": sum(by_status.values()), **by_status, "failed_by_error_type": by_error}


def complete_manifest(run_dir: str | Path, status: str) -> str:
    """Record the end of the run: end time, final status and case counts."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError(run_dir, None, "run directory not found")
    path = run_dir / "manifest.json"
    manifest = read_json_object(path)
    manifest["ended_at"] = now_iso()
    manifest["status"] = status
    manifest["case_counts"] = case_counts(run_dir)
    write_json(path, redact(manifest))
    return f"{path}: status {status}, {manifest['case_counts']['total']} case dir(s)"


# ---------------------------------------------------------------- checks


def judge_loaded(
    loaded: Loaded, expect: int | None, expect_osl: int | None, min_output_fraction: float = 1.0
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(facts, verdict) of a loaded result by the one case judge (``module_utils/verdicts.py``)."""
    fmt = detect_format(loaded.obj)
    if fmt is None or fmt == "aiperf_record":
        raise InputError(
            loaded.path,
            f"line {loaded.line}" if loaded.line else None,
            "not a recognised result (expected quickmap.loadgen/1, SGLang, vLLM, guidellm or AIPerf keys "
            "such as 'completed')",
        )
    facts = summarize(loaded.obj, fmt, all_finite)
    return facts, judge_case(facts, expect, expect_osl, min_output_fraction)


def check_loaded(
    loaded: Loaded, expect: int, expect_osl: int | None, min_output_fraction: float = 1.0
) -> str | None:
    """None when the case judge passes the result; else the reason, one line naming the file."""
    facts, verdict = judge_loaded(loaded, expect, expect_osl, min_output_fraction)
    reason = verdict["reason"]
    if reason is None:
        return None
    if reason == "count" and facts["completed"] is not None:
        extra = f", {facts['failed']} failed" if facts["failed"] else ""
        return f"{loaded.path}: {facts['completed']} completed requests{extra}, expected {expect}"
    if reason == "short_output" and verdict["output_check"] == "per_request" and facts["output_lens"]:
        lens = facts["output_lens"]
        return (
            f"{loaded.path}: {verdict['short']} of {len(lens)} requests produced fewer than {expect_osl} "
            f"output tokens (min {min(lens)}; rule: at least {min_output_fraction:g} of them reach it)"
        )
    return f"{loaded.path}: {verdict['problem']}"


def check_bench(
    path: str | Path, expect: int, expect_osl: int | None, min_output_fraction: float = 1.0
) -> tuple[int, str]:
    """(exit code, message) for ``check-bench``."""
    # A big SGLang --output-details file: counts, lengths and the tail are enough (see rawload).
    loaded = load_sglang_summary(path) or load_result(path)
    reason = check_loaded(loaded, expect, expect_osl, min_output_fraction)
    if reason:
        return 1, reason
    note = ""
    if loaded.obj.get("reliable") is False:
        reasons = (loaded.obj.get("reliability") or {}).get("reasons") or []
        note = f" (warning: client timing unreliable: {'; '.join(map(str, reasons)) or 'no reason given'})"
    return 0, f"{loaded.path}: ok, {expect} completed requests{note}"


def case_done(case_dir: str | Path, expect: int | None) -> tuple[int, str]:
    """(exit code, message) for ``case-done``: meta completed AND bench.json complete."""
    case_dir = Path(case_dir)
    meta_path = case_dir / "meta.json"
    if not meta_path.exists():
        return 1, f"{case_dir}: not done: no meta.json"
    meta = read_json_object(meta_path, missing_ok=False)
    status = meta.get("status")
    if status != "completed":
        return 1, f"{case_dir}: not done: meta status is {status!r}"
    if expect is None:
        expect = as_int(meta.get("num_prompts"))
        if expect is None:
            raise InputError(
                meta_path, "field 'num_prompts'", "missing; expected an integer (or pass --expect-requests)"
            )
    # The rules the bench_case module judged the case by: the case's OSL, the fraction it was given.
    osl = as_int(meta.get("osl"))
    fraction = meta.get("min_output_fraction", 1.0)
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 < fraction <= 1:
        raise InputError(meta_path, "field 'min_output_fraction'", f"got {fraction!r}, expected 0 < f <= 1")
    try:
        loaded = load_sglang_summary(case_dir / "bench.json") or load_result(case_dir / "bench.json")
        reason = check_loaded(loaded, expect, osl if osl and osl > 0 else None, float(fraction))
    except InputError as exc:
        return 1, f"{case_dir}: not done: {exc}"
    if reason:
        return 1, f"{case_dir}: not done: {reason}"
    return 0, f"{case_dir}: done ({expect} requests)"


# Patterns are plain strings (compiled on first use by re's cache): importing this module is on
# the path of every per-case role call.
_OOM = (
    r"(?i)out of memory|OutOfMemoryError|Out of memory even after retracting|OOMKilled|oom-kill|"
    r"Cannot allocate memory|not enough memory"
)
_DEAD = (
    r"EngineDeadError|Scheduler hit an exception|Received sigquit|Segmentation fault|core dumped|"
    r"Killed process|exited with code [1-9]|Traceback \(most recent call last\)"
)
_TRANSPORT = (
    r"(?i)Connection refused|ConnectError|ClientConnectorError|Server disconnected|RemoteProtocolError|"
    r"ConnectionResetError|Connection reset|ReadError|ServerDisconnectedError|Broken pipe|stream_cut|"
    r"error_class.{0,4}(connection|stream_cut)"
)


def _tail(path: Path | None, limit: int = 4 << 20) -> str:
    if path is None or not path.is_file():
        return ""
    with path.open("rb") as fh:
        size = fh.seek(0, 2)
        fh.seek(max(0, size - limit))
        return fh.read().decode("utf-8", "replace")


def classify_failure(
    case_dir: str | Path,
    server_log: str | Path | None,
    health_url: str | None,
    timed_out: bool,
    server_alive: bool | None = None,
) -> tuple[str, str]:
    """(error type, evidence) from the server log, liveness, the timeout flag and bench.log.

    ``server_alive`` is a liveness answer already taken elsewhere (the node probes its own server,
    which the controller may not reach); when given, ``health_url`` only names it in the evidence.
    """
    case_dir = Path(case_dir)
    server_text = _tail(Path(server_log) if server_log else None)
    bench_text = _tail(case_dir / "bench.log")
    if m := re.search(_OOM, server_text) or re.search(_OOM, bench_text):
        return "OOM", f"log says {m.group(0)!r}"
    if server_alive is None and health_url:
        server_alive = healthy(health_url)
    if server_alive is False:
        return "SERVER_DEAD", f"{health_url or 'the server'} did not answer 2xx"
    if server_alive is None and (m := re.search(_DEAD, server_text)):
        return "SERVER_DEAD", f"server log says {m.group(0)!r}"
    if timed_out:
        return "TIMEOUT", "the client ran past its timeout"
    if m := re.search(_TRANSPORT, bench_text):
        return "TRANSPORT_ERROR", f"bench.log says {m.group(0)!r}"
    return "BENCH_FAILED", "no OOM, dead server, timeout or transport error found"
