"""One judge per verdict (issue 13): every caller gives the same answer on the same input.

"Is this case complete?" is asked by the bench_result module, by the bench_case action plugin (inside a
real ansible-playbook: the meta.json it writes on the controller), by ``check-bench`` and ``case-done``
and by ``summarize``. "Did the A/B overlap?" by ``check-overlap`` and ``summarize``. Before, each had
its own copy and they disagreed: a loadgen file without ``complete`` passed the module and failed
analysis, an unverifiable OSL failed the module and passed check-bench, ``duration: Infinity`` passed
everyone, an injection sent before the background's main phase passed summarize and failed
check-overlap, one sent at the very end the other way round.
"""

from __future__ import annotations

import copy
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from qm_analysis_synth import FIXTURES, ROOT

from tests.modules.conftest import run_module
from tests.modules.test_bench_result import loadgen_result, vllm_result

PLAYBOOK_BIN = ROOT / ".venv" / "bin" / "ansible-playbook"
DETAILS = FIXTURES / "sglang-0.5.23_c32_details.jsonl"


def _lg(**changes: object) -> dict:
    obj = loadgen_result(8, 16)
    obj.update(changes)
    return obj


def _nan_ttft() -> dict:
    obj = loadgen_result(8, 16)
    obj["requests"][3]["ttft_ms"] = math.nan
    return obj


def _no_complete() -> dict:
    obj = loadgen_result(8, 16)
    del obj["complete"]
    return obj


def _sglang_nan() -> bytes:
    """The real SGLang --output-details line with one TTFT NaN, and the TTFT statistics SGLang computes
    from them NaN too (numpy's mean and percentiles of an array holding NaN)."""
    obj = json.loads(DETAILS.read_text())
    obj["ttfts"][5] = math.nan
    for stat in ("mean", "median", "std", "p90", "p95", "p99"):
        obj[f"{stat}_ttft_ms"] = math.nan
    return (json.dumps(obj) + "\n").encode()  # json writes the bare token NaN, as SGLang would


def _vllm_nan_array() -> bytes:
    """vLLM --save-detailed with an Infinity among the per-request TTFTs (its p90/p95 come from them)."""
    obj = json.loads((FIXTURES / "vllm-bench-serve_constructed_detailed.json").read_text())
    obj["ttfts"][2] = math.inf
    return json.dumps(obj).encode()


def _log_two_results() -> bytes:
    """A console log holding two result lines: the first is the one read (it is short of requests)."""
    short, good = json.dumps(loadgen_result(7, 16)), json.dumps(_lg())
    return f"Starting main benchmark run...\n{short}\nagain\n{good}\nbye\n".encode()


# name -> (file bytes, expect_requests, OSL, passes?)
CASES: dict[str, tuple[bytes, int, int, bool]] = {
    "good": (json.dumps(_lg()).encode(), 8, 16, True),
    "one_failed": (json.dumps(loadgen_result(8, 16, failed=1)).encode(), 8, 16, False),
    "short_outputs": (json.dumps(loadgen_result(8, 16, outputs=[16] * 7 + [9])).encode(), 8, 16, False),
    "interrupted": (json.dumps(_lg(complete=False)).encode(), 8, 16, False),
    "no_complete_flag": (json.dumps(_no_complete()).encode(), 8, 16, False),
    "duration_inf": (json.dumps(_lg(duration=math.inf)).encode(), 8, 16, False),
    "nan_ttft": (json.dumps(_nan_ttft()).encode(), 8, 16, False),
    "osl_unverifiable": (
        json.dumps({k: v for k, v in vllm_result(32).items() if k != "total_output_tokens"}).encode(),
        32,
        256,
        False,
    ),
    "vllm_good": (json.dumps(vllm_result(32)).encode(), 32, 256, True),
    "log_two_results": (_log_two_results(), 8, 16, False),
    "sglang_real": (DETAILS.read_bytes(), 96, 64, True),
    "sglang_nan": (_sglang_nan(), 96, 64, False),
    "vllm_inf_in_array": (_vllm_nan_array(), 8, 16, False),
    "guidellm_real": ((FIXTURES / "guidellm-0.8.1_c64_benchmarks.json").read_bytes(), 256, 128, True),
    "aiperf_real": ((FIXTURES / "aiperf-0.13.0_c64_profile_export_aiperf.json").read_bytes(), 256, 128, True),
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("inputs")
    out = {}
    for name, (data, _, _, _) in CASES.items():
        out[name] = d / f"{name}.json"
        out[name].write_bytes(data)
    return out


def module_verdicts(inputs: dict[str, Path]) -> dict[str, bool]:
    out = {}
    for name, (_, n, osl, _) in CASES.items():
        kind, res = run_module(
            "bench_result", {"path": str(inputs[name]), "expect_requests": n, "expect_output_len": osl}
        )
        assert kind in ("exit", "fail") and ("reason" in res), res
        out[name] = kind == "exit" and res["passed"]
    return out


def check_bench_verdicts(cli, inputs: dict[str, Path]) -> dict[str, bool]:
    out = {}
    for name, (_, n, osl, _) in CASES.items():
        code, _, err = cli("check-bench", inputs[name], "--expect-requests", n, "--expect-output-len", osl)
        assert code in (0, 1), err
        out[name] = code == 0
    return out


def _case_dirs(root: Path, inputs: dict[str, Path]) -> dict[str, Path]:
    """A run directory: one completed case per input, its meta the plan bench_case judged it by."""
    dirs = {}
    for name, (_, n, osl, _) in CASES.items():
        d = root / "cases" / name / "rep1"
        d.mkdir(parents=True)
        shutil.copy(inputs[name], d / "bench.json")
        meta = {"case_id": name, "suite": "fixed", "rep": 1, "stage": "short_decode", "isl": 128, "osl": osl,
                "concurrency": 4, "num_prompts": n, "warmup": 0, "status": "completed"}  # fmt: skip
        (d / "meta.json").write_text(json.dumps(meta))
        dirs[name] = d
    return dirs


def case_done_verdicts(cli, root: Path, inputs: dict[str, Path]) -> dict[str, bool]:
    out = {}
    for name, d in _case_dirs(root, inputs).items():
        code, _, err = cli("case-done", d)
        assert code in (0, 1), err
        out[name] = code == 0
    return out


def summarize_verdicts(cli, root: Path) -> dict[str, bool]:
    code, _, err = cli("summarize", root)
    assert code == 0, err
    lines = (root / "summary.jsonl").read_text().splitlines()
    return {r["case_id"]: r["status"] == "completed" for r in map(json.loads, lines)}


PLAY = """
- name: one judge, action plugin path
  hosts: localhost
  gather_facts: false
  tasks:
    - name: run each case through the bench_case action
      bench_case:
        label: "{{ item.name }}"
        case_dir: "{{ node }}/{{ item.name }}"
        controller_case_dir: "{{ ctrl }}/{{ item.name }}"
        node_is_controller: false
        script: "{{ item.script }}"
        timeout_s: 60
        expect_requests: "{{ item.n }}"
        expect_output_len: "{{ item.osl }}"
        meta: {case_id: "{{ item.name }}"}
      loop: "{{ cases }}"
      ignore_errors: true
"""


def action_plugin_verdicts(tmp_path: Path, inputs: dict[str, Path]) -> dict[str, bool]:
    node, ctrl = tmp_path / "node", tmp_path / "ctrl"
    cases = []
    for name, (_, n, osl, _) in CASES.items():
        (node / name).mkdir(parents=True)
        script = f"cp {shlex.quote(str(inputs[name]))} bench.json\n"
        cases.append({"name": name, "n": n, "osl": osl, "script": script})
    ctrl.mkdir()
    (tmp_path / "play.yml").write_text(PLAY)
    (tmp_path / "vars.json").write_text(json.dumps({"node": str(node), "ctrl": str(ctrl), "cases": cases}))
    env = dict(os.environ, LC_ALL="C.UTF-8", ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    env["ANSIBLE_HOME"] = str(tmp_path / "ansible_home")
    argv = [str(PLAYBOOK_BIN), "-i", "localhost,", "-c", "local", str(tmp_path / "play.yml")]
    argv += ["-e", f"ansible_python_interpreter={sys.executable}", "-e", f"@{tmp_path / 'vars.json'}"]
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    out = {}
    for name in CASES:
        meta = json.loads((ctrl / name / "meta.json").read_text())
        assert meta["status"] in ("completed", "failed"), meta
        out[name] = meta["status"] == "completed"
    return out


@pytest.mark.skipif(not PLAYBOOK_BIN.exists(), reason=f"{PLAYBOOK_BIN} not installed (make venv)")
def test_every_caller_gives_the_same_case_verdict(cli, inputs: dict[str, Path], tmp_path: Path) -> None:
    expected = {name: case[3] for name, case in CASES.items()}
    verdicts = {
        "module bench_result": module_verdicts(inputs),
        "action plugin bench_case": action_plugin_verdicts(tmp_path / "play", inputs),
        "check-bench": check_bench_verdicts(cli, inputs),
        "case-done": case_done_verdicts(cli, tmp_path / "resume", inputs),
        "summarize": summarize_verdicts(cli, tmp_path / "resume"),
    }
    for caller, got in verdicts.items():
        wrong = {name: got[name] for name in CASES if got[name] != expected[name]}
        assert not wrong, f"{caller} disagrees with the rule on {wrong}"


def test_the_reason_names_the_rule(cli, inputs: dict[str, Path]) -> None:
    """Same verdict, and the message says which rule (what a person reading the failure needs)."""
    expect = {
        "duration_inf": ("nonfinite", "duration"),
        "nan_ttft": ("nonfinite", "requests[].ttft_ms"),
        "sglang_nan": ("nonfinite", "mean_ttft_ms"),
        "vllm_inf_in_array": ("nonfinite", "ttfts"),
        "no_complete_flag": ("incomplete", "complete=None"),
        "osl_unverifiable": ("short_output", "cannot verify output lengths"),
    }
    for name, (reason, needle) in expect.items():
        _, n, osl, _ = CASES[name]
        _, res = run_module(
            "bench_result", {"path": str(inputs[name]), "expect_requests": n, "expect_output_len": osl}
        )
        assert res["reason"] == reason and needle in res["msg"], res["msg"]
        code, out, _ = cli("check-bench", inputs[name], "--expect-requests", n, "--expect-output-len", osl)
        assert code == 1 and needle in out, out


def test_a_result_without_a_plan_is_still_judged_for_nan(tmp_path: Path, cli) -> None:
    """summarize on a result nobody planned (status unknown): a NaN figure is no measurement either."""
    run = tmp_path / "flat"
    run.mkdir()
    (run / "good.json").write_text(json.dumps(_lg()))
    (run / "bad.json").write_text(json.dumps(_lg(duration=math.inf)))
    code, _, err = cli("summarize", run)
    assert code == 0, err
    rows = {r["case_id"]: r for r in map(json.loads, (run / "summary.jsonl").read_text().splitlines())}
    assert rows["good.json"]["status"] == "unknown"
    bad = rows["bad.json"]
    assert bad["status"] == "failed" and bad["reliable"] is False and "non-finite" in bad["reason"]
    assert "duration" in bad["reason"]


# ---------------------------------------------------------------- overlap

T0 = 1_800_000_000.0
BG = {
    "schema": "quickmap.loadgen/1", "complete": True, "completed": 1, "failed": 0, "t0_epoch_s": T0,
    "main_start_s": 2.0, "main_end_s": 10.0, "duration": 8.0, "total_output_tokens": 16,
    "requests": [{"index": 0, "send_s": 2.0, "success": True, "output_tokens": 16, "ttft_ms": 5.0}],
}  # fmt: skip


def _mixed_run(root: Path, sent_after_t0: float) -> Path:
    rep = root / "mixed" / "rep1"
    inj = copy.deepcopy(BG)
    inj.update(t0_epoch_s=T0, main_start_s=sent_after_t0, main_end_s=sent_after_t0 + 1)
    inj["requests"][0]["send_s"] = sent_after_t0
    for role, bench in (("control", BG), ("decode_background", BG), ("prefill_injection", inj)):
        (rep / role).mkdir(parents=True)
        (rep / role / "bench.json").write_text(json.dumps(bench))
        meta = {"case_id": "mixed", "suite": "mixed", "role": role, "rep": 1, "num_prompts": 1, "osl": 16,
                "status": "completed"}  # fmt: skip
        (rep / role / "meta.json").write_text(json.dumps(meta))
    return root


@pytest.mark.parametrize(
    ("sent", "overlap"),
    [(6.0, True), (2.0, True), (1.0, False), (10.0, False), (10.5, False)],
    ids=["inside", "at-start", "before-start", "at-end", "after-end"],
)
def test_check_overlap_and_summarize_agree(tmp_path: Path, cli, sent: float, overlap: bool) -> None:
    summarized = _mixed_run(tmp_path / "s", sent)
    code, _, err = cli("summarize", summarized)
    assert code == 0, err
    rows = {r["role"]: r for r in map(json.loads, (summarized / "summary.jsonl").read_text().splitlines())}
    summarize_says = rows["decode_background"]["status"] == "completed"

    checked = _mixed_run(tmp_path / "c", sent)
    code, out, err = cli("check-overlap", checked / "mixed" / "rep1")
    assert code in (0, 1), err
    assert (code == 0, summarize_says) == (overlap, overlap), out
    if not overlap:
        assert rows["decode_background"]["error_type"] == "BACKGROUND_FINISHED_BEFORE_INJECTION"


def test_not_sent_is_no_overlap_for_both_roles(tmp_path: Path, cli) -> None:
    run = _mixed_run(tmp_path, 6.0)
    shutil.rmtree(run / "mixed" / "rep1" / "prefill_injection")
    code, out, _ = cli("check-overlap", run / "mixed" / "rep1", "--not-sent", "background phase was done")
    assert code == 1 and "no injection was sent: background phase was done" in out
    for role in ("decode_background", "prefill_injection"):
        meta = json.loads((run / "mixed" / "rep1" / role / "meta.json").read_text())
        assert meta["status"] == "failed" and meta["error_type"] == "BACKGROUND_FINISHED_BEFORE_INJECTION"
        assert meta["overlap_proved"] is False and "background phase was done" in meta["reason"]
