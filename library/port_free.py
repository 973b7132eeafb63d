#!/usr/bin/python
# Copyright: quickmap contributors
# Apache-2.0
"""Ansible module: refuse to start when a port the server needs is already taken."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: port_free
short_description: Fail when something already listens on a TCP port the server is about to bind
description:
  - >-
    Looks for listening TCP sockets on each port in C(/proc/net/tcp) and C(/proc/net/tcp6) (the host's
    network namespace) and tries a TCP connect. A listener conflicts when it is on O(host), or either
    side is a wildcard address (C(0.0.0.0), C(::)).
  - >-
    Fails with a message naming the port, the address and, when visible, the owning pid and command
    line, so a preflight stops before anything starts.
  - Read-only, so it runs the same in check mode. The result always has C(changed=false).
version_added: "0.1.0"
author: quickmap contributors (!UNKNOWN)
options:
  port:
    description: The TCP port to check. Give O(port) or O(ports).
    type: int
  ports:
    description: Several TCP ports to check (for example the HTTP port and the dist-init port).
    type: list
    elements: int
  host:
    description: >-
      The address the server will bind. V(0.0.0.0) (or V(::)) collides with any listener on the port.
    type: str
    default: 0.0.0.0
  connect_timeout:
    description: Seconds for the TCP connect probe.
    type: float
    default: 1.0
attributes:
  check_mode:
    description: Can run in check mode and return a prediction of changed status without changing the target.
    support: full
  diff_mode:
    description: Returns details on what changed (or would change in check mode) when run in diff mode.
    support: none
notes:
  - Owners of sockets of other users are only visible when the module runs as root.
"""

EXAMPLES = r"""
- name: Preflight | the server and rendezvous ports are free
  port_free:
    ports: ["{{ engine_port }}", "{{ engine_dist_init_port }}"]
    host: "{{ engine_host }}"
"""

RETURN = r"""
free:
  description: True when no port is in use.
  returned: always
  type: bool
ports:
  description: One entry per port checked.
  returned: always
  type: list
  elements: dict
  contains:
    port: {description: The port., type: int}
    in_use: {description: Whether something listens on it., type: bool}
    connect: {description: Whether the TCP connect probe was accepted., type: bool}
    listeners:
      description: Conflicting listeners with their owners (pid, cmdline) when visible.
      type: list
      elements: dict
msg:
  description: One-line verdict naming the busy ports and their owners.
  returned: always
  type: str
  sample: "port 30000 for 0.0.0.0 is already in use: 127.0.0.1:30000 (pid 4242: python3 -m enginesim sglang)"
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.net_probe import describe, probe_port  # noqa: E402

RULE = "the server's ports must be free before it starts"

argument_spec = dict(
    port=dict(type="int"),
    ports=dict(type="list", elements="int"),
    host=dict(type="str", default="0.0.0.0"),
    connect_timeout=dict(type="float", default=1.0),
)


def main() -> None:
    module = AnsibleModule(
        argument_spec=argument_spec,
        mutually_exclusive=[("port", "ports")],
        required_one_of=[("port", "ports")],
        supports_check_mode=True,
    )
    p = module.params
    ports = [p["port"]] if p["port"] is not None else list(p["ports"])
    for port in ports:
        if not 1 <= port <= 65535:
            module.fail_json(msg=f"port_free: port={port} (rule: a TCP port is 1-65535)")
    host = p["host"]
    checked = []
    busy = []
    for port in ports:
        probe = probe_port(host, port, p["connect_timeout"])
        entry = {
            "port": port,
            "in_use": probe["in_use"],
            "connect": probe["connect"],
            "listeners": probe["listeners"],
        }
        entry["method"] = probe["method"]
        checked.append(entry)
        if probe["in_use"]:
            who = "; ".join(describe(s) for s in probe["listeners"]) or "a TCP connect was accepted"
            busy.append(f"port {port} for {host} is already in use: {who}")
    result = {"changed": False, "free": not busy, "host": host, "ports": checked}
    if busy:
        module.fail_json(msg=f"{'; '.join(busy)} (rule: {RULE})", **result)
    result["msg"] = f"port(s) {', '.join(str(x) for x in ports)} free for {host}"
    module.exit_json(**result)


if __name__ == "__main__":
    main()
