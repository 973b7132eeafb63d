"""Run `ansible-test sanity` on the quickmap.serving collection assembled from this checkout.

    python tools/collection_sanity.py [--log FILE] [ansible-test sanity options...]

Assembles the collection into a temporary <dir>/ansible_collections/quickmap/serving (ansible-test needs
that layout; outside this git checkout, where ansible-test would take the ignored build/ tree for "no
files" and skip every test), runs `ansible-test sanity --python <this python's X.Y>` there, writes
everything it printed to the log (default build/collection-sanity.log, kept after a failure) and exits
with its status. A run in which any of the tests in REQUIRED_TESTS did not run fails, whatever
ansible-test's status: a skipped check is not a passed one.

ansible-test installs each sanity test's pinned requirements into virtual environments of its own,
under $HOME/.ansible/test (about two minutes on this box when none exists). `make test`'s set-up builds
them first (`make sanity-venvs`: this script with `--prime-venvs`, which builds every environment and
runs no check), so the sanity test itself only runs the checks. Two things of this environment are
arranged, both under build/ansible-test-home (the HOME ansible-test runs with, kept between runs as
its cache):
- ansible-test fills each empty environment with pip from a bootstrap script it downloads from
  ci-files.testing.ansible.com. Where that host cannot be reached, the cache holds a stand-in: the
  standard library's bundled pip (ensurepip), then pip installs the pip version ansible-test asked for
  from the package index, as the bootstrap script would.
- ansible-test passes HOME and little else to pip, so the user's pip configuration (index, certificate)
  is copied into that HOME.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import build_collection

REPO = Path(__file__).resolve().parents[1]
BUILD = REPO / "build"
TEST_HOME = BUILD / "ansible-test-home"
# The sanity tests that matter most for modules and plugins; each must have run.
REQUIRED_TESTS = ("validate-modules", "pylint", "import", "ansible-doc", "compile", "pep8", "yamllint")
SKIP_LINE = re.compile(r"Skipping sanity test|targets skipped|Required program .* not found")
PIP_CONFIGS = (".config/pip/pip.conf", ".pip/pip.conf")
BOOTSTRAP_STAND_IN = '''"""Stand-in for get-pip.py (tools/collection_sanity.py): ensurepip's bundled pip,
then pip installs what get-pip was asked to install (its pip version) from the package index."""
import ensurepip
import os
import subprocess
import sys

ensurepip.bootstrap()
os.environ.pop("PIP_CONFIG_FILE", None)  # ensurepip hides pip's configuration; the install needs it
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install", *args]))
'''


def bootstrap_pip_version() -> str:
    """The pip version ansible-test bootstraps its environments with (the cache file is named after it)."""
    import ansible_test

    source = Path(ansible_test.__file__).parent / "_internal" / "python_requirements.py"
    match = re.search(r"pip='([0-9.]+)'", source.read_text(encoding="utf-8"))
    if not match:
        raise SystemExit(f"cannot find the bootstrap pip version in {source} (ansible-test changed?)")
    return match.group(1)


def prepare_home(home: Path) -> None:
    """ansible-test's HOME: the user's pip configuration and the pip bootstrap script's stand-in."""
    real_home = Path.home()
    for rel in PIP_CONFIGS:
        if (real_home / rel).is_file():
            (home / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(real_home / rel, home / rel)
    cache = home / ".ansible" / "test" / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    script = cache / f"get_pip_{bootstrap_pip_version().replace('.', '_')}.py"
    if not script.exists():
        script.write_text(BOOTSTRAP_STAND_IN, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--log", type=Path, default=BUILD / "collection-sanity.log")
    args, extra = parser.parse_known_args(argv)
    TEST_HOME.mkdir(parents=True, exist_ok=True)
    prepare_home(TEST_HOME)
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    cmd = [str(Path(sys.executable).with_name("ansible-test")), "sanity", "--python", python, "--color", "no"]
    env = {**os.environ, "HOME": str(TEST_HOME), "LC_ALL": "C.UTF-8"}
    out = Path(tempfile.mkdtemp(prefix="qm-collection-sanity-"))
    try:
        root = build_collection.assemble(out)
        started = time.monotonic()
        proc = subprocess.run(cmd + extra, cwd=root, env=env, capture_output=True, text=True, check=False)
        took = time.monotonic() - started
    finally:
        shutil.rmtree(out, ignore_errors=True)
    output = proc.stdout + proc.stderr
    ran = set(re.findall(r'^Running sanity test "([^"]+)"', output, flags=re.M))
    missing = [] if extra else [t for t in REQUIRED_TESTS if t not in ran]
    skipped = [line for line in output.splitlines() if SKIP_LINE.search(line)]
    built = len(re.findall(r"^Installing requirements for ", output, flags=re.M))
    status = proc.returncode if not missing else 1
    summary = (
        f"\n== {' '.join(cmd + extra)}\n== in {root}\n== exit {proc.returncode} after {took:.0f} s;"
        f" {len(ran)} sanity tests ran; {built} virtual environments built (make sanity-venvs builds them)\n"
        + "".join(f"== skipped by ansible-test: {line}\n" for line in skipped)
        + (f"== FAILED: these sanity tests did not run: {', '.join(missing)}\n" if missing else "")
    )
    args.log.parent.mkdir(parents=True, exist_ok=True)
    args.log.write_text(output + summary, encoding="utf-8")
    errors = [line for line in output.splitlines() if line.startswith(("ERROR", "FATAL"))]
    print("\n".join(errors[-60:]) + summary + f"== log: {args.log}")
    return status


if __name__ == "__main__":
    sys.exit(main())
