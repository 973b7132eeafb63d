"""An ops team's playbook (tests/collection/ops/) on the two-host rig, with quickmap.serving installed
from its tarball: the engine role starts SGLang in Docker on both hosts (the rig's docker shim runs
enginesim), worker before head, the nccl_gate role proves both IB rails from each host's log, the
engine role stops both servers with evidence. It runs from a directory outside the repository with the
ops team's own ansible.cfg (no roles_path, no library, no plugin paths): the roles, modules and filters
can only come from the collection. Needs root; skips with the reason otherwise."""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO, Built

sys.path.insert(0, str(REPO))
from tests.rig.conftest import ansible, rig  # noqa: F401  (the rig's session fixtures)
from tests.rig.core import VENV_PYTHON, Rig, RigHost, make_hca
from tests.rig.inventory import host_overrides

pytestmark = pytest.mark.rig

OPS = Path(__file__).with_name("ops")
# The rig's per-host values the ops inventory takes: how to reach the host, where its dirs, devices,
# HCAs and model stand-in are, enginesim's time scale (everything else is the ops team's group_vars).
HOST_KEYS = re.compile(r"ansible_.*|engine_.*|rig_time_scale|quickmap_node_results_dir")


def ops_project(on: Rig, tmp_path: Path) -> Path:
    """The ops project copied outside the repository, with an inventory for the rig's two hosts."""
    project = tmp_path / "ops"
    shutil.copytree(OPS, project)
    inv = project / "inventory"
    groups = {"head": "head", "workers": "worker"}
    tree = {
        "all": {
            "children": {
                "nodes": {
                    "children": {
                        group: {"hosts": {on.host(role).name: {"engine_node_rank": int(role == "worker")}}}
                        for group, role in groups.items()
                    }
                }
            }
        }
    }
    (inv / "hosts.yml").write_text(yaml.safe_dump(tree, sort_keys=False))
    (inv / "host_vars").mkdir()
    for host in on.hosts:
        own = {k: v for k, v in host_overrides(on, host.role).items() if HOST_KEYS.fullmatch(k)}
        (inv / "host_vars" / f"{host.name}.yml").write_text(yaml.safe_dump(own, sort_keys=False))
    return project


def run_ops(on: Rig, project: Path, collections: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """ansible-playbook serve_and_gate.yml from the ops project, the collection from `collections` only."""
    env = {k: v for k, v in on.ansible_env().items() if not k.startswith("ANSIBLE_") or k.endswith("DIR")}
    env.update(
        ANSIBLE_CONFIG=str(project / "ansible.cfg"),
        ANSIBLE_COLLECTIONS_PATH=str(collections),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_HOST_KEY_CHECKING="True",
    )
    return subprocess.run(
        [str(VENV_PYTHON.parent / "ansible-playbook"), "serve_and_gate.yml", *extra],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )


def server_starts(host: RigHost, since: float) -> list[dict]:
    return [c for c in host.docker_calls() if c["argv"][1:3] == ["run", "-d"] and c["time"] >= since]


def gate(host: RigHost, run_id: str) -> dict:
    return json.loads((host.work_dir / run_id / "server" / f"{host.name}.start1_nccl_gate.json").read_text())


def assert_stopped_with_evidence(on: Rig, run_id: str, since: float) -> None:
    for host in on.hosts:
        assert not [s for s in host.containers(include_removed=False) if s["status"] == "running"], host.name
        assert not host.live_engine_pids(), host.name
        removes = [c for c in host.docker_calls() if c["argv"][1:2] == ["rm"] and c["time"] >= since]
        assert removes and removes[-1]["argv"][-1] == "ops-sglang", host.docker_calls()[-3:]
        assert (host.work_dir / run_id / "server" / f"{host.name}.start1.inspect.json").is_file()


def tail(proc: subprocess.CompletedProcess[str], lines: int = 40) -> str:
    out = (proc.stdout + proc.stderr).splitlines()
    failures = [line[:800] for line in out if line.startswith(("fatal:", "failed:", "[ERROR]", "ERROR!"))]
    return "\n".join(["--- failures:", *failures, "--- end of output:", *out[-lines:]])


def test_ops_playbook_serves_and_gates_through_the_installed_collection(
    rig: Rig,  # noqa: F811
    built_collection: Built,
    tmp_path: Path,
) -> None:
    project = ops_project(rig, tmp_path)
    started = time.time()
    proc = run_ops(rig, project, built_collection.install_root, "-e", "run_id=ops-pass", "-vvv")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, tail(proc)
    # The modules ran from the install, never from the checkout.
    modules = built_collection.installed / "plugins" / "modules"
    for module in ("server_process", "nccl_transport"):
        assert f"Using module file {modules / module}.py" in out, module
    assert str(REPO / "library") not in out and str(REPO / "roles") not in out
    head, worker = rig.host("head"), rig.host("worker")
    worker_runs, head_runs = server_starts(worker, started), server_starts(head, started)
    assert len(worker_runs) == 1 and len(head_runs) == 1, (worker_runs, head_runs)
    assert worker_runs[0]["time"] < head_runs[0]["time"]  # worker ranks before the head
    for host, (run,) in ((worker, worker_runs), (head, head_runs)):
        argv = run["argv"]
        assert "lmsysorg/sglang:v0.5.6-cu129" in argv and "--name" in argv and "ops-sglang" in argv
        assert "NCCL_IB_HCA==mlx5_0:1,mlx5_3:1" in argv, argv
        devices = [v for f, v in itertools.pairwise(argv) if f == "--device"]
        assert sorted(d.rsplit("/", 1)[-1] for d in devices) == ["rdma_cm", "uverbs0", "uverbs3"], devices
        verdict = gate(host, "ops-pass")
        assert verdict["passed"] is True, verdict
        assert sorted(verdict["logs"][0]["hcas"]) == ["mlx5_0:1", "mlx5_3:1"], verdict["logs"][0]
    assert_stopped_with_evidence(rig, "ops-pass", started)


def test_ops_gate_fails_closed_on_one_rail_and_still_stops(
    rig: Rig,  # noqa: F811
    built_collection: Built,
    tmp_path: Path,
) -> None:
    """mlx5_3 gone on the worker: the collection's gate fails the run naming the worker; both servers
    are stopped with evidence."""
    project = ops_project(rig, tmp_path)
    worker = rig.host("worker")
    shutil.rmtree(worker.ib_dir / "mlx5_3")
    try:
        started = time.time()
        proc = run_ops(rig, project, built_collection.install_root, "-e", "run_id=ops-nohca")
    finally:
        make_hca(worker.ib_dir, "mlx5_3")
    assert proc.returncode != 0, tail(proc)
    assert f"GATE_FAILED on {worker.name}" in proc.stdout + proc.stderr, tail(proc)
    verdict = gate(worker, "ops-nohca")
    assert verdict["passed"] is False and verdict["logs"][0]["hcas"] == ["mlx5_0:1"], verdict
    assert gate(rig.host("head"), "ops-nohca")["passed"] is True
    assert_stopped_with_evidence(rig, "ops-nohca", started)


def test_without_the_collection_the_ops_playbook_cannot_resolve_its_roles(
    rig: Rig,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The control: the same project with an empty collections path does not find quickmap.serving, so
    the runs above used the install and nothing from the checkout."""
    project = ops_project(rig, tmp_path)
    empty = tmp_path / "no-collections"
    empty.mkdir()
    proc = run_ops(rig, project, empty, "-e", "run_id=ops-none")
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "the role 'quickmap.serving.engine' was not found" in proc.stdout + proc.stderr
    assert not [c for h in rig.hosts for c in h.docker_calls() if "ops-none" in json.dumps(c)]
