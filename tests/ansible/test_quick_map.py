"""End-to-end runs of quick_map.yml on inventory/local (enginesim + the real client zipapp).

Each test runs the real playbook (ansible-runner where job events matter, the plain ansible-playbook
CLI where the user's exact command matters) into its own results directory on its own port.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from .conftest import port_listening
from .runner import (
    PLAYBOOK,
    REPO,
    VENV_BIN,
    ansible_env,
    free_port,
    read_json,
    recorded_servers,
    run_cli,
    run_runner,
    server_still_running,
)

pytestmark = pytest.mark.slow


def _meta(run_dir: Path, rel: str) -> dict:
    return read_json(run_dir / rel / "meta.json")


def _assert_server_stopped(results: Path, port: int) -> None:
    assert not port_listening(port), f"server still listening on {port}"
    for rec in recorded_servers(results):
        assert not server_still_running(rec), f"server pid {rec['pid']} still alive"


def test_full_map_subset_with_mixed(run_env: dict) -> None:
    """The whole map (two cases + the A/B) through ansible-runner: every phase, every file."""
    ev = dict(run_env["extravars"], run_id="full", case_ids="cold_prefill_4k,short_decode_c1")
    r = run_runner(run_env["tmp"] / "runner", ev)
    run_dir = run_env["results"] / "full"
    assert r.status == "successful", r.stdout.read() if hasattr(r.stdout, "read") else r.status

    manifest = read_json(run_dir / "manifest.json")
    assert manifest["status"] == "completed", (manifest.get("failed_cases"), manifest.get("abort_reasons"))
    assert manifest["case_counts"]["completed"] == 5
    assert manifest["inventory"] == "local" and manifest["nnodes"] == 1
    assert "--enable-metrics" in manifest["engine_flags"]
    assert manifest["engine_env"] == {"ENGINESIM_TIME_SCALE": "0.02"}
    assert "emulated engine (enginesim), time scale 0.02" in (run_dir / "report.md").read_text()

    for case in ("cold_prefill_4k", "short_decode_c1"):
        d = run_dir / "cases" / case / "rep1"
        meta = read_json(d / "meta.json")
        assert meta["status"] == "completed" and meta["case_id"] == case and meta["suite"] == "fixed"
        assert meta["bench_cmd"].startswith("timeout ")
        assert [h["status"] for h in meta["history"]] == ["running", "completed"]
        assert read_json(d / "bench.json")["completed"] == meta["num_prompts"]
        cmd = (d / "bench_cmd.txt").read_text()
        assert "metrics_before.prom" in cmd and "metrics_after.prom" in cmd and meta["bench_cmd"] in cmd
        assert (d / "metrics_before.prom").stat().st_size > 0 and (
            d / "metrics_after.prom"
        ).stat().st_size > 0

    # The A/B: control, then an injection that landed inside the background's main phase.
    roles = {
        role: _meta(run_dir, f"mixed/rep1/{role}")
        for role in ("control", "decode_background", "prefill_injection")
    }
    assert all(m["status"] == "completed" for m in roles.values()), roles
    bg = read_json(run_dir / "mixed/rep1/decode_background/bench.json")
    sent = roles["prefill_injection"]["injection_sent_epoch_s"]
    assert bg["t0_epoch_s"] + bg["main_start_s"] <= sent <= bg["t0_epoch_s"] + bg["main_end_s"]
    assert roles["decode_background"]["background_main_started_epoch_s"] <= sent

    server = run_dir / "server"
    assert "setsid nohup" in (server / "localhost.start1_server_cmd.txt").read_text()
    assert (server / "localhost.start1.log").stat().st_size > 0
    assert read_json(server / "localhost.start1_nccl_gate.json")["passed"] is True
    assert (run_dir / "report.md").is_file() and (run_dir / "summary.csv").is_file()
    _assert_server_stopped(run_env["results"], run_env["port"])
    # run.log: the orchestration record, from the first play to the recap, kept in the run dir.
    run_log = (run_dir / "run.log").read_text().splitlines()
    assert run_log[0].split()[1] == "START" and run_log[-1].split()[1] == "RECAP", run_log[:3]
    assert any("Engine | run the server command" in line for line in run_log)
    assert not any(line.split()[1] == "FAILED" for line in run_log)
    # The overhead figure is computed from these events: they must carry per-task timing.
    assert any(e.get("event") == "runner_on_ok" and e["event_data"].get("duration") for e in r.events)


def test_tags_mixed_runs_only_the_ab_and_a_background_that_ends_first_is_no_success(run_env: dict) -> None:
    """`--tags mixed` runs only the A/B (around preflight, serve, stop, report). Its background here is
    far too short for the injection: the repetition must be recorded as
    BACKGROUND_FINISHED_BEFORE_INJECTION, never as a success (the full-map test covers a real overlap)."""
    ev = dict(
        run_env["extravars"],
        run_id="ab",
        mixed_decode={"isl": 128, "osl": 16, "concurrency": 4, "num_prompts": 8, "warmup": 1},
        mixed_injection_delay_s=2,
    )
    res = run_cli(ev, "--tags", "mixed")
    run_dir = run_env["results"] / "ab"
    # No success: the run fails, naming the repetition, after the report was written.
    assert res.rc != 0 and "case run(s) failed: mixed/rep1" in res.output, res.output[-3000:]
    assert not (run_dir / "cases").exists()
    assert _meta(run_dir, "mixed/rep1/control")["status"] == "completed"
    for role in ("decode_background", "prefill_injection"):
        meta = _meta(run_dir, f"mixed/rep1/{role}")
        assert meta["status"] == "failed" and meta["error_type"] == "BACKGROUND_FINISHED_BEFORE_INJECTION", (
            meta
        )
    assert not (run_dir / "mixed/rep1/prefill_injection/bench.json").exists(), "the injection was sent"
    assert read_json(run_dir / "manifest.json")["status"] == "partial"
    assert (run_dir / "report.md").is_file()
    assert f"Report: {run_dir}/report.md" in res.stdout
    _assert_server_stopped(run_env["results"], run_env["port"])


def test_check_mode_starts_nothing_and_writes_only_the_plan(run_env: dict) -> None:
    res = run_cli(dict(run_env["extravars"], run_id="dry", case_ids="short_decode_c1"), "--check")
    assert res.rc == 0, res.output[-3000:]
    files = sorted(p.relative_to(run_env["results"]).as_posix() for p in run_env["results"].rglob("*"))
    assert files == [".plans", ".plans/dry.plan.txt"], "a dry run creates no run directory"
    plan = (run_env["results"] / ".plans/dry.plan.txt").read_text()
    assert "short_decode_c1" in plan and "setsid nohup" in plan and "loadgen.pyz" in plan
    assert "mixed/rep1/prefill_injection" in plan and "--random-input-len 131072" in plan
    assert "setsid nohup" in res.stdout and "--max-concurrency 1" in res.stdout
    assert not port_listening(run_env["port"])
    # Every run starts on an empty prefix cache, except the injection, which lands mid-background.
    client_lines = {
        section.split("\n", 1)[0]: next(line for line in section.splitlines() if "loadgen.pyz" in line)
        for section in plan.split("== client: ")[1:]
    }
    assert set(client_lines) == {
        "cases/short_decode_c1/rep1",
        "mixed/rep1/control",
        "mixed/rep1/decode_background",
        "mixed/rep1/prefill_injection",
    }
    for where, line in client_lines.items():
        assert ("--flush-cache" in line) == (where != "mixed/rep1/prefill_injection"), where


def test_case_timeout_is_classified_and_the_run_continues(run_env: dict) -> None:
    ev = dict(
        run_env["extravars"],
        run_id="to",
        report_summarize=False,
        case_ids="short_decode_c1,long_decode_8k_c32",
        bench_case_timeouts={"long_decode_8k_c32": 1},  # a case that needs several seconds
        quickmap_fail_on_case_failure=False,  # the run goes on and, so told, accepts the failure
    )
    res = run_cli(ev, "--tags", "fixed")
    run_dir = run_env["results"] / "to"
    assert res.rc == 0, res.output[-3000:]
    slow = _meta(run_dir, "cases/long_decode_8k_c32/rep1")
    assert slow["status"] == "failed" and slow["error_type"] == "TIMEOUT", slow
    assert _meta(run_dir, "cases/short_decode_c1/rep1")["status"] == "completed"
    assert read_json(run_dir / "manifest.json")["status"] == "partial"
    _assert_server_stopped(run_env["results"], run_env["port"])


def test_case_failure_stops_the_run_when_policy_says_so(run_env: dict) -> None:
    ev = dict(
        run_env["extravars"],
        run_id="stop",
        report_summarize=False,
        case_ids="long_decode_8k_c32,long_context_decode_32k_c16",
        bench_case_timeouts={"long_decode_8k_c32": 1},  # a case that needs several seconds
        continue_on_case_failure=False,
    )
    res = run_cli(ev, "--tags", "fixed")
    run_dir = run_env["results"] / "stop"
    assert res.rc != 0
    assert "long_decode_8k_c32" in res.output and "TIMEOUT" in res.output
    assert _meta(run_dir, "cases/long_decode_8k_c32/rep1")["error_type"] == "TIMEOUT"
    assert not (run_dir / "cases/long_context_decode_32k_c16/rep1/meta.json").exists()
    assert read_json(run_dir / "manifest.json")["status"] == "failed"
    assert (run_dir / "server/localhost.start1.log").stat().st_size > 0
    _assert_server_stopped(run_env["results"], run_env["port"])


def _snapshot(d: Path) -> dict[str, tuple[int, bytes]]:
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(d.iterdir()) if p.is_file()}


def test_resume_after_a_run_killed_mid_case(run_env: dict) -> None:
    ev = dict(
        run_env["extravars"],
        run_id="rk",
        report_summarize=False,
        case_ids="cold_prefill_4k,short_decode_c1,short_decode_c32",
    )
    run_dir = run_env["results"] / "rk"
    killed_case = run_dir / "cases/short_decode_c32/rep1"
    cmd = [str(VENV_BIN / "ansible-playbook"), str(PLAYBOOK), "-e", json.dumps(ev), "--tags", "fixed"]
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=ansible_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not (killed_case / "phase.json").exists():  # the client of the third case is running
            assert proc.poll() is None, "run ended before the case to kill started"
            assert time.monotonic() < deadline
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal: the whole foreground group
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    done = {c: _snapshot(run_dir / f"cases/{c}/rep1") for c in ("cold_prefill_4k", "short_decode_c1")}
    interrupted = _meta(run_dir, "cases/short_decode_c32/rep1")
    assert interrupted["status"] == "failed" and interrupted["error_type"] == "INTERRUPTED", interrupted
    # Ctrl-C still stopped the server, evidence first, and said so in the manifest.
    _assert_server_stopped(run_env["results"], run_env["port"])
    assert read_json(run_dir / "manifest.json")["status"] == "interrupted"
    assert (run_dir / "server/localhost.start1.log").stat().st_size > 0

    resumed = run_cli(dict(ev, run_id="rk", resume=True), "--tags", "fixed")
    assert resumed.rc == 0, resumed.output[-3000:]

    for case, snap in done.items():
        assert _snapshot(run_dir / f"cases/{case}/rep1") == snap, f"completed case {case} was touched"
    redone = _meta(run_dir, "cases/short_decode_c32/rep1")
    assert redone["status"] == "completed"
    assert [h["status"] for h in redone["history"]] == ["running", "failed", "running", "completed"]
    assert read_json(killed_case / "bench.json")["complete"] is True
    assert read_json(run_dir / "manifest.json")["status"] == "completed"
    _assert_server_stopped(run_env["results"], run_env["port"])


def test_stale_server_from_an_earlier_run_is_refused(run_env: dict) -> None:
    ev = dict(run_env["extravars"], run_id="st1", report_summarize=False, case_ids="short_decode_c1")
    started = run_cli(ev, "--tags", "serve")  # starts the server and (by tag choice) leaves it up
    assert started.rc == 0, started.output[-3000:]
    assert port_listening(run_env["port"])
    pid = str(recorded_servers(run_env["results"])[0]["pid"])
    refused = run_cli(dict(ev, run_id="st2", engine_port=free_port()))
    assert refused.rc != 0
    assert pid in refused.output and "rule: no server from an earlier run" in refused.output, refused.output[
        -3000:
    ]
    stopped = run_cli(ev, "--tags", "stop")
    assert stopped.rc == 0, stopped.output[-3000:]
    _assert_server_stopped(run_env["results"], run_env["port"])


def test_shell_injection_through_a_variable_runs_nothing_and_secrets_stay_out(run_env: dict) -> None:
    pwned = run_env["tmp"] / "pwned"
    name = f"x; touch {pwned}; echo $(touch {pwned})"
    ev = dict(
        run_env["extravars"],
        run_id="inj",
        report_summarize=False,
        case_ids="short_decode_c1",
        engine_served_model_name=name,
    )
    secret = "hf_QuickmapTestSecret0123456789"
    res = run_cli(ev, "--tags", "fixed", env={"HF_TOKEN": secret})
    assert res.rc == 0, res.output[-3000:]
    assert not pwned.exists()
    # The token reached the server's environment only: no saved file and no output carries it.
    assert secret not in res.output
    for f in run_env["results"].rglob("*"):
        if f.is_file() and f.suffix != ".pyz":
            assert secret.encode() not in f.read_bytes(), f"secret written to {f}"
    run_dir = run_env["results"] / "inj"
    meta = _meta(run_dir, "cases/short_decode_c1/rep1")
    assert meta["status"] == "completed"
    assert read_json(run_dir / "cases/short_decode_c1/rep1/bench.json")["model"] == name
    assert "--served-model-name 'x; touch" in (run_dir / "server/localhost.start1_server_cmd.txt").read_text()


# ------------------------------------------------------------------ preflight refusals


def _two_node_inventory(tmp: Path) -> Path:
    inv = tmp / "inv2"
    inv.mkdir()
    (inv / "group_vars").symlink_to(REPO / "inventory/local/group_vars")
    host = (
        "              ansible_connection: local\n"
        "              ansible_python_interpreter: '{{ ansible_playbook_python }}'\n"
    )
    (inv / "hosts.yml").write_text(
        "all:\n  children:\n    nodes:\n      children:\n"
        "        head:\n          hosts:\n            localhost:\n"
        + host
        + "              engine_node_rank: 0\n"
        "        workers:\n          hosts:\n            worker1:\n"
        + host
        + "              engine_node_rank: 1\n"
    )
    return inv


REFUSALS = {
    "unknown_case_id": ({"case_ids": "short_decode_c1,no_such_case"}, ["no_such_case"]),
    "nic_outside_allowlist": (
        {"quickmap_nics": ["eth9"], "preflight_nic_allowlist": ["eth0"]},
        ["NIC eth9 is not in the allow-list", "rule:"],
    ),
    "hca_outside_allowlist": (
        {"engine_nccl_env": {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_7:1"}, "preflight_hca_allowlist": ["mlx5_0"]},
        ["HCA mlx5_7 is not in the allow-list", "rule:"],
    ),
    "missing_model_path": (
        {"engine_model_host_path": "/nonexistent/models/X"},
        ["/nonexistent/models/X", "rule:"],
    ),
    "run_id_with_shell": ({"run_id": "a;touch /tmp/x"}, ['run_id="a;touch /tmp/x"', "rule:"]),
    "bad_repetitions": ({"repetitions": "0"}, ['repetitions="0"', "rule:"]),
}


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_preflight_refuses(run_env: dict, name: str) -> None:
    extra, expect = REFUSALS[name]
    res = run_cli(dict(run_env["extravars"], **extra))
    assert res.rc != 0
    for text in expect:
        assert text in res.output, res.output[-3000:]
    assert not (run_env["results"] / ".state").exists(), "a server was started"
    assert not port_listening(run_env["port"])


def test_preflight_refuses_malformed_table(run_env: dict) -> None:
    bad = run_env["tmp"] / "bad.tsv"
    bad.write_text("case_id\tstage\tisl\n" + "x\tcold_prefill\tlots\n")
    res = run_cli(dict(run_env["extravars"], quickmap_scenario_file=str(bad)))
    assert res.rc != 0 and str(bad) in res.output, res.output[-3000:]
    assert not (run_env["results"] / ".state").exists()


def test_preflight_refuses_tp_not_divisible_by_nodes(run_env: dict) -> None:
    res = run_cli(dict(run_env["extravars"], engine_tp_size=3), inventory=_two_node_inventory(run_env["tmp"]))
    assert res.rc != 0
    assert "engine_tp_size=3 with 2 node(s) (rule: TP must be divisible by the node count)" in res.output


def test_preflight_refuses_port_in_use(run_env: dict) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", run_env["port"]))
        s.listen()
        res = run_cli(run_env["extravars"])
    assert res.rc != 0
    assert str(run_env["port"]) in res.output and "rule: the server's ports must be free" in res.output
    assert not (run_env["results"] / ".state").exists()


def test_preflight_refuses_stray_gpu_process(run_env: dict) -> None:
    fake = run_env["tmp"] / "bin"
    fake.mkdir()
    smi = fake / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '4242, python3 stray_notebook.py, 20480 MiB'\n")
    smi.chmod(0o755)
    res = run_cli(run_env["extravars"], env={"PATH": f"{fake}{os.pathsep}{ansible_env()['PATH']}"})
    assert res.rc != 0
    assert "4242" in res.output and "rule: no compute process on the GPUs" in res.output
    assert not (run_env["results"] / ".state").exists()
