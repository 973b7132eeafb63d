"""One secret rule (module_utils/redact.py), and every writer of a saved file goes through it.

Canaries in the shapes a secret takes on its way in (an env assignment, JSON from -e, a flag with its
value, a Python repr echoed by an engine, a list of argv words) are written through each writer:
manifest and meta (analysis.state), run.log (the callback), saved commands (the modules and the
template filters). None may come out.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

from tests.ansible.runner import REPO

CANARY = "canary-0b5e55ed-secret"
SHAPES = [
    f"HF_TOKEN={CANARY}",
    f"export MY_API_KEY='{CANARY}'",
    json.dumps({"engine_env": {"HF_TOKEN": CANARY}, "engine_extra_args": ["--api-key", CANARY]}),
    f"--api-key {CANARY} --port 1",
    f"--hf-token={CANARY}",
    f"server_args=ServerArgs(api_key='{CANARY}', tokenizer_path=None)",
    f"['--api-key', '{CANARY}']",
]


def test_every_writer_uses_the_same_rule() -> None:
    sys.path.insert(0, str(REPO))
    from analysis import state
    from module_utils import redact

    sys.path.insert(0, str(REPO / "callback_plugins"))
    sys.path.insert(0, str(REPO / "filter_plugins"))
    runlog = importlib.import_module("quickmap_runlog")
    filters = importlib.import_module("quickmap")
    assert state._redact is redact, "analysis has a rule of its own"
    assert runlog.redact_text is redact.redact_text
    assert filters._redact is redact


def test_no_shape_of_a_secret_survives_any_writer(tmp_path: Path) -> None:
    from analysis import state

    sys.path.insert(0, str(REPO / "callback_plugins"))
    runlog = importlib.import_module("quickmap_runlog").CallbackModule()
    log = tmp_path / "run" / "run.log"
    log.parent.mkdir()
    runlog._path = str(log)
    for i, shape in enumerate(SHAPES):
        state.write_case(tmp_path / f"cases/c{i}/rep1", "running", {"bench_cmd": shape, "note": shape})
        runlog._emit(f"2026-01-01T00:00:00.000Z START    ansible-playbook quick_map.yml -e {shape}")
    state.write_manifest(tmp_path / "run", {"engine_flags": " ".join(SHAPES), "extra": SHAPES}, None)
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert CANARY not in path.read_text(), f"{path}: {path.read_text()}"
    assert "***" in log.read_text()
