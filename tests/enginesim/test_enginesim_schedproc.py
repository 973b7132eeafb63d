"""--sim-scheduler-process: the engine runs in a child titled like the real engine's scheduler process,
dies with its parent's SIGTERM, and the profiler trace carries the scheduler's CPU spans on a track of
their own, each before its step's forward pass (the emulator prices them serially)."""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path

import httpx
import pytest


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as f:
            out += [int(x) for x in f.read().split()]
    return out


def _cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().rstrip(b"\0").decode().split("\0")


def _gone(pid: int, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[-1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(
    ("args", "title", "env"),
    [
        (["sglang", "--model-path", "Qwen/Qwen3-0.6B"], "sglang::scheduler_TP0", {}),
        (["vllm", "serve", "Qwen/Qwen3-0.6B"], "VLLM::EngineCore", {"VLLM_TORCH_PROFILER_DIR": ""}),
    ],
)
def test_scheduler_child_process_and_its_trace(start, tmp_path: Path, args, title, env) -> None:
    env = dict(env)
    if "VLLM_TORCH_PROFILER_DIR" in env:
        env["VLLM_TORCH_PROFILER_DIR"] = str(tmp_path / "vllm_prof")
    srv = start([*args, "--sim-scheduler-process"], env=env)
    kids = _children(srv.proc.pid)
    assert len(kids) == 1, kids
    child = kids[0]
    assert _cmdline(child)[0] == title
    with open(f"/proc/{child}/comm") as f:
        assert f.read().strip() == title[:15]
    assert _cmdline(srv.proc.pid)[0] != title  # the parent keeps the command line it was started with

    out = tmp_path / "trace"
    body = {"output_dir": str(out)} if args[0] == "sglang" else None
    assert httpx.post(srv.url + "/start_profile", json=body, timeout=5).status_code == 200
    if args[0] == "sglang":
        r = httpx.post(
            srv.url + "/generate", json={"text": "hello " * 40, "sampling_params": {"max_new_tokens": 8}}
        )
    else:
        r = httpx.post(
            srv.url + "/v1/completions",
            json={"model": "Qwen/Qwen3-0.6B", "prompt": "hello " * 40, "max_tokens": 8},
        )
    assert r.status_code == 200, r.text
    assert httpx.post(srv.url + "/stop_profile", timeout=30).status_code == 200
    where = out if args[0] == "sglang" else tmp_path / "vllm_prof"
    files = sorted(where.glob("*.json.gz"))
    assert len(files) == 1, files
    if args[0] == "vllm":
        assert files[0].name.split(".")[0].endswith(f"_{child}")  # written by the EngineCore process
    events = json.loads(gzip.decompress(files[0].read_bytes()))["traceEvents"]
    sched = [e for e in events if e.get("ph") == "X" and e.get("tid") == 2]
    fwd = [e for e in events if e.get("ph") == "X" and e.get("tid") == 1]
    assert sched and len(sched) == len(fwd)
    expect = "Scheduler.get_next_batch_to_run" if args[0] == "sglang" else "Scheduler.schedule"
    assert {e["name"] for e in sched} == {expect}
    for s, f in zip(sched, fwd, strict=True):
        assert s["dur"] > 0
        assert f["ts"] >= s["ts"] + s["dur"] - 1e-3  # scheduled, then forward: no overlap emulated

    os.kill(srv.proc.pid, 15)
    assert srv.proc.wait(10) == 0
    assert _gone(child)
