"""Attack 2: shell injection. Names are validated, every value that reaches a shell is quoted.

Replays issue 11 item 2 (`engine_nccl_env: {"NCCL_DEBUG=INFO;touch …;Z": "1"}` ran the command on the
node), then renders EVERY shell template of the roles with hostile values in every variable it uses
and runs the result with recording stand-ins for setsid/docker/curl/timeout: no injected command may
run, and each hostile value must arrive as one argv word, byte for byte.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.ansible.runner import REPO, VENV_BIN, ansible_env, run_cli

from .conftest import assert_untouched, tree_digest

pytestmark = pytest.mark.slow

# Quotes of both kinds, command substitution, backticks, a separator, a newline and a comment.
HOSTILE = "h'q\"$(touch $QM_CANARY) `touch $QM_CANARY`;touch $QM_CANARY;\ntouch $QM_CANARY #"


@pytest.mark.parametrize("env_var", ["engine_nccl_env", "engine_env"])
def test_an_environment_name_cannot_inject_a_command(sandbox: dict, env_var: str) -> None:
    before = tree_digest(sandbox["tmp"], skip=sandbox["results"])
    key = f"NCCL_DEBUG=INFO;touch {sandbox['canary']};Z"
    ev = dict(sandbox["extravars"], run_id="inj", case_ids="short_decode_c1", **{env_var: {key: "1"}})
    res = run_cli(ev, "--tags", "fixed")
    assert res.rc != 0
    assert "rule: every name matches [A-Za-z_][A-Za-z0-9_]*" in res.output, res.output[-2000:]
    assert key in res.output
    assert_untouched(sandbox, before)
    assert not (sandbox["results"] / "inj" / "manifest.json").exists(), "refused after the run opened"


STUB = """#!{python}
import json, os, sys
tool, argv = os.path.basename(sys.argv[0]), sys.argv[1:]
call = {{"tool": tool, "argv": argv, "script": os.environ["QM_SCRIPT"], "env": os.environ.get("CAL_X")}}
with open(os.environ["QM_CALLS"], "a") as fh:
    fh.write(json.dumps(call) + "\\n")
if tool == "docker" and argv[:2] == ["inspect", "-f"]:
    print("exited 0")  # the calibration script waits for its container to exit
elif tool == "docker":
    print("f" * 64)
"""


LAB_SCRIPTS = {
    "run.sh",
    "evidence.sh",
    "accuracy.sh",
    "evidence_pd.sh",
    "fault_pd.sh",
}  # roles/labs: checked on their own below


def _stubs(bin_dir: Path) -> None:
    bin_dir.mkdir()
    for tool in ("setsid", "docker", "curl", "timeout"):
        path = bin_dir / tool
        path.write_text(STUB.format(python=sys.executable))
        path.chmod(0o755)


def shell_templates() -> list[Path]:
    """Every template of the roles that renders a shell script (included fragments come with them)."""
    return sorted(REPO.glob("roles/*/templates/*.sh.j2"))


def test_every_shell_template_quotes_every_hostile_value(tmp_path: Path) -> None:
    results = tmp_path / f"res-{HOSTILE}"  # a directory name may hold any of it
    canary = tmp_path / "pwned"
    bench_run = {
        "case_id": HOSTILE,
        "suite": "fixed",
        "rep": 1,
        "rel": f"cases/{HOSTILE}/rep1",
        "isl": 16,
        "osl": 4,
        "concurrency": 1,
        "num_prompts": 1,
        "warmup": 0,
        "stage": "short_decode",
        "timeouts": {"case_s": 60, "kill_after_s": 5, "module_s": 95, "poll_retries": 125, "task_s": 185},
    }
    hostile = {
        "engine_model_path": HOSTILE,
        "engine_served_model_name": HOSTILE,
        "engine_bind_host": HOSTILE,
        "engine_image": HOSTILE,
        "engine_container_name": HOSTILE,
        "engine_shm_size": HOSTILE,
        "engine_docker_gpus": HOSTILE,
        "engine_cache_host_dir": HOSTILE,
        "engine_cache_mount": HOSTILE,
        "engine_rdma_device_dir": HOSTILE,
        "engine_mem_fraction_static": HOSTILE,
        "engine_extra_mounts": [HOSTILE],
        "engine_docker_extra_opts": [HOSTILE],
        "engine_extra_args": ["--extra", HOSTILE, "--api-key", HOSTILE],
        "engine_process_command": [HOSTILE, HOSTILE],
        "engine_container_command": [HOSTILE],
        "engine_env": {"SAFE_NAME": HOSTILE, "HF_TOKEN": HOSTILE},
        "engine_nccl_env": {"NCCL_X": HOSTILE},
        "quickmap_hcas": ["mlx5_0"],
        "quickmap_results_dir": str(results),
        "quickmap_node_results_dir": str(results),
        "run_id": "r1",
        "quickmap_run_id": "r1",
        "bench_node_python": HOSTILE,
        "bench_model": HOSTILE,
        "bench_tokenizer": HOSTILE,
        "bench_dataset_name": HOSTILE,
        "bench_dataset_path": HOSTILE,
        "bench_request_rate": HOSTILE,
        "bench_random_range_ratio": HOSTILE,
        "bench_seed": HOSTILE,
        "bench_extra_args": [HOSTILE],
        "bench_server_host": HOSTILE,
        "bench_cross_check": True,
        "bench_reference_tokenizer": HOSTILE,
        "bench_sglang_client_command": [HOSTILE, "-m", "sglang.bench_serving"],
        "bench_scrape_metrics": True,
        "bench_run": bench_run,
        "_jobs": [HOSTILE],
        "calibrate_image": HOSTILE,
        "calibrate_container_prefix": HOSTILE,
        "calibrate_container_python": HOSTILE,
        "calibrate_node_python": HOSTILE,
        "calibrate_subdir": HOSTILE,
        "calibrate_sections": [HOSTILE],
        "calibrate_base": HOSTILE,
        "calibrate_env": {"CAL_X": HOSTILE},
        "calibrate_docker_extra_opts": [HOSTILE],
        "calibrate_timeout_s": 60,
        "labs_lab": HOSTILE,
        "labs_variant": {"name": HOSTILE, "fault": {"argv": ["loadgen", "--model", HOSTILE], "after_s": 0}},
        "labs_timeout_s": 1,
        # pd_disagg: both sides scraped beside the router (a side's name and address are hostile too)
        "labs_extra_scrapes": [{"name": HOSTILE, "base": f"http://{HOSTILE}:30001"}],
        "_labs_pd_sides_placed": [
            {"name": "prefill", "base": f"http://{HOSTILE}:30001"},
            {"name": "decode", "base": f"http://{HOSTILE}:30002"},
        ],
        "engine_runtime": HOSTILE,
        "labs_run": {
            "name": HOSTILE,
            "rel": f"run-{HOSTILE}",
            "argv": ["loadgen", "--model", HOSTILE],
            "rate_from": False,
            "sample_metrics": True,
            "profile": True,
        },
        "labs_plan": {"sample_interval_s": 0.01},
        "labs_node_dir": str(results / "labs"),
        "labs_dir": str(results / "labs"),
        "labs_client_host": HOSTILE,
        "labs_nvidia_smi": HOSTILE,
        "engine_start_result": {"pid": HOSTILE},
        "pd_launch_engine": "sglang",
        "pd_launch_prefill_address": HOSTILE,
        "pd_launch_decode_address": HOSTILE,
        "pd_launch_prefill_port": 30001,
        "pd_launch_decode_port": 30002,
        "pd_launch_bootstrap_port": 8998,
        "pd_launch_router_port": 30000,
        "pd_launch_bind_host": HOSTILE,
        "pd_launch_server_dir": str(results / f"pd-{HOSTILE}"),
        "pd_launch_router_command": [HOSTILE, HOSTILE],
        "pd_launch_router_extra_args": ["--policy", HOSTILE],
    }
    out = tmp_path / "rendered"
    out.mkdir()
    templates = shell_templates()
    hostile["render_out"] = str(out)
    hostile["render_templates"] = [{"src": str(t), "name": t.name[: -len(".j2")]} for t in templates]
    ev = tmp_path / "ev.yml"
    ev.write_text(yaml.safe_dump(hostile))
    # evidence_pd.sh.j2 reads the nodes group's hostvars (each side's start record and liveness answer)
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "nodes": {
                    "hosts": {
                        "localhost": {
                            "ansible_connection": "local",
                            "ansible_python_interpreter": sys.executable,
                        }
                    }
                }
            }
        )
    )
    rendered = subprocess.run(
        [
            str(VENV_BIN / "ansible-playbook"),
            str(Path(__file__).with_name("render_templates.yml")),
            "-i",
            str(inventory),
            "-e",
            f"@{ev}",
        ],
        cwd=REPO,
        env=ansible_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rendered.returncode == 0, rendered.stdout[-3000:] + rendered.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == sorted(t.name[: -len(".j2")] for t in templates)

    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.jsonl"
    _stubs(bin_dir)
    (results / "r1" / "server").mkdir(parents=True)
    (results / "r1" / bench_run["rel"]).mkdir(parents=True)
    (results / "labs" / HOSTILE / f"run-{HOSTILE}").mkdir(parents=True)
    (results / f"pd-{HOSTILE}" / "router").mkdir(parents=True)
    env = dict(
        os.environ,
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        QM_CANARY=str(canary),
        QM_CALLS=str(calls),
        HF_TOKEN="hf-secret-value",
        QUICKMAP_SECRET_API_KEY=HOSTILE,
    )
    runs = [(script, str(tmp_path / "server.log")) for script in sorted(out.iterdir())]
    runs += [(out / "fault_pd.sh", "start"), (out / "fault_pd.sh", "wait")]
    for script, arg in runs:
        proc = subprocess.run(
            ["bash", str(script), arg],
            cwd=tmp_path,
            env=dict(env, QM_SCRIPT=script.name),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert not canary.exists(), f"{script.name} ran an injected command:\n{script.read_text()}"
        assert proc.returncode == 0, f"{script.name}: {proc.stderr}\n{script.read_text()}"
    deadline = time.monotonic() + 20  # the server start is a background job: let it run
    while '"setsid"' not in calls.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    assert not canary.exists()
    seen = [json.loads(line) for line in calls.read_text().splitlines()]
    by_tool: dict[str, list[list[str]]] = {}
    for call in seen:
        if not call["script"].startswith("calibrate_") and call["script"] not in LAB_SCRIPTS:
            by_tool.setdefault(call["tool"], []).append(call["argv"])
    assert set(by_tool) == {"setsid", "docker", "curl", "timeout"}, by_tool.keys()

    # Every hostile value reached its program as one word, unchanged (the secret flag's value too,
    # through its environment variable).
    def after(argv: list[str], flag: str) -> str:
        return argv[argv.index(flag) + 1]

    [engine] = [
        c["argv"]
        for c in seen
        if c["tool"] == "setsid" and c["script"] not in ("run_router.sh", "fault_pd.sh")
    ]
    assert engine[:3] == ["nohup", HOSTILE, HOSTILE]
    for flag in (
        "--model-path",
        "--served-model-name",
        "--host",
        "--mem-fraction-static",
        "--extra",
        "--api-key",
    ):
        assert after(engine, flag) == HOSTILE, flag
    # The P/D router (roles/pd_launch): its command, addresses and extra flags, one word each.
    [router] = [c["argv"] for c in seen if c["script"] == "run_router.sh" and c["tool"] == "setsid"]
    assert router[:3] == ["nohup", HOSTILE, HOSTILE], router
    assert after(router, "--prefill") == f"http://{HOSTILE}:30001"
    assert after(router, "--decode") == f"http://{HOSTILE}:30002"
    assert after(router, "--host") == HOSTILE and after(router, "--policy") == HOSTILE
    docker = by_tool["docker"][0]
    for flag in ("--name", "--shm-size", "--gpus"):
        assert after(docker, flag) == HOSTILE, flag
    assert f"{HOSTILE}/rdma_cm:/dev/infiniband/rdma_cm" in docker
    assert f"{HOSTILE}:{HOSTILE}" in docker and docker.count(HOSTILE) >= 6  # mount, opts, image, command
    assert f"SAFE_NAME={HOSTILE}" in docker and f"NCCL_X={HOSTILE}" in docker
    assert not any(w.startswith("HF_TOKEN") for w in docker), "a secret went on the docker command line"
    assert after(docker, "--model-path") == HOSTILE and after(docker, "--api-key") == HOSTILE
    client = by_tool["timeout"][0]
    for flag in ("--model", "--tokenizer", "--dataset-name", "--dataset-path", "--request-rate", "--seed"):
        assert client[client.index(flag) + 1] == HOSTILE, flag
    # The reference client (bench_cross_check) after loadgen: its command and flags, one word each.
    reference = by_tool["timeout"][1]
    assert reference[3:6] == [HOSTILE, "-m", "sglang.bench_serving"], reference
    for flag in ("--model", "--tokenizer", "--dataset-name", "--dataset-path", "--request-rate", "--seed"):
        assert reference[reference.index(flag) + 1] == HOSTILE, flag

    # The calibration scripts (one container / one process per GPU; here the GPU index is hostile too).
    out_dir = f"{results}/r1/{HOSTILE}/localhost/gpu{HOSTILE}"
    cal_docker = [
        c["argv"] for c in seen if c["script"] == "calibrate_docker.sh" and c["argv"][:2] == ["run", "-d"]
    ]
    assert len(cal_docker) == 1, seen
    argv = cal_docker[0]
    assert after(argv, "--name") == f"{HOSTILE}-gpu{HOSTILE}" and after(argv, "--gpus") == f"device={HOSTILE}"
    assert f"CAL_X={HOSTILE}" in argv and argv.count(HOSTILE) >= 3  # extra option, image, python
    assert after(argv, "--out") == out_dir
    assert after(argv, "--sections") == HOSTILE and after(argv, "--base") == HOSTILE
    cal_process = [c for c in seen if c["script"] == "calibrate_process.sh" and c["tool"] == "timeout"]
    assert len(cal_process) == 1, seen
    argv = cal_process[0]["argv"]
    assert argv[2] == HOSTILE and after(argv, "--out") == out_dir and after(argv, "--base") == HOSTILE
    assert cal_process[0]["env"] == HOSTILE  # exported to the calibration process unchanged
    assert Path(out_dir).is_dir()

    # The lab run script: the client's argv arrives word for word, the metrics URL as one word.
    lab_client = [c["argv"] for c in seen if c["script"] == "run.sh" and c["tool"] == "timeout"]
    assert len(lab_client) == 1, seen
    assert lab_client[0][-3:] == ["loadgen", "--model", HOSTILE]
    lab_curls = [c["argv"] for c in seen if c["script"] in LAB_SCRIPTS and c["tool"] == "curl"]
    assert lab_curls and all(any(w.startswith(f"http://{HOSTILE}:") for w in argv) for argv in lab_curls)
    assert Path(results / "labs" / HOSTILE / HOSTILE / "server_alive.json").is_file()
    # The P/D fault run's client (started under setsid through the router) and its fault record.
    [fault_client] = [c["argv"] for c in seen if c["script"] == "fault_pd.sh" and c["tool"] == "setsid"]
    assert fault_client[-3:] == ["loadgen", "--model", HOSTILE], fault_client
    assert (
        json.loads((results / "labs" / HOSTILE / HOSTILE / "fault" / "fault.json").read_text())["after_s"]
        == 0
    )
    # evidence_pd.sh (after evidence.sh) wrote the runtime into server_alive.json as data, unchanged
    assert (
        f'"runtime": "{HOSTILE}"' in (results / "labs" / HOSTILE / HOSTILE / "server_alive.json").read_text()
    )
