"""`python -m tests.rig up|down|status` — build or remove a rig by hand for debugging.

up      builds a rig, prints its dir, inventory and the ansible command to use, and leaves it running
        (the owner recorded is this shell's parent, so a later `up` does not treat it as stale).
down    [RIG_DIR...] tears down the given rigs, or every rig under $QM_RIG_ROOT (default /tmp).
status  lists rigs and rig namespaces.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from . import core, netns


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; exit 2 with a message when the rig cannot be built here."""
    parser = argparse.ArgumentParser(prog="python -m tests.rig", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("up", help="build a rig and leave it running")
    down = sub.add_parser("down", help="tear down rigs")
    down.add_argument("dirs", nargs="*", type=Path)
    sub.add_parser("status", help="list rigs")
    args = parser.parse_args(argv)
    if args.cmd == "up":
        reason = core.unavailable_reason()
        if reason:
            print(f"rig unavailable: {reason}", file=sys.stderr)
            return 2
        for note in core.cleanup_stale():
            print(note)
        rig = core.Rig.create()
        rig.owner_pid = os.getppid()
        rig.up()
        env = " ".join(
            f"{k}={shlex.quote(v)}" for k, v in sorted(rig.ansible_env().items()) if k.startswith("ANSIBLE_")
        )
        print(f"rig {rig.rig_id} up in {rig.dir}")
        for host in rig.hosts:
            print(f"  {host.name:8} {host.role:7} ns={host.ns} addr={host.address} sshd pid={host.sshd_pid}")
        print(
            f"try:  env LC_ALL=C.UTF-8 {env} .venv/bin/ansible all -i {rig.inventory} -m ansible.builtin.ping"
        )
        print(f"down: .venv/bin/python -m tests.rig down {rig.dir}")
        return 0
    if args.cmd == "down":
        dirs = args.dirs or sorted(core.RIG_ROOT.glob(f"{core.DIR_PREFIX}*"))
        for rig_dir in dirs:
            for note in core.teardown_dir(rig_dir):
                print(note)
            print(f"down: {rig_dir}")
        if not args.dirs:
            for note in core.cleanup_stale(force=True):
                print(note)
        return 0
    for rig_dir in sorted(core.RIG_ROOT.glob(f"{core.DIR_PREFIX}*")):
        state = "live" if core.owner_alive(rig_dir) else "stale"
        print(f"{rig_dir} ({state})")
    for ns in netns.list_namespaces():
        if ns.startswith(f"{netns.PREFIX}-"):
            print(f"namespace {ns}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
