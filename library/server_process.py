#!/usr/bin/python
# Copyright: quickmap contributors
# Apache-2.0
"""Ansible module: start a server from its rendered script and record it; stop only what was recorded."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: server_process
short_description: Start an inference server and record what was started; stop only that
description:
  - >-
    O(state=started) picks the next start number N of this host in O(server_dir), saves O(script) as
    C(<name>.startN_server_cmd.txt) with every secret masked as C(***) (the one redaction rule of
    C(module_utils/redact.py)), runs the script with C(bash -s -- LOG) (LOG is
    C(<name>.startN.log); no earlier start's log or command is ever overwritten) and records what it
    started in C(<name>.startN.server.json): for the process runtime the PID the script prints, its start
    time (C(/proc/<pid>/stat) field 22), the boot id and its command line (read once the
    C(setsid)/C(nohup) exec chain settled; the values of secret flags masked, and masked the same way
    when compared); for the docker runtime the container name and the ID
    C(docker run -d) printed. The same record is copied to C(<state_dir>/<name>.json) so that a later
    run's preflight can find a server still running.
  - >-
    Secrets reach the server through the environment only: O(secret_env) (for docker written to
    O(env_file), mode 0600 in a mode 0700 directory, passed with C(--env-file)) and O(secret_args_env),
    the values of secret flags that the script refers to as C("${QUICKMAP_SECRET_...}").
  - >-
    O(state=stopped) reads every start record of this host in O(server_dir) (one run's records only, so
    C(--tags stop -e run_id=X) never touches another run's server). A process is signalled only when its
    PID, start time, boot id and command line all still match the record: its process group gets
    SIGTERM, then SIGKILL after O(grace_s). A container is removed only when the container of that name
    still has the recorded ID, after its C(docker inspect) and C(docker logs) were saved (secret values
    masked). Anything that no longer matches is left alone and named in RV(left_alone) with the reason.
    The secrets directory of O(env_file) is removed.
  - >-
    O(state=logs) saves the current C(docker logs) of the latest recorded container (masked) to its
    start's log.
  - In check mode nothing is written, started or signalled.
version_added: "0.3.0"
author: quickmap contributors (!UNKNOWN)
options:
  state:
    description: What to do.
    type: str
    choices: [started, stopped, logs]
    required: true
  name:
    description: File name prefix of this server's files (the inventory host name).
    type: str
    required: true
  server_dir:
    description: The run's server directory on the node (created when missing).
    type: path
    required: true
  state_dir:
    description: Node-level directory that outlives runs; holds C(<name>.json), the latest start's record.
    type: path
    required: true
  run_id:
    description: The run the server belongs to (written into the record).
    type: str
    required: true
  runtime:
    description: How the script starts the server.
    type: str
    choices: [process, docker]
    default: process
  script:
    description:
      - The start script (bash). It gets the log path as C($1) and prints the PID or container ID last.
    type: str
  secret_env:
    description: Secret environment of the server (values never saved; docker gets them through O(env_file)).
    type: dict
    default: {}
  secret_args_env:
    description:
      - Values of secret flags, handed to the script's environment only (C("${QUICKMAP_SECRET_...}")).
    type: dict
    default: {}
  env_file:
    description:
      - Docker runtime with secrets, path of the C(--env-file) the script names; its directory is private.
    type: path
  container_name:
    description: Docker runtime, the container name.
    type: str
  docker:
    description: The docker command (name on PATH or a path).
    type: str
    default: docker
  grace_s:
    description: Seconds between SIGTERM and SIGKILL when stopping a process.
    type: float
    default: 15
  settle_s:
    description: Seconds to wait for the started PID to exec the server (its command line is recorded then).
    type: float
    default: 2
attributes:
  check_mode:
    description: Can run in check mode and return a prediction of changed status without changing the target.
    support: full
  diff_mode:
    description: Returns details on what changed (or would change in check mode) when run in diff mode.
    support: none
notes:
  - Identity checks read C(/proc) (Linux).
"""

EXAMPLES = r"""
- name: Engine | start the server and record it
  server_process:
    state: started
    name: "{{ inventory_hostname }}"
    server_dir: /data/quickmap/run1/server
    state_dir: /data/quickmap/.state
    run_id: run1
    script: "{{ engine_server_cmd }}"
    secret_env: "{{ engine_secret_values }}"
  no_log: true

- name: Engine | stop this run's server (only if it is still the one recorded)
  server_process:
    state: stopped
    name: "{{ inventory_hostname }}"
    server_dir: /data/quickmap/run1/server
    state_dir: /data/quickmap/.state
    run_id: run1
"""

RETURN = r"""
start:
  description: The start number N of this server start (state=started).
  returned: when state=started
  type: int
pid:
  description: PID of the started server (process runtime).
  returned: when state=started and runtime=process
  type: int
container_id:
  description: ID of the started container (docker runtime).
  returned: when state=started and runtime=docker
  type: str
files:
  description: Paths of this start's files (cmd, log, record, gate, inspect).
  returned: when state=started or state=logs
  type: dict
stopped:
  description: One line per recorded server that was stopped (TERM) or killed (KILL) or removed.
  returned: when state=stopped
  type: list
  elements: str
left_alone:
  description: One line per recorded server that no longer matched its record, with the reason.
  returned: when state=stopped
  type: list
  elements: str
msg:
  description: One-line summary.
  returned: always
  type: str
"""

import glob  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

from ansible.module_utils.atomic_write import atomic_write_bytes, atomic_write_json, atomic_write_text  # noqa: E402
from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.proc_identity import alive, boot_id, identity, same_process  # noqa: E402
from ansible.module_utils.redact import mask_argv, redact_text  # noqa: E402

argument_spec = dict(
    state=dict(type="str", choices=["started", "stopped", "logs"], required=True),
    name=dict(type="str", required=True),
    server_dir=dict(type="path", required=True),
    state_dir=dict(type="path", required=True),
    run_id=dict(type="str", required=True),
    runtime=dict(type="str", choices=["process", "docker"], default="process"),
    script=dict(type="str"),
    secret_env=dict(type="dict", default={}, no_log=True),
    secret_args_env=dict(type="dict", default={}, no_log=True),
    env_file=dict(type="path"),
    container_name=dict(type="str"),
    docker=dict(type="str", default="docker"),
    grace_s=dict(type="float", default=15),
    settle_s=dict(type="float", default=2),
)

_SCHEMA = "quickmap.server/1"
# Programs the start script's background job passes through before it becomes the server (env and
# bash also run interpreter shims such as pyenv's).
_LAUNCHERS = ("bash", "sh", "dash", "env", "setsid", "nohup")
# The exec chain has settled when argv[0] is no launcher and the command line stayed the same this long.
_STABLE_S = 0.05
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def files_of(server_dir: str, name: str, start: int) -> dict:
    """This start's file paths: the command, log, record, NCCL gate verdict and docker inspect."""
    prefix = os.path.join(server_dir, f"{name}.start{start}")
    return {
        "cmd": prefix + "_server_cmd.txt",
        "log": prefix + ".log",
        "record": prefix + ".server.json",
        "gate": prefix + "_nccl_gate.json",
        "inspect": prefix + ".inspect.json",
    }


def start_numbers(server_dir: str, name: str) -> list[int]:
    """Start numbers already used by this host in ``server_dir`` (any file of a start counts)."""
    pattern = re.compile(re.escape(name) + r"\.start([0-9]+)[._]")
    found = set()
    for path in glob.glob(os.path.join(glob.escape(server_dir), glob.escape(name) + ".start*")):
        m = pattern.match(os.path.basename(path))
        if m:
            found.add(int(m.group(1)))
    return sorted(found)


def records(server_dir: str, name: str) -> list[tuple[int, str, dict | None]]:
    """(start, path, record or None when unreadable) for every start record of this host."""
    out = []
    for start in start_numbers(server_dir, name):
        path = files_of(server_dir, name, start)["record"]
        if not os.path.exists(path):
            continue
        try:
            with open(path) as handle:
                rec = json.load(handle)
        except (OSError, ValueError):
            rec = None
        out.append((start, path, rec if isinstance(rec, dict) else None))
    return out


def check_secret_env(env: dict, what: str) -> str | None:
    """The first rule a secret environment breaks (env names; docker env-file values are one line)."""
    for key, value in env.items():
        if not _ENV_NAME.fullmatch(str(key)):
            return f"{what} name {key!r} (rule: an environment name, [A-Za-z_][A-Za-z0-9_]*)"
        if "\n" in str(value) or "\0" in str(value):
            return (
                f"{what} {key} holds a newline or NUL (rule: one line; docker --env-file cannot carry more)"
            )
    return None


def _settled_identity(pid: int, settle_s: float) -> dict | None:
    """The started PID's identity once it exec'd the server (argv[0] no launcher, argv stable)."""
    deadline = time.monotonic() + settle_s
    ident = identity(pid, mask_argv)
    stable_since = time.monotonic()
    while time.monotonic() < deadline:
        if ident is None and not alive(pid):
            return None  # it exited (a refused flag): the health wait reports why
        settled = ident is not None and os.path.basename(ident["cmdline"][0]) not in _LAUNCHERS
        if settled and time.monotonic() - stable_since >= _STABLE_S:
            break
        time.sleep(0.01)
        now = identity(pid, mask_argv)  # None for a moment while the kernel swaps the exec'd image
        if now is None or ident is None or now["cmdline"] != ident["cmdline"]:
            stable_since = time.monotonic()
        ident = now
    return ident


def _write_env_file(path: str, env: dict) -> None:
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    body = "".join(f"{k}={v}\n" for k, v in sorted(env.items()))
    atomic_write_bytes(path, body.encode("utf-8"), mode=0o600, make_dirs=False)


def _remove_secret_dir(env_file: str | None) -> bool:
    if not env_file:
        return False
    directory = os.path.dirname(env_file)
    if os.path.isdir(directory):
        shutil.rmtree(directory, ignore_errors=True)
        return True
    return False


def start(module: AnsibleModule) -> dict:
    """Save the masked command, run the script, record the server it started."""
    p = module.params
    if not p["script"]:
        module.fail_json(msg="server_process: state=started needs script")
    if p["runtime"] == "docker" and not p["container_name"]:
        # Only a start needs the name: a stop and a log save take it from the start record.
        module.fail_json(msg="server_process: state=started with runtime=docker needs container_name")
    for env, what in ((p["secret_env"], "secret_env"), (p["secret_args_env"], "secret_args_env")):
        problem = check_secret_env(env, what)
        if problem:
            module.fail_json(msg=f"server_process: {problem}")
    docker_secrets = p["runtime"] == "docker" and bool(p["secret_env"])
    if docker_secrets and not p["env_file"]:
        module.fail_json(
            msg="server_process: runtime=docker with secret_env needs env_file (rule: docker --env-file)"
        )
    used = start_numbers(p["server_dir"], p["name"])
    number = (used[-1] + 1) if used else 1
    files = files_of(p["server_dir"], p["name"], number)
    if module.check_mode:
        return {
            "changed": False,
            "start": number,
            "files": files,
            "msg": f"check mode: would start {files['cmd']}",
        }
    secrets = [str(v) for v in list(p["secret_env"].values()) + list(p["secret_args_env"].values())]
    leaked = [v for v in secrets if v and v in p["script"]]
    if leaked:
        module.fail_json(
            msg="server_process: the start script holds a secret value "
            "(rule: secrets only in the environment)"
        )
    os.makedirs(p["server_dir"], exist_ok=True)
    atomic_write_text(files["cmd"], redact_text(p["script"], secrets))
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in p["secret_args_env"].items()})
    if p["runtime"] == "process":
        env.update({str(k): str(v) for k, v in p["secret_env"].items()})
    elif docker_secrets:
        _write_env_file(p["env_file"], p["secret_env"])
    proc = subprocess.run(
        ["bash", "-s", "--", files["log"]],
        input=p["script"].encode("utf-8"),
        cwd=p["server_dir"],
        env=env,
        capture_output=True,
        check=False,
    )
    out = proc.stdout.decode("utf-8", "replace").strip()
    err = redact_text(proc.stderr.decode("utf-8", "replace").strip(), secrets)
    last = out.splitlines()[-1].strip() if out else ""
    result = {"changed": True, "start": number, "files": files, "rc": proc.returncode}
    if proc.returncode != 0 or not last:
        _remove_secret_dir(p["env_file"] if docker_secrets else None)
        module.fail_json(
            msg=f"server_process: the start script {files['cmd']} exited {proc.returncode}: "
            f"{(err or out or 'no output').splitlines()[-1]}",
            stderr=err,
            **result,
        )
    record = {
        "schema": _SCHEMA,
        "run_id": p["run_id"],
        "host": p["name"],
        "start": number,
        "runtime": p["runtime"],
        "started_at": _now(),
        "server_dir": p["server_dir"],
        "log": files["log"],
        "cmd_file": files["cmd"],
        "secret_dir": os.path.dirname(p["env_file"]) if docker_secrets else None,
    }
    if p["runtime"] == "process":
        if not last.isdigit():
            module.fail_json(
                msg=f"server_process: the start script printed {last[:80]!r}, not a PID", **result
            )
        pid = int(last)
        ident = _settled_identity(pid, p["settle_s"])
        if ident is None:
            # It already exited (a refused flag): nothing to signal later; the health wait says why.
            ident = {"pid": pid, "start_ticks": None, "boot_id": boot_id(), "cmdline": None}
        record.update(ident)
        result["pid"] = pid
    else:
        record.update(container_name=p["container_name"], container_id=last)
        result["container_id"] = last
    atomic_write_json(files["record"], record)
    atomic_write_json(os.path.join(p["state_dir"], p["name"] + ".json"), dict(record, record=files["record"]))
    result["record"] = record
    what = f"pid {result['pid']}" if "pid" in result else f"container {last[:12]}"
    result["msg"] = f"started {what} (start {number}); command saved as {files['cmd']}"
    return result


def _docker(module: AnsibleModule, *args: str) -> tuple[int, str, str]:
    return module.run_command([module.params["docker"], *args], environ_update={"LC_ALL": "C"})


def _save_container_evidence(module: AnsibleModule, rec: dict, files: dict, secrets: list[str]) -> list[str]:
    problems = []
    name = rec["container_name"]
    rc, out, err = _docker(module, "inspect", name)
    if rc == 0:
        atomic_write_text(files["inspect"], redact_text(out, secrets))
    else:
        problems.append(f"docker inspect {name} failed: {err.strip()[:200]}")
    rc, out, err = _docker(module, "logs", name)
    if rc == 0:
        atomic_write_text(files["log"], redact_text(out + err, secrets))
    else:
        problems.append(f"docker logs {name} failed: {err.strip()[:200]}")
    return problems


def _container_id(module: AnsibleModule, name: str) -> str | None:
    rc, out, _ = _docker(module, "inspect", "--format", "{{.Id}}", name)
    return out.strip() if rc == 0 and out.strip() else None


def _stop_container(module: AnsibleModule, rec: dict, files: dict, secrets: list[str]) -> tuple[str, str]:
    name, want = rec.get("container_name"), str(rec.get("container_id") or "")
    have = _container_id(module, name) if name else None
    if have is None:
        return "absent", f"container {name} of start {rec.get('start')} is gone"
    if not want or (not have.startswith(want) and not want.startswith(have)):
        return "left_alone", (
            f"container {name} is {have[:12]}, not {want[:12] or '?'} that run {rec.get('run_id')} "
            "started; left alone"
        )
    problems = _save_container_evidence(module, rec, files, secrets)
    rc, _, err = _docker(module, "rm", "-f", name)
    if rc != 0:
        module.fail_json(msg=f"server_process: docker rm -f {name} failed: {err.strip()[:200]}")
    extra = f" ({'; '.join(problems)})" if problems else ""
    return "stopped", f"container {name} ({have[:12]}) removed after saving inspect and logs{extra}"


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return
    except PermissionError:
        os.kill(pid, sig)


def _stop_process(rec: dict, grace_s: float) -> tuple[str, str]:
    pid = rec.get("pid")
    ok, why = same_process(rec, mask_argv)
    if not ok:
        if isinstance(pid, int) and alive(pid):
            return (
                "left_alone",
                f"pid {pid} is not the server run {rec.get('run_id')} started: {why}; left alone",
            )
        return "absent", f"start {rec.get('start')}: {why}"
    _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not same_process(rec, mask_argv)[0]:
            return "stopped", f"pid {pid} (start {rec.get('start')}) stopped with SIGTERM"
        time.sleep(0.1)
    if same_process(rec, mask_argv)[0]:
        _signal_group(pid, signal.SIGKILL)
        return "stopped", f"pid {pid} (start {rec.get('start')}) killed with SIGKILL after {grace_s:g} s"
    return "stopped", f"pid {pid} (start {rec.get('start')}) stopped with SIGTERM"


def stop(module: AnsibleModule) -> dict:
    """Stop every recorded server of this host in this run's server dir that still matches its record."""
    p = module.params
    secrets = [str(v) for v in list(p["secret_env"].values()) + list(p["secret_args_env"].values()) if v]
    found = records(p["server_dir"], p["name"]) if os.path.isdir(p["server_dir"]) else []
    result: dict = {"changed": False, "stopped": [], "left_alone": [], "absent": []}
    if not found:
        result["msg"] = (
            f"run {p['run_id']} recorded no server on {p['name']} ({p['server_dir']}): nothing to stop"
        )
        return result
    index = os.path.join(p["state_dir"], p["name"] + ".json")
    for _start, path, rec in found:
        if rec is None:
            result["left_alone"].append(f"{path}: unreadable record; nothing signalled")
            continue
        if module.check_mode:
            result["absent"].append(f"check mode: would stop start {rec.get('start')} if it still matches")
            continue
        runtime = rec.get("runtime", p["runtime"])
        if runtime == "docker":
            files = files_of(p["server_dir"], p["name"], int(rec.get("start") or 0))
            kind, line = _stop_container(module, rec, files, secrets)
        else:
            kind, line = _stop_process(rec, p["grace_s"])
        result[kind].append(line)
        if kind == "stopped":
            result["changed"] = True
        if rec.get("secret_dir") and os.path.isdir(rec["secret_dir"]):
            shutil.rmtree(rec["secret_dir"], ignore_errors=True)
            result["changed"] = True
    if not module.check_mode and _remove_secret_dir(p["env_file"]):
        result["changed"] = True
    if not module.check_mode and os.path.exists(index):
        try:
            with open(index) as handle:
                pointed = json.load(handle).get("record")
        except (OSError, ValueError, AttributeError):
            pointed = None
        if pointed in {path for _s, path, _r in found} or pointed is None:
            os.unlink(index)
    parts = [
        f"{len(result[k])} {k.replace('_', ' ')}" for k in ("stopped", "left_alone", "absent") if result[k]
    ]
    detail = "; ".join(result["stopped"] + result["left_alone"])
    result["msg"] = f"{p['name']}, run {p['run_id']}: {', '.join(parts)}" + (f": {detail}" if detail else "")
    return result


def logs(module: AnsibleModule) -> dict:
    """Save the latest recorded container's current log (masked) to its start's log file."""
    p = module.params
    found = [r for r in records(p["server_dir"], p["name"]) if r[2] is not None]
    if not found:
        module.fail_json(msg=f"server_process: run {p['run_id']} recorded no server on {p['name']}")
    start_no, _path, rec = found[-1]
    files = files_of(p["server_dir"], p["name"], start_no)
    result = {"changed": False, "start": start_no, "files": files}
    if rec.get("runtime") != "docker" or module.check_mode:
        result["msg"] = f"log of start {start_no}: {files['log']}"
        return result
    secrets = [str(v) for v in list(p["secret_env"].values()) + list(p["secret_args_env"].values()) if v]
    rc, out, err = _docker(module, "logs", rec["container_name"])
    if rc != 0:
        module.fail_json(
            msg=f"server_process: docker logs {rec['container_name']} failed: {err.strip()[:200]}"
        )
    atomic_write_text(files["log"], redact_text(out + err, secrets))
    result.update(changed=True, msg=f"saved the log of container {rec['container_name']} to {files['log']}")
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec=argument_spec,
        supports_check_mode=True,
        required_if=[("state", "started", ("script",))],
    )
    handler = {"started": start, "stopped": stop, "logs": logs}[module.params["state"]]
    module.exit_json(**handler(module))


if __name__ == "__main__":
    main()
