"""Speed benchmark for ``python -m analysis summarize`` (a script, not a timed test).

Builds a synthetic run of 100 cases x 10,000 requests in SGLang's ``--output-details`` JSONL
format (each request with 32 per-token ITLs, ``request_rate: Infinity`` as SGLang writes it),
then runs ``summarize`` as a subprocess on both paths, alternating, several times each, and
reports per path the median wall time, the CPU time of the process tree (user + sys, what a
loaded box cannot hide), the peak RSS of the largest process
(``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss``) and the 1-minute load average at each run
(the box is shared: wall time depends on what else runs).

Paths: ``default`` takes a complete SGLang summary without decoding the per-request arrays;
``full`` (QUICKMAP_ANALYSIS_FULL_DECODE=1) decodes every array, as mixed runs, incomplete
summaries and every other format do. ``--incomplete-summary`` writes the files without their
latency statistics, so both paths decode and recompute every figure from the arrays.

Target (issue 2): <= 6 s and <= 2 GiB, plots and report included.

``--against DIR`` times another checkout's ``analysis`` too (e.g. ``git worktree add /tmp/base main``),
alternating with this one on the same files, and prints the new/old ratio of wall and CPU time per
pair: before/after figures from one session, under the same background load.

    .venv/bin/python benchmarks/bench_analysis.py [--paths default,full] [--cases 100] [--requests 10000]
        [--repeats 3] [--keep DIR] [--full-decode] [--incomplete-summary] [--against DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 6.0
TARGET_RSS_GIB = 2.0


def sglang_detailed(
    rng: np.random.Generator, n: int, n_itl: int, conc: int, incomplete: bool = False
) -> bytes:
    """One SGLang JSONL line with summary keys (ms) and detail arrays (s)."""
    ttfts = rng.gamma(8.0, 0.01, n)
    itls = rng.gamma(30.0, 0.0003, (n, n_itl))
    lat = ttfts + itls.sum(axis=1)
    tpot = itls.mean(axis=1)
    dur = float(lat.sum() / conc)
    osl = n_itl + 1
    obj: dict[str, object] = {
        "tag": None, "backend": "sglang", "dataset_name": "random", "request_rate": "__INF__",
        "max_concurrency": conc, "sharegpt_output_len": None, "random_input_len": 1024,
        "random_output_len": osl, "random_range_ratio": 1.0, "server_info": None,
        "duration": dur, "completed": n, "total_input_tokens": 1024 * n,
        "total_input_text_tokens": 1024 * n, "total_input_vision_tokens": 0,
        "total_output_tokens": osl * n, "total_output_tokens_retokenized": osl * n,
        "request_throughput": n / dur, "input_throughput": 1024 * n / dur,
        "output_throughput": osl * n / dur, "total_throughput": (1024 + osl) * n / dur,
    }  # fmt: skip
    for name, arr in (("e2e_latency", lat), ("ttft", ttfts), ("tpot", tpot), ("itl", itls.ravel())):
        ms = arr * 1000.0
        obj[f"mean_{name}_ms"] = float(ms.mean())
        obj[f"median_{name}_ms"] = float(np.median(ms))
        obj[f"std_{name}_ms"] = float(ms.std())
        for q in (90, 95, 99):
            obj[f"p{q}_{name}_ms"] = float(np.percentile(ms, q))
    if incomplete:  # a client that wrote no latency statistics: every figure is recomputed
        obj = {k: v for k, v in obj.items() if not k.endswith("_ms")}
    obj.update(concurrency=float(conc), accept_length=None, max_output_tokens_per_s=0.0)
    obj.update(max_concurrent_requests=conc, input_lens=[1024] * n, output_lens=[osl] * n)
    obj.update(ttfts=ttfts.tolist(), itls=itls.tolist(), generated_texts=[""] * n, errors=[""] * n)
    # SGLang writes json.dumps(...): ", " / ": " separators and the bare token Infinity. orjson is
    # ~10x faster; no string here holds "," or ":", so widening the separators gives identical bytes.
    raw = orjson.dumps(obj).replace(b",", b", ").replace(b'":', b'": ')
    return raw.replace(b'"__INF__"', b"Infinity") + b"\n"


def build_run(root: Path, cases: int, requests: int, n_itl: int, incomplete: bool = False) -> Path:
    run = root / "bench_run"
    rng = np.random.default_rng(2026)
    (run / "cases").mkdir(parents=True)
    params = {"cases": cases, "requests": requests, "itls": n_itl, "incomplete_summary": incomplete}
    (run / "manifest.json").write_text(
        json.dumps({"run_id": "bench_run", "model": "synthetic", "bench": params})
    )
    for i in range(cases):
        conc = (1, 16, 32, 64, 128)[i % 5]
        d = run / "cases" / f"case{i:03d}_c{conc}" / "rep1"
        d.mkdir(parents=True)
        (d / "bench.json").write_bytes(sglang_detailed(rng, requests, n_itl, conc, incomplete))
        meta = {"case_id": d.parent.name, "suite": "fixed", "rep": 1, "stage": "short_decode", "isl": 1024,
                "osl": n_itl + 1, "concurrency": conc, "num_prompts": requests, "warmup": 0,
                "status": "completed"}  # fmt: skip
        (d / "meta.json").write_text(json.dumps(meta))
    return run


class Run:
    """One timed summarize: wall s, CPU s of the process tree, peak RSS GiB, 1-min load average."""

    def __init__(self, wall: float, cpu: float, rss_gib: float, load: float) -> None:
        self.wall, self.cpu, self.rss_gib, self.load = wall, cpu, rss_gib, load


def measure(run: Path, full_decode: bool, root: Path = ROOT) -> Run:
    code = (
        "import resource,subprocess,sys,time;"
        "t=time.perf_counter();"
        f"r=subprocess.run([sys.executable,'-m','analysis','summarize',{str(run)!r}],capture_output=True);"
        "w=time.perf_counter()-t;"
        "u=resource.getrusage(resource.RUSAGE_CHILDREN);"
        "print(r.returncode,w,u.ru_utime+u.ru_stime,u.ru_maxrss)"
    )
    for name in ("summary.csv", "summary.jsonl", "aggregate.csv", "ab.csv", "report.md"):
        (run / name).unlink(missing_ok=True)
    shutil.rmtree(run / "plots", ignore_errors=True)
    env = {**os.environ, "QUICKMAP_ANALYSIS_FULL_DECODE": "1" if full_decode else "0"}
    load = os.getloadavg()[0]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True, env=env
    )
    rc, wall, cpu, rss_kib = out.stdout.split()
    if int(rc) != 0:
        raise SystemExit(f"summarize failed (exit {rc}) in {root}")
    if not (run / "report.md").is_file() or not any((run / "plots").glob("*.png")):
        raise SystemExit("summarize did not write report.md and plots")
    load = max(load, os.getloadavg()[0])  # the higher of before/after: the box is shared
    return Run(float(wall), float(cpu), int(rss_kib) / (1024 * 1024), load)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=100)
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--itls", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--keep",
        type=Path,
        default=None,
        help="build the run here and keep it (reused when built with the same parameters)",
    )
    ap.add_argument("--paths", default="default,full", help="comma list of default, full")
    ap.add_argument("--full-decode", action="store_true", help="same as --paths full")
    ap.add_argument(
        "--incomplete-summary", action="store_true", help="files without latency statistics (recompute all)"
    )
    ap.add_argument("--against", type=Path, default=None, help="another checkout to time alternately (old)")
    args = ap.parse_args()
    if args.against is not None and not (args.against / "analysis" / "__main__.py").is_file():
        ap.error(f"--against {args.against}: expected a quickmap checkout (no analysis/__main__.py there)")
    paths = ["full"] if args.full_decode else [p.strip() for p in args.paths.split(",") if p.strip()]
    if not paths or any(p not in ("default", "full") for p in paths):
        ap.error(f"--paths {args.paths!r}: expected a comma list of default, full")
    tmp = Path(tempfile.mkdtemp(prefix="qm_bench_analysis_")) if args.keep is None else args.keep
    try:
        t = time.perf_counter()
        run = tmp / "bench_run"
        want = {"cases": args.cases, "requests": args.requests, "itls": args.itls,
                "incomplete_summary": args.incomplete_summary}  # fmt: skip
        manifest = run / "manifest.json"
        if not manifest.is_file() or json.loads(manifest.read_text()).get("bench") != want:
            shutil.rmtree(run, ignore_errors=True)  # absent, or built with other parameters
            run = build_run(tmp, args.cases, args.requests, args.itls, args.incomplete_summary)
        size = sum(p.stat().st_size for p in run.rglob("bench.json")) / 2**20
        print(f"run of {args.cases} cases x {args.requests} requests x {args.itls} ITLs "
              f"({size:.0f} MiB of JSONL{', no latency statistics' if args.incomplete_summary else ''}) "
              f"ready in {time.perf_counter() - t:.1f} s; {os.cpu_count()} CPUs")  # fmt: skip
        runs: dict[str, list[Run]] = {p: [] for p in paths}
        old: dict[str, list[Run]] = {p: [] for p in paths}
        for i in range(args.repeats):
            for p in paths:  # alternate, so both paths (and both checkouts) see the same background load
                order = [ROOT] if args.against is None else [ROOT, args.against][:: 1 if i % 2 else -1]
                for root in order:
                    r = measure(run, p == "full", root)
                    (runs if root == ROOT else old)[p].append(r)
                    which = "" if args.against is None else (" new" if root == ROOT else " old")
                    print(f"run {i + 1} {p:7s}{which}: {r.wall:5.2f} s wall, {r.cpu:5.2f} s CPU, "
                          f"peak RSS {r.rss_gib:.2f} GiB, load average {r.load:.1f}")  # fmt: skip
        ok = True
        for p, rs in runs.items():
            med_w = statistics.median(r.wall for r in rs)
            med_c = statistics.median(r.cpu for r in rs)
            max_r = max(r.rss_gib for r in rs)
            loads = [r.load for r in rs]
            good = med_w <= TARGET_S and max_r <= TARGET_RSS_GIB
            ok = ok and good
            walls = ", ".join(f"{r.wall:.2f}" for r in rs)
            print(f"{p:7s} median of {len(rs)}: {med_w:.2f} s wall (target <= {TARGET_S} s; runs "
                  f"{walls}), CPU {med_c:.2f} s, peak RSS max {max_r:.2f} GiB "
                  f"(<= {TARGET_RSS_GIB} GiB), load average {min(loads):.1f}-{max(loads):.1f}: "
                  f"{'PASS' if good else 'FAIL'}")  # fmt: skip
            if old[p]:
                w_ratio = statistics.median(n.wall / o.wall for n, o in zip(rs, old[p], strict=True))
                c_ratio = statistics.median(n.cpu / o.cpu for n, o in zip(rs, old[p], strict=True))
                print(f"{p:7s} --against {args.against}: median of {len(rs)} old runs "
                      f"{statistics.median(o.wall for o in old[p]):.2f} s wall, "
                      f"{statistics.median(o.cpu for o in old[p]):.2f} s CPU; new/old per pair: wall "
                      f"{w_ratio:.2f}, CPU {c_ratio:.2f}")  # fmt: skip
        return 0 if ok else 1
    finally:
        if args.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
