"""Role documentation is generated from defaults/main.yml and cannot drift from it.

An operator reads a role's README table or `ansible-doc --type role`; both must say what the default
really is and describe each variable on its own (a shared comment once described `nccl_gate_dest` as
"server log").
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "role_docs.py"
ROLES = sorted(p.parent.parent.name for p in (REPO / "roles").glob("*/defaults/main.yml"))


def _load_tool():
    spec = importlib.util.spec_from_file_location("role_docs", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules["role_docs"] = module
    spec.loader.exec_module(module)
    return module


role_docs = _load_tool()


def test_every_role_is_documented_as_generated():
    proc = subprocess.run([sys.executable, str(TOOL), "--check"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, (
        f"stale role docs (run python tools/role_docs.py):\n{proc.stdout}{proc.stderr}"
    )


@pytest.mark.parametrize("role", ROLES)
def test_specs_readme_and_defaults_name_the_same_variables(role):
    defaults = yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text())
    spec = yaml.safe_load((REPO / "roles" / role / "meta" / "argument_specs.yml").read_text())
    options = spec["argument_specs"]["main"]["options"]
    assert set(options) == set(defaults)
    readme = (REPO / "roles" / role / "README.md").read_text()
    for name, option in options.items():
        assert f"| `{name}` |" in readme, f"{role}: {name} missing from the README table"
        assert option["description"], f"{role}.{name}: empty description"
        if "default" in option:
            assert option["default"] == defaults[name], f"{role}.{name}: documented default differs"


@pytest.mark.parametrize("role", ROLES)
def test_no_two_variables_share_a_description(role):
    options = yaml.safe_load((REPO / "roles" / role / "meta" / "argument_specs.yml").read_text())
    descriptions = [o["description"] for o in options["argument_specs"]["main"]["options"].values()]
    shared = {d for d in descriptions if descriptions.count(d) > 1}
    assert not shared, f"{role}: descriptions shared by several variables: {shared}"


def _role(tmp_path: Path, defaults: str, spec_options: str = "{}") -> Path:
    role = tmp_path / "roles" / "demo"
    (role / "defaults").mkdir(parents=True)
    (role / "meta").mkdir()
    (role / "defaults" / "main.yml").write_text(defaults)
    (role / "meta" / "argument_specs.yml").write_text(
        f"---\nargument_specs:\n  main:\n    short_description: Demo\n    options: {spec_options}\n"
    )
    (role / "README.md").write_text(
        "# demo\n\n## Variables\n\n| variable | default | what it does |\n|---|---|---|\n"
    )
    return role


def test_a_shared_comment_is_refused_naming_the_variable(tmp_path):
    _role(tmp_path, "---\n# The log and the verdict file.\ndemo_log: a.log\ndemo_dest: b.json\n")
    with pytest.raises(role_docs.RoleDocsError, match="'demo_dest' has no comment of its own"):
        role_docs.stale_files(tmp_path)


def test_a_templated_default_needs_a_hand_written_type(tmp_path):
    _role(tmp_path, "---\n# Node count.\ndemo_nodes: \"{{ groups['nodes'] | length }}\"\n")
    with pytest.raises(role_docs.RoleDocsError, match="'demo_nodes' has a templated default"):
        role_docs.stale_files(tmp_path)


def test_generation_keeps_hand_fields_and_rewrites_description_default_and_readme(tmp_path):
    role = _role(
        tmp_path,
        '---\n# Transport required.\ndemo_require: ib\n# Node count.\ndemo_nodes: "{{ 2 }}"\n',
        "{demo_require: {type: str, choices: [ib, socket], description: stale, default: socket},"
        " demo_nodes: {type: int}, demo_gone: {type: str}}",
    )
    stale = role_docs.stale_files(tmp_path, write=True)
    assert {p.name for p in stale} == {"argument_specs.yml", "README.md"}
    options = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"][
        "options"
    ]
    assert options == {
        "demo_require": {
            "type": "str",
            "description": "Transport required.",
            "choices": ["ib", "socket"],
            "default": "ib",
        },
        "demo_nodes": {"type": "int", "description": "Node count."},
    }
    readme = (role / "README.md").read_text()
    assert "| `demo_require` | `ib` | Transport required. |" in readme
    assert '| `demo_nodes` | `"{{ 2 }}"` | Node count. |' in readme
    assert role_docs.stale_files(tmp_path) == []


def test_ansible_doc_reads_every_role_spec(tmp_path):
    ansible_doc = shutil.which("ansible-doc", path=str(REPO / ".venv" / "bin"))
    assert ansible_doc, "ansible-doc is installed by make venv"
    proc = subprocess.run(
        [ansible_doc, "--type", "role", "--roles-path", str(REPO / "roles"), "--json", *ROLES],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "ERROR" not in proc.stderr
