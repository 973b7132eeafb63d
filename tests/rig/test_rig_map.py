"""The quick map on two real (namespaced) hosts: `ansible-playbook quick_map.yml -i <rig inventory>`.

Everything here goes through the user's exact command line: real SSH, the roles' docker commands run by
the rig's docker shim, two enginesim ranks meeting over TCP across the namespaces, the NCCL gate reading
both nodes' logs, artefacts coming home as one tarball per host. The tests run in file order: the full
map first (its saved commands seed the stale-server test), then the failure paths.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from . import procs
from .ansible_cli import AnsibleRunner
from .core import REPO, VENV_PYTHON, Rig, RigHost, make_hca

pytestmark = [pytest.mark.rig, pytest.mark.slow]

CASES = ["cold_prefill_4k", "short_decode_c1"]
RUN_TIMEOUT_S = 300
# What inventory/dual asks for (issue 6): the NCCL environment and the RDMA devices for mlx5_0/mlx5_3.
NCCL_ENV = {"NCCL_SOCKET_IFNAME": "eth0,eth3", "NCCL_IB_HCA": "=mlx5_0:1,mlx5_3:1", "NCCL_DEBUG": "INFO"}
RDMA_DEVICES = ["rdma_cm", "uverbs0", "uverbs3"]
MIXED_ROLES = ["control", "decode_background", "prefill_injection"]


# ------------------------------------------------------------------------------------------ helpers


def tail(proc: subprocess.CompletedProcess[str], lines: int = 40) -> str:
    """Every failure line of a playbook's output, then its end (for assertion messages)."""
    out = (proc.stdout + proc.stderr).splitlines()
    failures = [line[:600] for line in out if line.startswith(("fatal:", "failed:", "[ERROR]"))]
    return "\n".join(["--- failures:", *failures, "--- end of output:", *out[-lines:]])


def run_map(ansible: AnsibleRunner, run_id: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """`ansible-playbook quick_map.yml -i <rig> -e run_id=RUN_ID EXTRA...` (the user's command)."""
    return ansible.playbook("quick_map.yml", "-e", f"run_id={run_id}", *extra, timeout=RUN_TIMEOUT_S)


def start_map(ansible: AnsibleRunner, run_id: str, *extra: str) -> subprocess.Popen[str]:
    """The same command, in the background (for tests that act while it runs)."""
    cmd = [str(VENV_PYTHON.parent / "ansible-playbook"), "quick_map.yml", "-i", str(ansible.rig.inventory)]
    return subprocess.Popen(
        [*cmd, "-e", f"run_id={run_id}", *extra],
        cwd=REPO,
        env=ansible.rig.ansible_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_dir(rig: Rig, run_id: str) -> Path:
    """The run directory on the controller."""
    return rig.path / "controller" / "results" / run_id


def read_json(path: Path) -> dict:
    """A JSON file's content (with the path in the error when it is missing or broken)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise AssertionError(f"cannot read {path}: {err}") from err


def docker_runs(host: RigHost, since: float = 0.0) -> list[dict]:
    """The server starts (`docker run -d`) recorded on `host` at or after `since`.

    Preflight's flag check also runs the image (`docker run --rm ... --help`, in the foreground): that
    starts no server and is not counted.
    """
    return [
        c
        for c in host.docker_calls()
        if c["argv"][1:2] == ["run"] and "-d" in c["argv"] and c["time"] >= since
    ]


def live_containers(rig: Rig) -> list[str]:
    """Containers whose engine still runs, on any host ("host:name")."""
    return [
        f"{h.name}:{s['name']}"
        for h in rig.hosts
        for s in h.containers(include_removed=False)
        if s["status"] == "running" and procs.alive(s["pid"] or 0)
    ]


def engines_alive(rig: Rig) -> list[int]:
    """Engine PIDs recorded by the shims that are still alive."""
    return [pid for h in rig.hosts for pid in h.live_engine_pids()]


def env_pairs(argv: list[str]) -> dict[str, str]:
    """`-e K=V` / `--env K=V` pairs of a docker argv (up to the image)."""
    pairs = {}
    for flag, value in itertools.pairwise(argv):
        if flag in ("-e", "--env") and "=" in value:
            key, _, val = value.partition("=")
            pairs[key] = val
    return pairs


def option_values(argv: list[str], name: str) -> list[str]:
    """Every value given to option `name` in argv."""
    return [value for flag, value in itertools.pairwise(argv) if flag == name]


def case_meta(rig: Rig, run_id: str, case_id: str, rep: int = 1) -> dict:
    """meta.json of one case as the controller holds it."""
    return read_json(run_dir(rig, run_id) / "cases" / case_id / f"rep{rep}" / "meta.json")


def case_done(rig: Rig, run_id: str, case_id: str, rep: int = 1) -> subprocess.CompletedProcess[str]:
    """`python -m analysis case-done` (meta completed AND bench.json complete with the expected count)."""
    case = run_dir(rig, run_id) / "cases" / case_id / f"rep{rep}"
    return subprocess.run(
        [str(VENV_PYTHON), "-m", "analysis", "case-done", str(case)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def assert_servers_stopped(rig: Rig) -> None:
    """No container running and no engine process alive on either host."""
    assert live_containers(rig) == []
    assert engines_alive(rig) == []


def assert_evidence_home(rig: Rig, run_id: str) -> None:
    """Each host's tarball came home with its server command, final log and docker inspect."""
    for host in rig.hosts:
        server = run_dir(rig, run_id) / "nodes" / host.name / "server"
        names = (
            f"{host.name}.start1_server_cmd.txt",
            f"{host.name}.start1.log",
            f"{host.name}.start1.inspect.json",
        )
        for name in names:
            assert (server / name).is_file(), f"missing evidence {server / name}"
        inspect = json.loads((server / f"{host.name}.start1.inspect.json").read_text())
        assert inspect and inspect[0]["Config"]["Image"], inspect


# -------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session", autouse=True)
def zipapp() -> Path:
    """The client zipapp the bench role copies to the head (`make zipapp`; built here when missing)."""
    pyz = REPO / "build" / "loadgen.pyz"
    if not pyz.exists():
        subprocess.run(
            [str(VENV_PYTHON), "-m", "loadgen.build_zipapp", str(pyz)], cwd=REPO, check=True, timeout=120
        )
    return pyz


@pytest.fixture(scope="module")
def full_map(ansible: AnsibleRunner, rig: Rig) -> tuple[str, subprocess.CompletedProcess[str], float]:
    """One full map on the rig (small case subset, small time scale), shared by the checks below."""
    started = time.time()
    proc = run_map(ansible, "rig-full", "-e", f"case_ids={','.join(CASES)}")
    return "rig-full", proc, started


# ----------------------------------------------------------------------------------------- tests


def test_full_map_completes_on_two_hosts(full_map: tuple, rig: Rig) -> None:
    run_id, proc, _ = full_map
    assert proc.returncode == 0, tail(proc)
    manifest = read_json(run_dir(rig, run_id) / "manifest.json")
    assert manifest["status"] == "completed", manifest
    for case_id in CASES:
        assert case_meta(rig, run_id, case_id)["status"] == "completed"
        done = case_done(rig, run_id, case_id)
        assert done.returncode == 0, done.stdout + done.stderr
    assert (run_dir(rig, run_id) / "report.md").is_file()
    assert_evidence_home(rig, run_id)
    for host in rig.hosts:
        gate = read_json(
            run_dir(rig, run_id) / "nodes" / host.name / "server" / f"{host.name}.start1_nccl_gate.json"
        )
        assert gate["passed"] is True, gate.get("msg")
        assert gate["logs"][0]["transport"] == "ib", gate["logs"][0]
        assert sorted(gate["logs"][0]["hcas"]) == ["mlx5_0:1", "mlx5_3:1"], gate["logs"][0]["hcas"]
    # The benchmark ran on the head only; the worker's disk has no case directories.
    assert not (rig.host("worker").work_dir / run_id / "cases").exists()
    assert_servers_stopped(rig)


def test_worker_started_before_head(full_map: tuple, rig: Rig) -> None:
    """From the docker calls recorded on each host: the worker's rank was up before the head was started."""
    _, proc, started = full_map
    assert proc.returncode == 0, tail(proc)
    worker_runs = docker_runs(rig.host("worker"), started)
    head_runs = docker_runs(rig.host("head"), started)
    assert len(worker_runs) == 1 and len(head_runs) == 1, (worker_runs, head_runs)
    assert worker_runs[0]["time"] < head_runs[0]["time"]
    worker_state = next(
        s for s in rig.host("worker").containers() if s["docker_argv"] == worker_runs[0]["argv"]
    )
    started_at = time.mktime(time.strptime(worker_state["started"][:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
    assert started_at <= head_runs[0]["time"] + 1.0  # whole-second resolution of the ISO stamp


def test_docker_argv_carries_rdma_devices_and_nccl_env(full_map: tuple, rig: Rig) -> None:
    """Every RDMA device and every NCCL variable is on each node's docker command, and reached the engine."""
    _, proc, started = full_map
    assert proc.returncode == 0, tail(proc)
    head = rig.host("head")
    for host in rig.hosts:
        (call,) = docker_runs(host, started)
        argv = call["argv"]
        devices = option_values(argv, "--device")
        for dev in RDMA_DEVICES:
            assert f"{host.devices_dir}/infiniband/{dev}:/dev/infiniband/{dev}" in devices, devices
        env = env_pairs(argv)
        for key, value in NCCL_ENV.items():
            assert env.get(key) == value, (key, env)
        assert "NCCL_CROSS_NIC" in env
        assert option_values(argv, "--network") == ["host"] and option_values(argv, "--ipc") == ["host"]
        assert option_values(argv, "--shm-size")
        launch = argv.index("sglang.launch_server")
        engine_args = argv[launch + 1 :]
        rank = "0" if host.role == "head" else "1"
        assert option_values(engine_args, "--nnodes") == ["2"]
        assert option_values(engine_args, "--node-rank") == [rank]
        assert option_values(engine_args, "--dist-init-addr") == [f"{head.address}:20000"]
        assert option_values(engine_args, "--tp-size") == ["16"] and option_values(
            engine_args, "--ep-size"
        ) == ["2"]
        assert option_values(engine_args, "--mem-fraction-static") == ["0.9"]
        assert option_values(engine_args, "--cuda-graph-max-bs") == ["64"]
        assert option_values(engine_args, "--max-running-requests") == ["256"]
        # What the engine process actually received (the shim's container env), incl. the stand-in HCAs.
        state = next(s for s in host.containers() if s["docker_argv"] == argv)
        for key, value in NCCL_ENV.items():
            assert state["env"][key] == value
        assert state["env"]["ENGINESIM_IB_DIR"] == str(host.ib_dir)
        saved = (
            run_dir(rig, full_map[0]) / "nodes" / host.name / "server" / f"{host.name}.start1_server_cmd.txt"
        )
        assert "docker run" in saved.read_text()


def test_servers_left_by_earlier_runs_are_refused_in_preflight(
    full_map: tuple, ansible: AnsibleRunner, rig: Rig
) -> None:
    """Two leftovers, one per host: on the worker its saved rank command re-run by hand (a live stale
    server), on the head an engine that died (DeepSeek-V3 on one GPU runs out of memory) and left an
    exited container. The next map stops in preflight on both, before anything starts anywhere. Neither
    container is the one run rig-full recorded, so its --tags stop names them and leaves them alone
    (ownership); removing them by hand clears the way."""
    run_id, proc, _ = full_map
    assert proc.returncode == 0, tail(proc)
    head, worker = rig.host("head"), rig.host("worker")
    saved = worker.work_dir / run_id / "server" / f"{worker.name}.start1_server_cmd.txt"
    left = ansible.adhoc(worker.name, "ansible.builtin.command", f"bash {saved}")
    assert left.returncode == 0, left.stdout + left.stderr
    dead = "docker run -d --name quickmap-sglang img python3 -m sglang.launch_server"
    dead += " --model-path deepseek-ai/DeepSeek-V3 --port 31000"
    left = ansible.adhoc(head.name, "ansible.builtin.command", dead)
    assert left.returncode == 0, left.stdout + left.stderr
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and [s["status"] for s in head.containers(False)] != ["exited"]:
        time.sleep(0.2)
    assert [s["status"] for s in head.containers(include_removed=False)] == ["exited"]
    try:
        before = time.time()
        refused = run_map(ansible, "rig-stale", "-e", f"case_ids={CASES[0]}")
        assert refused.returncode != 0
        out = refused.stdout + refused.stderr
        assert f"{worker.name}: a server from an earlier run is still running" in out, tail(refused)
        refusal = f"{head.name}: container quickmap-sglang from an earlier run still exists (state exited)"
        assert refusal in out, tail(refused)
        # The whole run stopped in preflight: nothing started anywhere, no case, no new server.
        assert docker_runs(head, before) == [] and docker_runs(worker, before) == []
        assert not (run_dir(rig, "rig-stale") / "cases").exists()
    finally:
        stop = ansible.playbook("quick_map.yml", "--tags", "stop", "-e", f"run_id={run_id}")
        for host in (head, worker):
            ansible.adhoc(host.name, "ansible.builtin.command", "docker rm -f quickmap-sglang")
    assert stop.returncode == 0, tail(stop)
    assert "left alone" in stop.stdout, tail(stop)
    assert head.containers(include_removed=False) == [] and worker.containers(include_removed=False) == []
    assert_servers_stopped(rig)


def test_mixed_tag_runs_only_the_ab(ansible: AnsibleRunner, rig: Rig) -> None:
    started = time.time()
    proc = run_map(ansible, "rig-mixed", "--tags", "mixed")
    assert proc.returncode == 0, tail(proc)
    rdir = run_dir(rig, "rig-mixed")
    for role in MIXED_ROLES:
        meta = read_json(rdir / "mixed" / "rep1" / role / "meta.json")
        assert meta["status"] == "completed", meta
    assert not (rdir / "cases").exists() or not any((rdir / "cases").iterdir())
    assert read_json(rdir / "manifest.json")["status"] == "completed"
    worker_runs, head_runs = docker_runs(rig.host("worker"), started), docker_runs(rig.host("head"), started)
    assert len(worker_runs) == 1 and len(head_runs) == 1 and worker_runs[0]["time"] < head_runs[0]["time"]
    assert_evidence_home(rig, "rig-mixed")
    assert_servers_stopped(rig)


def test_missing_hca_on_worker_fails_the_gate_closed(ansible: AnsibleRunner, rig: Rig) -> None:
    """mlx5_3 gone on the worker: NCCL there cannot use both rails; the gate fails, nothing is benchmarked."""
    worker = rig.host("worker")
    shutil.rmtree(worker.ib_dir / "mlx5_3")
    try:
        started = time.time()
        proc = run_map(ansible, "rig-nohca", "-e", f"case_ids={CASES[0]}")
    finally:
        make_hca(worker.ib_dir, "mlx5_3")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, tail(proc)
    assert "GATE_FAILED" in out, tail(proc)
    rdir = run_dir(rig, "rig-nohca")
    # Nothing benchmarked: no case ran on the head, no client result anywhere.
    assert not (rig.host("head").work_dir / "rig-nohca" / "cases").exists()
    assert not list(rdir.rglob("bench.json"))
    # Both servers were started (worker first) and both were stopped, with their evidence saved.
    assert len(docker_runs(worker, started)) == 1 and len(docker_runs(rig.host("head"), started)) == 1
    assert_servers_stopped(rig)
    assert_evidence_home(rig, "rig-nohca")
    gate = read_json(rdir / "nodes" / worker.name / "server" / f"{worker.name}.start1_nccl_gate.json")
    assert gate["passed"] is False, gate
    # The evidence: the verdict keeps the NCCL lines it read and says what was wrong with them.
    evidence = gate["logs"][0]
    assert "mlx5_3:1" not in evidence["hcas"] and evidence["problems"], evidence
    # Real NCCL keeps going on the remaining rail (mlx5_0 alone); the rails rule is what fails it.
    assert evidence["hcas"] == ["mlx5_0:1"] and evidence["transport"] == "ib", evidence
    assert any("fewer than min_hcas=2" in p for p in evidence["problems"]), evidence["problems"]
    assert any("NET/IB" in line for line in evidence["lines"]), evidence["lines"]
    head = rig.host("head").name
    head_gate = read_json(rdir / "nodes" / head / "server" / f"{head}.start1_nccl_gate.json")
    assert head_gate["passed"] is True  # the head still has both rails: the worker's log failed the gate
    assert read_json(rdir / "manifest.json")["status"] in ("failed", "partial"), (
        "run status must say it failed"
    )


KILL_CASES = ["cold_prefill_4k", "short_decode_c1"]


def test_worker_killed_mid_case_then_resume(ansible: AnsibleRunner, rig: Rig) -> None:
    """Kill the worker's engine while the head benchmarks: the case is classified, servers stopped, the run
    says failed; resuming the same run id keeps the finished case and completes the rest."""
    run_id = "rig-kill"
    head, worker = rig.host("head"), rig.host("worker")
    # The fixed suite only (the mixed A/B adds nothing here); 4 prompts per case so the victim (1K-token
    # decodes one at a time) is still decoding when the worker dies.
    plan = ["--tags", "fixed", "-e", f"case_ids={','.join(KILL_CASES)}"]
    proc = start_map(ansible, run_id, *plan, "-e", "num_prompts_cap=4")
    victim = head.work_dir / run_id / "cases" / KILL_CASES[1] / "rep1"
    killed = None
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            phase = victim / "phase.json"
            if phase.exists() and json.loads(phase.read_text() or "{}").get("phase") == "main":
                running = [s for s in worker.containers(include_removed=False) if s["status"] == "running"]
                assert running, "worker container should be running while the head benchmarks"
                killed = running[0]["pid"]
                os.kill(killed, signal.SIGKILL)  # the worker's rank dies without a word
                break
            time.sleep(0.1)
        out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert killed, f"the victim case never reached its main phase:\n{out[-4000:]}"
    assert proc.returncode != 0, out[-4000:]
    first = case_meta(rig, run_id, KILL_CASES[0])
    assert first["status"] == "completed"
    meta = case_meta(rig, run_id, KILL_CASES[1])
    assert meta["status"] == "failed" and meta["error_type"] in ("SERVER_DEAD", "TRANSPORT_ERROR"), meta
    assert read_json(run_dir(rig, run_id) / "manifest.json")["status"] in ("failed", "partial")
    assert_servers_stopped(rig)
    # The head saw the worker's rendezvous connection (across the namespaces) drop, and its final log
    # came home with the evidence.
    head_log = run_dir(rig, run_id) / "nodes" / head.name / "server" / f"{head.name}.start1.log"
    assert f"Connection closed by remote peer {worker.address}" in head_log.read_text()

    # Resume: same run id and the same plan (a kept case measured under another prompt count would be
    # refused by its fingerprint), the finished case untouched, the killed case redone and completed.
    resumed = run_map(ansible, run_id, *plan, "-e", "num_prompts_cap=4", "-e", "resume=true")
    assert resumed.returncode == 0, tail(resumed)
    assert case_meta(rig, run_id, KILL_CASES[0]) == first
    for case_id in KILL_CASES:
        done = case_done(rig, run_id, case_id)
        assert done.returncode == 0, (case_id, done.stdout + done.stderr)
    assert read_json(run_dir(rig, run_id) / "manifest.json")["status"] == "completed"
    assert_servers_stopped(rig)
