"""Assemble the quickmap.serving collection from this checkout and build its tarball.

    python tools/build_collection.py OUT_DIR

writes OUT_DIR/ansible_collections/quickmap/serving/ (the layout ansible-test needs) and
OUT_DIR/quickmap-serving-<version>.tar.gz (`ansible-galaxy collection build`). The checkout keeps its
playbook-project layout (library/, module_utils/, action_plugins/, callback_plugins/, roles/); here
each goes to its collection place, and the modules' `ansible.module_utils.<ours>` imports become the
collection's `ansible_collections.quickmap.serving.plugins.module_utils.<ours>`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NAMESPACE, NAME = "quickmap", "serving"
PLACES = {
    "library": "plugins/modules",
    "module_utils": "plugins/module_utils",
    "action_plugins": "plugins/action",
    "callback_plugins": "plugins/callback",
}
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "README.md")


def our_module_utils() -> list[str]:
    """Names of the project's own module_utils (the imports to rewrite)."""
    return sorted(p.stem for p in (REPO / "module_utils").glob("*.py") if p.stem != "__init__")


def rewrite_imports(text: str, names: list[str]) -> str:
    """`from ansible.module_utils.X import` -> the collection path, for the project's own X only."""
    pattern = re.compile(rf"\bfrom ansible\.module_utils\.({'|'.join(map(re.escape, names))}) import")
    return pattern.sub(rf"from ansible_collections.{NAMESPACE}.{NAME}.plugins.module_utils.\1 import", text)


def assemble(out: Path) -> Path:
    """The collection tree under OUT/ansible_collections/<ns>/<name>; returns its path."""
    root = out / "ansible_collections" / NAMESPACE / NAME
    if root.exists():
        raise SystemExit(f"{root} exists (rule: the collection is assembled into an empty directory)")
    shutil.copytree(REPO / "collection", root)
    shutil.copytree(REPO / "roles", root / "roles", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    names = our_module_utils()
    for src, dest in PLACES.items():
        target = root / dest
        target.mkdir(parents=True, exist_ok=True)
        for path in sorted((REPO / src).glob("*.py")):
            (target / path.name).write_text(rewrite_imports(path.read_text(), names))
    return root


def build(root: Path, out: Path) -> Path:
    """`ansible-galaxy collection build` of the assembled tree; returns the tarball."""
    galaxy = Path(sys.executable).with_name("ansible-galaxy")
    subprocess.run(
        [str(galaxy), "collection", "build", str(root), "--output-path", str(out), "--force"],
        check=True,
        capture_output=True,
        text=True,
    )
    return next(out.glob(f"{NAMESPACE}-{NAME}-*.tar.gz"))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python tools/build_collection.py OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[0]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    tarball = build(assemble(out), out)
    print(tarball)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
