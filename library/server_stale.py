#!/usr/bin/python
# Copyright: quickmap contributors
# Apache-2.0
"""Ansible module: detect a server left running by an earlier run before starting a new one."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: server_stale
short_description: Detect an inference server still running from an earlier run
description:
  - >-
    Collects evidence that a server from an earlier run is alive on this host, from any of the sources
    given: a listener on O(port) (with its pid and command line when visible), a start O(record) (the
    C(server_process) module's JSON: PID, start time, boot id and command line) whose process still
    runs as recorded, a O(pid_file) naming a live process, and a Docker container named
    O(container_name) in a running state.
  - >-
    With O(fail_on_stale=true) (the default) fails with one message listing the evidence (a record names
    its run), so preflight stops before a second server competes for the GPUs. A pid file whose process is
    gone, a record whose PID now belongs to another process (or none), or an exited container with the
    name, is reported (RV(leftovers)) but is not a running server.
  - >-
    Containers are listed with C(docker ps -a --filter name=NAME --format ...) printing ID, name and
    state separated by tabs; only the container named exactly O(container_name) counts.
    When O(docker) is not installed no container can be running, which is reported; when it errors,
    the module fails (it cannot prove that nothing runs).
  - Read-only, so it runs the same in check mode. The result always has C(changed=false).
version_added: "0.1.0"
author: quickmap contributors (!UNKNOWN)
options:
  port:
    description: The server's HTTP port.
    type: int
  host:
    description: The address the server binds (V(0.0.0.0) matches any listener on O(port)).
    type: str
    default: 0.0.0.0
  pid_file:
    description: A plain pid file (any live process it names counts; prefer O(record)).
    type: path
  record:
    description:
      - A start record of the C(server_process) module; counts only while PID, start time and command
        line match.
    type: path
  container_name:
    description: The container name the docker runtime gives the server.
    type: str
  docker:
    description: The docker command (name on PATH or a path).
    type: str
    default: docker
  fail_on_stale:
    description: Fail when a running server is found. Set V(false) to only report (RV(stale)).
    type: bool
    default: true
attributes:
  check_mode:
    description: Can run in check mode and return a prediction of changed status without changing the target.
    support: full
  diff_mode:
    description: Returns details on what changed (or would change in check mode) when run in diff mode.
    support: none
"""

EXAMPLES = r"""
- name: Preflight | no server left from an earlier run
  server_stale:
    port: "{{ engine_port }}"
    record: "{{ engine_state_dir }}/{{ inventory_hostname }}.json"
    container_name: "{{ engine_container_name }}"
"""

RETURN = r"""
stale:
  description: True when a running server was found.
  returned: always
  type: bool
evidence:
  description: One line per finding that shows a running server.
  returned: always
  type: list
  elements: str
leftovers:
  description: Remains that are not running (dead pid file, exited container).
  returned: always
  type: list
  elements: str
pids:
  description: Live pids found (listener owners and the pid file's process), with command lines.
  returned: always
  type: list
  elements: dict
container:
  description: The container found (id, name, state), or null.
  returned: when O(container_name) is set
  type: dict
container_checked:
  description: Whether docker was queried (false when docker is not installed).
  returned: when O(container_name) is set
  type: bool
msg:
  description: One-line verdict.
  returned: always
  type: str
"""

import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.net_probe import cmdline, describe, pid_alive, probe_port  # noqa: E402
from ansible.module_utils.proc_identity import same_process  # noqa: E402
from ansible.module_utils.redact import mask_argv  # noqa: E402

RULE = "stop the earlier server before a new run starts"
RUNNING_STATES = ("running", "restarting", "paused")

argument_spec = dict(
    port=dict(type="int"),
    host=dict(type="str", default="0.0.0.0"),
    pid_file=dict(type="path"),
    record=dict(type="path"),
    container_name=dict(type="str"),
    docker=dict(type="str", default="docker"),
    fail_on_stale=dict(type="bool", default=True),
)


def check_pid_file(path: str, evidence: list[str], leftovers: list[str], pids: list[dict]) -> None:
    """A pid file naming a live process is evidence; one naming a dead process is a leftover."""
    try:
        with open(path) as handle:
            text = handle.read().strip()
    except FileNotFoundError:
        return
    except OSError as exc:
        leftovers.append(f"pid file {path} unreadable: {exc.strerror}")
        return
    if not text.isdigit():
        leftovers.append(f"pid file {path} does not hold a pid ({text[:40]!r})")
        return
    pid = int(text)
    if pid_alive(pid):
        line = cmdline(pid)
        evidence.append(f"pid file {path} names live pid {pid}" + (f" ({line[:160]})" if line else ""))
        pids.append({"pid": pid, "cmdline": line, "source": "pid_file"})
    else:
        leftovers.append(f"pid file {path} names pid {pid}, which is not running")


def check_record(path: str, evidence: list[str], leftovers: list[str], pids: list[dict]) -> None:
    """A start record whose process still runs as recorded is evidence (naming its run); else a leftover."""
    try:
        with open(path) as handle:
            rec = json.load(handle)
    except FileNotFoundError:
        return
    except (OSError, ValueError) as exc:
        leftovers.append(f"start record {path} unreadable: {exc}")
        return
    if not isinstance(rec, dict):
        leftovers.append(f"start record {path} is not a JSON object")
        return
    if rec.get("runtime") == "docker":
        return  # the container check (container_name) judges a container by its name and state
    run = rec.get("run_id", "?")
    ok, why = same_process(rec, mask_argv)
    if not ok:
        leftovers.append(f"start record {path} of run {run}: {why}")
        return
    line = " ".join(rec.get("cmdline") or [])
    evidence.append(
        f"the server of run {run} (pid {rec['pid']}, started {rec.get('started_at', '?')}) is still running"
        + (f" ({line[:160]})" if line else "")
    )
    pids.append({"pid": rec["pid"], "cmdline": line, "source": "record", "run_id": run})


def check_container(module: AnsibleModule, result: dict, evidence: list[str], leftovers: list[str]) -> None:
    name = module.params["container_name"]
    wanted = module.params["docker"]
    docker = wanted if os.sep in wanted else module.get_bin_path(wanted, required=False)
    result["container"] = None
    if not docker or not os.path.exists(docker):
        result["container_checked"] = False
        leftovers.append(f"{wanted} not found: no container can be running")
        return
    # docker's name filter is a regex search (so "x" also matches "x-old"); the exact match is done below.
    argv = [docker, "ps", "-a", "--filter", f"name={name}", "--format", "{{.ID}}\t{{.Names}}\t{{.State}}"]
    rc, out, err = module.run_command(argv, environ_update={"LC_ALL": "C"})
    if rc != 0:
        detail = (err.strip() or out.strip() or "no output").splitlines()[0]
        module.fail_json(
            msg=f"server_stale: cannot list containers with {docker} (rc={rc}): {detail}; "
            "cannot prove no earlier server runs",
            rc=rc,
            stdout=out,
            stderr=err,
            **result,
        )
    result["container_checked"] = True
    for line in out.splitlines():
        fields = line.strip().split("\t")
        if len(fields) < 3 or fields[1].lstrip("/") != name:
            continue
        state = fields[2].strip().lower()
        result["container"] = {"id": fields[0], "name": fields[1], "state": state}
        if state in RUNNING_STATES:
            evidence.append(f"container {name} ({fields[0]}) is {state}")
        else:
            leftovers.append(
                f"container {name} ({fields[0]}) exists in state {state} (remove it before docker run)"
            )


def main() -> None:
    module = AnsibleModule(
        argument_spec=argument_spec,
        required_one_of=[("port", "pid_file", "record", "container_name")],
        supports_check_mode=True,
    )
    p = module.params
    if p["port"] is not None and not 1 <= p["port"] <= 65535:
        module.fail_json(msg=f"server_stale: port={p['port']} (rule: a TCP port is 1-65535)")
    host = platform.node()
    evidence: list[str] = []
    leftovers: list[str] = []
    pids: list[dict] = []
    result: dict = {"changed": False, "host": host}
    if p["port"] is not None:
        probe = probe_port(p["host"], p["port"])
        result["listeners"] = probe["listeners"]
        if probe["in_use"]:
            who = "; ".join(describe(s) for s in probe["listeners"]) or "a TCP connect was accepted"
            evidence.append(f"port {p['port']} is listening: {who}")
            for s in probe["listeners"]:
                pids += [dict(o, source="port") for o in s["pids"]]
    if p["pid_file"]:
        check_pid_file(p["pid_file"], evidence, leftovers, pids)
    if p["record"]:
        check_record(p["record"], evidence, leftovers, pids)
    if p["container_name"]:
        check_container(module, result, evidence, leftovers)
    result.update(stale=bool(evidence), evidence=evidence, leftovers=leftovers, pids=pids)
    if evidence:
        msg = f"a server from an earlier run is still running on {host}: {'; '.join(evidence)} (rule: {RULE})"
        result["msg"] = msg
        if p["fail_on_stale"]:
            module.fail_json(**result)
    else:
        extra = f" ({'; '.join(leftovers)})" if leftovers else ""
        result["msg"] = f"no running server from an earlier run on {host}{extra}"
    module.exit_json(**result)


if __name__ == "__main__":
    main()
