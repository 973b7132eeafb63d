"""``python -m loadgen``: flags mirror ``python -m sglang.bench_serving`` (contracts.md §2).

Exit codes: 0 run finished (failed requests are counted in the file), 1 --strict and the run is
unreliable, 2 bad arguments (the message names the flag), 3 the run was refused (the cache flush
never succeeded), 130 interrupted (what was measured is written, complete=false).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import resource
import sys
import time
import urllib.parse
from time import perf_counter_ns

from . import __version__, arrivals, backends, datasets, results, runner, serverapi
from .httpconn import build_request
from .tokenizer import TokenizerError, load_tokenizer

MARKER = "Starting main benchmark run..."
WARMUP_OUTPUT_CAP = 16


def _pos_int(flag: str, minimum: int = 1):
    def conv(v: str) -> int:
        try:
            x = int(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be an integer, got {v!r}") from None
        if x < minimum:
            raise argparse.ArgumentTypeError(f"{flag} must be >= {minimum}, got {x}")
        return x

    return conv


def _rate(v: str) -> float | None:
    if v.strip().lower() == "inf":
        return None
    try:
        x = float(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--request-rate must be a number or 'inf', got {v!r}") from None
    if not x > 0 or math.isinf(x):
        return None if math.isinf(x) else _bad_rate(x)
    return x


def _bad_rate(x: float):
    raise argparse.ArgumentTypeError(f"--request-rate must be > 0 (or 'inf'), got {x:g}")


def _workers(v: str) -> int | str:
    if v == "auto":
        return "auto"
    return _pos_int("--workers")(v)


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="loadgen",
        description="Benchmark client for SGLang/vLLM-style servers (flags mirror sglang.bench_serving).",
    )
    a = p.add_argument
    # Preflight runs it through the chosen client runtime (host Python or a container) and reads both.
    a("--version", action="version", version=f"loadgen {__version__} (Python {sys.version.split()[0]})")
    a("--backend", choices=backends.BACKENDS, default="sglang")
    a("--base-url", default=None, help="e.g. http://127.0.0.1:30000 (overrides --host/--port)")
    a("--host", default="127.0.0.1")
    a("--port", type=_pos_int("--port"), default=30000)
    a("--model", default=None, help="model name sent to OpenAI endpoints (default: first of /v1/models)")
    a("--tokenizer", default=None, help="local HF tokenizer dir (needs 'tokenizers') or 'server' (/tokenize)")
    a("--dataset-name", choices=datasets.DATASETS, default="random")
    a("--dataset-path", default=None, help="file for --dataset-name jsonl|sharegpt")
    a("--random-input-len", type=_pos_int("--random-input-len"), default=1024)
    a("--random-output-len", type=_pos_int("--random-output-len"), default=1024)
    a("--random-range-ratio", type=float, default=0.0)
    a("--range-ratio-semantics", choices=datasets.SEMANTICS, default="sglang")
    a(
        "--prompt-format",
        choices=("auto", "ids", "text"),
        default="auto",
        help="auto = token ids when the backend takes them, else text",
    )
    a("--gsp-num-groups", type=_pos_int("--gsp-num-groups"), default=64)
    a("--gsp-prompts-per-group", type=_pos_int("--gsp-prompts-per-group"), default=16)
    a("--gsp-system-prompt-len", type=_pos_int("--gsp-system-prompt-len"), default=2048)
    a("--gsp-question-len", type=_pos_int("--gsp-question-len"), default=128)
    a("--gsp-output-len", type=_pos_int("--gsp-output-len"), default=256)
    a("--sharegpt-output-len", type=_pos_int("--sharegpt-output-len"), default=None)
    a("--num-prompts", type=_pos_int("--num-prompts"), default=None)
    a("--max-concurrency", type=_pos_int("--max-concurrency"), default=None)
    a("--request-rate", type=_rate, default=None, help="requests/s or 'inf' (default inf)")
    a("--burstiness", type=float, default=1.0, help="gamma shape; 1.0 = Poisson")
    a(
        "--arrival",
        choices=arrivals.ARRIVALS,
        default=None,
        help="default: poisson, or gamma if --burstiness != 1",
    )
    a("--warmup-requests", type=_pos_int("--warmup-requests", 0), default=1)
    a("--seed", type=int, default=1)
    a("--output-file", default=None)
    a("--output-details", action="store_true")
    a("--disable-ignore-eos", action="store_true")
    a("--request-timeout", type=float, default=600.0, help="seconds; no request lasts longer")
    a("--phase-file", default=None)
    a("--scrape-metrics", action="store_true", help="GET /metrics before and after the main phase")
    a("--flush-cache", action="store_true", help="flush the prefix cache before the main phase")
    a("--flush-timeout", type=float, default=60.0, help="keep retrying the flush this long (s)")
    a("--strict", action="store_true", help="exit 1 when the run is unreliable")
    a("--max-lag-ms", type=float, default=25.0, help="loop/schedule lag p99 above this = unreliable")
    a("--workers", type=_workers, default="auto", help="worker processes (N or auto)")
    a("--no-uvloop", action="store_true")
    a(
        "--timestamps",
        choices=("kernel", "read"),
        default="kernel" if sys.platform.startswith("linux") else "read",
        help="event time: the kernel's receive timestamp (SO_TIMESTAMPNS; default on Linux) or "
        "when the loop read the bytes (default elsewhere)",
    )
    return p


def validate(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse bad combinations before anything starts (argparse.error exits 2 naming the flag)."""
    if args.random_range_ratio < 0 or args.random_range_ratio > 1:
        p.error(f"--random-range-ratio must be in [0, 1], got {args.random_range_ratio:g}")
    if args.range_ratio_semantics == "vllm" and args.random_range_ratio >= 1:
        p.error("--random-range-ratio must be < 1 with --range-ratio-semantics vllm")
    if not args.burstiness > 0:
        p.error(f"--burstiness must be > 0, got {args.burstiness:g}")
    if args.arrival is None:
        args.arrival = "poisson" if args.burstiness == 1.0 else "gamma"
    elif args.arrival == "poisson" and args.burstiness != 1.0:
        p.error("--burstiness != 1 needs --arrival gamma (Poisson is gamma with burstiness 1)")
    if not args.request_timeout > 0:
        p.error(f"--request-timeout must be > 0, got {args.request_timeout:g}")
    if args.dataset_name in ("jsonl", "sharegpt") and not args.dataset_path:
        p.error(f"--dataset-name {args.dataset_name} needs --dataset-path")
    if args.dataset_path and not os.path.isfile(args.dataset_path):
        p.error(f"--dataset-path {args.dataset_path!r} does not exist")
    if args.prompt_format == "ids" and not backends.accepts_ids(args.backend):
        p.error(f"--prompt-format ids: --backend {args.backend} takes text only")
    if args.base_url:
        u = urllib.parse.urlsplit(args.base_url)
        if u.scheme != "http" or not u.hostname:
            p.error(f"--base-url must look like http://HOST:PORT, got {args.base_url!r}")
        args.host = u.hostname
        args.port = u.port or 80
        args.base_url = f"http://{u.netloc}{u.path.rstrip('/')}"
    else:
        args.base_url = f"http://{args.host}:{args.port}"
    if args.output_file:
        d = os.path.dirname(os.path.abspath(args.output_file))
        if not os.path.isdir(d):
            p.error(f"--output-file: directory {d!r} does not exist")
    if args.phase_file:
        d = os.path.dirname(os.path.abspath(args.phase_file))
        if not os.path.isdir(d):
            p.error(f"--phase-file: directory {d!r} does not exist")
    if args.dataset_name == "shared-prefix" and args.num_prompts is None:
        args.num_prompts = args.gsp_num_groups * args.gsp_prompts_per_group
    if args.num_prompts is None:
        args.num_prompts = 1000


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, which containers and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def auto_workers(cap: int | None, n: int, cpus: int | None = None) -> int:
    """One worker per 128 concurrent streams, leaving one CPU to the server and the OS.

    On a 2-core box shared with the server, a second worker measured worse on every target
    (benchmarks/bench_loadgen.py, loadgen-w1 vs loadgen: ITL p99 at C=256 +0.73 vs +0.99 ms, ingest
    105k vs 99k tok/s): it competes with the server for the core the events come from.
    """
    conc = cap if cap is not None else n
    spare = max(1, (usable_cpus() if cpus is None else cpus) - 1)
    return max(1, min(spare, math.ceil(conc / 128)))


def write_phase(path: str | None, phase: str) -> None:
    if path:
        results.write_atomic(path, {"phase": phase, "time": time.time()})


def log(msg: str) -> None:
    print(msg, flush=True)


def make_prompts(args, tok, want_ids: bool) -> tuple[list, list, dict]:
    """(main prompts, warm-up prompts, dataset info) for the chosen dataset."""
    rng = random.Random(args.seed)
    maker = datasets.PromptMaker(tok, want_ids, rng)
    n = args.num_prompts
    info: dict = {}
    if args.dataset_name == "random":
        lo, hi = datasets.len_window(
            args.random_input_len, args.random_range_ratio, args.range_ratio_semantics
        )
        olo, ohi = datasets.len_window(
            args.random_output_len, args.random_range_ratio, args.range_ratio_semantics
        )
        log(
            f"Sampling input_len from [{lo}, {hi}] and output_len from [{olo}, {ohi}] "
            f"({args.range_ratio_semantics} range-ratio semantics, ratio {args.random_range_ratio:g})"
        )
        ins = datasets.sample_lens(
            args.random_input_len, args.random_range_ratio, args.range_ratio_semantics, n, rng
        )
        outs = datasets.sample_lens(
            args.random_output_len, args.random_range_ratio, args.range_ratio_semantics, n, rng
        )
        main = datasets.random_prompts(maker, n, ins, outs)
    elif args.dataset_name == "shared-prefix":
        main = datasets.shared_prefix_prompts(
            maker,
            n,
            args.gsp_num_groups,
            args.gsp_system_prompt_len,
            args.gsp_question_len,
            args.gsp_output_len,
        )
    elif args.dataset_name == "jsonl":
        main = datasets.jsonl_prompts(args.dataset_path, n, args.random_output_len, tok, want_ids, rng)
    else:
        main = datasets.sharegpt_prompts(args.dataset_path, n, args.sharegpt_output_len, tok, rng)
    # warm-up prompts are fresh random ones (other seed) so they do not prime the prefix cache
    wmaker = datasets.PromptMaker(tok, want_ids, random.Random(args.seed + 7919))
    warm = []
    for i in range(args.warmup_requests):
        ref = main[i % len(main)]
        warm.append(wmaker.make(max(1, min(ref.input_len, 4096)), min(ref.output_len, WARMUP_OUTPUT_CAP)))
    info["prompt_len_mismatch_tokens"] = maker.mismatch
    info["input_lens_checked"] = all(pr.len_checked for pr in main)
    return main, warm, info


def main(argv: list[str] | None = None) -> int:
    p = make_parser()
    args = p.parse_args(argv)
    validate(p, args)
    t0_ns = perf_counter_ns()
    t0_epoch = time.time()
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        pass
    kind = backends.api_kind(args.backend)
    if args.model is None:
        args.model = serverapi.first_model(args.base_url) if kind != "native" else None
        if args.model is None and kind != "native":
            p.error(
                f"--model is required for --backend {args.backend} ({args.base_url}/v1/models gave no id)"
            )
    try:
        tok = load_tokenizer(args.tokenizer, args.base_url, args.model or "")
    except TokenizerError as exc:
        p.error(str(exc))
    want_ids = backends.accepts_ids(args.backend) and args.prompt_format != "text"
    if args.prompt_format == "auto" and args.dataset_name in ("jsonl", "sharegpt"):
        want_ids = want_ids and args.dataset_name == "jsonl"
    try:
        main_prompts, warm_prompts, dinfo = make_prompts(args, tok, want_ids)
    except datasets.DatasetError as exc:
        p.error(str(exc))
    n = len(main_prompts)
    offsets = arrivals.schedule(n, args.request_rate, args.arrival, args.burstiness, args.seed)
    ignore_eos = not args.disable_ignore_eos
    path = backends.PATHS[args.backend]
    hostport = f"{args.host}:{args.port}"

    def payload(pr: datasets.Prompt) -> bytes:
        body = backends.build_body(args.backend, args.model or "", pr.text, pr.ids, pr.output_len, ignore_eos)
        return build_request("POST", hostport, path, body)

    main_items = [
        (i, int(offsets[i] * 1e9), payload(pr), pr.input_len, pr.output_len)
        for i, pr in enumerate(main_prompts)
    ]
    warm_items = [(-1 - i, 0, payload(pr), pr.input_len, pr.output_len) for i, pr in enumerate(warm_prompts)]
    workers = auto_workers(args.max_concurrency, n) if args.workers == "auto" else args.workers
    log(f"#Input tokens: {sum(pr.input_len for pr in main_prompts)}")
    log(f"#Output tokens: {sum(pr.output_len for pr in main_prompts)}")
    log(
        f"loadgen {__version__}: {n} requests to {args.base_url}{path}, workers={workers}, "
        f"max_concurrency={args.max_concurrency}, request_rate={args.request_rate or 'inf'}"
    )

    metrics: dict = {"before": None, "after": None, "raw_before": None}
    refused: list[str] = []

    def before_main() -> None:
        if warm_items:
            log(f"Warmup completed with {len(warm_items)} sequences.")
        if args.flush_cache:
            ok, msg = serverapi.flush_cache(args.base_url, args.backend, args.flush_timeout)
            log(f"flush cache: {msg}")
            if not ok:
                refused.append(msg)
                raise KeyboardInterrupt  # unwinds the runner cleanly; reported as refused below
        if args.scrape_metrics:
            metrics["before"], _ = serverapi.scrape(args.base_url)
        write_phase(args.phase_file, "main")
        log(MARKER)

    if warm_items:
        log(f"Starting warmup with {len(warm_items)} sequences...")
    write_phase(args.phase_file, "warmup")
    out = runner.run(
        args.host,
        args.port,
        args.backend,
        workers,
        args.max_concurrency,
        args.request_timeout,
        warm_items,
        main_items,
        before_main,
        use_uvloop=not args.no_uvloop,
        kernel_ts=args.timestamps == "kernel",
    )
    if refused:
        print(f"loadgen: run refused: --flush-cache: {refused[0]}", file=sys.stderr, flush=True)
        write_phase(args.phase_file, "done")
        return 3
    if args.scrape_metrics and not out.interrupted:
        metrics["after"], _ = serverapi.scrape(args.base_url)
    write_phase(args.phase_file, "done")
    server_metrics = None
    if metrics["before"] is not None and metrics["after"] is not None:
        server_metrics = {
            "before": metrics["before"],
            "after": metrics["after"],
            "delta": serverapi.counter_deltas(metrics["before"], metrics["after"]),
        }
    reasons = [f"worker failure: {e}" for e in out.worker_errors]
    if out.unstamped_reads:
        print(
            f"loadgen: {out.unstamped_reads} reads came without a kernel receive timestamp (stamping "
            "not switched on yet, or this kernel does not stamp TCP receives); their events were "
            "timed at the read",
            file=sys.stderr,
            flush=True,
        )
    if out.interrupted:
        reasons.append("interrupted: the run is incomplete")
    cfg = {
        "schema": "quickmap.loadgen/1",
        "tool": {"name": "loadgen", "version": __version__},
        "backend": args.backend,
        "base_url": args.base_url,
        "model": args.model,
        "tokenizer": args.tokenizer,
        "dataset_name": args.dataset_name,
        "dataset_path": args.dataset_path,
        "random_input_len": args.random_input_len,
        "random_output_len": args.random_output_len,
        "random_range_ratio": args.random_range_ratio,
        "range_ratio_semantics": args.range_ratio_semantics,
        "prompt_format": "ids" if want_ids else "text",
        "num_prompts": n,
        "max_concurrency": args.max_concurrency,
        "request_rate": args.request_rate,
        "burstiness": args.burstiness,
        "arrival": args.arrival,
        "warmup_requests": args.warmup_requests,
        "seed": args.seed,
        "ignore_eos": ignore_eos,
        "timestamps": args.timestamps,
        "reads_without_kernel_stamp": out.unstamped_reads,
        "workers": max(1, min(workers, args.max_concurrency or workers, n)),
        "t0_epoch_s": t0_epoch,
        "t0_monotonic_s": t0_ns / 1e9,  # same origin on CLOCK_MONOTONIC (to match server-side logs)
        "dataset_info": dinfo,
        "server_metrics": server_metrics,
        "warmup_failed": sum(1 for r in out.warm if r[6] is not None),
        "connections": {
            "preopened": sum(x[0] for x in out.pool),
            "wanted": sum(x[1] for x in out.pool),
            "opened_during_main": out.new_conns,
        },
    }
    res = results.build(
        cfg,
        out.main,
        t0_ns,
        out.main_start_ns or perf_counter_ns(),
        out.main_over_ns or perf_counter_ns(),
        out.lags,
        args.output_details,
        not out.interrupted,
        args.max_lag_ms,
        reasons,
    )
    if args.output_file:
        results.write_atomic(args.output_file, res)
    log(results.banner(res))
    if out.interrupted:
        return 130
    if args.strict and not res["reliable"]:
        print(
            "loadgen: --strict: run unreliable: " + "; ".join(res["reliability"]["reasons"]),
            file=sys.stderr,
            flush=True,
        )
        return 1
    return 0


def entry() -> None:
    try:
        code = main()
    except BrokenPipeError:
        code = 0
    except KeyboardInterrupt:  # before the run started (prompt preparation): nothing measured
        print("loadgen: interrupted before the run started", file=sys.stderr, flush=True)
        code = 130
    sys.exit(code)


if __name__ == "__main__":
    entry()
