"""The reference client's preflight on the rig (issue 15 item 4): the head alone checks it, every node stops.

The head's client runtime has no vLLM, so `bench_client=vllm` is refused by the head's flag check
(`roles/bench/tasks/client_check.yml`, run on the head only). The refusal must end the run for every
node: without `any_errors_fatal` the workers went on alone, opened the run (the manifest is written
run_once by whichever host is left) and reached the serve play.
"""

from __future__ import annotations

import time

import pytest

from .ansible_cli import AnsibleRunner
from .core import Rig
from .test_rig_map import docker_runs, run_dir, run_map, tail

pytestmark = [pytest.mark.rig, pytest.mark.slow]


def test_a_reference_client_refused_on_the_head_stops_every_node(ansible: AnsibleRunner, rig: Rig) -> None:
    started = time.time()
    proc = run_map(
        ansible,
        "rig-noclient",
        "-e",
        "bench_client=vllm",
        "-e",
        "bench_reference_tokenizer=/nonexistent/tokenizer",
        "-e",
        "case_ids=short_decode_c1",
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "vllm client" in out and "exited" in out, tail(proc)
    # No node went past preflight: the run was never opened and no server started anywhere.
    assert not (run_dir(rig, "rig-noclient") / "manifest.json").exists(), tail(proc)
    assert all(docker_runs(h, started) == [] for h in rig.hosts), "a server started"
    assert "Preflight | write the manifest" not in out, tail(proc)
