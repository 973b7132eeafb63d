"""pd_disagg through its real command (`ansible-playbook labs.yml --tags pd_disagg`) on enginesim, both
flavours: the P/D trio started by roles/pd_launch, every run's client sent to the router (never to one
instance), both sides' /metrics scraped around each run with the KV transfers counted, the baseline
one instance on the same GPUs, the break-even reported, and only the lab's own PIDs stopped."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from labs_helpers import REPO

sys.path.insert(0, str(REPO))
from tests.ansible.runner import ansible_env, free_port, server_still_running

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
SMALL = {
    "short_isl": 64, "long_isl": 768, "short_osl": 8, "long_osl": 48, "num_prompts": 6, "concurrency": 3,
    "prefix_len": 384, "question_len": 32, "prefix_osl": 8, "fault_prompts": 120, "fault_after_s": 1,
}  # fmt: skip


def run_pd_lab(
    tmp: Path, engine: str, run_id: str, *args: str, **extra
) -> tuple[subprocess.CompletedProcess, Path]:
    """labs.yml --tags pd_disagg with its own ports (labs_pd_ports; no -e engine_port: the lab passes it)."""
    pyz = tmp / "loadgen.pyz"
    if not pyz.exists():
        subprocess.run([sys.executable, "-m", "loadgen.build_zipapp", str(pyz)], cwd=REPO, check=True)
    ports = {k: free_port() for k in ("baseline", "prefill", "decode", "router", "bootstrap")}
    ev = {
        "quickmap_results_dir": str(tmp / "results"),
        "quickmap_loadgen_pyz": str(pyz),
        "engine_name": engine,
        "run_id": run_id,
        "labs_pd_ports": ports,
        "labs_workload_overrides": {"pd_disagg": SMALL},
        **extra,
    }
    ev_file = tmp / f"{run_id}.json"
    ev_file.write_text(json.dumps(ev))
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            *("labs.yml", "-i", "inventory/local", "--tags", "pd_disagg", "-e", f"@{ev_file}"),
            *args,
        ],
        cwd=REPO,
        env=ansible_env(),
        capture_output=True,
        text=True,
        timeout=800,
    )
    return proc, tmp / "results" / run_id / "labs"


def leftovers(tmp: Path) -> list[str]:
    """Recorded processes still running as recorded (none may be: the lab stops all it started)."""
    out = []
    for path in (tmp / "results").glob("**/*.server.json"):
        record = json.loads(path.read_text())
        if record.get("runtime") == "process" and server_still_running(record):
            out.append(str(path))
    return out


@pytest.fixture(scope="module", params=["sglang", "vllm"])
def lab(request, tmp_path_factory) -> dict:
    engine = request.param
    tmp = tmp_path_factory.mktemp(f"pd_{engine}")
    proc, labs_dir = run_pd_lab(tmp, engine, f"pd_{engine}")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    doc = json.loads((labs_dir / "pd_disagg" / "lab.json").read_text())
    return {"engine": engine, "dir": labs_dir / "pd_disagg", "doc": doc, "tmp": tmp}


def test_pd_runs_go_through_the_router_and_move_kv(lab) -> None:
    doc, ldir = lab["doc"], lab["dir"]
    fig = doc["figures"]
    assert fig["launch"]["through_router"] is True
    router = fig["launch"]["measured_url"]
    plan = json.loads((ldir / "plan.json").read_text())
    pd = next(v for v in plan["variants"] if v.get("pd"))
    for run in pd["runs"]:
        cmd = (ldir / "pd" / "runs" / run["name"] / "bench_cmd.txt").read_text()
        assert f"--base-url {router}" in cmd and "--flush-cache" not in cmd
    for wl, row in fig["workloads"].items():
        n = row["pd"]["n"]
        assert n == row["workload"]["num_prompts"], (wl, row)
        kv = row["kv"]
        assert kv["transfers"] >= n and kv["failures"] == 0 and kv["bytes"] > 0, (wl, kv)
        assert kv["ms_per_transfer"] > 0
    # the long prompts move more KV per request than the short ones
    w = fig["workloads"]
    assert w["long_in_short_out"]["kv"]["mb_per_transfer"] > w["short_in_short_out"]["kv"]["mb_per_transfer"]
    # the evidence was taken while both recorded instances still ran
    alive = json.loads((ldir / "pd" / "server_alive.json").read_text())
    assert alive["running"] is True and all(x["pid"] for x in alive["sides"].values()), alive
    # both sides' logs, the router's and the connector lines are kept
    logs = {p.name.split(".")[0] for p in (ldir / "pd" / "logs").iterdir()}
    assert {"prefill", "decode", "router", "connector"} <= logs


def test_baseline_same_gpus_and_break_even_reported(lab) -> None:
    doc, ldir = lab["doc"], lab["dir"]
    base_cmd = next((ldir / "baseline" / "server").glob("*_server_cmd.txt")).read_text()
    assert ("--tp-size 2" in base_cmd) or ("--tensor-parallel-size 2" in base_cmd), base_cmd
    be = doc["figures"]["break_even"]
    for key in ("ttft_p50_ms", "tpot_p50_ms", "output_tok_s"):
        assert sorted(be[key]["pd"] + be[key]["baseline"]) == sorted(doc["figures"]["workloads"])
    assert doc["verdict"] in ("supported", "not supported"), doc["reason"]
    assert any(o.startswith("break-even:") for o in doc["observations"])
    assert len(doc["comparisons"]) == 6
    report = (ldir.parent / "report.md").read_text()
    assert "pd_disagg" in report and "Pitfalls" in report
    assert leftovers(lab["tmp"]) == []


def test_fault_run_kills_the_prefill_mid_run_and_records_what_requests_saw(lab) -> None:
    doc, ldir = lab["doc"], lab["dir"]
    f = doc["figures"]["fault"]
    assert f is not None and f["client_result"], f
    assert f["requests"] == 120 and f["failed"] > 0 and f["completed"] + f["failed"] == 120, f
    assert f["prefill_health_after"] is False and f["decode_health_after"] is True
    assert f["first_errors"] and any(o.startswith("fault run: prefill stopped") for o in doc["observations"])
    # the prefill was stopped through its record (engine role), not by name: the stop says so
    record = json.loads(next((ldir / "pd" / "server" / "prefill").glob("*.server.json")).read_text())
    assert not server_still_running(record)
    assert leftovers(lab["tmp"]) == []


def test_pd_lab_check_mode_prints_the_trio_and_the_clients(tmp_path) -> None:
    proc, labs_dir = run_pd_lab(tmp_path, "sglang", "pd_check", "--check")
    assert proc.returncode == 0, proc.stdout[-4000:]
    out = proc.stdout
    assert "--disaggregation-mode" in out and "prefill" in out and "decode" in out
    assert "sglang_router" in out and "--pd-disaggregation" in out
    assert out.count("--base-url") >= 14  # 7 runs x 2 variants, the P/D ones at the router
    assert not (labs_dir / "pd_disagg" / "lab.json").exists()


def test_stop_phase_finds_a_labs_pd_trio_and_stops_only_its_recorded_pids(tmp_path: Path) -> None:
    """After Ctrl-C the interrupt handler reruns `labs.yml --tags stop`: it must find the trio recorded
    under labs/pd_disagg/pd/server/{prefill,decode,router} (not only labs/<lab>/<variant>/server)."""
    from test_pd_disagg_launch import launch

    run_id = "pd_stop"
    server_dir = tmp_path / "results" / run_id / "labs" / "pd_disagg" / "pd" / "server"
    proc, _, _ = launch(tmp_path, run_id, pd_launch_server_dir=str(server_dir))
    assert proc.returncode == 0, proc.stdout[-4000:]
    records = {p.parent.name: json.loads(p.read_text()) for p in server_dir.glob("*/*.server.json")}
    assert set(records) == {"prefill", "decode", "router"}
    assert all(server_still_running(r) for r in records.values())
    ev_file = tmp_path / "stop.json"
    ev_file.write_text(json.dumps({"quickmap_results_dir": str(tmp_path / "results"), "run_id": run_id}))
    stop = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            *("labs.yml", "-i", "inventory/local", "--tags", "stop", "-e", f"@{ev_file}"),
        ],
        cwd=REPO,
        env=ansible_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert stop.returncode == 0, stop.stdout[-4000:]
    assert not any(server_still_running(r) for r in records.values()), leftovers(tmp_path)
