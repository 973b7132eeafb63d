"""Faults of issue 11 items 5-9: nothing lost, no state that stays wrong, no silent success, clear refusals.

Each test runs the real playbook on inventory/local (enginesim) and judges what a user would see: the
exit status, the files of the run directory, the message.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.ansible.conftest import port_listening
from tests.ansible.runner import PLAYBOOK, REPO, VENV_BIN, ansible_env, read_json, recorded_servers, run_cli

from .conftest import tree_digest

pytestmark = pytest.mark.slow

SLOW_CASE = "long_decode_8k_c32"  # seconds of work even at the test time scale


def _meta(run_dir: Path, rel: str) -> dict:
    return read_json(run_dir / rel / "meta.json")


# ------------------------------------------------------------------ 5 + 8: the limit that fired, the verdict


def test_a_timed_out_case_names_its_own_timeout_and_fails_the_run(sandbox: dict) -> None:
    ev = dict(
        sandbox["extravars"],
        run_id="to",
        case_ids=f"short_decode_c1,{SLOW_CASE}",
        bench_case_timeouts={SLOW_CASE: 2},
        bench_kill_after_s=3,
    )
    res = run_cli(ev, "--tags", "fixed")
    run_dir = sandbox["results"] / "to"
    meta = _meta(run_dir, f"cases/{SLOW_CASE}/rep1")
    assert meta["status"] == "failed" and meta["error_type"] == "TIMEOUT", meta
    assert "case timeout of 2 s" in meta["reason"], meta["reason"]
    assert "35 s" not in meta["reason"], "the safety limit (2 + 3 + 30 s) was named instead"
    # The run is no success: non-zero, naming the failed case; the report is still written and lists it.
    assert res.rc != 0
    assert f"1 case run(s) failed: cases/{SLOW_CASE}/rep1 (TIMEOUT)" in res.output, res.output[-3000:]
    assert read_json(run_dir / "manifest.json")["status"] == "partial"
    report = (run_dir / "report.md").read_text()
    assert SLOW_CASE in report and "TIMEOUT" in report
    assert _meta(run_dir, "cases/short_decode_c1/rep1")["status"] == "completed"
    assert not port_listening(sandbox["port"])


def test_failed_cases_can_be_accepted_explicitly_and_are_still_named(sandbox: dict) -> None:
    ev = dict(
        sandbox["extravars"],
        run_id="acc",
        case_ids=SLOW_CASE,
        bench_case_timeouts={SLOW_CASE: 1},
        quickmap_fail_on_case_failure=False,
        report_summarize=False,
    )
    res = run_cli(ev, "--tags", "fixed")
    assert (
        f"1 case run(s) failed, accepted (quickmap_fail_on_case_failure=false): cases/{SLOW_CASE}/rep1"
        in (res.output)
    ), res.output[-3000:]
    assert res.rc == 0, res.output[-3000:]
    assert _meta(sandbox["results"] / "acc", f"cases/{SLOW_CASE}/rep1")["error_type"] == "TIMEOUT"


# ------------------------------------------------------------------ 6: resume never relabels


def test_resume_under_another_configuration_is_refused_or_rerun_keeping_the_old_case(sandbox: dict) -> None:
    ev = dict(sandbox["extravars"], run_id="rs", case_ids="short_decode_c1")
    first = run_cli(ev, "--tags", "fixed")
    assert first.rc == 0, first.output[-3000:]
    run_dir = sandbox["results"] / "rs"
    case = run_dir / "cases/short_decode_c1/rep1"
    kept = {p.name: p.read_bytes() for p in case.iterdir()}
    start1_log = (run_dir / "server/localhost.start1.log").read_bytes()
    before = tree_digest(run_dir, skip=run_dir / "run.log")

    changed = dict(ev, resume=True, engine_mem_fraction_static=0.5)
    refused = run_cli(changed, "--tags", "fixed")
    assert refused.rc != 0
    assert "resume refused" in refused.output and "--mem-fraction-static '0.9' -> '0.5'" in refused.output, (
        refused.output[-3000:]
    )
    assert "cases/short_decode_c1/rep1" in refused.output
    assert tree_digest(run_dir, skip=run_dir / "run.log") == before, "a refused resume changed the run"
    assert not recorded_servers(sandbox["results"])[1:], "a server started before the refusal"

    rerun = run_cli(dict(changed, resume_mismatch="rerun"), "--tags", "fixed")
    assert rerun.rc == 0, rerun.output[-3000:]
    [old] = list((run_dir / "superseded").glob("*/cases/short_decode_c1/rep1"))
    assert {p.name: p.read_bytes() for p in old.iterdir()} == kept, (
        "the superseded case was not kept as it was"
    )
    assert (
        read_json(old / "meta.json")["fingerprint"]["server_command"].count("--mem-fraction-static 0.9") == 1
    )
    new = _meta(run_dir, "cases/short_decode_c1/rep1")
    assert (
        new["status"] == "completed" and "--mem-fraction-static 0.5" in new["fingerprint"]["server_command"]
    )
    # Every server start keeps its own log and gate file: the first one is untouched.
    assert (run_dir / "server/localhost.start1.log").read_bytes() == start1_log
    assert (run_dir / "server/localhost.start2.log").stat().st_size > 0
    assert (run_dir / "server/localhost.start2_nccl_gate.json").is_file()


# ------------------------------------------------------------------ 7: states that stay wrong


def _start_and_wait_for_a_running_case(ev: dict, case_dir: Path) -> subprocess.Popen:
    cmd = [str(VENV_BIN / "ansible-playbook"), str(PLAYBOOK), "-e", json.dumps(ev), "--tags", "fixed"]
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=ansible_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 240
    while not (case_dir / "phase.json").exists():  # the client of the case is running
        assert proc.poll() is None, "run ended before the case started"
        assert time.monotonic() < deadline
        time.sleep(0.1)
    return proc


def _assert_closed_as_interrupted(run_dir: Path, rel: str) -> None:
    meta = _meta(run_dir, rel)
    assert meta["status"] == "failed" and meta["error_type"] == "INTERRUPTED", meta
    statuses = [read_json(m)["status"] for m in run_dir.glob("cases/*/rep*/meta.json")]
    assert "running" not in statuses, statuses
    manifest = read_json(run_dir / "manifest.json")
    assert manifest["status"] == "interrupted" and "ended_at" in manifest
    assert (run_dir / "report.md").is_file(), "no report after the interruption"


def test_ctrl_c_leaves_no_running_state_and_writes_a_report(sandbox: dict) -> None:
    ev = dict(sandbox["extravars"], run_id="cc", case_ids=f"short_decode_c1,{SLOW_CASE}")
    run_dir = sandbox["results"] / "cc"
    proc = _start_and_wait_for_a_running_case(ev, run_dir / f"cases/{SLOW_CASE}/rep1")
    try:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal: the whole foreground group
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    _assert_closed_as_interrupted(run_dir, f"cases/{SLOW_CASE}/rep1")
    assert _meta(run_dir, "cases/short_decode_c1/rep1")["status"] == "completed"
    assert not port_listening(sandbox["port"])


def test_kill_9_of_ansible_then_tags_stop_closes_the_run(sandbox: dict) -> None:
    ev = dict(sandbox["extravars"], run_id="k9", case_ids=SLOW_CASE)
    run_dir = sandbox["results"] / "k9"
    proc = _start_and_wait_for_a_running_case(ev, run_dir / f"cases/{SLOW_CASE}/rep1")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert read_json(run_dir / "manifest.json")["status"] == "running"
    assert port_listening(sandbox["port"]), "nothing left to stop: the test proves nothing"
    res = run_cli(ev, "--tags", "stop")
    assert res.rc == 0, res.output[-3000:]
    assert not port_listening(sandbox["port"])
    _assert_closed_as_interrupted(run_dir, f"cases/{SLOW_CASE}/rep1")
    # A second stop leaves the closed run as it is.
    manifest = (run_dir / "manifest.json").read_bytes()
    assert run_cli(ev, "--tags", "stop").rc == 0
    assert (run_dir / "manifest.json").read_bytes() == manifest


def test_a_garbage_meta_json_on_resume_is_kept_aside_and_the_case_redone(sandbox: dict) -> None:
    ev = dict(sandbox["extravars"], run_id="gm", case_ids="cold_prefill_4k,short_decode_c1")
    assert run_cli(ev, "--tags", "fixed").rc == 0
    run_dir = sandbox["results"] / "gm"
    garbage = run_dir / "cases/short_decode_c1/rep1/meta.json"
    garbage.write_bytes(b"{\x00 not json")
    report_before = (run_dir / "report.md").stat().st_mtime_ns
    res = run_cli(dict(ev, resume=True), "--tags", "fixed")
    assert res.rc == 0, res.output[-3000:]
    assert _meta(run_dir, "cases/short_decode_c1/rep1")["status"] == "completed"
    [aside] = list(garbage.parent.glob("meta.json.unreadable-*"))
    assert aside.read_bytes() == b"{\x00 not json"
    manifest = read_json(run_dir / "manifest.json")
    assert manifest["status"] == "completed" and manifest["case_counts"]["completed"] == 2
    assert (run_dir / "report.md").stat().st_mtime_ns > report_before, "the old report was left"


def test_a_dry_run_creates_nothing_so_the_real_run_with_its_id_starts(sandbox: dict) -> None:
    ev = dict(sandbox["extravars"], run_id="dry", case_ids="short_decode_c1")
    dry = run_cli(ev, "--check")
    assert dry.rc == 0, dry.output[-3000:]
    assert not (sandbox["results"] / "dry").exists()
    assert (sandbox["results"] / ".plans" / "dry.plan.txt").is_file()
    real = run_cli(ev, "--tags", "preflight")
    assert real.rc == 0, real.output[-3000:]
    assert read_json(sandbox["results"] / "dry" / "manifest.json")["run_id"] == "dry"


# ------------------------------------------------------------------ 9: refusals that explain


def _refused(box: dict, extra: dict, *expect: str) -> str:
    res = run_cli(dict(box["extravars"], run_id="bad", **extra), "--tags", "fixed")
    assert res.rc != 0
    for text in expect:
        assert text in res.output, res.output[-3000:]
    assert "Traceback" not in res.output
    assert not recorded_servers(box["results"]), "a server was started"
    assert not port_listening(box["port"])
    return res.output


def test_an_integer_beyond_64_bits_in_the_table_is_named(sandbox: dict) -> None:
    table = sandbox["tmp"] / "big.tsv"
    header = "case_id\tstage\tisl\tosl\tconcurrency\tmultiplier\tminimum\twarmup\tnote\n"
    table.write_text(header + "huge\tcold_prefill\t99999999999999999999999\t1\t1\t1\t1\t0\tx\n")
    _refused(
        sandbox, {"quickmap_scenario_file": str(table)}, "field 'isl'", "99999999999999999999999", "(64 bits)"
    )


def test_a_case_longer_than_the_context_is_refused_before_the_server_starts(sandbox: dict) -> None:
    _refused(
        sandbox,
        {"case_ids": "cold_prefill_4k,short_decode_c1", "engine_context_length": 4096},
        "cold_prefill_4k: isl 4096 + osl 1 = 4097",
        "context length 4096 (engine_context_length)",
        "rule: ISL + OSL of every case must fit the context length",
    )


def test_engine_extra_args_given_as_a_string_is_named(sandbox: dict) -> None:
    out = _refused(
        sandbox,
        {"engine_extra_args": "--trust-remote-code"},
        'engine_extra_args="--trust-remote-code" is a str',
    )
    assert "rule: a list, one item per argv word" in out and "can only concatenate list (not" not in out


def test_a_json_array_bomb_is_named_by_every_reader(tmp_path: Path) -> None:
    bomb = tmp_path / "bench.json"
    bomb.write_text("[" * 100000 + "]" * 100000)
    proc = subprocess.run(
        [sys.executable, "-m", "analysis", "check-bench", str(bomb), "--expect-requests", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "JSON nested deeper than 1024 levels" in proc.stderr, proc.stderr
    from module_utils import bench_file  # the reader the bench_case/bench_result modules run

    verdict = bench_file.judge_file(str(bomb), 1, None, 1.0)
    assert not verdict["passed"] and "nested deeper" in verdict["msg"]
