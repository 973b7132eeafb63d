"""Attack 1: a run id that escapes results/ (or carries a newline) is refused before anything writes.

Replays issue 11 item 1: `-e run_id=../outside` appended run.log to the directory it pointed at;
`--tags stop -e run_id=../outside -e quickmap_interrupted=true` rewrote a manifest.json there; a run id
(or case_ids) ending in a newline passed `match('^…$')`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.ansible.runner import REPO, run_cli

from .conftest import assert_untouched, tree_digest

pytestmark = pytest.mark.slow


def test_a_run_id_pointing_outside_results_writes_nothing(sandbox: dict) -> None:
    before = tree_digest(sandbox["tmp"], skip=sandbox["results"])
    res = run_cli(
        dict(sandbox["extravars"], run_id="../outside", case_ids="short_decode_c1"), "--tags", "fixed"
    )
    assert not (sandbox["outside"] / "run.log").exists(), "run.log written outside results/"
    assert_untouched(sandbox, before)
    assert res.rc != 0
    assert 'run_id="../outside" (rule:' in res.output, res.output[-2000:]
    assert not sandbox["results"].exists() or not any(sandbox["results"].iterdir())


def test_tags_stop_validates_the_run_id_before_touching_a_manifest(sandbox: dict) -> None:
    victim = sandbox["outside"] / "manifest.json"
    victim.write_text(json.dumps({"run_id": "someone-else", "status": "running"}) + "\n")
    before = tree_digest(sandbox["tmp"], skip=sandbox["results"])
    res = run_cli(
        dict(sandbox["extravars"], run_id="../outside", quickmap_interrupted=True), "--tags", "stop"
    )
    assert_untouched(sandbox, before)
    assert res.rc != 0
    assert 'run_id="../outside" (rule:' in res.output, res.output[-2000:]


@pytest.mark.parametrize(
    ("extra", "shown"),
    [
        ({"run_id": "a\n"}, 'run_id="a\\n" (rule:'),
        ({"case_ids": "short_decode_c1\n"}, 'case_ids="short_decode_c1\\n"'),
    ],
)
def test_a_trailing_newline_does_not_pass_a_rule(sandbox: dict, extra: dict, shown: str) -> None:
    """`$` matches before a final newline; every rule is a full match now (even under --check)."""
    before = tree_digest(sandbox["tmp"], skip=sandbox["results"])
    res = run_cli(dict(sandbox["extravars"], **extra), "--check")
    assert not (sandbox["results"] / "a\n").exists()
    assert_untouched(sandbox, before)
    assert res.rc != 0 and shown in res.output, res.output[-2000:]


def test_no_rule_in_the_playbooks_uses_match_semantics() -> None:
    """Ansible's `match` test is re.match: a rule written with it accepts a trailing newline."""
    offenders = []
    for path in sorted(
        [*REPO.glob("roles/**/*.yml"), *REPO.glob("playbooks/**/*.yml"), REPO / "quick_map.yml"]
    ):
        for lineno, line in enumerate(path.read_text().splitlines(), start=1):
            if re.search(r"\bis\s+(not\s+)?match\(", line):
                offenders.append(f"{path.relative_to(REPO)}:{lineno}: {line.strip()}")
    assert not offenders, "use regex(..., match_type='fullmatch'):\n" + "\n".join(offenders)


def test_the_run_log_callback_never_opens_a_path_outside_a_run_directory(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(REPO / "callback_plugins"))
    from quickmap_runlog import _safe_log_path

    assert _safe_log_path("/r/results/run1/run.log") == "/r/results/run1/run.log"
    for bad in ("/r/results/../etc/run.log", "results/run1/run.log", "/r/results/run1/passwd", ""):
        assert _safe_log_path(bad) is None, bad
