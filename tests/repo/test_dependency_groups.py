"""Each dependency sits in the group that uses it: a main dependency is imported by shipped code (or is
named below with the reason it is not), and no shipped code imports a test- or benchmark-only one."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHIPPED = (
    "analysis",
    "loadgen",
    "enginesim",
    "library",
    "module_utils",
    "action_plugins",
    "callback_plugins",
)
IMPORT_NAME = {"pyyaml": "yaml", "ansible-core": "ansible", "prometheus-client": "prometheus_client"}
# main dependencies that shipped code does not import by name, and why they are main anyway
USED_WITHOUT_IMPORT = {
    "jinja2": "ansible-core's templating: every command line is a template",
    "pyyaml": "ansible-core's inventories and vars files",
    "paramiko": "ansible-core's paramiko_ssh connection plugin (-c paramiko_ssh)",
    "pandas": "the analyst API of analysis",
}
# optional-group dependencies that shipped code imports, only on an optional path, and which path
OPTIONAL_FEATURES = {
    "tokenizers": "loadgen's --tokenizer DIR, imported only when given and installed",
    "torch": "python -m enginesim.calibrate only (on a GPU node the engine image's own torch)",
}


def deps(spec: list[str]) -> list[str]:
    return [re.split(r"[=<>!~\[; ]", s, maxsplit=1)[0].lower() for s in spec]


def imported_by_shipped_code() -> set[str]:
    names = set()
    rx = re.compile(r"^\s*(?:import|from)\s+([A-Za-z_][\w]*)", re.M)
    for part in SHIPPED:
        for path in (REPO / part).rglob("*.py"):
            names.update(rx.findall(path.read_text(encoding="utf-8")))
    return names


def test_main_dependencies_are_used_and_extras_are_not_shipped():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    used = imported_by_shipped_code()
    main = deps(project["dependencies"])
    unused = [
        d
        for d in main
        if IMPORT_NAME.get(d, d.replace("-", "_")) not in used and d not in USED_WITHOUT_IMPORT
    ]
    assert not unused, f"main dependencies no shipped code imports (move them to dev/bench): {unused}"
    for group, specs in project["optional-dependencies"].items():
        shipped = [d for d in deps(specs) if IMPORT_NAME.get(d, d.replace("-", "_")) in used]
        shipped = [d for d in shipped if d not in OPTIONAL_FEATURES]
        assert not shipped, (
            f"[{group}] dependencies imported by shipped code (they belong in main): {shipped}"
        )
