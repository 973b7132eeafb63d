"""python -m enginesim.calibrate.collectives --out DIR: NCCL all-reduce and all-gather at TP message sizes.

On a host with several GPUs: for each world size (2, 4, 8 by default, as many as the host has), one
process per GPU (torch.multiprocessing spawn) joins an NCCL process group and times all-reduce and
all-gather of tokens × hidden bf16 values at the sizes of a TP decode step and a TP prefill chunk of
catalogue models. NCCL_DEBUG=INFO and NCCL_NVLS_ENABLE=0 are set for every rank; each rank's complete
NCCL log goes to nccl/tp<N>/rank<R>.log (NCCL_DEBUG_FILE). On a CPU the same code runs with the gloo
backend and tiny sizes; its output says backend=gloo and is never a GPU figure.

Why each figure is the slowest rank's: a TP layer waits for its last rank. Each sample is the mean of
`inner` back-to-back collectives (as nccl-tests times them) after a barrier, and the figure is the
median over samples of the slowest rank's sample. collectives.json is rewritten atomically after each
world size, so a lost machine keeps what was measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import time
import traceback
from typing import Any

from . import comm_plan, nccl_files
from .profile import dumps, write_atomic

SCHEMA = "enginesim.collectives/1"
NCCL_ENV = {"NCCL_DEBUG": "INFO", "NCCL_NVLS_ENABLE": "0"}
CPU_NOTE = "CPU/gloo run: it tests the measuring code on tiny sizes and says nothing about a GPU interconnect"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m enginesim.calibrate.collectives", description=__doc__)
    p.add_argument("--out", required=True, help="directory for collectives.json and nccl/ (created)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument(
        "--world-sizes",
        default="auto",
        help="comma list of GPU counts (default: 2,4,8 up to the GPUs present; 2 on a CPU)",
    )
    p.add_argument(
        "--models", default=",".join(comm_plan.DEFAULT_MODELS), help="catalogue models (hidden sizes)"
    )
    p.add_argument(
        "--nccl-subsys",
        default="INIT,ENV,GRAPH",
        help="NCCL_DEBUG_SUBSYS for every rank (INIT carries the transport and channel lines)",
    )
    p.add_argument("--samples", type=int, default=None, help="timed samples per size (default: the plan's)")
    p.add_argument("--trim-into", default=None, help="also write host-trimmed copies of the NCCL logs here")
    ns = p.parse_args(argv)
    if ns.world_sizes != "auto":
        try:
            ns.world_sizes = tuple(int(w) for w in ns.world_sizes.split(","))
        except ValueError:
            p.error(f"--world-sizes {ns.world_sizes!r}: must be 'auto' or a comma list of integers >= 2")
        if not ns.world_sizes or min(ns.world_sizes) < 2:
            p.error(f"--world-sizes {ns.world_sizes!r}: every size must be >= 2")
    ns.models = [m for m in ns.models.split(",") if m]
    try:
        comm_plan.hidden_sizes(ns.models)
    except (KeyError, ValueError) as e:
        p.error(f"--models {','.join(ns.models)!r}: {e}")
    if ns.samples is not None and ns.samples < 3:
        p.error(f"--samples {ns.samples}: must be >= 3 (a median of fewer says little)")
    if not ns.nccl_subsys.replace(",", "").replace("^", "").isalpha():
        p.error(f"--nccl-subsys {ns.nccl_subsys!r}: must be a comma list of NCCL subsystem names")
    if os.path.exists(os.path.join(ns.out, "collectives.json")):
        p.error(f"--out {ns.out!r}: collectives.json already exists there (results are never overwritten)")
    return ns


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------------------------- one rank


def _barrier(dist: Any, torch: Any, dev: Any) -> None:
    """A one-value all-reduce: the same barrier on both backends, then the device is idle."""
    flag = torch.zeros(1, device=dev)
    dist.all_reduce(flag)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _timed(fn: Any, torch: Any, dev: Any, inner: int) -> float:
    """Mean seconds of `inner` back-to-back calls: CUDA events on a GPU, the host clock on a CPU."""
    if dev.type == "cuda":
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(inner):
            fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / 1e3 / inner
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - t0) / inner


def _gather_into(dist: Any) -> Any:
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def measure(
    msg: comm_plan.Message, plan: comm_plan.CommPlan, world: int, rank: int, dist: Any, torch: Any, dev: Any
) -> dict[str, Any] | None:
    """One size on this rank: a correctness check, warm-up, timed samples; rank 0 returns the row."""
    numel = msg.nbytes // 2
    bf16 = torch.bfloat16
    gather = _gather_into(dist)
    if msg.collective == "all_reduce":
        check = torch.ones(numel, dtype=bf16, device=dev)
        dist.all_reduce(check)
        correct = bool((check == world).all().item())
        buf = torch.zeros(numel, dtype=bf16, device=dev)  # zeros: repeated sums stay finite

        def op() -> None:
            dist.all_reduce(buf)

    else:
        part = torch.full((numel // world,), float(rank + 1), dtype=bf16, device=dev)
        full = torch.empty(numel, dtype=bf16, device=dev)
        gather(full, part)
        want = torch.arange(1, world + 1, dtype=bf16, device=dev).repeat_interleave(numel // world)
        correct = bool((full == want).all().item())

        def op() -> None:
            gather(full, part)

    for _ in range(plan.warmup):
        op()
    samples = []
    for _ in range(plan.samples):
        _barrier(dist, torch, dev)
        samples.append(_timed(op, torch, dev, plan.inner))
    mine = torch.tensor(samples, dtype=torch.float64, device=dev)
    every = torch.empty(world * len(samples), dtype=torch.float64, device=dev)
    gather(every, mine)
    ok = torch.tensor([1.0 if correct else 0.0], device=dev)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    if rank != 0:
        return None
    per_rank = every.view(world, len(samples)).cpu().tolist()
    slowest = sorted(max(col) for col in zip(*per_rank, strict=True))
    med = statistics.median(slowest)
    algbw, busbw = comm_plan.bus_bandwidth(msg.collective, msg.nbytes, med, world)
    row = {
        **dataclasses.asdict(msg),
        "models": list(msg.models),
        "world_size": world,
        "statistic": (
            f"median over {len(slowest)} samples of the slowest rank's mean of {plan.inner} back-to-back "
            f"calls, after {plan.warmup} warm-up calls"
        ),
        "median_s": med,
        "min_s": slowest[0],
        "max_s": slowest[-1],
        "p10_s": slowest[int(0.1 * (len(slowest) - 1))],
        "p90_s": slowest[int(0.9 * (len(slowest) - 1))],
        "samples_s": slowest,
        "per_rank_median_s": [statistics.median(r) for r in per_rank],
        "algbw_bytes_per_s": algbw,
        "busbw_bytes_per_s": busbw,
        "correct": bool(ok.item() == 1.0),
    }
    if not row["correct"]:
        row["error"] = "result mismatch: the collective returned wrong values on at least one rank"
    return row


def worker(
    rank: int, world: int, port: int, plan: comm_plan.CommPlan, nccl_dir: str, result_file: str
) -> None:
    """One process of one world size (spawned): join the group, measure every size, rank 0 writes the rows."""
    import torch
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    timeout = dt.timedelta(minutes=10)
    if plan.backend == "nccl":
        os.environ["NCCL_DEBUG_FILE"] = nccl_files.rank_log(nccl_dir, world, rank)
        dev = torch.device("cuda", rank)
        torch.cuda.set_device(dev)
        try:
            dist.init_process_group("nccl", rank=rank, world_size=world, timeout=timeout, device_id=dev)
        except TypeError:  # torch without device_id (< 2.3)
            dist.init_process_group("nccl", rank=rank, world_size=world, timeout=timeout)
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
    rows = []
    try:
        for msg in plan.messages:
            row = measure(msg, plan, world, rank, dist, torch, dev)
            if rank == 0:
                rows.append(row)
                write_atomic(result_file, dumps({"rows": rows}))
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------------------- parent


def _nvidia_smi_topo() -> str | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        r = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unavailable: {e}"
    return (r.stdout or r.stderr).strip()


def environment(torch: Any, use_cuda: bool) -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl_env": {k: os.environ.get(k) for k in (*NCCL_ENV, "NCCL_DEBUG_SUBSYS")},
    }
    if use_cuda:
        ver = torch.cuda.nccl.version()  # a tuple in recent torch, an int (e.g. 21805) in older ones
        env["nccl"] = ".".join(str(x) for x in ver) if isinstance(ver, tuple) else str(ver)
        env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        env["nvidia_smi_topo"] = _nvidia_smi_topo()
    else:
        env["cpu"] = platform.processor() or platform.machine()
        env["threads"] = torch.get_num_threads()
    return env


def summary(doc: dict[str, Any]) -> str:
    lines = [
        f"backend {doc['backend']} on {doc['device']}" + (f" ({CPU_NOTE})" if doc["device"] == "cpu" else "")
    ]
    for world, rows in doc["results"].items():
        for r in rows:
            lines.append(
                f"tp{world} {r['collective']:<10} {r['phase']:<7} {r['tokens']:>5} x {r['hidden']:<5} "
                f"{r['nbytes'] / 1e6:>9.3f} MB  median {r['median_s'] * 1e6:>9.1f} us  "
                f"busbw {r['busbw_bytes_per_s'] / 1e9:>7.1f} GB/s"
                + ("" if r["correct"] else "  WRONG RESULT")
            )
    for world, err in doc["errors"].items():
        lines.append(f"tp{world} FAILED: {err.strip().splitlines()[-1]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    ns = parse_args(args)
    import torch
    import torch.multiprocessing as mp

    if ns.device == "cuda" and not torch.cuda.is_available():
        print(
            "python -m enginesim.calibrate.collectives: error: --device cuda: no CUDA device", file=sys.stderr
        )
        return 2
    use_cuda = ns.device == "cuda" or (ns.device == "auto" and torch.cuda.is_available())
    count = torch.cuda.device_count() if use_cuda else 0
    if ns.world_sizes == "auto":
        sizes = tuple(w for w in (2, 4, 8) if w <= count) if use_cuda else (2,)
    else:
        sizes = ns.world_sizes
    if use_cuda and (not sizes or max(sizes) > count):
        print(
            f"python -m enginesim.calibrate.collectives: error: world sizes {list(sizes)} need more GPUs "
            f"than the {count} visible (rule: at least 2, at most the GPU count)",
            file=sys.stderr,
        )
        return 2
    plan = comm_plan.gpu_plan(ns.models, sizes) if use_cuda else comm_plan.cpu_plan(sizes)
    if ns.samples:
        plan = dataclasses.replace(plan, samples=ns.samples)
    os.environ.update(NCCL_ENV)
    os.environ["NCCL_DEBUG_SUBSYS"] = ns.nccl_subsys
    os.makedirs(ns.out, exist_ok=True)
    nccl_dir = os.path.join(ns.out, "nccl")
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "device": plan.device,
        "backend": plan.backend,
        "started_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": ["python", "-m", "enginesim.calibrate.collectives", *args],
        "env": environment(torch, use_cuda),
        "plan": plan.to_json(),
        "results": {},
        "errors": {},
        "nccl_logs": {},
    }
    if plan.device == "cpu":
        doc["note"] = CPU_NOTE
    out_path = os.path.join(ns.out, "collectives.json")
    for world in plan.world_sizes:
        if plan.backend == "nccl":
            os.makedirs(os.path.join(nccl_dir, f"tp{world}"), exist_ok=True)
        part = os.path.join(ns.out, f".tp{world}.rows.json")
        print(f"[collectives] {plan.backend} world size {world} ...", flush=True)
        try:
            mp.spawn(worker, args=(world, free_port(), plan, nccl_dir, part), nprocs=world, join=True)
        except Exception as e:  # recorded with its traceback; the next world size still runs
            doc["errors"][str(world)] = "".join(traceback.format_exception(e))[-4000:]
        if os.path.exists(part):
            with open(part, encoding="utf-8") as f:
                doc["results"][str(world)] = json.load(f)["rows"]
            os.unlink(part)
        if plan.backend == "nccl":
            doc["nccl_logs"][str(world)] = [
                os.path.relpath(nccl_files.rank_log(nccl_dir, world, r), ns.out) for r in range(world)
            ]
        write_atomic(out_path, dumps(doc))
    if ns.trim_into and plan.backend == "nccl":
        nccl_files.trim_tree(nccl_dir, ns.trim_into)
    print(summary(doc))
    wrong = any(not r["correct"] for rows in doc["results"].values() for r in rows)
    return 1 if (doc["errors"] or wrong) else 0


if __name__ == "__main__":
    sys.exit(main())
