"""The engines' profiler endpoints on the emulator: /start_profile and /stop_profile write a Chrome
trace of the emulated forward passes, priced by the cost model.

Why: the TP-scaling lab reads the communication share of a forward pass from a profiler trace
(GEMM / attention / NCCL kernels, and the idle gaps between them). A real engine writes a torch
profiler trace; the emulator writes one with the same layout (kernel events on a GPU stream, named
like the real kernels) from the cost model's terms, so the same analysis reads both. Every event's
args say `enginesim: true`: nothing here is a measured kernel time.

Per step the trace also has the scheduler's CPU span (the cost model's per-step and per-request CPU
part) on a track of its own, before the forward pass: the cost model adds it serially, so the trace
shows no overlap of scheduling and forward pass (sched_profile's analysis reads it as such).

Surfaces (as the engines have them): SGLang serves both routes always and writes
`<dir>/<profile_id>-TP-<rank>.trace.json.gz` (dir: the request's `output_dir`, else
SGLANG_TORCH_PROFILER_DIR, else /tmp; `num_steps` stops it by itself); vLLM serves them (POST) only
when VLLM_TORCH_PROFILER_DIR is set and writes `<dir>/<host>_<pid>.<ms>.pt.trace.json.gz`.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import time
from typing import Any

from .httpserver import Response

# Kernel names the trace gives each cost term (the real kernels' families; the analysis classifies
# real traces by the same name patterns).
KERNELS = {
    "gemm": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n",
    "attention": "flash_fwd_splitkv_kernel",
    "nccl": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
}
GPU_TID = 7  # the CUDA stream id torch traces usually show for the default compute stream
SCHED_TID = 2  # the scheduler's CPU track
# The function a real engine's scheduler spends a step's CPU scheduling in (torch profiler's Python
# stack events name them): SGLang's `Scheduler.get_next_batch_to_run`, vLLM V1's `Scheduler.schedule`.
SCHED_SPAN = {"sglang": "Scheduler.get_next_batch_to_run", "vllm": "Scheduler.schedule"}


class Recorder:
    """Wraps the engine's cost model: prices every step as before and, while profiling, records it."""

    def __init__(self, inner: Any, scale: float) -> None:
        self.inner = inner
        self.scale = scale
        self.active = False
        self.t0 = 0.0
        self.steps: list[dict[str, Any]] = []
        self.end_s = 0.0  # where the last recorded step ended on the emulated timeline
        self.limit: int | None = None
        self.on_limit: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def step(self, prefill: list[tuple[int, int]], dec_reqs: int, dec_tokens: int, dec_ctx: int) -> Any:
        c = self.inner.step(prefill, dec_reqs, dec_tokens, dec_ctx)
        if self.active:
            self.steps.append(self._breakdown(c, prefill, dec_reqs, dec_tokens, dec_ctx))
            if self.limit is not None and len(self.steps) >= self.limit and self.on_limit is not None:
                self.on_limit()
        return c

    def _breakdown(
        self, c: Any, prefill: list[tuple[int, int]], dec_reqs: int, dec_tokens: int, dec_ctx: int
    ) -> dict[str, Any]:
        """One step's time split into GEMM, attention, all-reduce and the rest (launch, CPU)."""
        m = self.inner
        p_tokens = sum(n for n, _ in prefill)
        tokens = p_tokens + dec_tokens
        attn_ctx = dec_ctx + sum(n * (before + n / 2.0) for n, before in prefill)
        kv_read = dec_ctx + sum(before for _, before in prefill)
        gemm = max(m.lin_flops_per_token * tokens / m.flops_rate, m.weight_bytes(tokens) / m.bw)
        attn = max(m.attn_flops_per_ctx * attn_ctx / m.flops_rate, (kv_read + tokens) * m.kv_bpt / m.bw)
        gpu = max(c.compute, c.memory)
        share = gemm / (gemm + attn) if gemm + attn > 0 else 1.0
        rest = max(c.total - gpu - c.comm, 0.0)
        # the scheduler's CPU part of the step (the cost model adds it serially: no overlap modelled)
        sched = min(m.step_cpu + m.per_req_cpu * (dec_reqs + len(prefill)), rest)
        # Steps sit end to end on the emulated timeline (a late emulator prices steps back to back in
        # wall time); a gap remains only where the engine really waited for work.
        start = max((time.perf_counter() - self.t0) / self.scale, self.end_s)
        self.end_s = start + c.total
        return {
            "start_s": start,
            "total_s": c.total,
            "gemm_s": gpu * share,
            "attention_s": gpu * (1.0 - share),
            "nccl_s": c.comm,
            "idle_s": rest,
            "sched_s": sched,
            "tokens": tokens,
            "prefill_tokens": p_tokens,
            "decode_reqs": dec_reqs,
        }


def chrome_trace(steps: list[dict[str, Any]], tp: int, flavour: str) -> dict[str, Any]:
    """The recorded steps as a Chrome trace: per step a forward annotation and its kernels in a row."""
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": f"enginesim {flavour} TP{tp} rank 0"}},
        {"name": "thread_name", "ph": "M", "pid": 0, "tid": SCHED_TID, "args": {"name": "scheduler (CPU)"}},
        {"name": "thread_name", "ph": "M", "pid": 0, "tid": 1, "args": {"name": "forward pass"}},
    ]
    for i, s in enumerate(steps):
        t = s["start_s"] * 1e6
        sched_us = s.get("sched_s", 0.0) * 1e6
        kind = "EXTEND" if s["prefill_tokens"] else "DECODE"
        if sched_us > 0:
            events.append(
                {
                    "name": SCHED_SPAN.get(flavour, "schedule"),
                    "cat": "python_function",
                    "ph": "X",
                    "ts": round(t, 3),
                    "dur": round(sched_us, 3),
                    "pid": 0,
                    "tid": SCHED_TID,
                    "args": {"step": i, "enginesim": True},
                }
            )
        t += sched_us  # the forward pass starts once the step is scheduled
        events.append(
            {
                "name": f"forward {kind.lower()}",
                "cat": "user_annotation",
                "ph": "X",
                "ts": round(t, 3),
                "dur": round(s["total_s"] * 1e6 - sched_us, 3),
                "pid": 0,
                "tid": 1,
                "args": {
                    "step": i,
                    "tokens": s["tokens"],
                    "decode_reqs": s["decode_reqs"],
                    "enginesim": True,
                },
            }
        )
        for cat in ("gemm", "attention", "nccl"):
            dur = s[f"{cat}_s"] * 1e6
            if dur <= 0:
                continue
            events.append(
                {
                    "name": KERNELS[cat],
                    "cat": "kernel",
                    "ph": "X",
                    "ts": round(t, 3),
                    "dur": round(dur, 3),
                    "pid": 0,
                    "tid": GPU_TID,
                    "args": {"step": i, "enginesim": True},
                }
            )
            t += dur
    return {"traceEvents": events, "displayTimeUnit": "ms", "enginesim": {"tp": tp, "steps": len(steps)}}


class Profiler:
    """/start_profile and /stop_profile of one emulated server."""

    def __init__(self, recorder: Recorder, flavour: str, tp: int, log: Any, env: dict[str, str]) -> None:
        self.rec = recorder
        self.flavour = flavour
        self.tp = tp
        self.log = log
        self.env = env
        self.out_dir = ""
        self.profile_id = ""
        self.written: list[str] = []

    def _path(self) -> str:
        if self.flavour == "sglang":
            return os.path.join(self.out_dir, f"{self.profile_id}-TP-0.trace.json.gz")
        worker = f"{socket.gethostname()}_{os.getpid()}"
        return os.path.join(self.out_dir, f"{worker}.{int(time.time() * 1000)}.pt.trace.json.gz")

    def start(self, req: Any, conn: Any) -> Response:
        body: dict[str, Any] = {}
        if req.body:
            try:
                body = json.loads(req.body)
            except ValueError:
                return Response(400, json.dumps({"detail": "body must be JSON"}))
            if not isinstance(body, dict):
                return Response(400, json.dumps({"detail": "body must be a JSON object"}))
        if self.rec.active:
            return Response(
                400, "Profiling is already in progress. Call /stop_profile first.\n", "text/plain"
            )
        if self.flavour == "sglang":
            self.out_dir = str(body.get("output_dir") or self.env.get("SGLANG_TORCH_PROFILER_DIR") or "/tmp")
            self.profile_id = str(time.time())
            n = body.get("num_steps")
            self.rec.limit = int(n) if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None
        else:
            self.out_dir = self.env["VLLM_TORCH_PROFILER_DIR"]
            self.rec.limit = None
        self.rec.on_limit = self._finish
        self.rec.steps = []
        self.rec.end_s = 0.0
        self.rec.t0 = time.perf_counter()
        self.rec.active = True
        if self.flavour == "sglang":
            self.log.line(
                f"Profiling starts. Traces will be saved to: {self.out_dir} "
                f"(with profile id: {self.profile_id})",
                rank=True,
            )
            return Response(200, "Start profiling.\n", "text/plain")
        self.log.line("Starting profiler...", src="api_server.py:950")
        self.log.line("Profiler started.", src="api_server.py:953")
        return Response(200, b"")

    def _finish(self) -> str | None:
        if not self.rec.active:
            return None
        self.rec.active = False
        if self.flavour == "sglang":
            self.log.line("Stop profiling...", rank=True)
        path = self._path()
        doc = chrome_trace(self.rec.steps, self.tp, self.flavour)
        try:
            os.makedirs(self.out_dir, exist_ok=True)
            tmp = path + ".tmp"
            with gzip.open(tmp, "wt", encoding="utf-8") as f:
                json.dump(doc, f)
            os.replace(tmp, path)
        except OSError as e:
            self.log.error(f"profiler could not write {path}: {e}")
            return None
        self.written.append(path)
        if self.flavour == "sglang":
            self.log.line(f"Profiling done. Traces are saved to: {self.out_dir}", rank=True)
        return path

    def stop(self, req: Any, conn: Any) -> Response:
        if self.flavour == "vllm":
            self.log.line("Stopping profiler...", src="api_server.py:962")
        was_active = self.rec.active
        path = self._finish()
        if self.flavour == "sglang":
            if not was_active and not self.written:
                return Response(
                    400, "Profiling is not in progress. Call /start_profile first.\n", "text/plain"
                )
            return Response(200, "Stop profiling. This will take some time.\n", "text/plain")
        self.log.line("Profiler stopped.", src="api_server.py:965")
        return Response(200 if path or not was_active else 500, b"")


def attach(app: Any, engine: Any, flavour: str, tp: int, scale: float, log: Any, env: dict[str, str]) -> None:
    """Wrap the engine's cost model and add the profiler routes the engine would serve."""
    if flavour == "vllm" and not env.get("VLLM_TORCH_PROFILER_DIR"):
        return
    rec = Recorder(engine.cost, scale)
    engine.cost = rec
    prof = Profiler(rec, flavour, tp, log, env)
    methods = ("GET", "POST") if flavour == "sglang" else ("POST",)
    for method in methods:
        app.routes[(method, "/start_profile")] = prof.start
        app.routes[(method, "/stop_profile")] = prof.stop
    app.paths |= {"/start_profile", "/stop_profile"}
    if flavour == "vllm":
        log.line(
            "Torch Profiler is enabled in the API server. This should ONLY be used for local development!",
            src="api_server.py:673",
            level="WARNING",
        )
