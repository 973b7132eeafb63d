"""The modules' documentation parses with ansible-doc and says exactly what argument_spec accepts.

The roles' author codes against DOCUMENTATION, so an option documented with another default, type or
choice list than the module really uses is a bug this test catches.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_DOC = REPO / ".venv" / "bin" / "ansible-doc"
MODULES = sorted(p.stem for p in (REPO / "library").glob("*.py"))


def _action_argument_spec(path: Path) -> dict:
    """The action plugin's _ARGUMENT_SPEC, read without importing Ansible's plugin loader."""
    module_spec = importlib.util.spec_from_file_location(f"_action_{path.stem}", path)
    plugin = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(plugin)
    return plugin._ARGUMENT_SPEC


@pytest.fixture(scope="module")
def docs(tmp_path_factory) -> dict:
    if not ANSIBLE_DOC.exists():
        pytest.skip(f"{ANSIBLE_DOC} not installed")
    home = tmp_path_factory.mktemp("ansible_home")
    env = dict(os.environ, LC_ALL="C.UTF-8", ANSIBLE_HOME=str(home), ANSIBLE_CONFIG=str(home / "none.cfg"))
    env["ANSIBLE_MODULE_UTILS"] = str(REPO / "module_utils")
    proc = subprocess.run(
        [str(ANSIBLE_DOC), "-M", str(REPO / "library"), "--json", *MODULES],
        env=env,
        cwd=home,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "ERROR" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def test_expected_modules_exist():
    assert {"nccl_transport", "bench_result", "gpu_idle", "port_free", "server_stale"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_documentation_matches_argument_spec(docs, name):
    entry = docs[name]
    assert entry["examples"].strip() and entry["return"], f"{name}: EXAMPLES/RETURN missing"
    doc = entry["doc"]
    assert doc["attributes"]["check_mode"]["support"] == "full"
    spec = dict(importlib.import_module(name).argument_spec)
    action = REPO / "action_plugins" / f"{name}.py"
    if action.exists():
        # The action plugin's options reach the play through the same task: they are documented here too.
        spec = {**_action_argument_spec(action), **spec}
    assert set(doc["options"]) == set(spec), f"{name}: documented options differ from argument_spec"
    for opt, s in spec.items():
        d = doc["options"][opt]
        assert d.get("type", "str") == s.get("type", "str"), f"{name}.{opt}: type"
        assert d.get("elements") == s.get("elements"), f"{name}.{opt}: elements"
        assert bool(d.get("required")) == bool(s.get("required")), f"{name}.{opt}: required"
        assert d.get("choices") == s.get("choices"), f"{name}.{opt}: choices"
        assert d.get("default") == s.get("default"), (
            f"{name}.{opt}: default {d.get('default')} != {s.get('default')}"
        )
        assert d.get("description"), f"{name}.{opt}: no description"
