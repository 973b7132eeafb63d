"""Command lines of the two engines (argparse, like the real ones) plus the emulator's --sim-* knobs.

Why: the same templates render real and emulated engine commands, so every flag a template can emit
must be accepted with the engine's spelling, and an unknown or malformed flag must be refused at start
naming it (argparse exits 2 with `error: unrecognized arguments: --x` / `argument --x: invalid ...`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from . import catalog, hwprofile, quantization

SGLANG_KV_DTYPES = ["auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1"]
VLLM_KV_DTYPES = ["auto", "fp8", "fp8_e5m2", "fp8_e4m3", "bfloat16", "fp8_inc", "fp8_ds_mla"]


@dataclass
class SimKnobs:
    """Emulator-only knobs (ENGINESIM_* env or --sim-* flags; the flag wins)."""

    time_scale: float = 1.0
    hardware: str = "h200"
    hw_override: dict[str, Any] = field(default_factory=dict)
    hardware_file: str | None = None
    ib_dir: str = "/sys/class/infiniband"
    crash_after: int | None = None
    oom_at_start: bool = False
    start_delay_s: float = 0.0
    hang_after: int | None = None
    seed: int = 0


@dataclass
class Config:
    """Both engines' flags normalised to one scheduler configuration."""

    flavour: str
    argv: list[str]
    model_path: str
    served_model_name: str
    host: str
    port: int
    mem_fraction: float | None
    context_length: int | None
    max_running: int | None
    chunk: int | None  # per-step prefill token budget; None = unchunked
    max_prefill_tokens: int
    mixed_chunk: bool
    enable_metrics: bool
    cuda_graph: bool
    cuda_graph_max_bs: int
    max_total_tokens: int | None
    num_gpu_blocks_override: int | None
    prefix_cache: bool
    page_size: int
    spec_algorithm: str | None
    spec_num_draft_tokens: int  # SGLang meaning: draft tokens per verify incl. the root (drafts = n - 1)
    spec_min_match: int
    spec_max_match: int
    tp: int
    ep: int
    nnodes: int
    node_rank: int
    dist_init_addr: str | None
    kv_cache_dtype: str
    kv_dtype_bytes: int
    scheduling_policy: str
    decode_log_interval: int
    stream_interval: int
    sim: SimKnobs
    raw: dict[str, Any]


def _add_sim_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("enginesim (emulator-only knobs; env ENGINESIM_* is the fallback)")
    g.add_argument("--sim-time-scale", type=float, default=None)
    g.add_argument("--sim-hardware", choices=catalog.hardware_keys(), default=None)
    g.add_argument("--sim-hw-json", default=None, help="JSON object or file overriding hardware fields")
    g.add_argument("--sim-hardware-file", default=None, help="profile from python -m enginesim.calibrate")
    g.add_argument("--sim-allow-cpu-profile", action="store_true", default=None)
    g.add_argument("--sim-ib-dir", default=None)
    g.add_argument("--sim-crash-after", type=int, default=None)
    g.add_argument("--sim-oom-at-start", action="store_true", default=None)
    g.add_argument("--sim-start-delay-s", type=float, default=None)
    g.add_argument("--sim-hang-after", type=int, default=None)
    g.add_argument("--sim-seed", type=int, default=None)


def _bool_str(v: str) -> bool:
    return v.lower() in ("1", "true", "yes", "on")


def _sim_knobs(ns: argparse.Namespace, env: dict[str, str], err: Any) -> SimKnobs:
    """Merge --sim-* flags over ENGINESIM_* env vars and check each value's rule."""

    def pick(flag_val: Any, env_name: str, conv: Any, rule: str, ok: Any) -> Any:
        flag = "--sim-" + env_name[len("ENGINESIM_") :].lower().replace("_", "-")
        if flag_val is not None:
            val, src = flag_val, flag
        elif env.get(env_name, "") != "":
            src = env_name
            try:
                val = conv(env[env_name])
            except ValueError:
                err(f"{env_name}={env[env_name]!r}: must be {rule}")
        else:
            return None
        if not ok(val):
            err(f"{src}={val!r}: must be {rule}")
        return val

    k = SimKnobs()
    v = pick(ns.sim_time_scale, "ENGINESIM_TIME_SCALE", float, "a number > 0", lambda x: x > 0)
    if v is not None:
        k.time_scale = v
    keys = catalog.hardware_keys()
    v = pick(ns.sim_hardware, "ENGINESIM_HARDWARE", str, f"one of {', '.join(keys)}", lambda x: x in keys)
    if v is not None:
        k.hardware = v
    hw_json = ns.sim_hw_json if ns.sim_hw_json is not None else env.get("ENGINESIM_HW_JSON")
    if hw_json:
        try:
            text = hw_json
            if not hw_json.lstrip().startswith("{"):
                with open(hw_json) as f:
                    text = f.read()
            k.hw_override = json.loads(text)
            assert isinstance(k.hw_override, dict)
        except (OSError, ValueError, AssertionError) as e:
            err(
                f"--sim-hw-json/ENGINESIM_HW_JSON {hw_json!r}: must be a JSON object or a file holding "
                f"one ({e})"
            )
    _hardware_file(ns, env, k, err, pick)
    v = pick(ns.sim_ib_dir, "ENGINESIM_IB_DIR", str, "a directory path", lambda x: bool(x))
    if v is not None:
        k.ib_dir = v
    k.crash_after = pick(
        ns.sim_crash_after, "ENGINESIM_CRASH_AFTER", int, "an integer >= 1", lambda x: x >= 1
    )
    v = pick(ns.sim_oom_at_start, "ENGINESIM_OOM_AT_START", _bool_str, "0 or 1", lambda x: True)
    k.oom_at_start = bool(v)
    v = pick(ns.sim_start_delay_s, "ENGINESIM_START_DELAY_S", float, "a number >= 0", lambda x: x >= 0)
    if v is not None:
        k.start_delay_s = v
    k.hang_after = pick(ns.sim_hang_after, "ENGINESIM_HANG_AFTER", int, "an integer >= 0", lambda x: x >= 0)
    v = pick(ns.sim_seed, "ENGINESIM_SEED", int, "an integer", lambda x: True)
    if v is not None:
        k.seed = v
    return k


def _hardware_file(ns: argparse.Namespace, env: dict[str, str], k: SimKnobs, err: Any, pick: Any) -> None:
    """A measured profile file replaces the hardware key: all its fields override `custom`'s."""
    path = pick(ns.sim_hardware_file, "ENGINESIM_HARDWARE_FILE", str, "a file path", lambda x: bool(x))
    if path is None:
        return
    if ns.sim_hardware is not None or env.get("ENGINESIM_HARDWARE"):
        err(
            f"--sim-hardware-file/ENGINESIM_HARDWARE_FILE {path!r} and --sim-hardware/ENGINESIM_HARDWARE "
            "both name the hardware: give one"
        )
    allow = pick(ns.sim_allow_cpu_profile, "ENGINESIM_ALLOW_CPU_PROFILE", _bool_str, "0 or 1", lambda x: True)
    try:
        prof = hwprofile.read(path, allow_cpu=bool(allow))
    except hwprofile.ProfileError as e:
        err(f"--sim-hardware-file/ENGINESIM_HARDWARE_FILE: {e}")
    k.hardware = "custom"
    k.hardware_file = path
    k.hw_override = {**prof, **k.hw_override}


def _positive(name: str) -> Any:
    def conv(s: str) -> int:
        v = int(s)
        if v <= 0:
            raise ValueError(f"{name} must be > 0")
        return v

    conv.__name__ = "positive int"
    return conv


def sglang_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="launch_server.py", allow_abbrev=False)
    a = p.add_argument
    a("--model-path", "--model", required=True)
    a("--tokenizer-path")
    a("--served-model-name")
    a("--host", default="127.0.0.1")
    a("--port", type=int, default=30000)
    a("--mem-fraction-static", type=float)
    a("--context-length", type=int)
    a("--max-running-requests", type=_positive("max-running-requests"))
    a("--max-queued-requests", type=int)
    a("--chunked-prefill-size", type=int)
    a("--max-prefill-tokens", type=int, default=16384)
    a("--enable-mixed-chunk", action="store_true")
    a("--attention-backend")
    a("--prefill-attention-backend")
    a("--decode-attention-backend")
    a("--sampling-backend")
    a("--enable-metrics", action="store_true")
    a("--enable-metrics-for-all-schedulers", action="store_true")
    a("--enable-cache-report", action="store_true")
    a("--cuda-graph-max-bs", type=int)
    a("--cuda-graph-bs", type=int, nargs="+")
    a("--disable-cuda-graph", action="store_true")
    a("--disable-cuda-graph-padding", action="store_true")
    a("--cuda-graph-backend-decode", choices=["full", "breakable", "disabled", "default"])
    a("--cuda-graph-backend-prefill", choices=["full", "breakable", "disabled", "default"])
    a("--max-total-tokens", type=_positive("max-total-tokens"))
    a("--disable-radix-cache", action="store_true")
    a("--speculative-algorithm", choices=["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"])
    a("--speculative-num-draft-tokens", type=int)
    a("--speculative-num-steps", type=int)
    a("--speculative-eagle-topk", type=int)
    a("--speculative-draft-model-path")
    a("--speculative-ngram-min-match-window-size", type=int, default=1)
    a("--speculative-ngram-max-match-window-size", type=int, default=12)
    a("--speculative-ngram-min-bfs-breadth", type=int)
    a("--speculative-ngram-max-bfs-breadth", type=int)
    a("--speculative-ngram-match-type", choices=["BFS", "PROB"])
    a("--speculative-ngram-branch-length", type=int)
    a("--speculative-ngram-capacity", type=int)
    a("--speculative-ngram-max-trie-depth", type=int)
    a("--tp-size", "--tensor-parallel-size", "--tp", type=_positive("tp-size"), default=1)
    a("--ep-size", "--expert-parallel-size", "--ep", type=_positive("ep-size"), default=1)
    a("--dp-size", "--data-parallel-size", "--dp", type=int, default=1)
    a("--pp-size", "--pipeline-parallel-size", type=int, default=1)
    a("--nnodes", type=_positive("nnodes"), default=1)
    a("--node-rank", type=int, default=0)
    a("--dist-init-addr", "--nccl-init-addr")
    a("--dist-timeout", type=int)
    a("--nccl-port", type=int)
    a("--kv-cache-dtype", choices=SGLANG_KV_DTYPES, default="auto")
    a("--dtype", default="auto")
    a("--quantization")
    a("--trust-remote-code", action="store_true")
    a("--tokenizer-mode", default="auto")
    a("--skip-tokenizer-init", action="store_true")
    a("--load-format", default="auto")
    a("--revision")
    a("--page-size", type=_positive("page-size"), default=1)
    a("--schedule-policy", default="fcfs")
    a("--schedule-conservativeness", type=float, default=1.0)
    a("--decode-log-interval", type=_positive("decode-log-interval"), default=40)
    a("--stream-interval", type=_positive("stream-interval"), default=1)
    a("--incremental-streaming-output", action="store_true")
    a("--disable-overlap-schedule", action="store_true")
    a("--enable-dp-attention", action="store_true")
    a("--enable-ep-moe", action="store_true")
    a("--moe-a2a-backend")
    a("--moe-runner-backend")
    a("--enable-two-batch-overlap", action="store_true")
    a("--disable-custom-all-reduce", action="store_true")
    a("--enable-torch-compile", action="store_true")
    a("--torch-compile-max-bs", type=int)
    a("--random-seed", type=int)
    a("--watchdog-timeout", type=float)
    a("--log-level", default="info")
    a("--log-level-http")
    a("--log-requests", action="store_true")
    a("--log-requests-level", type=int)
    a("--show-time-cost", action="store_true")
    a("--skip-server-warmup", action="store_true")
    a("--warmups")
    a("--device", default="cuda")
    a("--base-gpu-id", type=int, default=0)
    a("--chat-template")
    a("--reasoning-parser")
    a("--tool-call-parser")
    a("--api-key")
    a("--retraction-policy", choices=["length", "priority"])
    a("--collect-tokens-histogram", action="store_true")
    a("--enable-deterministic-inference", action="store_true")
    a("--sleep-on-idle", action="store_true")
    a("--model-loader-extra-config")
    a("--weight-version", default="default")
    _add_sim_flags(p)
    return p


def vllm_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vllm serve", usage="vllm serve [model_tag] [options]", allow_abbrev=False
    )
    a = p.add_argument
    a("model_tag", nargs="?")
    a("--model")
    a("--tokenizer")
    a("--served-model-name", nargs="+")
    a("--host", default="127.0.0.1")
    a("--port", type=int, default=8000)
    a("--gpu-memory-utilization", type=float, default=0.9)
    a("--max-model-len", type=int)
    a("--max-num-seqs", type=_positive("max-num-seqs"))
    a("--max-num-batched-tokens", type=_positive("max-num-batched-tokens"))
    a("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    a("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True)
    a("--enforce-eager", action="store_true")
    a("--num-gpu-blocks-override", type=_positive("num-gpu-blocks-override"))
    a("--block-size", type=int, choices=[1, 8, 16, 32, 64, 128], default=16)
    a("--kv-cache-dtype", choices=VLLM_KV_DTYPES, default="auto")
    a("--speculative-config", type=json.loads)
    a("--tensor-parallel-size", "-tp", type=_positive("tensor-parallel-size"), default=1)
    a("--pipeline-parallel-size", "-pp", type=int, default=1)
    a("--data-parallel-size", "-dp", type=int, default=1)
    a("--enable-expert-parallel", action="store_true")
    a("--nnodes", type=_positive("nnodes"), default=1)
    a("--node-rank", type=int, default=0)
    a("--master-addr")
    a("--master-port", type=int)
    a("--headless", action="store_true")
    a("--distributed-executor-backend")
    a("--scheduling-policy", choices=["fcfs", "priority"], default="fcfs")
    a("--dtype", default="auto")
    a("--quantization", "-q")
    a("--trust-remote-code", action="store_true")
    a("--seed", type=int)
    a("--swap-space", type=float)
    a("--max-logprobs", type=int)
    a("--disable-log-requests", action="store_true")
    a("--enable-log-requests", action="store_true")
    a("--disable-log-stats", action="store_true")
    a("--enable-prompt-tokens-details", action="store_true")
    a("--uvicorn-log-level")
    a("--api-key")
    a("--compilation-config", "-O")
    a("--cuda-graph-sizes", type=int, nargs="+")
    a("--max-seq-len-to-capture", type=int)
    a("--load-format")
    a("--download-dir")
    a("--generation-config")
    a("--chat-template")
    a("--tokenizer-mode")
    a("--revision")
    a("--async-scheduling", action="store_true")
    a("--disable-uvicorn-access-log", action="store_true")
    _add_sim_flags(p)
    return p


def _kv_bytes(dtype: str, model_bytes: int) -> int:
    if dtype.startswith("fp8"):
        return 1
    if dtype == "fp4_e2m1":
        return 1  # packed fp4 + scales; the emulator rounds to one byte
    return 2 if model_bytes <= 2 else model_bytes


def parse(argv: list[str], env: dict[str, str] | None = None) -> Config:
    """`argv` after `python -m enginesim`: `sglang ...` or `vllm serve MODEL ...`. Exits 2 on bad input."""
    env = dict(os.environ if env is None else env)
    top = argparse.ArgumentParser(prog="python -m enginesim", add_help=True)
    if not argv or argv[0] not in ("sglang", "vllm"):
        top.print_usage(sys.stderr)
        top.exit(
            2,
            "python -m enginesim: error: first argument must be 'sglang' or 'vllm' (got "
            f"{argv[0] if argv else 'nothing'!r})\n",
        )
    if argv[0] == "sglang":
        p = sglang_parser()
        ns = p.parse_args(argv[1:])
        return _sglang_config(p, ns, argv, env)
    if len(argv) < 2 or argv[1] != "serve":
        top.exit(2, "python -m enginesim: error: the vLLM form is `vllm serve <model> [flags]`\n")
    p = vllm_parser()
    ns = p.parse_args(argv[2:])
    return _vllm_config(p, ns, argv, env)


def _check_model(p: argparse.ArgumentParser, flag: str, value: str) -> catalog.ModelSpec:
    try:
        return quantization.load_checkpoint(value)
    except KeyError:
        p.error(
            f"argument {flag}: {value!r} is neither a catalogue model "
            f"({', '.join(catalog.catalogue_names())}) nor a directory with config.json"
        )
    except (OSError, ValueError) as e:
        p.error(f"argument {flag}: cannot read {value!r}: {e}")
    raise AssertionError("unreachable")


def _check_dist(p: argparse.ArgumentParser, nnodes: int, rank: int, addr: str | None, flag: str) -> None:
    if not 0 <= rank < nnodes:
        p.error(f"argument --node-rank: {rank} must be in [0, --nnodes={nnodes})")
    if nnodes > 1:
        if not addr:
            p.error(f"argument {flag}: required when --nnodes > 1")
        host, _, port = addr.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            p.error(f"argument {flag}: {addr!r} must be HOST:PORT")


def _sglang_config(
    p: argparse.ArgumentParser, ns: argparse.Namespace, argv: list[str], env: dict[str, str]
) -> Config:
    model = _check_model(p, "--model-path", ns.model_path)
    sim = _sim_knobs(ns, env, p.error)
    if ns.mem_fraction_static is not None and not 0 < ns.mem_fraction_static < 1:
        p.error(f"argument --mem-fraction-static: {ns.mem_fraction_static} must be in (0, 1)")
    _check_dist(p, ns.nnodes, ns.node_rank, ns.dist_init_addr, "--dist-init-addr")
    if ns.tp_size % ns.nnodes:
        p.error(f"argument --tp-size: {ns.tp_size} must be divisible by --nnodes={ns.nnodes}")
    chunk = ns.chunked_prefill_size
    if chunk is None:
        chunk = 8192 if catalog.load_hardware(sim.hardware, sim.hw_override).mem_bytes >= 60e9 else 2048
    if chunk == 0 or chunk < -1:
        p.error(f"argument --chunked-prefill-size: {chunk} must be -1 (disabled) or > 0")
    spec = ns.speculative_algorithm
    if spec not in (None, "NGRAM"):
        p.error(
            f"argument --speculative-algorithm: {spec} needs a draft model; enginesim emulates NGRAM only"
        )
    n_draft = ns.speculative_num_draft_tokens or (12 if spec else 0)
    if spec and n_draft < 2:
        p.error(f"argument --speculative-num-draft-tokens: {n_draft} must be >= 2")
    graph = not ns.disable_cuda_graph and ns.cuda_graph_backend_decode != "disabled"
    return Config(
        flavour="sglang",
        argv=argv,
        model_path=ns.model_path,
        served_model_name=ns.served_model_name or ns.model_path,
        host=ns.host,
        port=ns.port,
        mem_fraction=ns.mem_fraction_static,
        context_length=ns.context_length,
        max_running=ns.max_running_requests,
        chunk=None if chunk == -1 else chunk,
        max_prefill_tokens=ns.max_prefill_tokens,
        mixed_chunk=ns.enable_mixed_chunk,
        enable_metrics=ns.enable_metrics,
        cuda_graph=graph,
        cuda_graph_max_bs=ns.cuda_graph_max_bs or (max(ns.cuda_graph_bs) if ns.cuda_graph_bs else 256),
        max_total_tokens=ns.max_total_tokens,
        num_gpu_blocks_override=None,
        prefix_cache=not ns.disable_radix_cache,
        page_size=ns.page_size,
        spec_algorithm=spec,
        spec_num_draft_tokens=n_draft,
        spec_min_match=ns.speculative_ngram_min_match_window_size,
        spec_max_match=ns.speculative_ngram_max_match_window_size,
        tp=ns.tp_size,
        ep=ns.ep_size,
        nnodes=ns.nnodes,
        node_rank=ns.node_rank,
        dist_init_addr=ns.dist_init_addr,
        kv_cache_dtype=ns.kv_cache_dtype,
        kv_dtype_bytes=_kv_bytes(ns.kv_cache_dtype, model.dtype_bytes),
        scheduling_policy=ns.schedule_policy,
        decode_log_interval=ns.decode_log_interval,
        stream_interval=ns.stream_interval,
        sim=sim,
        raw=vars(ns),
    )


def _vllm_config(
    p: argparse.ArgumentParser, ns: argparse.Namespace, argv: list[str], env: dict[str, str]
) -> Config:
    model_name = ns.model_tag or ns.model
    if not model_name:
        p.error("the following arguments are required: model_tag (or --model)")
    model = _check_model(p, "model_tag", model_name)
    sim = _sim_knobs(ns, env, p.error)
    if not 0 < ns.gpu_memory_utilization <= 1:
        p.error(f"argument --gpu-memory-utilization: {ns.gpu_memory_utilization} must be in (0, 1]")
    addr = f"{ns.master_addr}:{ns.master_port or 29501}" if ns.master_addr else None
    _check_dist(p, ns.nnodes, ns.node_rank, addr, "--master-addr")
    spec_cfg = ns.speculative_config
    spec, n_spec, pl_min, pl_max = None, 0, 1, 4
    if spec_cfg is not None:
        if not isinstance(spec_cfg, dict):
            p.error(f"argument --speculative-config: {spec_cfg!r} must be a JSON object")
        method = spec_cfg.get("method")
        if method not in ("ngram", "[ngram]"):
            p.error(
                f"argument --speculative-config: method {method!r} needs a draft model; "
                "enginesim emulates 'ngram' only"
            )
        n_spec = spec_cfg.get("num_speculative_tokens")
        if not isinstance(n_spec, int) or n_spec < 1:
            p.error("argument --speculative-config: num_speculative_tokens must be an integer >= 1")
        spec = "NGRAM"
        pl_max = int(spec_cfg.get("prompt_lookup_max", 4))
        pl_min = int(spec_cfg.get("prompt_lookup_min", pl_max))
    served = ns.served_model_name[0] if ns.served_model_name else model_name
    return Config(
        flavour="vllm",
        argv=argv,
        model_path=model_name,
        served_model_name=served,
        host=ns.host,
        port=ns.port,
        mem_fraction=ns.gpu_memory_utilization,
        context_length=ns.max_model_len,
        max_running=ns.max_num_seqs or 256,
        chunk=ns.max_num_batched_tokens or 8192,
        max_prefill_tokens=ns.max_num_batched_tokens or 8192,
        mixed_chunk=True,
        enable_metrics=True,
        cuda_graph=not ns.enforce_eager,
        cuda_graph_max_bs=max(ns.cuda_graph_sizes) if ns.cuda_graph_sizes else 512,
        max_total_tokens=None,
        num_gpu_blocks_override=ns.num_gpu_blocks_override,
        prefix_cache=ns.enable_prefix_caching,
        page_size=ns.block_size,
        spec_algorithm=spec,
        spec_num_draft_tokens=n_spec + 1 if spec else 0,
        spec_min_match=pl_min,
        spec_max_match=pl_max,
        tp=ns.tensor_parallel_size,
        ep=1,
        nnodes=ns.nnodes,
        node_rank=ns.node_rank,
        dist_init_addr=addr,
        kv_cache_dtype=ns.kv_cache_dtype,
        kv_dtype_bytes=_kv_bytes(ns.kv_cache_dtype, model.dtype_bytes),
        scheduling_policy=ns.scheduling_policy,
        decode_log_interval=40,
        stream_interval=1,
        sim=sim,
        raw=vars(ns),
    )
