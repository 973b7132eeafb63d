"""The collection is the checkout, packed: built by ansible-galaxy, installed, equal file for file."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tarfile
from pathlib import Path

import build_collection
import pytest
import yaml
from conftest import REPO, Built

VENV_BIN = REPO / ".venv" / "bin"


def _galaxy_env(collections: Path) -> dict[str, str]:
    # No project ansible.cfg (none in the install dir, ANSIBLE_CONFIG dropped): only the install answers.
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    return {**env, "LC_ALL": "C.UTF-8", "ANSIBLE_COLLECTIONS_PATH": str(collections)}


def test_installed_files_equal_the_checkout_after_the_import_rewrite(built_collection: Built) -> None:
    """Every role file, module, module_util and plugin of the checkout is installed, byte for byte (plugin
    imports of the project's module_utils rewritten), and the install holds nothing else."""
    expected = build_collection.collection_files()
    galaxy = yaml.safe_load(expected.pop("galaxy.yml").read_text())  # becomes MANIFEST.json
    names, filters = build_collection.our_module_utils(), build_collection.our_filters()
    installed = built_collection.installed
    got = {
        p.relative_to(installed).as_posix()
        for p in installed.rglob("*")
        if p.is_file() and p.name not in ("MANIFEST.json", "FILES.json")
    }
    assert got == set(expected)
    manifest = json.loads((installed / "MANIFEST.json").read_text())["collection_info"]
    assert {k: manifest[k] for k in ("namespace", "name", "version")} == {
        k: galaxy[k] for k in ("namespace", "name", "version")
    }
    for place, source in expected.items():
        want = build_collection.collection_text(place, source, names, filters)
        assert (installed / place).read_bytes() == want, place
    # Every role and every plugin directory of the checkout made it (a new one is never left behind).
    assert {p.name for p in (installed / "roles").iterdir()} == {p.name for p in (REPO / "roles").iterdir()}
    for src, dest in build_collection.PLACES.items():
        got_names = {p.name for p in (installed / dest).glob("*.py")}
        assert got_names == {p.name for p in (REPO / src).glob("*.py")}, dest


def test_no_installed_plugin_imports_the_checkouts_module_utils(built_collection: Built) -> None:
    """A plugin importing `ansible.module_utils.<ours>` or `module_utils.<ours>` would only work next to
    the checkout: after the rewrite none does, and the rewritten imports are there."""
    names = build_collection.our_module_utils()
    rewritten = 0
    for path in (built_collection.installed / "plugins").rglob("*.py"):
        text = path.read_text()
        for name in names:
            for stale in (f"ansible.module_utils.{name} import", f"from module_utils.{name} import"):
                assert stale not in text, (path, stale)
            assert f"from module_utils import {name}" not in text, path
        rewritten += text.count(build_collection.COLLECTION_IMPORT)
    assert rewritten >= 20


def test_rewrite_touches_only_the_projects_own_module_utils() -> None:
    names = ["redact", "atomic_write"]
    text = (
        "from ansible.module_utils.basic import AnsibleModule\n"
        "from ansible.module_utils.redact import mask_argv  # noqa\n"
        "    from module_utils import redact as _redact\n"
        "from module_utils.atomic_write import atomic_write_text\n"
        "from ansible.module_utils.redactor import x\n"
    )
    assert build_collection.rewrite_imports(text, names) == (
        "from ansible.module_utils.basic import AnsibleModule\n"
        "from ansible_collections.quickmap.serving.plugins.module_utils.redact import mask_argv  # noqa\n"
        "    from ansible_collections.quickmap.serving.plugins.module_utils import redact as _redact\n"
        "from ansible_collections.quickmap.serving.plugins.module_utils.atomic_write"
        " import atomic_write_text\n"
        "from ansible.module_utils.redactor import x\n"
    )


def test_role_files_name_the_projects_filters_by_fqcn(built_collection: Built) -> None:
    """Role defaults are templated in the play's context, where a short filter name from a collection
    does not resolve: every use of the project's filters in the installed roles is by FQCN."""
    filters = build_collection.our_filters()
    assert "quickmap_shell_args" in filters and "quickmap_oneline" in filters
    short = re.compile(rf"\|\s*({'|'.join(filters)})\b")
    fqcn = 0
    for path in (built_collection.installed / "roles").rglob("*"):
        if path.suffix in (".yml", ".j2"):
            text = path.read_text()
            assert not short.search(text), path
            fqcn += text.count("quickmap.serving.quickmap_")
    assert fqcn >= 20


def _members(tar: tarfile.TarFile) -> dict[str, tuple]:
    """Every packed file and directory but the two manifests ansible-galaxy stamps with the build time."""
    skip = ("MANIFEST.json", "FILES.json")
    return {m.name: (m.mode, m.mtime, m.size) for m in tar.getmembers() if m.name not in skip}


def _files_json(tarball: Path) -> dict:
    with tarfile.open(tarball) as tar:
        return json.load(tar.extractfile("FILES.json"))


def test_build_is_deterministic(built_collection: Built, tmp_path: Path) -> None:
    """A second build of the same checkout packs the same files with the same checksums and mtimes."""
    again = build_collection.build(build_collection.assemble(tmp_path), tmp_path)
    assert _files_json(again) == _files_json(built_collection.tarball)
    with tarfile.open(again) as a, tarfile.open(built_collection.tarball) as b:
        assert _members(a) == _members(b)


def test_assemble_refuses_a_used_directory(tmp_path: Path) -> None:
    build_collection.assemble(tmp_path)
    with pytest.raises(build_collection.BuildError, match="exists"):
        build_collection.assemble(tmp_path)


@pytest.mark.parametrize(
    ("kind", "fqcn"),
    [
        ("module", "quickmap.serving.server_process"),
        ("module", "quickmap.serving.nccl_transport"),
        ("callback", "quickmap.serving.quickmap_console"),
        ("role", "quickmap.serving.engine"),
        ("role", "quickmap.serving.nccl_gate"),
    ],
)
def test_ansible_doc_resolves_by_fqcn_from_the_install(built_collection: Built, kind: str, fqcn: str) -> None:
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-doc"), "-t", kind, fqcn],
        capture_output=True,
        text=True,
        check=False,
        cwd=built_collection.install_root,
        env=_galaxy_env(built_collection.install_root),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert fqcn.upper() in proc.stdout.upper() or fqcn in proc.stdout, proc.stdout[:500]
    assert str(built_collection.installed) in proc.stdout, proc.stdout[:500]


def test_every_role_readme_shows_its_fqcn_usage() -> None:
    """An ops team reads the role README: each shows the role by its collection name, in a section the
    README generator (tools/role_docs.py) keeps."""
    for role_dir in sorted(p for p in (REPO / "roles").iterdir() if p.is_dir()):
        readme = (role_dir / "README.md").read_text()
        section = readme.partition("## From the quickmap.serving collection")[2]
        assert section, f"{role_dir.name}: README has no FQCN usage section"
        assert f"name: quickmap.serving.{role_dir.name}\n" in section, role_dir.name
