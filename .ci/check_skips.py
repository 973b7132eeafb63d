#!/usr/bin/env python3
"""The skip gate: a skipped test is a check that did not run, so it fails the run unless allowed.

    check_skips.py REPORT ALLOWLIST

REPORT is the JSON the test session writes when QUICKMAP_SKIP_REPORT is set (tests/conftest.py);
ALLOWLIST is .ci/allowed-skips.txt (its header says the format). Prints the allow-list and every
skip of the run, each marked allowed or not; exits 1 when any skip is not allowed or the report is
missing, else 0. Standard library only.
"""

from __future__ import annotations

import fnmatch
import json
import re
import sys


def read_allowlist(path: str) -> list[tuple[str, str, re.Pattern[str]]]:
    """(node-id glob, reason regex text, compiled regex) per entry; a malformed line is an error."""
    entries = []
    with open(path, encoding="utf-8") as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            glob, sep, reason = (part.strip() for part in line.partition("|"))
            if not sep or not glob or not reason:
                raise SystemExit(f"{path}:{lineno}: expected 'NODEID-GLOB | REASON-REGEX', got {line!r}")
            try:
                entries.append((glob, reason, re.compile(reason)))
            except re.error as exc:
                raise SystemExit(f"{path}:{lineno}: bad reason regex {reason!r}: {exc}") from None
    return entries


def allowed(skip: dict, entries: list[tuple[str, str, re.Pattern[str]]]) -> bool:
    return any(fnmatch.fnmatchcase(skip["nodeid"], g) and rx.search(skip["reason"]) for g, _, rx in entries)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    report_path, allow_path = argv[1], argv[2]
    entries = read_allowlist(allow_path)
    print(f"skip gate: skips allowed by {allow_path}:")
    for glob, reason, _ in entries:
        print(f"  {glob} | {reason}")
    try:
        with open(report_path, encoding="utf-8") as f:
            skips = json.load(f)["skips"]
    except (OSError, ValueError, KeyError) as exc:
        print(f"skip gate: FAIL: no skip report at {report_path} ({exc}); did the test session run?")
        return 1
    bad = [s for s in skips if not allowed(s, entries)]
    print(f"skip gate: {len(skips)} skipped in this run, {len(bad)} not allowed")
    for s in skips:
        mark = "allowed    " if s not in bad else "NOT ALLOWED"
        print(f"  {mark} {s['nodeid']} ({s['when']}): {s['reason']}")
    if bad:
        print(
            "skip gate: FAIL: make the check run, or (only for a machine condition CI cannot meet) "
            f"add it to {allow_path}"
        )
        return 1
    print("skip gate: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
