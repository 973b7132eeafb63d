#!/usr/bin/python
# Copyright: quickmap contributors
# Apache-2.0
"""Ansible module: refuse a server flag the engine image's own --help does not list, before it starts."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_flags
short_description: Check the rendered server flags against the engine version's own --help
description:
  - >-
    Runs the engine's version command and its C(--help) once, through the same runtime that serves
    (C(docker run --rm IMAGE ...) for the docker runtime, the command itself for the process runtime),
    keeps both in O(cache_dir) under the image digest (so a resumed run reads them instead of running
    the image again), applies the inventory's per-version renames (O(renames)) to the rendered flags,
    and fails naming every flag the help does not list and the engine version.
  - >-
    Only the help's usage block and its option column are read; a flag mentioned in a description
    ("deprecated, use --x") does not count as known.
  - >-
    In check mode the commands still run (they start no server) and nothing is written.
version_added: "0.1.0"
author: quickmap contributors (!UNKNOWN)
options:
  engine:
    description: Engine name, for messages (sglang or vllm).
    type: str
    required: true
  runtime:
    description: How the engine runs, C(docker) (the commands run in O(image)) or C(process) (run directly).
    type: str
    choices: [docker, process]
    required: true
  image:
    description: Engine image (docker runtime). Its digest (C(docker image inspect)) keys the cache.
    type: str
    default: ""
  help_command:
    description: The engine's help command, for example V([python3, -m, sglang.launch_server, --help]).
    type: list
    elements: str
    required: true
  version_command:
    description: >-
      A command whose output carries the engine version, for example V([python3, -m, pip, show, sglang])
      (C(Version:) line) or V([vllm, --version]). Empty = version unknown (no rename applies).
    type: list
    elements: str
    default: []
  environment:
    description: Environment for the commands (docker -e for the docker runtime).
    type: dict
    default: {}
  docker_args:
    description: >-
      Extra C(docker run) options before the image (docker runtime), for example V([--gpus, all]): the
      help runs where the server will. vLLM's C(vllm serve --help) and C(vllm --version) fail with
      C(Failed to infer device type) in a container that sees no GPU.
    type: list
    elements: str
    default: []
  flags:
    description: The rendered server flags, one argv word per item (values included; they are skipped).
    type: list
    elements: str
    default: []
  flags_lines:
    description: >-
      Rendered server flag lines (shell-quoted words, one line per node); split like a shell and
      checked together with O(flags).
    type: list
    elements: str
    default: []
  renames:
    description: >-
      Per-version spellings, C({rendered flag: [{since: VERSION, flag: SPELLING}]}); the entry with the
      highest C(since) not above the detected version wins.
    type: dict
    default: {}
  cache_dir:
    description: Directory of the cached help/version texts (one JSON file per image digest).
    type: path
    required: true
  timeout:
    description: Seconds one command may take.
    type: int
    default: 600
attributes:
  check_mode:
    description: Can run in check mode and return a prediction of changed status without changing the target.
    support: full
  diff_mode:
    description: Returns details on what changed (or would change in check mode) when run in diff mode.
    support: none
"""

EXAMPLES = r"""
- name: Preflight | the rendered flags are the engine version's own
  engine_flags:
    engine: sglang
    runtime: docker
    image: lmsysorg/sglang:v0.5.6-cu129
    help_command: [python3, -m, sglang.launch_server, --help]
    version_command: [python3, -m, pip, show, sglang]
    flags: [--model-path, /models/m, --cuda-graph-max-bs, "64"]
    renames: {--cuda-graph-max-bs: [{since: "0.5.23", flag: --cuda-graph-max-bs-decode}]}
    cache_dir: /var/tmp/quickmap/results/RUN/server/engine_help
"""

RETURN = r"""
version:
  description: Engine version from the version command (null when unknown).
  returned: always
  type: str
digest:
  description: Image id (docker) or a hash of the command and version (process) that keys the cache.
  returned: always
  type: str
cached:
  description: Whether the help came from the cache instead of running the image.
  returned: always
  type: bool
cache_file:
  description: The cache file read or written (not written in check mode).
  returned: always
  type: str
known_flags:
  description: How many option spellings the help lists.
  returned: always
  type: int
known_flag_names:
  description: The option spellings the help lists, sorted (a lab whose variant needs a flag reads it).
  returned: always
  type: list
  elements: str
rename_map:
  description: "Renames that apply to this version, {rendered flag: spelling}."
  returned: always
  type: dict
flags:
  description: The flags after renaming, as the server will get them.
  returned: always
  type: list
unknown:
  description: Flags the help does not list.
  returned: always
  type: list
msg:
  description: One-line verdict.
  returned: always
  type: str
"""

import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402

from ansible.module_utils.atomic_write import atomic_write_text  # noqa: E402
from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.engine_help import (  # noqa: E402
    apply_renames,
    flag_words,
    help_flags,
    parse_version,
    rename_map,
    unknown_flags,
    validate_renames,
)

argument_spec = dict(
    engine=dict(type="str", required=True),
    runtime=dict(type="str", required=True, choices=["docker", "process"]),
    image=dict(type="str", default=""),
    help_command=dict(type="list", elements="str", required=True),
    version_command=dict(type="list", elements="str", default=[]),
    environment=dict(type="dict", default={}),
    docker_args=dict(type="list", elements="str", default=[]),
    flags=dict(type="list", elements="str", default=[]),
    flags_lines=dict(type="list", elements="str", default=[]),
    renames=dict(type="dict", default={}),
    cache_dir=dict(type="path", required=True),
    timeout=dict(type="int", default=600),
)


def _wrap(p: dict, cmd: list[str]) -> list[str]:
    """The argv that runs `cmd` through the serving runtime."""
    if p["runtime"] != "docker":
        return list(cmd)
    env = [w for k, v in sorted(p["environment"].items()) for w in ("-e", f"{k}={v}")]
    return ["docker", "run", "--rm", "--entrypoint", "", *p["docker_args"], *env, p["image"], *cmd]


def _run(module: AnsibleModule, p: dict, cmd: list[str]) -> tuple[int, str, str]:
    env = {k: str(v) for k, v in p["environment"].items()} if p["runtime"] == "process" else {}
    argv = _wrap(p, cmd)
    with_timeout = ["timeout", str(p["timeout"]), *argv]
    return module.run_command(with_timeout, environ_update=env)


def _image_digest(module: AnsibleModule, image: str) -> str | None:
    rc, out, _err = module.run_command(["docker", "image", "inspect", image])
    if rc != 0:
        return None
    try:
        doc = json.loads(out)[0]
    except (ValueError, IndexError, KeyError, TypeError):
        return None
    return str(doc.get("Id") or "") or None


def main() -> None:
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    p = module.params
    problem = validate_renames(p["renames"])
    if problem:
        module.fail_json(msg=problem)
    if p["runtime"] == "docker" and not p["image"]:
        module.fail_json(
            msg="runtime docker without an image (rule: engine_image names the image that serves)"
        )
    shown_help = shlex.join(p["help_command"])

    digest = _image_digest(module, p["image"]) if p["runtime"] == "docker" else None
    cache = None
    cache_file = ""
    if digest:
        cache_file = os.path.join(p["cache_dir"], re.sub(r"[^A-Za-z0-9_.-]", "-", digest) + ".json")
        if os.path.exists(cache_file):
            with open(cache_file) as f:
                cache = json.load(f)
    cached = cache is not None
    if cache is None:
        version_out = ""
        if p["version_command"]:
            rc, out, err = _run(module, p, p["version_command"])
            if rc != 0:
                module.fail_json(
                    msg=f"{p['engine']} version command `{shlex.join(p['version_command'])}` exited {rc}: "
                    f"{(err or out).strip()[-400:]} "
                    "(rule: the serving runtime must run the engine's version command)",
                )
            version_out = out
        rc, help_out, err = _run(module, p, p["help_command"])
        if rc != 0 or not help_out.strip():
            module.fail_json(
                msg=f"{p['engine']} help `{shown_help}` exited {rc}: {(err or help_out).strip()[-400:]} "
                "(rule: the serving runtime must print the engine's own --help)",
            )
        if p["runtime"] == "docker" and not digest:
            digest = _image_digest(module, p["image"])
        if not digest:
            digest = "cmd-" + hashlib.sha256((shown_help + "\n" + version_out).encode()).hexdigest()[:16]
        cache = {
            "engine": p["engine"],
            "image": p["image"],
            "digest": digest,
            "help_command": p["help_command"],
            "version_command": p["version_command"],
            "version_output": version_out,
            "help": help_out,
        }
        cache_file = os.path.join(p["cache_dir"], re.sub(r"[^A-Za-z0-9_.-]", "-", digest) + ".json")
        if not module.check_mode:
            atomic_write_text(cache_file, json.dumps(cache, indent=1))

    version = parse_version(cache["version_output"]) if cache["version_output"] else None
    known = help_flags(cache["help"])
    mapping = rename_map(p["renames"], version)
    words = list(p["flags"])
    for line in p["flags_lines"]:
        words += shlex.split(line)
    flags = apply_renames(words, mapping)
    unknown = unknown_flags(flags, known)
    where = f"{p['engine']} {version or '(version unknown)'}" + (
        f" in {p['image']} ({digest})" if p["runtime"] == "docker" else ""
    )
    result = dict(
        changed=False,
        version=version,
        digest=digest,
        cached=cached,
        cache_file=cache_file,
        known_flags=len(known),
        known_flag_names=sorted(known),
        rename_map=mapping,
        flags=flags,
        unknown=unknown,
    )
    if not known:
        module.fail_json(
            msg=f"{where}: `{shown_help}` printed no option list (rule: the engine's argparse help)", **result
        )
    if unknown:
        renamed = [f"{a} -> {b}" for a, b in mapping.items()]
        module.fail_json(
            msg=(
                f"{', '.join(unknown)}: {'a flag' if len(unknown) == 1 else 'flags'} unknown to {where}: "
                f"its own `{shown_help}` does not list {'it' if len(unknown) == 1 else 'them'}"
                + (f" (renames applied: {', '.join(renamed)})" if renamed else "")
                + " (rule: every server flag must be one this engine version accepts; where the version "
                "renamed a flag, say which spelling to use in engine_flag_renames)"
            ),
            **result,
        )
    result["msg"] = f"{len(flag_words(flags))} flags checked against {where}: every one is known" + (
        f"; renamed {', '.join(f'{a} -> {b}' for a, b in mapping.items())}" if mapping else ""
    )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
