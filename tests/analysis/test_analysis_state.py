"""Case/run state: meta and manifest merges, atomic writes, resume, check-bench, classify-failure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from qm_analysis_synth import FIXTURES, ROOT, loadgen_result

from analysis import atomic, state

DETAILS = FIXTURES / "sglang-0.5.23_c32_details.jsonl"


def _meta(d: Path) -> dict:
    return json.loads((d / "meta.json").read_text())


def test_write_case_merges_keeps_fields_and_history(cli, tmp_path: Path) -> None:
    d = tmp_path / "run" / "cases" / "short_c1" / "rep2"
    assert cli("write-case", d, "--status", "planned", "--set", "num_prompts=4", "--set", "note=a=b")[0] == 0
    assert cli("write-case", d, "--status", "running", "--set-json", 'engine_flags=["--tp", 16]')[0] == 0
    code, _, err = cli("write-case", d, "--status", "completed", "--set", "bench_cmd=x")
    assert code == 0, err
    m = _meta(d)
    assert m["num_prompts"] == 4 and m["note"] == "a=b" and m["engine_flags"] == ["--tp", 16]
    assert m["case_id"] == "short_c1" and m["rep"] == 2 and m["suite"] == "fixed"  # from the layout
    assert [h["status"] for h in m["history"]] == ["planned", "running", "completed"]
    assert m["started_at"].endswith("Z") and m["ended_at"] >= m["started_at"]
    assert not list(d.glob(".*tmp"))


def test_caller_times_win_over_now(cli, tmp_path: Path) -> None:
    d = tmp_path / "c" / "rep1"
    cli("write-case", d, "--status", "running", "--set", "started_at=2026-12-02T10:00:00Z")
    cli("write-case", d, "--status", "completed", "--set", "ended_at=2026-12-02T10:05:00Z")
    m = _meta(d)
    assert m["started_at"] == "2026-12-02T10:00:00Z" and m["ended_at"] == "2026-12-02T10:05:00Z"


def test_completed_case_is_not_rewritten_by_resume(cli, tmp_path: Path) -> None:
    d = tmp_path / "c" / "rep1"
    cli("write-case", d, "--status", "completed")
    before = (d / "meta.json").read_text()
    code, out, _ = cli("write-case", d, "--status", "planned")
    assert code == 0 and "left unchanged" in out
    assert (d / "meta.json").read_text() == before


def test_mark_failed_then_retry_keeps_the_old_error(cli, tmp_path: Path) -> None:
    d = tmp_path / "mixed" / "rep1" / "decode_background"
    cli("write-case", d, "--status", "completed")
    code, _, _ = cli(
        "mark-case-failed", d, "--error-type", "BACKGROUND_FINISHED_BEFORE_INJECTION", "--reason", "late"
    )
    assert code == 0
    m = _meta(d)
    assert m["status"] == "failed" and m["error_type"] == "BACKGROUND_FINISHED_BEFORE_INJECTION"
    assert m["role"] == "decode_background" and m["suite"] == "mixed"
    cli("write-case", d, "--status", "running")
    m = _meta(d)
    assert "error_type" not in m and m["last_error"]["reason"] == "late"
    assert m["history"][1]["error_type"] == "BACKGROUND_FINISHED_BEFORE_INJECTION"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--set", "novalue"], "expected key=value"),
        (["--set", "num_prompts=many"], "expected an integer"),
        (["--set-json", "x={bad"], "not valid JSON"),
        (["--set", "status=completed"], "managed by the subcommand"),
        (["--status", "done"], "invalid choice"),
    ],
)
def test_write_case_bad_flags_exit_2_and_write_nothing(
    cli, tmp_path: Path, args: list[str], needle: str
) -> None:
    d = tmp_path / "c" / "rep1"
    full = ["write-case", d, *args] if "--status" in args else ["write-case", d, "--status", "running", *args]
    code, _, err = cli(*full)
    assert code == 2 and needle in err
    if "--status" not in args:
        assert str(d / "meta.json") in err  # names the file the value was for
    assert not (d / "meta.json").exists()


def test_corrupt_meta_is_exit_2_and_left_alone(cli, tmp_path: Path) -> None:
    d = tmp_path / "c" / "rep1"
    d.mkdir(parents=True)
    (d / "meta.json").write_text('{"status": "runn')
    code, _, err = cli("write-case", d, "--status", "completed")
    assert code == 2 and "meta.json" in err and "line 1" in err
    assert (d / "meta.json").read_text() == '{"status": "runn'


def test_atomic_write_survives_a_crash_at_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "c" / "rep1"
    state.write_case(d, "running", {"num_prompts": 8})
    before = (d / "meta.json").read_bytes()

    def boom(src: str, dst: str) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk gone"):
        state.write_case(d, "completed", {"x": 1})
    assert (d / "meta.json").read_bytes() == before
    assert sorted(p.name for p in d.iterdir()) == ["meta.json"]  # no temp file left behind


def test_atomic_write_crash_during_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "m.json"
    atomic.write_json(target, {"a": 1})
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        atomic.write_json(target, {"a": 2})
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]


def test_manifest_provenance_secrets_and_completion(cli, tmp_path: Path) -> None:
    run = tmp_path / "20261202-run"
    code, _, err = cli(
        "write-manifest", run,
        "--set", "model=Qwen/Qwen3-0.6B", "--set", "engine_image=lmsysorg/sglang:v0.5.23",
        "--set", "HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz", "--set", "tokenizer=/models/tok",
        "--set-json", 'engine_flags={"cmd": "sglang --api-key s3cret HF_TOKEN=hf_zzzzzzzzzzzzzzzzzzzz"}',
        "--nccl-env", "NCCL_IB_HCA=mlx5_0,mlx5_1", "--nccl-env", "NCCL_DEBUG=INFO",
    )  # fmt: skip
    assert code == 0, err
    m = json.loads((run / "manifest.json").read_text())
    text = (run / "manifest.json").read_text()
    assert "HF_TOKEN" not in m and "s3cret" not in text and "hf_abc" not in text and "hf_zzz" not in text
    assert m["tokenizer"] == "/models/tok"  # "tokenizer" is not a secret word
    assert m["nccl_env"] == {"NCCL_IB_HCA": "mlx5_0,mlx5_1", "NCCL_DEBUG": "INFO"}
    assert m["git"]["commit"] and len(m["git"]["commit"]) == 40 and isinstance(m["git"]["dirty"], bool)
    assert m["tool_versions"]["python"] == sys.version.split()[0]
    assert (
        m["tool_versions"]["ansible_core"] and m["tool_versions"]["engine_image"] == "lmsysorg/sglang:v0.5.23"
    )
    started = m["started_at"]
    # a second write keeps the first write's fields
    cli("write-manifest", run, "--set", "inventory=local")
    m2 = json.loads((run / "manifest.json").read_text())
    assert m2["started_at"] == started and m2["model"] == "Qwen/Qwen3-0.6B" and m2["inventory"] == "local"
    # completion counts the case dirs by status
    state.write_case(run / "cases" / "a" / "rep1", "completed", {})
    state.mark_case_failed(run / "cases" / "b" / "rep1", "OOM", "boom")
    (run / "cases" / "c" / "rep1").mkdir(parents=True)
    (run / "cases" / "c" / "rep1" / "bench.json").write_text("{}")
    code, _, _ = cli("complete-manifest", run, "--status", "partial")
    m3 = json.loads((run / "manifest.json").read_text())
    assert code == 0 and m3["status"] == "partial" and m3["ended_at"] and m3["model"] == "Qwen/Qwen3-0.6B"
    assert m3["case_counts"] == {"total": 3, "completed": 1, "failed": 1, "unknown": 1,
                                 "failed_by_error_type": {"OOM": 1}}  # fmt: skip


def test_secrets_never_reach_meta(cli, tmp_path: Path) -> None:
    d = tmp_path / "c" / "rep1"
    cli(
        "write-case",
        d,
        "--status",
        "running",
        "--set",
        "bench_cmd=HF_TOKEN=hf_abcdefghijklmnopqrstuv loadgen --x 1",
    )
    m = _meta(d)
    assert m["bench_cmd"] == "HF_TOKEN=*** loadgen --x 1"


def test_redact_rules() -> None:
    out = state.redact(
        {"api_key": "x", "AWS_SECRET_ACCESS_KEY": "y", "max_tokens": 5, "cmd": "a PASSWORD=p --token t b"}
    )
    assert out == {"max_tokens": 5, "cmd": "a PASSWORD=*** --token *** b"}


# ---------------------------------------------------------------- check-bench / case-done


def test_check_bench_real_files(cli) -> None:
    assert cli("check-bench", DETAILS, "--expect-requests", "96", "--expect-output-len", "64")[0] == 0
    code, out, _ = cli("check-bench", DETAILS, "--expect-requests", "96", "--expect-output-len", "65")
    assert code == 1 and "96 of 96 requests produced fewer than 65" in out
    code, out, _ = cli("check-bench", FIXTURES / "sglang-0.5.23_c64_summary.jsonl", "--expect-requests", "96")
    assert code == 1 and "256 completed requests, expected 96" in out
    code, _, err = cli("check-bench", FIXTURES / "sglang-0.5.23_c32_client.log", "--expect-requests", "96")
    assert code == 2 and "no line holds a JSON result" in err
    code, _, err = cli("check-bench", FIXTURES / "nope.json", "--expect-requests", "1")
    assert code == 2 and "file not found" in err


def test_check_bench_loadgen_incomplete_and_failed(cli, tmp_path: Path) -> None:
    p = tmp_path / "bench.json"
    p.write_text(json.dumps(loadgen_result(n=10, n_failed=1)))
    code, out, _ = cli("check-bench", p, "--expect-requests", "10")
    assert code == 1 and "9 completed requests, 1 failed, expected 10" in out
    p.write_text(json.dumps(dict(loadgen_result(n=10), complete=False)))
    code, out, _ = cli("check-bench", p, "--expect-requests", "10")
    assert code == 1 and "complete=False" in out
    p.write_text(
        json.dumps(dict(loadgen_result(n=10), reliable=False, reliability={"reasons": ["loop lag"]}))
    )
    code, out, _ = cli("check-bench", p, "--expect-requests", "10", "--expect-output-len", "16")
    assert code == 0 and "loop lag" in out


def test_case_done_resume_semantics(cli, tmp_path: Path) -> None:
    d = tmp_path / "cases" / "c" / "rep1"
    code, out, _ = cli("case-done", d)
    assert code == 1 and "no meta.json" in out
    state.write_case(d, "running", {"num_prompts": 96})
    assert cli("case-done", d)[0] == 1  # running
    state.write_case(d, "completed", {})
    code, out, _ = cli("case-done", d)
    assert code == 1 and "bench.json" in out  # completed but no result
    (d / "bench.json").write_bytes(DETAILS.read_bytes()[:5000])
    code, out, _ = cli("case-done", d)
    assert code == 1 and "truncated" in out
    (d / "bench.json").write_bytes(DETAILS.read_bytes())
    assert cli("case-done", d)[0] == 0  # num_prompts from meta = 96
    code, out, _ = cli("case-done", d, "--expect-requests", "100")
    assert code == 1 and "expected 100" in out
    state.mark_case_failed(d, "TIMEOUT", None)
    assert cli("case-done", d)[0] == 1


def test_classify_failure(cli, tmp_path: Path) -> None:
    d = tmp_path / "c" / "rep1"
    d.mkdir(parents=True)
    log = tmp_path / "server.log"
    log.write_text(
        "[2026-09-13 16:06:07] Out of memory even after retracting all other requests in the decode batch\n"
    )
    assert cli("classify-failure", d, "--server-log", log)[1].strip() == "OOM"
    log.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n")
    assert (
        cli("classify-failure", d, "--server-log", log, "--timed-out")[1].strip() == "OOM"
    )  # OOM beats timeout
    log.write_text("[2026-12-02 10:00:00] Scheduler hit an exception: Traceback (most recent call last):\n")
    assert cli("classify-failure", d, "--server-log", log)[1].strip() == "SERVER_DEAD"
    log.write_text("fine\n")
    assert (
        cli("classify-failure", d, "--server-log", log, "--health-url", "http://127.0.0.1:9/health")[
            1
        ].strip()
        == "SERVER_DEAD"
    )
    assert cli("classify-failure", d, "--server-log", log, "--timed-out")[1].strip() == "TIMEOUT"
    (d / "bench.log").write_text("aiohttp.client_exceptions.ClientConnectorError: Connection refused\n")
    assert cli("classify-failure", d)[1].strip() == "TRANSPORT_ERROR"
    (d / "bench.log").write_text("ValueError: something else\n")
    assert cli("classify-failure", d)[1].strip() == "BENCH_FAILED"


def test_state_subcommands_do_not_import_heavy_libraries(tmp_path: Path) -> None:
    """The roles call these once per case: they must not pay for numpy/pandas/matplotlib."""
    d = tmp_path / "cases" / "c" / "rep1"
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['analysis', 'case-done', {str(d)!r}]\n"
        "try:\n    runpy.run_module('analysis', run_name='__main__')\n"
        "except SystemExit as e:\n    rc = e.code\n"
        "heavy = sorted(m for m in ('numpy', 'pandas', 'matplotlib', 'scipy') if m in sys.modules)\n"
        "print(rc, heavy)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.stdout.strip().splitlines()[-1] == "1 []", res.stderr


def test_cli_exit_codes_as_a_process(tmp_path: Path) -> None:
    bad = subprocess.run(
        [sys.executable, "-m", "analysis", "check-bench", str(tmp_path / "x.json"), "--expect-requests", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and "expected an integer > 0" in bad.stderr


def test_atomic_writes_are_readable_like_plain_files(tmp_path):
    """mkstemp's 0600 must not leak into results: reviewers on the box read report.md and meta.json."""
    from analysis import atomic

    target = tmp_path / "meta.json"
    atomic.write_json(target, {"a": 1})
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    assert (target.stat().st_mode & 0o777) == (plain.stat().st_mode & 0o777)
