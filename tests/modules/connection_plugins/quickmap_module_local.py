# Copyright: quickmap contributors
# Apache-2.0
"""Test connection: Ansible's ``local`` connection under another name, so ``bench_case`` takes the
module path (AnsiballZ, a separate Python process) on the controller. The action plugin runs its
node side in-process only for the ``local`` transport; the identity and interrupt tests run the same
cases both ways with this plugin (``-c quickmap_module_local``). With QM_TEST_FETCH_LOG set, every
file transfer from the "node" is logged there, one path per line (the transfers a remote head costs)."""

from __future__ import annotations

DOCUMENTATION = """
    name: quickmap_module_local
    short_description: the local connection, seen as remote by quickmap's bench_case action (tests only)
    description:
        - Runs everything on the controller exactly as the C(local) connection does; only its transport name
          differs, so the bench_case action ships its module instead of running it in-process.
    author: quickmap contributors
    options:
        become_success_timeout:
            type: int
            default: 10
            description:
                - Number of seconds to wait for become to succeed when enabled.
            vars:
                - name: ansible_local_become_success_timeout
        become_strip_preamble:
            type: bool
            default: true
            description:
                - Strip internal become output preceding command execution.
            vars:
                - name: ansible_local_become_strip_preamble
    extends_documentation_fragment:
        - connection_pipelining
"""

import os  # noqa: E402

from ansible.plugins.connection.local import Connection as LocalConnection  # noqa: E402


class Connection(LocalConnection):
    """The local connection with a transport name of its own."""

    def fetch_file(self, in_path: str, out_path: str) -> None:
        log = os.environ.get("QM_TEST_FETCH_LOG")
        if log:
            with open(log, "a", encoding="utf-8") as f:
                f.write(in_path + "\n")
        super().fetch_file(in_path, out_path)

    transport = "quickmap_module_local"
