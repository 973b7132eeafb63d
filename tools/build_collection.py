"""Assemble the quickmap.serving collection from this checkout, build its tarball, optionally install it.

    python tools/build_collection.py OUT_DIR              # assemble + `ansible-galaxy collection build`
    python tools/build_collection.py OUT_DIR --install P  # ... then `ansible-galaxy collection install -p P`

writes OUT_DIR/ansible_collections/quickmap/serving/ (the layout ansible-test needs) and
OUT_DIR/quickmap-serving-<version>.tar.gz. The checkout stays the one source: it keeps its
playbook-project layout (library/, module_utils/, action_plugins/, callback_plugins/, filter_plugins/,
roles/) and each goes to its collection place here, with two changes: the project's own module_utils
imports (`ansible.module_utils.X` in modules, `module_utils.X` in controller plugins) become
`ansible_collections.quickmap.serving.plugins.module_utils.X`, and the project's Jinja filters in role
YAML and templates (`| quickmap_shell_args`) get their FQCN (`| quickmap.serving.quickmap_shell_args`).
Nothing else is rewritten, so the installed files equal the checkout's after `collection_text`
(tests/collection/test_build.py).

Same checkout, same collection: every file and directory of the tree gets a fixed mtime, so FILES.json
(every file's sha256) and every member of the tarball are identical from build to build; only the
timestamps ansible-galaxy itself stamps on MANIFEST.json/FILES.json and the gzip header differ.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NAMESPACE, NAME = "quickmap", "serving"
COLLECTION_IMPORT = f"ansible_collections.{NAMESPACE}.{NAME}.plugins.module_utils"
# checkout directory -> place in the collection (Python files only; each directory's README.md stays).
PLACES = {
    "library": "plugins/modules",
    "module_utils": "plugins/module_utils",
    "action_plugins": "plugins/action",
    "callback_plugins": "plugins/callback",
    "filter_plugins": "plugins/filter",
}
# Role files whose Jinja may name the project's filters.
ROLE_TEXT_SUFFIXES = (".yml", ".yaml", ".j2")
SKIPPED_NAMES = ("__pycache__", ".pytest_cache")
SKIPPED_SUFFIXES = (".pyc",)
# 2020-01-01T00:00:00Z: every assembled file gets this mtime (a build does not depend on checkout time).
FIXED_MTIME = 1577836800


class BuildError(RuntimeError):
    """The collection cannot be assembled, built or installed; the message says what and why."""


def our_module_utils(repo: Path = REPO) -> list[str]:
    """Names of the project's own module_utils (the only imports that are rewritten)."""
    return sorted(p.stem for p in (repo / "module_utils").glob("*.py") if p.stem != "__init__")


def rewrite_imports(text: str, names: list[str]) -> str:
    """The project's module_utils imports -> the collection's; every other import stays as it is.

    Modules: `from ansible.module_utils.X import ...`. Controller plugins (run from the checkout with
    the repository root on sys.path): `from module_utils.X import ...` and `from module_utils import X`.
    """
    alternatives = "|".join(map(re.escape, names))
    text = re.sub(
        rf"\bfrom (?:ansible\.)?module_utils\.({alternatives}) import",
        rf"from {COLLECTION_IMPORT}.\1 import",
        text,
    )
    return re.sub(
        rf"^(\s*)from module_utils import ({alternatives})\b",
        rf"\1from {COLLECTION_IMPORT} import \2",
        text,
        flags=re.M,
    )


def our_filters(repo: Path = REPO) -> list[str]:
    """Names of the project's own Jinja filters (the keys of filter_plugins/*.py's filters() maps)."""
    names: set[str] = set()
    for path in (repo / "filter_plugins").glob("*.py"):
        body = path.read_text(encoding="utf-8").partition("def filters(")[2]
        names.update(re.findall(r'^\s*"([a-z_][a-z0-9_]*)":', body, flags=re.M))
    return sorted(names)


def rewrite_filters(text: str, names: list[str]) -> str:
    """`| quickmap_x` -> `| quickmap.serving.quickmap_x` in role files.

    Inside a collection role, modules and roles named short resolve in the role's own collection, but
    Jinja filters do not (role defaults are templated in the play's context): they need the FQCN.
    """
    alternatives = "|".join(map(re.escape, names))
    return re.sub(rf"(\|\s*)({alternatives})\b", rf"\1{NAMESPACE}.{NAME}.\2", text)


def collection_files(repo: Path = REPO) -> dict[str, Path]:
    """Every file of the collection: {path inside the collection: source file in the checkout}."""
    files: dict[str, Path] = {}
    for path in sorted((repo / "collection").rglob("*")):
        if path.is_file() and not _skipped(path):
            files[path.relative_to(repo / "collection").as_posix()] = path
    for path in sorted((repo / "roles").rglob("*")):
        if path.is_file() and not _skipped(path):
            files[path.relative_to(repo).as_posix()] = path
    for src, dest in PLACES.items():
        for path in sorted((repo / src).glob("*.py")):
            files[f"{dest}/{path.name}"] = path
    return files


def _skipped(path: Path) -> bool:
    return any(part in SKIPPED_NAMES for part in path.parts) or path.suffix in SKIPPED_SUFFIXES


def collection_text(place: str, source: Path, names: list[str], filters: list[str]) -> bytes:
    """The bytes a collection file holds: plugin Python with its imports rewritten, role YAML and
    templates with the project's filters by FQCN, anything else as is."""
    data = source.read_bytes()
    if place.startswith("plugins/") and place.endswith(".py"):
        return rewrite_imports(data.decode("utf-8"), names).encode("utf-8")
    if place.startswith("roles/") and place.endswith(ROLE_TEXT_SUFFIXES):
        return rewrite_filters(data.decode("utf-8"), filters).encode("utf-8")
    return data


def assemble(out: Path, repo: Path = REPO) -> Path:
    """The collection tree under OUT/ansible_collections/<ns>/<name>; returns its path."""
    root = out / "ansible_collections" / NAMESPACE / NAME
    if root.exists():
        raise BuildError(f"{root} exists (rule: the collection is assembled into an empty directory)")
    names, filters = our_module_utils(repo), our_filters(repo)
    for place, source in collection_files(repo).items():
        target = root / place
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(collection_text(place, source, names, filters))
        # The executable bit travels (ansible-galaxy keeps it; role files scripts may need it).
        os.chmod(target, 0o755 if os.access(source, os.X_OK) else 0o644)
        os.utime(target, (FIXED_MTIME, FIXED_MTIME))
    for directory in sorted((p for p in root.rglob("*") if p.is_dir()), reverse=True):
        os.utime(directory, (FIXED_MTIME, FIXED_MTIME))
    return root


def _galaxy(*args: str) -> subprocess.CompletedProcess[str]:
    galaxy = Path(sys.executable).with_name("ansible-galaxy")
    proc = subprocess.run(
        [str(galaxy), *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "LC_ALL": "C.UTF-8", "ANSIBLE_NOCOLOR": "1"},
    )
    if proc.returncode != 0:
        what = f"ansible-galaxy {' '.join(args)} failed (exit {proc.returncode})"
        raise BuildError(f"{what}:\n{proc.stdout}{proc.stderr}")
    return proc


def build(root: Path, out: Path) -> Path:
    """`ansible-galaxy collection build` of the assembled tree; returns the tarball."""
    _galaxy("collection", "build", str(root), "--output-path", str(out), "--force")
    tarballs = sorted(out.glob(f"{NAMESPACE}-{NAME}-*.tar.gz"))
    if len(tarballs) != 1:
        found = [t.name for t in tarballs]
        raise BuildError(f"expected one {NAMESPACE}-{NAME}-*.tar.gz in {out}, found {found}")
    return tarballs[0]


def install(tarball: Path, dest: Path) -> Path:
    """`ansible-galaxy collection install -p DEST TARBALL`; returns the installed collection's path."""
    _galaxy("collection", "install", "--force", "-p", str(dest), str(tarball))
    installed = dest / "ansible_collections" / NAMESPACE / NAME
    if not (installed / "MANIFEST.json").is_file():
        raise BuildError(f"ansible-galaxy reported success but {installed}/MANIFEST.json is missing")
    return installed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("out", type=Path, help="empty (or new) directory for the tree and the tarball")
    parser.add_argument("--install", type=Path, metavar="DIR", help="also install the tarball under DIR")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    try:
        tarball = build(assemble(out), out)
        print(tarball)
        if args.install:
            print(install(tarball, args.install.resolve()))
    except BuildError as exc:
        print(f"build_collection: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
