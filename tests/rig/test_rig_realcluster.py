"""Issue 15 on the rig: what the first real run checks before it loads a model.

The flag check reads the emulated image's own --help (the docker shim turns the image tag's version into
the version enginesim emulates: v0.5.6 knows only --cuda-graph-max-bs, v0.5.23 also the seed's
--cuda-graph-max-bs-decode); the rails rule refuses a single HCA; the client runtime is proved on the
head. Every refusal happens in preflight: no server starts anywhere.
"""

from __future__ import annotations

import json
import time

import pytest

from .ansible_cli import AnsibleRunner
from .core import Rig
from .test_rig_map import docker_runs, read_json, run_dir, run_map, tail

pytestmark = [pytest.mark.rig, pytest.mark.slow]

SEED_ARGS = json.dumps({"engine_extra_args": ["--trust-remote-code", "--cuda-graph-max-bs-decode", "64"]})


def refused_before_start(rig: Rig, run_id: str, started: float) -> None:
    assert all(docker_runs(h, started) == [] for h in rig.hosts), "a server started"
    assert not (run_dir(rig, run_id) / "cases").exists()


def test_seed_flag_spelling_unknown_to_the_image_version_is_refused(ansible: AnsibleRunner, rig: Rig) -> None:
    started = time.time()
    proc = run_map(ansible, "rig-flag-drift", "-e", SEED_ARGS)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    want = (
        "--cuda-graph-max-bs-decode: a flag unknown to sglang 0.5.6 in lmsysorg/sglang:v0.5.6-cu129 (sha256:"
    )
    assert want in out, tail(proc)
    refused_before_start(rig, "rig-flag-drift", started)
    # The image really was asked: its version and its --help ran through the serving runtime, once.
    calls = [c["argv"] for c in rig.host("head").docker_calls() if c["time"] >= started]
    assert ["docker", "image", "inspect", "lmsysorg/sglang:v0.5.6-cu129"] in calls
    helps = [a for a in calls if a[-1] == "--help"]
    assert (
        helps == [[*helps[0][:-4], "python3", "-m", "sglang.launch_server", "--help"]] and "--rm" in helps[0]
    )
    # with the GPUs the server gets (engine_docker_gpus): vLLM's help fails in a container that sees none
    assert helps[0][helps[0].index("--gpus") + 1] == "all", helps[0]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (
            ["-e", '{"quickmap_hcas": ["mlx5_0"]}'],
            'quickmap_hcas=["mlx5_0"] has 1 HCA(s), quickmap_min_hcas=2 (rule: with RDMA on, every rail',
        ),
        (
            ["-e", "quickmap_node_python=/nonexistent/python3"],
            "bench_client_runtime=host (/nonexistent/python3) cannot run the client on head",
        ),
    ],
    ids=["single-rail", "client-runtime"],
)
def test_rails_and_client_runtime_are_refused_in_preflight(
    ansible: AnsibleRunner, rig: Rig, extra: list[str], needle: str
) -> None:
    started = time.time()
    proc = run_map(ansible, "rig-refused", *extra)
    assert proc.returncode != 0
    assert needle in proc.stdout + proc.stderr, tail(proc)
    refused_before_start(rig, "rig-refused", started)


def test_newer_image_gets_the_renamed_flag_and_the_client_runs_in_docker(
    ansible: AnsibleRunner, rig: Rig
) -> None:
    """v0.5.23: the inventory's rename applies (the seed's spelling reaches the server), the help cache
    comes home in the run dir, and the one case runs its client in the engine image."""
    image = "lmsysorg/sglang:v0.5.23-cu129"
    extra = [
        "-e",
        f"engine_image={image}",
        "-e",
        "bench_client_runtime=docker",
        "-e",
        "case_ids=short_decode_c1",
    ]
    proc = run_map(ansible, "rig-renamed", "--tags", "fixed", *extra)
    assert proc.returncode == 0, tail(proc)
    assert "renamed --cuda-graph-max-bs -> --cuda-graph-max-bs-decode" in proc.stdout
    rdir = run_dir(rig, "rig-renamed")
    for host in rig.hosts:
        cmd = (rdir / "nodes" / host.name / "server" / f"{host.name}.start1_server_cmd.txt").read_text()
        assert "--cuda-graph-max-bs-decode 64" in cmd and "--cuda-graph-max-bs 64" not in cmd
    cached = list((rdir / "nodes" / "head" / "server" / "engine_help").glob("sha256-*.json"))
    assert len(cached) == 1 and "--cuda-graph-max-bs-decode" in read_json(cached[0])["help"]
    meta = read_json(rdir / "cases" / "short_decode_c1" / "rep1" / "meta.json")
    assert meta["status"] == "completed", meta
    assert (
        meta["bench_cmd"].split()[4:7] == ["docker", "run", "--rm"]
        and f" {image} python3 " in meta["bench_cmd"]
    )
