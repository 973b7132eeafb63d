"""Roofline cost model: how long one engine step takes on the emulated GPUs.

Why: latencies must come from the work in each step (prefill FLOPs, weight and KV bytes, launches,
all-reduces), so effects like chunked-prefill interference or CUDA graphs emerge from the workload.
The formulas are written out in enginesim/README.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from .catalog import Hardware, ModelSpec


@dataclass
class StepCost:
    total: float
    compute: float
    memory: float
    launch: float
    comm: float
    graph: bool


class CostModel:
    def __init__(
        self,
        model: ModelSpec,
        hw: Hardware,
        tp: int,
        ep: int,
        nnodes: int,
        kv_bytes_per_token: float,
        cuda_graph: bool,
        graph_max_bs: int,
        graph_covers_mixed: bool,
    ) -> None:
        self.m = model
        self.hw = hw
        self.tp = tp
        self.ep = ep
        self.kv_bpt = kv_bytes_per_token
        self.cuda_graph = cuda_graph
        self.graph_max_bs = graph_max_bs
        self.graph_covers_mixed = graph_covers_mixed
        ov = hw.overheads
        self.flops_rate = hw.peak_flops * hw.eff_compute
        self.bw = hw.mem_bw * hw.eff_memory
        self.lin_flops_per_token = 2.0 * model.active_params / tp
        self.attn_flops_per_ctx = 4.0 * model.layers * model.heads * model.head_dim / tp
        # MoE: experts' bytes are read only for the experts the step's tokens touch
        if model.experts:
            per_expert = 3 * model.hidden * model.moe_intermediate * model.dtype_bytes
            moe_layers = model.layers - int(model.extra.get("first_dense_layers", 0))
            self.expert_bytes = per_expert * model.experts * moe_layers / tp
            self.dense_bytes = max(model.weight_bytes_per_gpu(tp) - self.expert_bytes, 0.0)
        else:
            self.expert_bytes = 0.0
            self.dense_bytes = model.weight_bytes_per_gpu(tp)
        self.eager_launch = model.layers * ov["kernels_per_layer"] * ov["kernel_launch"]
        self.graph_replay = ov["graph_replay"]
        self.step_cpu = ov["step_cpu"]
        self.per_req_cpu = ov["per_request_cpu"]
        cross_node = nnodes > 1 or tp > hw.gpus_per_node
        self.ar_bw = (hw.inter_node_bw if cross_node else hw.intra_node_bw / 2) * hw.eff_network
        self.ar_lat = ov["allreduce_latency_inter" if cross_node else "allreduce_latency_intra"]

    def weight_bytes(self, tokens: int) -> float:
        if not self.expert_bytes:
            return self.dense_bytes
        frac = min(1.0, tokens * self.m.experts_per_token / self.m.experts)
        return self.dense_bytes + self.expert_bytes * frac

    def step(self, prefill: list[tuple[int, int]], dec_reqs: int, dec_tokens: int, dec_ctx: int) -> StepCost:
        """prefill = [(new tokens, tokens already in KV)]; decode = requests, tokens (+ drafts), sum ctx."""
        p_tokens = 0
        attn_ctx = float(dec_ctx)
        kv_read = float(dec_ctx)
        for n, before in prefill:
            p_tokens += n
            attn_ctx += n * (before + n / 2.0)
            kv_read += before
        tokens = p_tokens + dec_tokens
        flops = self.lin_flops_per_token * tokens + self.attn_flops_per_ctx * attn_ctx
        mem = self.weight_bytes(tokens) + (kv_read + tokens) * self.kv_bpt
        t_comp = flops / self.flops_rate
        t_mem = mem / self.bw
        t_gpu = max(t_comp, t_mem)
        graph = (
            self.cuda_graph
            and (not p_tokens or self.graph_covers_mixed)
            and (tokens if self.graph_covers_mixed else dec_reqs) <= self.graph_max_bs
        )
        launch = self.graph_replay if graph else self.eager_launch
        # eager launches overlap GPU work; a step can't end before its kernels are launched
        t = t_gpu + launch if graph else max(t_gpu, launch)
        comm = 0.0
        if self.tp > 1:
            size = tokens * self.m.hidden * 2
            comm = 2 * self.m.layers * (self.ar_lat + 2 * (self.tp - 1) / self.tp * size / self.ar_bw)
        if self.ep > 1 and self.m.experts:
            a2a = 2 * tokens * self.m.experts_per_token * self.m.hidden * self.m.dtype_bytes / self.ep
            comm += self.m.layers * (self.ar_lat + a2a / self.ar_bw)
        t += comm + self.step_cpu + self.per_req_cpu * (dec_reqs + len(prefill))
        return StepCost(t, t_comp, t_mem, launch, comm, graph)
