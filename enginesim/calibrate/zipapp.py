"""Build the node-side calibration as one file: ``python -m enginesim.calibrate.zipapp build/calibrate.pyz``.

Why a zipapp (as loadgen ships): a GPU node runs the calibration inside the engine image, whose
Python already has torch. One file, copied by Ansible and mounted read-only into the container, needs
no pip, no network and no change to the image, and the exact code that ran is the file in the run's
``bin/``. The archive holds the whole ``enginesim`` package (the calibration imports its catalogue,
profile schema and data files) and runs ``python3 calibrate.pyz <flags of python -m enginesim.calibrate>``.
Written atomically: temp file + rename.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import zipapp

PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../enginesim
MAIN = "import sys\n\nfrom enginesim.calibrate.__main__ import main\n\nsys.exit(main())\n"


def _wanted(name: str) -> bool:
    return name.endswith((".py", ".json", ".md", ".txt", ".sh"))


def build(out: str) -> str:
    """Write the archive to `out` and return its absolute path."""
    out = os.path.abspath(out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="calibrate-zipapp-") as tmp:
        for root, dirs, files in os.walk(PKG):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            rel = os.path.relpath(root, os.path.dirname(PKG))
            os.makedirs(os.path.join(tmp, rel), exist_ok=True)
            for name in sorted(files):
                if _wanted(name):
                    shutil.copy2(os.path.join(root, name), os.path.join(tmp, rel, name))
        with open(os.path.join(tmp, "__main__.py"), "w", encoding="utf-8") as f:
            f.write(MAIN)
        fd, part = tempfile.mkstemp(prefix=".calibrate-", suffix=".pyz", dir=os.path.dirname(out))
        os.close(fd)
        try:
            zipapp.create_archive(tmp, part, interpreter="/usr/bin/env python3", compressed=True)
            os.chmod(part, 0o755)
            os.replace(part, out)
        except BaseException:
            if os.path.exists(part):
                os.unlink(part)
            raise
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m enginesim.calibrate.zipapp OUT.pyz", file=sys.stderr)
        return 2
    print(build(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
