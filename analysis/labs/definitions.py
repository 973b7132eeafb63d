"""What each lab asks (one sentence each) and the figures its verdict reads.

Why in code: the question a lab answers belongs with the function that answers it (verdicts.py);
the sizes and flags it is asked with belong to the inventory (roles/labs/defaults/main.yml), so a
site can change them without touching the logic.
"""

from __future__ import annotations

LABS = (
    "eager_vs_graph",
    "prefill_sweep",
    "decode_sweep",
    "prefix_cache",
    "chunk_interference",
    "token_budget",
    "kv_pressure",
    "fp8_kv",
    "ngram_spec",
    "quant_matrix",
    "tp_scaling",
    "sched_profile",
    "pd_disagg",
)

GOALS = {
    "eager_vs_graph": "Does capturing decode steps in CUDA graphs lower the time per output token "
    "against eager execution, and at which concurrencies?",
    "prefill_sweep": "How does the time to first token grow with the prompt length, and what prefill "
    "throughput does that imply?",
    "decode_sweep": "How do time per output token and output throughput change as more requests decode "
    "together?",
    "prefix_cache": "Does a repeated prompt prefix skip its prefill (server-reported cached tokens, lower "
    "TTFT) with prefix caching on, and not with it off?",
    "chunk_interference": "How long does a long prompt arriving mid-stream stall a running decode stream, "
    "and does a smaller prefill chunk (or mixing chunks with decode) bound that stall?",
    "token_budget": "Does a smaller per-step token budget stop short requests sent with a long prompt from "
    "waiting behind its whole prefill, and what does it cost their decoding and the long request?",
    "kv_pressure": "When the KV cache is full, does the engine preempt (vLLM) or retract (SGLang) running "
    "requests, and what does the queue look like meanwhile?",
    "fp8_kv": "How many more KV tokens does an FP8 KV cache fit in the same memory, as each server "
    "announces it at start-up?",
    "ngram_spec": "How many draft tokens does n-gram speculation get accepted on repetitive text and on "
    "prose, and does it speed decoding up against the baseline?",
    "quant_matrix": "How do FP8 and INT4 (AWQ, GPTQ) weights change memory, time per output token and "
    "throughput against the 16-bit baseline, and which kernel did the engine actually run for each?",
    "tp_scaling": "How do total and per-GPU throughput scale with the tensor-parallel size across request "
    "rates, where is each size's knee, and how much of a forward pass goes to communication?",
    "sched_profile": "How much of the engine's scheduler process goes to scheduling as the request rate "
    "grows, and does the scheduler's CPU work overlap the forward pass?",
    "pd_disagg": "Does splitting prefill and decode onto their own instances (KV moved between them, "
    "requests sent through the router) beat one instance on the same GPUs, and for which prompt and "
    "output lengths (the break-even)?",
}

# The engine flag words that mean "CUDA graphs off" etc. are configuration, not code: see
# labs_definitions in roles/labs/defaults/main.yml.
