"""Roofline cost model: how long one engine step takes on the emulated GPUs.

Why: latencies must come from the work in each step (prefill FLOPs, weight and KV bytes, launches,
all-reduces), so effects like chunked-prefill interference or CUDA graphs emerge from the workload.
The formulas are written out in enginesim/README.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from .catalog import Hardware, ModelSpec

# Kernels a piecewise (vLLM) or breakable (SGLang) prefill graph leaves eager in each layer: the
# attention and its KV write run between the graph pieces; everything else replays from the graph.
PIECEWISE_EAGER_KERNELS_PER_LAYER = 2

# An engine's fixed costs (data/engines.json), seconds. Zero = a bare model with no engine around it
# (what the H200 calibration measured, and what calibrate.compare prices).
ENGINE_COST_KEYS = ("step_cpu", "per_request_cpu", "sampling", "intake", "intake_per_token")
NO_ENGINE = dict.fromkeys(ENGINE_COST_KEYS, 0.0)


@dataclass
class StepCost:
    total: float
    compute: float
    memory: float
    launch: float
    comm: float
    graph: bool  # any CUDA graph ran the step (full, or piecewise around eager attention)
    mode: str = "eager"  # "full" graph, "piecewise" graph, or "eager"
    host: float = 0.0  # CPU seconds to issue the step's GPU work (overlaps the GPU's own time)


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
        engine: dict[str, float] | None = None,
        prefill_graph_max_tokens: int = 0,
    ) -> None:
        self.m = model
        self.hw = hw
        self.tp = tp
        self.ep = ep
        self.kv_bpt = kv_bytes_per_token
        self.cuda_graph = cuda_graph
        self.graph_max_bs = graph_max_bs
        self.graph_covers_mixed = graph_covers_mixed
        # steps with prefill tokens run under piecewise graphs up to this many tokens (0: eager)
        self.prefill_graph_max_tokens = prefill_graph_max_tokens
        ov = hw.overheads
        self.flops_rate = hw.peak_flops * hw.eff_compute
        self.bw = hw.mem_bw * hw.eff_memory
        # logits are computed for one row per prefill sequence and per decode token, not per prompt
        # token; the embedding lookup reads rows, not the table (and does no matmul)
        emb = float(model.vocab * model.hidden)
        untied = not model.extra.get("tie_embeddings", False)
        self.lm_head_flops = 2.0 * emb / tp
        body_params = max(model.active_params - emb * (2 if untied else 1), 0.0)
        self.lin_flops_per_token = 2.0 * body_params / tp
        self.attn_flops_per_ctx = 4.0 * model.layers * model.heads * model.head_dim / tp
        table_bytes = emb * model.dtype_bytes / tp if untied else 0.0
        # MoE: experts' bytes are read only for the experts the step's tokens touch
        if model.experts:
            per_expert = 3 * model.hidden * model.moe_intermediate * model.dtype_bytes
            moe_layers = model.layers - int(model.extra.get("first_dense_layers", 0))
            self.expert_bytes = per_expert * model.experts * moe_layers / tp
            self.dense_bytes = max(model.weight_bytes_per_gpu(tp) - self.expert_bytes - table_bytes, 0.0)
        else:
            self.expert_bytes = 0.0
            self.dense_bytes = model.weight_bytes_per_gpu(tp) - table_bytes
        kernels = model.layers * ov["kernels_per_layer"]
        self.eager_launch = kernels * ov["kernel_launch"]
        self.kernel_floor = kernels * ov.get("kernel_floor", 0.0)
        self.graph_replay = ov["graph_replay"]
        # piecewise: one replay per piece (layers + 1) and the eager attention kernels between them
        self.piecewise_host = (model.layers + 1) * ov["graph_replay"] + (
            model.layers * PIECEWISE_EAGER_KERNELS_PER_LAYER * ov["kernel_launch"]
        )
        eng = {**NO_ENGINE, **(engine or {})}
        self.step_cpu = eng["step_cpu"] + eng["sampling"]
        self.per_req_cpu = eng["per_request_cpu"]
        self.intake_fixed = eng["intake"]
        self.intake_per_token = eng["intake_per_token"]
        cross_node = nnodes > 1 or tp > hw.gpus_per_node
        self.ar_bw = (hw.inter_node_bw if cross_node else hw.intra_node_bw / 2) * hw.eff_network
        self.ar_lat = ov["allreduce_latency_inter" if cross_node else "allreduce_latency_intra"]

    def intake(self, prompt_tokens: int, text: bool) -> float:
        """Seconds from a request's send to the scheduler seeing it (HTTP, tokenisation, hand-over).

        A latency, not step time: the engines do it in another process (SGLang's tokenizer manager,
        vLLM's API server) while the GPU keeps stepping the running batch. Only a prompt sent as text
        is tokenised: one sent as token ids (SGLang `input_ids`, an OpenAI prompt of ints, as loadgen
        sends) pays the fixed part alone.
        """
        return self.intake_fixed + (self.intake_per_token * prompt_tokens if text else 0.0)

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
        logit_rows = len(prefill) + dec_tokens
        flops = (
            self.lin_flops_per_token * tokens
            + self.lm_head_flops * logit_rows
            + self.attn_flops_per_ctx * attn_ctx
        )
        mem = self.weight_bytes(tokens) + (kv_read + tokens) * self.kv_bpt
        t_comp = flops / self.flops_rate
        t_mem = mem / self.bw
        # every kernel costs at least a floor the roofline does not see (launch gap, tail, small grids)
        t_gpu = max(t_comp, t_mem) + self.kernel_floor
        mode = self.mode(p_tokens, dec_reqs, tokens)
        # The host issues kernels asynchronously: a step ends when both the host has issued its work
        # and the GPU has run it, so host and GPU time overlap (max), they do not add.
        host = {"full": self.graph_replay, "piecewise": self.piecewise_host, "eager": self.eager_launch}[mode]
        t = t_gpu + host if mode == "full" else max(t_gpu, host)
        comm = 0.0
        if self.tp > 1:
            size = tokens * self.m.hidden * 2
            comm = 2 * self.m.layers * (self.ar_lat + 2 * (self.tp - 1) / self.tp * size / self.ar_bw)
        if self.ep > 1 and self.m.experts:
            a2a = 2 * tokens * self.m.experts_per_token * self.m.hidden * self.m.dtype_bytes / self.ep
            comm += self.m.layers * (self.ar_lat + a2a / self.ar_bw)
        t += comm + self.step_cpu + self.per_req_cpu * (dec_reqs + len(prefill))
        return StepCost(t, t_comp, t_mem, host, comm, mode != "eager", mode, host)

    def mode(self, p_tokens: int, dec_reqs: int, tokens: int) -> str:
        """How the engine runs a step: a full CUDA graph (decode up to the captured batch; vLLM's
        FULL_AND_PIECEWISE also replays full graphs for uniform decode), piecewise graphs around
        eager attention (steps with prefill tokens up to the prefill capture size), or eager."""
        if not p_tokens:
            size = tokens if self.graph_covers_mixed else dec_reqs
            return "full" if self.cuda_graph and size <= self.graph_max_bs else "eager"
        return "piecewise" if tokens <= self.prefill_graph_max_tokens else "eager"
