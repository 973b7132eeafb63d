"""prefix_cache and kv_pressure on the two-host rig (tests/rig): real SSH, the docker path (the rig's
docker shim runs enginesim for `python3 -m sglang.launch_server`), TP over two ranks, nvidia-smi that
shows a GPU busy while a container runs. Needs root; skips with the reason otherwise."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
from labs_helpers import DEFAULTS, REPO

sys.path.insert(0, str(REPO))
from tests.rig.conftest import ansible, rig  # noqa: F401  (the rig's session fixtures)

pytestmark = [pytest.mark.rig, pytest.mark.slow]


def test_prefix_cache_and_kv_pressure_on_two_hosts_through_docker(rig, ansible, tmp_path) -> None:  # noqa: F811
    w = copy.deepcopy(DEFAULTS["labs_workloads"])
    # a rig run proves the orchestration and the evidence path: DeepSeek-V3 over two emulated nodes
    # decodes slowly, so the KV crowd is small (still far beyond a 4,096-token KV)
    w["kv_pressure"]["runs"][1].update(num_prompts=24, concurrency=24, isl=500, osl=200)
    w["kv_pressure"]["runs"][0].update(osl=256)
    ev = tmp_path / "ev.json"
    ev.write_text(
        json.dumps(
            {"run_id": "labs_rig", "labs_workloads": w, "labs_engine_env": {"ENGINESIM_TIME_SCALE": "1.0"}}
        )
    )
    proc = ansible.playbook("labs.yml", "--tags", "prefix_cache,kv_pressure", "-e", f"@{ev}", timeout=1200)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, "\n".join(out.splitlines()[-60:])
    labs_dir = rig.path / "controller" / "results" / "labs_rig" / "labs"
    head, worker = rig.host("head"), rig.host("worker")
    for lab, variants in (("prefix_cache", ["cache_on", "cache_off"]), ("kv_pressure", ["kv4096"])):
        doc = json.loads((labs_dir / lab / "lab.json").read_text())
        assert doc["verdict"] == "supported", (lab, doc["reason"])
        assert doc["emulated"] and doc["setup"]["engine"] == "sglang"
        for v in doc["setup"]["variants"]:
            assert v["name"] in variants
            # both ranks' commands and logs came home; the GPUs were proven idle on both before start
            for host in (head, worker):
                cmd = (
                    labs_dir / lab / v["name"] / "server" / f"{host.name}.start1_server_cmd.txt"
                ).read_text()
                assert cmd.count("docker run -d") == 1 and "--served-model-name" in cmd
                assert (labs_dir / lab / v["name"] / "server" / f"{host.name}.start1.log").stat().st_size > 0
            idle = {g["host"]: g for g in v["gpu_idle_before_start"]}
            assert set(idle) == {head.name, worker.name}
            assert all(g["checked"] is True and g["gpus_idle"] is True for g in idle.values())
            alive = json.loads((labs_dir / lab / v["name"] / "server_alive.json").read_text())
            assert alive == {"runtime": "docker", "container": "quickmap-sglang", "running": True}
    # server starts only (preflight also runs the image in the foreground: --help, version, the client)
    runs = [c for c in head.docker_calls() if c["argv"][1:3] == ["run", "-d"]]
    assert len(runs) == 3 and len([c for c in worker.docker_calls() if c["argv"][1:3] == ["run", "-d"]]) == 3
    kv = json.loads((labs_dir / "kv_pressure" / "lab.json").read_text())["figures"]["variants"]["kv4096"]
    assert kv["capacity"]["tokens"] == 4096  # from the head's start-up log
    assert sum(r["preemptions"] or 0 for r in kv["runs"].values()) > 0 and kv["kv_full_proofs"]
    prefix = json.loads((labs_dir / "prefix_cache" / "lab.json").read_text())["figures"]["variants"][
        "cache_on"
    ]
    assert prefix["identical_second"]["cached_tokens"] >= 2048
    assert (Path(labs_dir) / "report.md").read_text().count("**Conclusion.**") == 2
