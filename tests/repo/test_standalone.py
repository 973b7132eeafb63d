"""The repository stands alone: no tracked file points at a build machine or at a folder outside it.

A clone placed anywhere must run its tests, benchmarks and docs as they are. These checks read every
tracked text file (``git ls-files``) and fail naming each file:line that
- names an absolute path of a build machine (this box's work tree, a local SGLang install, a home
  directory) or the team's shared folder that lives beside the repository, or climbs above the
  repository root in code;
- names a ``*.md`` document that is not in the repository (a dangling doc pointer);
- links (Markdown ``[text](target)``) to a file that is not in the repository.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
THIS = Path(__file__).resolve().relative_to(REPO).as_posix()

# (pattern, what it points at)
OUTSIDE = (
    (r"/work/", "the build machine's work tree"),
    (r"/tmp/sgl\b", "a local SGLang install"),
    (r"(?<![\w.-])/(home|Users)/[A-Za-z0-9_.-]+", "a home directory"),
    (r"(?<![\w.-])/root/", "root's home directory"),
    (
        r"\.\./shared\b|(?<![\w.-])shared/(brief|reference|fixtures|tools|hooks)\b",
        "the shared folder beside the repo",
    ),
    (r"os\.path\.dirname\((ROOT|REPO)\)|\b(ROOT|REPO)\.parent\b", "a folder above the repository root"),
)
# Files whose text a tool wrote elsewhere, kept as records: real client outputs used as test fixtures,
# and raw measurement records (enginesim/data/measured/<device>/, as the measuring run wrote them on
# its machine). The paths inside are the other machine's, recorded as provenance; nothing here reads them.
THIRD_PARTY = re.compile(r"^(tests/.+/fixtures/|[^/]+/data/measured/)(?!.*README\.md$)")
# *.md names the project writes (not documents it points to)
OUTPUT_DOCS = {"report.md"}
# A name right after ":" is part of a URL (an external page), not a document of the repository.
DOC_NAME = re.compile(r"(?<![\w./:-])([\w./-]*[\w-]\.md)\b")
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")


def tracked_text_files() -> list[tuple[str, str]]:
    """(path, text) of every tracked file that decodes as UTF-8 text."""
    out = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True, timeout=60
    ).stdout
    files = []
    for name in out.decode().split("\0"):
        if not name or name == THIS:
            continue
        try:
            data = (REPO / name).read_bytes()
        except (FileNotFoundError, IsADirectoryError):  # deleted in the work tree, or a submodule
            continue
        if b"\0" in data:
            continue
        try:
            files.append((name, data.decode("utf-8")))
        except UnicodeDecodeError:
            continue
    assert files, "git ls-files listed no text file: run the tests from a git checkout"
    return files


def lines_matching(pattern: re.Pattern[str], text: str):
    for lineno, line in enumerate(text.splitlines(), 1):
        for m in pattern.finditer(line):
            yield lineno, m


def test_no_tracked_file_names_a_build_machine_path_or_a_folder_outside_the_repo():
    bad = []
    rules = [(re.compile(p), what) for p, what in OUTSIDE]
    for name, text in tracked_text_files():
        if THIRD_PARTY.match(name):
            continue
        for rx, what in rules:
            for lineno, m in lines_matching(rx, text):
                bad.append(f"{name}:{lineno}: {m.group(0)!r} ({what})")
    assert not bad, "paths outside the repository:\n" + "\n".join(bad)


def test_every_named_document_is_in_the_repo():
    files = tracked_text_files()
    names = {Path(n).name for n, _ in files} | {Path(n).name for n in _all_tracked()}
    bad = []
    for name, text in files:
        if THIRD_PARTY.match(name):
            continue
        here = (REPO / name).parent
        for lineno, m in lines_matching(DOC_NAME, text):
            doc = m.group(1)
            base = Path(doc).name
            if base in OUTPUT_DOCS:
                continue
            inside = (here / doc).resolve(), (REPO / doc).resolve()
            found = any(p.is_file() and p.is_relative_to(REPO) for p in inside)
            if not found and not ("/" not in doc and base in names):
                bad.append(f"{name}:{lineno}: {doc}")
    assert not bad, "documents named but not in the repository:\n" + "\n".join(bad)


def test_markdown_links_resolve_inside_the_repo():
    bad = []
    for name, text in tracked_text_files():
        if not name.endswith(".md"):
            continue
        here = (REPO / name).parent
        for lineno, m in lines_matching(MD_LINK, text):
            target = m.group(1).split("#", 1)[0]
            if not target or re.match(r"^[a-z]+:", target):  # an anchor, or a URL
                continue
            p = (here / target).resolve()
            if not (p.is_relative_to(REPO) and p.exists()):
                bad.append(f"{name}:{lineno}: ({m.group(1)})")
    assert not bad, "links to files that are not in the repository:\n" + "\n".join(bad)


def _all_tracked() -> list[str]:
    out = subprocess.run(["git", "-C", str(REPO), "ls-files"], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()
