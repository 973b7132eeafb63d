"""The clients benchmarks/bench_loadgen.py measures, each run as its own process against truthserver.

Clients (the ``--clients`` names):
  loadgen, loadgen-wN        this tree's loadgen (--workers auto / N)
  loadgen-kernel, -read      loadgen with --timestamps kernel / read
  base, base-wN              another copy of the loadgen package (--base-src DIR): an A/B in one session
  httpx, aiohttp             the same measuring loop on those libraries: pooled keep-alive client, pool
                             warmed first, closed loop at the concurrency, perf_counter_ns per received chunk
  sglang                     SGLang's own benchmark client (optional, see SGLangClient)
  raw                        benchmarks/truthserver/rawreader.py: drains the sockets and measures nothing;
                             the server's ceiling, to show the server did not limit the others

This module imports only the standard library at the top: its ``--sglang-shim`` entry runs under the
SGLang client's own interpreter.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.abspath(__file__)
PY = sys.executable
NAN = float("nan")


async def _baseline(lib: str, port: int, conc: int, n: int, out_len: int) -> dict:
    """Closed loop at concurrency ``conc``; TTFT from just before the request is issued."""
    body = {
        "input_ids": list(range(1000, 1128)),
        "sampling_params": {"max_new_tokens": out_len, "temperature": 0.0, "ignore_eos": True},
        "stream": True,
    }
    url = f"http://127.0.0.1:{port}/generate"
    ttfts, itls, toks = [], [], 0
    if lib == "httpx":
        import httpx

        client = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None), timeout=600
        )

        async def one():
            nonlocal toks
            times = []
            st = time.perf_counter_ns()
            async with client.stream("POST", url, json=body) as r:
                async for chunk in r.aiter_raw():
                    t = time.perf_counter_ns()
                    times.extend([t] * chunk.count(b"\n\n"))
            times = times[:-1]  # [DONE]
            return st, times
    else:
        import aiohttp

        client = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            read_bufsize=10 * 2**20,
            timeout=aiohttp.ClientTimeout(total=600),
        )

        async def one():
            times = []
            st = time.perf_counter_ns()
            async with client.post(url, json=body) as r:
                async for chunk in r.content.iter_any():
                    t = time.perf_counter_ns()
                    times.extend([t] * chunk.count(b"\n\n"))
            times = times[:-1]
            return st, times

    # warm the pool: one 1-token request per lane (truth.py drops requests of < 2 tokens)
    full_len = body["sampling_params"]["max_new_tokens"]
    body["sampling_params"]["max_new_tokens"] = 1
    await asyncio.gather(*(one() for _ in range(conc)))
    body["sampling_params"]["max_new_tokens"] = full_len
    queue = list(range(n))
    t_start = time.perf_counter_ns()

    async def lane():
        nonlocal toks
        while queue:
            queue.pop()
            st, times = await one()
            if times:
                ttfts.append((times[0] - st) / 1e6)
                itls.extend((b - a) / 1e6 for a, b in itertools.pairwise(times))
                toks += len(times)

    await asyncio.gather(*(lane() for _ in range(conc)))
    dur = (time.perf_counter_ns() - t_start) / 1e9
    if lib == "httpx":
        await client.aclose()
    else:
        await client.close()
    return {"ttfts": ttfts, "itls": itls, "output_throughput": toks / dur}


def _pct(v, q):
    v = sorted(v)
    if not v:
        return float("nan")
    pos = (len(v) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def pct(v: list[float], q: float) -> float:
    """Percentile with linear interpolation (numpy's default)."""
    v = sorted(v)
    if not v:
        return NAN
    pos = (len(v) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


class ClientFailed(Exception):
    """A peer client died during a run: the benchmark names it and goes on with the others."""


@dataclass
class Workload:
    """One benchmark case as the clients see it (SGLang native /generate unless ``backend`` says else)."""

    conc: int
    n: int
    out_len: int
    in_len: int = 128
    backend: str = "sglang"


@dataclass
class Clients:
    """How to run each client: where the other loadgen copy and SGLang's client live, the scratch dir."""

    tmp: str
    base_src: str | None = None
    sglang_src: str | None = None
    sglang_python: str = PY
    tokenizer_dir: str | None = None
    loadgen_extra: list[str] = field(default_factory=list)

    def run(self, client: str, port: int, w: Workload) -> tuple[dict, float]:
        """Run one client to completion; return (its figures in ms and tok/s, its CPU seconds)."""
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if client == "sglang":
            fig = self.run_sglang(port, w)
        elif client == "raw":
            fig = self.run_raw(port, w)
        elif client.startswith(("loadgen", "base")):
            fig = self.run_loadgen(client, port, w)
        else:
            fig = self.run_baseline(client, port, w)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        return fig, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)

    def run_loadgen(self, client: str, port: int, w: Workload) -> dict:
        src = ROOT
        if client.startswith("base"):
            if self.base_src is None:
                raise SystemExit("client base* needs --base-src DIR")
            src = self.base_src
            client = "loadgen" + client[len("base") :]
        out = os.path.join(self.tmp, "lg.json")
        cmd = [
            PY, "-m", "loadgen", "--backend", w.backend, "--port", str(port), "--model", "truthserver-model",
            "--random-input-len", str(w.in_len), "--random-output-len", str(w.out_len),
            "--random-range-ratio", "1", "--num-prompts", str(w.n), "--max-concurrency", str(w.conc),
            "--warmup-requests", "0", "--output-file", out, *self.loadgen_extra,
        ]  # fmt: skip
        if client.startswith("loadgen-w"):
            cmd += ["--workers", client[len("loadgen-w") :]]
        elif client in ("loadgen-kernel", "loadgen-read"):
            cmd += ["--timestamps", client[len("loadgen-") :]]
        if os.path.exists(out):
            os.unlink(out)
        cp = subprocess.run(
            cmd, cwd=src, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=900
        )
        if not os.path.exists(out):
            raise RuntimeError(f"{client} wrote no result (exit {cp.returncode}): {cp.stderr[-2000:]}")
        with open(out) as f:
            d = json.load(f)
        return {
            "mean_ttft": d["mean_ttft_ms"],
            "p99_ttft": d["p99_ttft_ms"],
            "mean_itl": d["mean_itl_ms"],
            "p99_itl": d["p99_itl_ms"],
            "tput": d["output_throughput"],
            "failed": d["failed"],
            "reliable": d["reliable"],
            "reasons": d["reliability"]["reasons"],
            "read_together_pct": 100
            * d["reliability"].get("events_read_together", 0)
            / max(d["reliability"].get("event_gaps", 0), 1),
            "itl_p99_ambiguity_ms": d["reliability"].get("itl_p99_ambiguity_ms", math.nan),
            "loop_lag_p99": d["reliability"]["loop_lag_ms"]["p99"],
            "workers": d["workers"],
        }

    def run_baseline(self, client: str, port: int, w: Workload) -> dict:
        if client not in ("httpx", "aiohttp"):
            raise SystemExit(f"unknown client {client!r}")
        cp = subprocess.run(
            [PY, HERE, "--baseline", client, "--port", str(port), "--c", str(w.conc), "--n", str(w.n),
             "--out-len", str(w.out_len)],
            check=False, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        if cp.returncode != 0:
            tail = (cp.stderr.strip().splitlines() or ["(no stderr)"])[-1]
            raise ClientFailed(f"{client} at C={w.conc} exited {cp.returncode}: {tail}")
        d = json.loads(cp.stdout.strip().splitlines()[-1])
        return {
            "mean_ttft": statistics.fmean(d["ttfts"]) if d["ttfts"] else NAN,
            "p99_ttft": pct(d["ttfts"], 99),
            "mean_itl": statistics.fmean(d["itls"]) if d["itls"] else NAN,
            "p99_itl": pct(d["itls"], 99),
            "tput": d["output_throughput"],
            "failed": w.n - len(d["ttfts"]),
        }

    def run_raw(self, port: int, w: Workload) -> dict:
        cp = subprocess.run(
            [PY, "-m", "benchmarks.truthserver.rawreader", "--port", str(port), "--conc", str(w.conc),
             "--num", str(w.n), "--out-len", str(w.out_len), "--input-len", str(w.in_len)],
            cwd=ROOT, check=True, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        d = json.loads(cp.stdout)
        # it measures nothing: its throughput is what the server sent (filled in from the truth log)
        return {k: NAN for k in ("mean_ttft", "p99_ttft", "mean_itl", "p99_itl", "tput")} | {
            "failed": w.n - d["requests"]
        }

    def run_sglang(self, port: int, w: Workload) -> dict:
        """SGLang's benchmark client, native /generate, random token ids; its figures."""
        out = os.path.join(self.tmp, "sgl.jsonl")
        if os.path.exists(out):
            os.unlink(out)  # it appends
        args = [
            "--backend", "sglang", "--host", "127.0.0.1", "--port", str(port),
            "--dataset-name", "random-ids", "--tokenizer", self.tokenizer_dir,
            "--random-input-len", str(w.in_len), "--random-output-len", str(w.out_len),
            "--random-range-ratio", "1", "--num-prompts", str(w.n), "--max-concurrency", str(w.conc),
            "--warmup-requests", "1", "--disable-tqdm", "--output-file", out,
        ]  # fmt: skip
        env = dict(os.environ, SGLANG_SRC=self.sglang_src, TOKENIZERS_PARALLELISM="false")
        cp = subprocess.run(
            [self.sglang_python, HERE, "--sglang-shim", "--", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        if cp.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"SGLang client failed (exit {cp.returncode}): {cp.stderr[-2000:]}")
        with open(out) as f:
            d = json.loads(f.read().strip().splitlines()[-1])
        return {
            "mean_ttft": d["mean_ttft_ms"],
            "p99_ttft": d["p99_ttft_ms"],
            "mean_itl": d["mean_itl_ms"],
            "p99_itl": d["p99_itl_ms"],
            "tput": d["output_throughput"],
            "failed": w.n - d["completed"],
        }


def sglang_shim(argv: list[str]) -> None:
    """Run sglang.benchmark.serving's cli_main from SGLANG_SRC without importing torch (this runs
    under --sglang-python, so it imports nothing but the standard library before the client)."""
    import types

    src = os.environ["SGLANG_SRC"]
    for name in ("sglang", "sglang.srt", "sglang.srt.utils", "sglang.srt.disaggregation"):
        mod = types.ModuleType(name)
        mod.__path__ = [os.path.join(src, *name.split("."))]
        sys.modules[name] = mod
    dis = types.ModuleType("sglang.srt.disaggregation.utils")
    dis.FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # the upstream constant; only PD disaggregation uses it
    sys.modules[dis.__name__] = dis
    from sglang.benchmark.serving import cli_main

    sys.argv = ["bench_serving", *argv]
    cli_main()


def main() -> int:
    """Subprocess entries: ``--baseline LIB ...`` (httpx/aiohttp loop) and ``--sglang-shim -- ARGS``."""
    if sys.argv[1:2] == ["--sglang-shim"]:  # under the SGLang client's python: nothing else of this file
        sglang_shim(sys.argv[3:] if sys.argv[2:3] == ["--"] else sys.argv[2:])
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", required=True, choices=("httpx", "aiohttp"))
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--c", type=int, required=True)
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--out-len", type=int, required=True)
    a = ap.parse_args()
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    print(json.dumps(runner(_baseline(a.baseline, a.port, a.c, a.n, a.out_len))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
