# Copyright: quickmap contributors
# Apache-2.0
"""The node side of one benchmark case: save its command, run it under limits, judge its result file.

Why a module_utils file and not only the ``bench_case`` module: the same code runs two ways. On a
remote head it is shipped inside the module (AnsiballZ). When the head is the controller, the
``bench_case`` action plugin calls :func:`run_case` in its own process: building and unpacking the
AnsiballZ zip and recompiling ``module_utils.basic`` cost about 1.5 s per case, half of the
orchestration cost of a local case. One function for both keeps their results identical.

Stop semantics: the script runs in its own session. ``timeout`` (the case's own limit inside the
script) puts itself and the client in a process group of their own, so signalling only the script's
group would leave the client running. :func:`stop_session` therefore signals every process group of
the session.

Standard library plus the project's module_utils only (relative imports: this file is imported as
``ansible.module_utils.bench_node`` inside the module and as ``module_utils.bench_node`` on the
controller).
"""

from __future__ import annotations

import base64
import datetime as dt
import os
import signal
import subprocess
import time

from .atomic_write import atomic_write_text
from .bench_file import judge_file
from .proc_identity import stat_fields
from .redact import redact_text

# The module's options (the action plugin's controller-side options are not here).
ARGUMENT_SPEC = dict(
    case_dir=dict(type="path", required=True),
    script=dict(type="str"),
    run=dict(type="bool", default=True),
    rc=dict(type="int"),
    timeout_s=dict(type="int", required=True),
    case_timeout_s=dict(type="int"),
    kill_after_s=dict(type="int", default=10),
    result_file=dict(type="str", default="bench.json"),
    expect_requests=dict(type="int", required=True),
    expect_output_len=dict(type="int"),
    min_output_fraction=dict(type="float", default=1.0),
    health_url=dict(type="str", default=""),
    bring=dict(type="list", elements="str", default=[]),
)
REQUIRED_IF = [("run", True, ("script",))]

_TIMEOUT_RCS = (124, 137)
# A case file up to this size comes back inside the module's answer (no transfer of its own); a larger
# one is listed under `large` and fetched.
BRING_INLINE_MAX = 1 << 20
_STDOUT_TAIL_BYTES = 4096
_PROC = "/proc"
# How often a stop looks again whether the session's processes are gone.
_POLL_S = 0.05


def _utc_now() -> str:
    # dt.UTC is 3.11+; module code runs on the nodes' python (3.8+)
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"  # noqa: UP017


def healthy(url: str) -> bool:
    """Whether our own server answers its health URL with 2xx (never through a proxy)."""
    import urllib.error  # only after a failure: keeps the start-up short
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # our own server: no proxy
    try:
        with opener.open(url, timeout=5) as resp:
            return 200 <= resp.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def session_groups(sid: int, proc: str = _PROC) -> list[int]:
    """Process group ids of every live process in session ``sid`` (from /proc/<pid>/stat), sorted.

    A session id stays valid after its leader exits, and the kernel does not hand out a PID that is
    still in use as a session or group id, so this finds exactly the script's processes.
    """
    try:
        names = os.listdir(proc)
    except OSError:
        return []
    groups: set[int] = set()
    for name in names:
        if not name.isdigit():
            continue
        fields = stat_fields(int(name), proc)
        # after the command name: state, ppid, pgrp, session, ...
        if not fields or len(fields) < 4 or fields[3] != str(sid):
            continue
        if fields[0] == "Z":  # a zombie holds no group worth signalling
            continue
        groups.add(int(fields[2]))
    return sorted(groups)


def signal_session(sid: int, sig: int, proc: str = _PROC) -> list[int]:
    """Send ``sig`` to every process group of session ``sid`` (and its own group); the groups hit."""
    hit = []
    for pgid in sorted(set(session_groups(sid, proc)) | {sid}):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            continue
        hit.append(pgid)
    return hit


def stop_session(proc: subprocess.Popen, kill_after_s: float) -> bytes:
    """SIGTERM every group of the script's session, SIGKILL what is left after ``kill_after_s``.

    Returns what the script printed meanwhile. The client gets the grace to write the records it has.
    """
    sid = proc.pid
    signal_session(sid, signal.SIGTERM)
    deadline = time.monotonic() + kill_after_s
    out, done = b"", False
    try:
        out, _err = proc.communicate(timeout=kill_after_s)
        done = True
    except subprocess.TimeoutExpired:
        pass
    # The script may be gone while the client (a group of its own) still writes: wait for the session.
    while session_groups(sid) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    if session_groups(sid) or proc.poll() is None:
        signal_session(sid, signal.SIGKILL)
    if not done:
        try:  # a process that left the session (setsid) may hold the pipe: do not wait on it forever
            out, _err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return out


def run_script(case_dir: str, timeout_s: int, kill_after_s: int, text: str | None = None) -> dict:
    """Run bench_cmd.txt (or ``text`` on stdin) in its own session; on timeout stop the whole session."""
    started_at, t0 = _utc_now(), time.monotonic()
    proc = subprocess.Popen(
        ["bash", "bench_cmd.txt"] if text is None else ["bash", "-s"],
        cwd=case_dir,
        stdin=subprocess.DEVNULL if text is None else subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    killed = False
    try:
        out, _err = proc.communicate(input=None if text is None else text.encode("utf-8"), timeout=timeout_s)
    except KeyboardInterrupt:
        # Ctrl-C (or SIGTERM) of the run: the client lives in its own session and would run on after
        # us. Stop it the way its timeout would, so it writes what it measured.
        stop_session(proc, kill_after_s)
        raise
    except subprocess.TimeoutExpired:
        killed = True
        out = stop_session(proc, kill_after_s)
    rc = None if killed else proc.returncode
    return {
        "rc": rc,
        "timed_out": killed or rc in _TIMEOUT_RCS,
        "limit": "safety_limit" if killed else ("case_timeout" if rc in _TIMEOUT_RCS else None),
        "started_at": started_at,
        "ended_at": _utc_now(),
        "wall_s": round(time.monotonic() - t0, 3),
        "stdout_tail": out[-_STDOUT_TAIL_BYTES:].decode("utf-8", "replace"),
    }


def check_args(p: dict) -> str | None:
    """The first rule a parameter breaks, as one line naming the value; None when all hold."""
    if p["timeout_s"] < 1:
        return f"bench_case: timeout_s={p['timeout_s']} (rule: >= 1 second)"
    if p["case_timeout_s"] is not None and not 1 <= p["case_timeout_s"] <= p["timeout_s"]:
        return (
            f"bench_case: case_timeout_s={p['case_timeout_s']} "
            f"(rule: 1 <= case_timeout_s <= timeout_s={p['timeout_s']})"
        )
    if p["kill_after_s"] < 0:
        return f"bench_case: kill_after_s={p['kill_after_s']} (rule: >= 0)"
    if p["expect_requests"] < 1:
        return f"bench_case: expect_requests={p['expect_requests']} (rule: >= 1)"
    if p["expect_output_len"] is not None and p["expect_output_len"] < 1:
        return f"bench_case: expect_output_len={p['expect_output_len']} (rule: >= 1)"
    if not 0.0 < p["min_output_fraction"] <= 1.0:
        return f"bench_case: min_output_fraction={p['min_output_fraction']} (rule: 0 < f <= 1)"
    if os.path.isabs(p["result_file"]) or ".." in p["result_file"].split("/"):
        return f"bench_case: result_file={p['result_file']!r} (rule: a path inside case_dir)"
    for name in p.get("bring") or []:
        if not name or "/" in name or name in (".", ".."):
            return f"bench_case: bring item {name!r} (rule: a file name in case_dir, no '/')"
    return None


def limit_message(p: dict, limit: str | None) -> str:
    """Which limit stopped the client, with the value that was configured for it."""
    case_limit = p["case_timeout_s"]
    if limit == "safety_limit":
        given = f"case timeout {case_limit} s + grace" if case_limit else "case timeout + grace"
        return (
            f"the case script ran past the safety limit of {p['timeout_s']} s ({given}): the client's own "
            "timeout did not end it, so its process group was stopped"
        )
    if case_limit:
        return (
            f"the client ran past its case timeout of {case_limit} s "
            "(bench_timeout_s / bench_case_timeouts) and was stopped"
        )
    return "the client ran past its case timeout and was stopped (exit code of timeout)"


def run_case(p: dict, check_mode: bool = False) -> dict:
    """Save the command, run it, judge the result file; ``passed`` says whether the case succeeded.

    ``p`` holds every option of :data:`ARGUMENT_SPEC`, already validated and converted. A broken rule
    returns ``{"failed": True, "msg": ...}`` before anything is written or run.
    """
    problem = check_args(p)
    if problem:
        return {"failed": True, "msg": problem}
    case_dir = p["case_dir"]
    if check_mode:
        return {
            "changed": False,
            "passed": True,
            "timed_out": False,
            "limit": None,
            "server_alive": None,
            "reason": None,
            "msg": f"check mode: would save and run {case_dir}/bench_cmd.txt",
        }
    if p["run"]:
        # Saved through the one secret rule; when it masked something the real text runs from memory.
        saved = redact_text(p["script"])
        atomic_write_text(os.path.join(case_dir, "bench_cmd.txt"), saved)
        ran = run_script(
            case_dir, p["timeout_s"], p["kill_after_s"], None if saved == p["script"] else p["script"]
        )
    else:
        timed_out = p["rc"] in _TIMEOUT_RCS
        ran = {"rc": p["rc"], "timed_out": timed_out, "limit": "case_timeout" if timed_out else None}
    result = judge_file(
        os.path.join(case_dir, p["result_file"]),
        p["expect_requests"],
        p["expect_output_len"],
        p["min_output_fraction"],
    )
    result.update(ran, changed=True, server_alive=None)
    if ran["timed_out"]:
        result.update(passed=False, msg=f"{case_dir}: {limit_message(p, ran['limit'])}; {result['msg']}")
    if not result["passed"] and p["health_url"]:
        result["server_alive"] = healthy(p["health_url"])
    if p.get("bring"):
        result["files"] = collect_files(case_dir, p["bring"])
    return result


def collect_files(case_dir: str, names: list) -> dict:
    """The case files a remote controller wants, in one answer: each present one up to
    BRING_INLINE_MAX bytes inline (base64), larger ones named under ``large``, absent ones left out.

    Why: fetching them one by one cost an SSH transfer each, and an absent one (a reference client's
    files when none ran) a failed transfer and its fallbacks: most of a case's Ansible time on the rig.
    """
    inline, large = {}, []
    for name in names:
        try:  # never through a link: the answer carries only the case directory's own files
            fd = os.open(os.path.join(case_dir, name), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue  # absent, unreadable or a link: nothing to bring
        try:
            with os.fdopen(fd, "rb") as f:
                if os.fstat(f.fileno()).st_size > BRING_INLINE_MAX:
                    large.append(name)
                    continue
                inline[name] = base64.b64encode(f.read()).decode("ascii")
        except OSError:
            continue  # absent (or unreadable): nothing to bring
    return {"inline": inline, "large": large}
