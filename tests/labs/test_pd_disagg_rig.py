"""pd_disagg on the two-host rig (tests/rig): real SSH, the docker path (the rig's docker shim runs
enginesim for `python3 -m sglang.launch_server`), the prefill instance on the worker, the decode
instance and the router on the head. Asserts what a user of the lab relies on there: a verdict, the
P/D runs sent through the router, KV transfers counted on both sides, each instance on its own host,
and nothing left running on either host afterwards. Needs root; skips with the reason otherwise."""

from __future__ import annotations

import json
import re
import sys
import time

import pytest
from labs_helpers import REPO

sys.path.insert(0, str(REPO))
from tests.rig.conftest import ansible, rig  # noqa: F401  (the rig's session fixtures)
from tests.rig.procs import alive

pytestmark = [pytest.mark.rig, pytest.mark.slow]
# Small workloads: a rig run proves the placement and the evidence path, not the numbers.
SMALL = {
    "short_isl": 64, "long_isl": 512, "short_osl": 8, "long_osl": 32, "num_prompts": 4, "concurrency": 2,
    "prefix_len": 256, "question_len": 32, "prefix_osl": 8, "fault_prompts": 40, "fault_after_s": 1,
}  # fmt: skip


def test_pd_disagg_prefill_on_worker_decode_and_router_on_head(rig, ansible, tmp_path) -> None:  # noqa: F811
    head, worker = rig.host("head"), rig.host("worker")
    ev = tmp_path / "ev.json"
    ev.write_text(
        json.dumps(
            {
                "run_id": "pd_rig",
                # runs of a few requests: at the rig's 0.2 one slip made a run saturated (inconclusive)
                "time_scale": "10",
                # DeepSeek-V3 (the rig default) does not fit one emulated GPU per side
                "engine_model_path": "Qwen/Qwen3-0.6B",
                "labs_workload_overrides": {"pd_disagg": SMALL},
                "pd_launch_prefill_host": worker.name,
                "pd_launch_decode_host": head.name,
                "pd_launch_router_host": head.name,
                # The rig has no sglang_router package: enginesim's router (same flags) from the venv
                # python the rig's hosts use for enginesim.
                "pd_launch_router_command": [sys.executable, "-m", "enginesim", "sglang_router"],
            }
        )
    )
    t0 = time.monotonic()
    proc = ansible.playbook("labs.yml", "--tags", "pd_disagg", "-e", f"@{ev}", timeout=1200)
    wall = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, "\n".join(out.splitlines()[-80:])
    print(f"pd_disagg on the rig: {wall:.1f} s wall")
    ldir = rig.path / "controller" / "results" / "pd_rig" / "labs" / "pd_disagg"
    doc = json.loads((ldir / "lab.json").read_text())
    assert doc["verdict"] in ("supported", "not supported"), doc["reason"]

    # the launch record: router on the head, prefill on the worker, decode on the head
    launch = json.loads((ldir / "pd" / "server" / "pd_launch.json").read_text())
    assert launch["through_router"] is True
    assert launch["router"]["host"] == head.name and launch["router"]["url"].endswith(":30300")
    assert launch["prefill"]["host"] == worker.name and launch["decode"]["host"] == head.name
    assert launch["measured_url"] == launch["router"]["url"]
    assert launch["check"]["status"] == 200
    fig = doc["figures"]
    assert fig["launch"]["through_router"] is True
    plan = json.loads((ldir / "plan.json").read_text())
    pd = next(v for v in plan["variants"] if v.get("pd"))
    for run in pd["runs"]:
        cmd = (ldir / "pd" / "runs" / run["name"] / "bench_cmd.txt").read_text()
        # the client runs on the head: the router by its address or by loopback, never an instance
        urls = set(re.findall(r"--base-url (\S+)", cmd))
        assert urls and urls <= {launch["router"]["url"], "http://127.0.0.1:30300"}, (run["name"], urls)

    # KV transfers counted on both sides, at least one per request
    for wl, row in fig["workloads"].items():
        kv = row["kv"]
        assert kv["transfers"] >= row["pd"]["n"] > 0 and kv["failures"] == 0 and kv["bytes"] > 0, (wl, kv)

    # each instance's container ran on its own host (the docker shim's records per host)
    def pd_runs(host, side: str) -> list[dict]:
        return [
            c
            for c in host.docker_calls()
            if c["argv"][1:3] == ["run", "-d"] and f"quickmap-sglang-pd-{side}" in c["argv"]
        ]

    assert len(pd_runs(worker, "prefill")) == 1 and pd_runs(worker, "decode") == []
    assert len(pd_runs(head, "decode")) == 1 and pd_runs(head, "prefill") == []
    assert any("--disaggregation-mode" in c["argv"] for c in pd_runs(worker, "prefill"))
    # the start records came home from the host that ran each side
    prefill_rec = next((worker.work_dir).glob("**/labs/pd_disagg/pd/server/prefill/*.server.json"))
    decode_rec = next((head.work_dir).glob("**/labs/pd_disagg/pd/server/decode/*.server.json"))
    assert json.loads(prefill_rec.read_text())["runtime"] == "docker"
    assert json.loads(decode_rec.read_text())["runtime"] == "docker"
    assert not list(head.work_dir.glob("**/labs/pd_disagg/pd/server/prefill/*.server.json"))

    # after the lab nothing it started runs on either host: no container, no engine, no router
    for host in (head, worker):
        assert host.containers(include_removed=False) == [], host.name
        assert host.live_engine_pids() == [], host.name
    router = json.loads(next((ldir / "pd" / "server" / "router").glob("*.server.json")).read_text())
    assert router["pid"] and not alive(int(router["pid"]))

    # --check on the same placement prints the run scripts with each side at the host that runs it: the
    # prefill's scrape goes to the worker's address, never to the head's port of a side it does not run
    checked = ansible.playbook(
        "labs.yml", "--tags", "pd_disagg", "--check", "-e", f"@{ev}", "-e", "run_id=pd_rig_check", timeout=600
    )
    assert checked.returncode == 0, "\n".join(checked.stdout.splitlines()[-60:])
    assert f"http://{worker.address}:30100/metrics" in checked.stdout
    assert f"http://{head.address}:30100/metrics" not in checked.stdout
    assert "127.0.0.1:30100/metrics" not in checked.stdout
