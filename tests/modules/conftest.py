"""Fixtures for unit tests of the custom modules in library/.

Ansible merges ``module_utils/*.py`` into the ``ansible.module_utils`` namespace at run time; here the
same is done by adding the directory to that package's search path, so the modules import exactly as
they do inside ansible-playbook. ``run_module`` drives a module's ``main()`` with
``patch_module_args`` and turns exit_json/fail_json into exceptions carrying the result.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import ansible.module_utils
import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

REPO = Path(__file__).resolve().parents[2]
LIBRARY = REPO / "library"
MODULE_UTILS = REPO / "module_utils"

if str(MODULE_UTILS) not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(MODULE_UTILS))
if str(LIBRARY) not in sys.path:
    sys.path.insert(0, str(LIBRARY))


class AnsibleExitJson(Exception):
    """module.exit_json was called; ``result`` holds its keyword arguments."""

    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__(result.get("msg", ""))
        self.result = result


class AnsibleFailJson(Exception):
    """module.fail_json was called; ``result`` holds its keyword arguments."""

    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__(result.get("msg", ""))
        self.result = result


def _exit_json(self: basic.AnsibleModule, **kwargs: Any) -> None:
    kwargs.setdefault("changed", False)
    raise AnsibleExitJson(kwargs)


def _fail_json(self: basic.AnsibleModule, msg: str = "", **kwargs: Any) -> None:
    kwargs["failed"] = True
    kwargs["msg"] = msg
    raise AnsibleFailJson(kwargs)


def run_module(name: str, args: dict[str, Any], check_mode: bool = False) -> tuple[str, dict[str, Any]]:
    """Run library/<name>.py's main() with ``args``; return ("exit" | "fail", result)."""
    module = importlib.import_module(name)
    module_args = dict(args)
    module_args["_ansible_check_mode"] = check_mode
    module_args.setdefault("_ansible_remote_tmp", "/tmp")
    module_args.setdefault("_ansible_keep_remote_files", False)
    with (
        patch_module_args(module_args),
        mock.patch.object(basic.AnsibleModule, "exit_json", _exit_json),
        mock.patch.object(basic.AnsibleModule, "fail_json", _fail_json),
    ):
        try:
            module.main()
        except AnsibleExitJson as done:
            return "exit", done.result
        except AnsibleFailJson as failed:
            return "fail", failed.result
    raise AssertionError(f"{name}.main() returned without exit_json/fail_json")


@pytest.fixture
def run() -> Any:
    """The ``run_module`` helper as a fixture."""
    return run_module
