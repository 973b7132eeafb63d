"""`ansible-playbook labs.yml --check` prints every variant's server command and every client command,
starts nothing and writes no lab files; a bad lab configuration is refused before anything starts."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from labs_helpers import DEFAULTS, REPO, rendered

sys.path.insert(0, str(REPO))
from tests.ansible.runner import ansible_env, free_port, zipapp_path

pytestmark = [pytest.mark.slow]


def playbook(tmp: Path, *args: str, **ev) -> subprocess.CompletedProcess:
    extra = {
        "quickmap_results_dir": str(tmp / "results"),
        "engine_port": free_port(),
        # Check mode runs no case, but preflight proves the client runs (`loadgen.pyz --version`).
        "quickmap_loadgen_pyz": str(zipapp_path(tmp)),
        **ev,
    }
    if extra["engine_port"] is None:  # pd_disagg hands out its own ports: -e engine_port is refused there
        del extra["engine_port"]
    ev_file = tmp / "ev.json"
    ev_file.write_text(json.dumps(extra))
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "labs.yml",
            "-i",
            "inventory/local",
            "-e",
            f"@{ev_file}",
            *args,
        ],
        cwd=REPO,
        # The default callback prints every command whole (the console callback shortens failures).
        env=dict(ansible_env(), ANSIBLE_STDOUT_CALLBACK="default"),
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_check_prints_every_variants_command_and_starts_nothing(tmp_path, engine) -> None:
    proc = playbook(tmp_path, "--check", engine_name=engine, run_id="dry", engine_port=None)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:]
    # the engine role's own "show the server command" lines: one rendered script per variant (a P/D
    # variant: two, its prefill and decode instances, and the router's command)
    scripts = re.findall(r"quickmap server start on localhost \(engine (\w+), runtime process", out)
    definitions = rendered(DEFAULTS["labs_definitions"])
    want = sum(1 + bool(v.get("pd")) for lab in definitions for v in definitions[lab][engine]["variants"])
    assert scripts == [engine] * want
    assert "quickmap P/D router start on localhost" in out
    assert ("--disaggregation-mode" if engine == "sglang" else "--kv-transfer-config") in out
    assert out.count("quickmap lab pd_disagg, variant pd, run") == 7
    for lab, d in definitions.items():
        for v in d[engine]["variants"]:
            # the words as the engine template quotes them, as they appear inside the printed JSON
            flags = " ".join(shlex.quote(a) for a in v["args"]).replace('"', '\\"')
            assert flags in out, (lab, v["name"], flags)
            runs = re.findall(rf"# quickmap lab {lab}, variant {v['name']}, run (\w+)", out)
            assert len(runs) == len(set(runs)), (lab, runs)
    assert out.count("loadgen.pyz --backend") > 40  # every client command, printed (the given zipapp)
    assert not (tmp_path / "results" / "dry" / "labs").exists()
    assert not (tmp_path / "results" / ".state").exists()  # no server was started


def test_a_two_variable_comparison_is_refused_before_anything_starts(tmp_path) -> None:
    defs = json.loads(json.dumps(DEFAULTS["labs_definitions"]))
    defs["chunk_interference"]["sglang"]["comparisons"] = [
        {"baseline": "chunk8192", "treatment": "chunk512_mixed", "expect": "lower"}
    ]
    proc = playbook(tmp_path, "--tags", "chunk_interference", labs_definitions=defs, run_id="bad")
    assert proc.returncode != 0
    assert "exactly one flag differs" in proc.stdout
    assert not (tmp_path / "results" / ".state").exists()
    assert "Engine | run the server command" not in proc.stdout


def test_a_sites_workload_override_replaces_the_default_sizes(tmp_path) -> None:
    """labs_workload_overrides (inventory/local sets smaller sizes) replaces the named keys of a lab's
    workload: the plan, and so the printed client commands, have exactly that many repetitions."""
    proc = playbook(
        tmp_path,
        "--check",
        "--tags",
        "chunk_interference",
        run_id="dry",
        labs_workload_overrides={"chunk_interference": {"repetitions": 2}},
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:]
    runs = re.findall(r"# quickmap lab chunk_interference, variant chunk8192, run (\w+)", out)
    assert runs == ["probe", "rep1", "rep2"]
