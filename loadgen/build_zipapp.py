"""Build the node-side client as one file: ``python -m loadgen.build_zipapp OUT``.

The archive holds the ``loadgen`` package (its .py files and README) plus a ``__main__.py`` and
runs as ``python3 OUT <flags>`` with only the standard library (uvloop, orjson and tokenizers are
used when the node happens to have them). Written atomically: temp file + rename.

Each module also goes in as bytecode (``name.pyc`` beside ``name.py``, unchecked-hash): zipimport
never caches compiled code, so without it every case run recompiles the package (~60 ms). A node
whose Python has another bytecode version ignores the .pyc files and compiles the sources.
"""

from __future__ import annotations

import os
import py_compile
import shutil
import sys
import tempfile
import zipapp

PKG = os.path.dirname(os.path.abspath(__file__))
MAIN = "from loadgen.cli import entry\n\nentry()\n"


def build(out: str) -> str:
    out = os.path.abspath(out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="loadgen-zipapp-") as tmp:
        dst = os.path.join(tmp, "loadgen")
        os.makedirs(dst)
        for name in sorted(os.listdir(PKG)):
            if name.endswith(".py") or name == "README.md":
                shutil.copy2(os.path.join(PKG, name), os.path.join(dst, name))
            if name.endswith(".py"):
                py_compile.compile(
                    os.path.join(dst, name),
                    cfile=os.path.join(dst, name[:-3] + ".pyc"),
                    dfile=f"loadgen/{name}",
                    doraise=True,
                    invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
                )
        with open(os.path.join(tmp, "__main__.py"), "w") as f:
            f.write(MAIN)
        fd, part = tempfile.mkstemp(prefix=".loadgen-", suffix=".pyz", dir=os.path.dirname(out))
        os.close(fd)
        zipapp.create_archive(tmp, part, interpreter="/usr/bin/env python3", compressed=True)
        os.chmod(part, 0o755)
        os.replace(part, out)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m loadgen.build_zipapp OUT.pyz", file=sys.stderr)
        return 2
    print(build(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
