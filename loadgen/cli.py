"""``python -m loadgen``: flags mirror ``python -m sglang.bench_serving`` (docs/bench-clients.md).

``main`` runs the steps in order: parse and validate, plan (prompts, schedule, request bytes), run
(runner.py: the workers), then write the result and choose the exit code.

Exit codes (README.md "Exit codes"): 0 the run finished and no more than --max-failed-fraction of its
requests failed; 1 --strict and the run is unreliable; 2 bad arguments (the message names the flag);
3 the run failed its own bar: more than --max-failed-fraction of the requests failed (the result is
written), or it was refused before the main phase (--flush-cache never succeeded; no result);
128 + signal number when SIGINT (130) or SIGTERM (143) cut it short: what was measured is written
with ``complete: false`` and ``interrupted_by``.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import signal
import sys
import time
import urllib.parse
from dataclasses import dataclass
from time import perf_counter_ns

from . import __version__, arrivals, backends, datasets, progress, results, runner, serverapi
from .plan import Plan, discover_model, log, make_plan
from .records import RequestRecord
from .tokenizer import TokenizerError

MARKER = "Starting main benchmark run..."
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


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
    a("--progress-file", default=None, help="JSON progress (completed/total, tok/s so far) every 2 s")
    a("--scrape-metrics", action="store_true", help="GET /metrics before and after the main phase")
    a("--flush-cache", action="store_true", help="flush the prefix cache before the main phase")
    a("--flush-timeout", type=float, default=60.0, help="keep retrying the flush this long (s)")
    a("--strict", action="store_true", help="exit 1 when the run is unreliable")
    a(
        "--max-failed-fraction",
        type=float,
        default=0.0,
        help="exit 3 when more than this fraction of the main-phase requests failed (default 0)",
    )
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
    if not 0.0 <= args.max_failed_fraction <= 1.0:
        p.error(f"--max-failed-fraction must be in [0, 1], got {args.max_failed_fraction:g}")
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
    if args.progress_file:
        d = os.path.dirname(os.path.abspath(args.progress_file))
        if not os.path.isdir(d):
            p.error(f"--progress-file: directory {d!r} does not exist")
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


@dataclass
class Clock:
    """The run's time origin, on both clocks (every ``*_s`` in the result counts from it)."""

    t0_ns: int
    t0_epoch: float


def raise_open_files_limit() -> None:
    """Thousands of streams need thousands of sockets: lift the soft limit to the hard one."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        pass


def ignore_stop_signals() -> None:
    """Once the run is over (or cut short), nothing may interrupt writing what was measured."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def plan_run(p: argparse.ArgumentParser, args: argparse.Namespace) -> Plan:
    args.model = discover_model(args)
    if args.model is None and backends.api_kind(args.backend) != "native":
        p.error(f"--model is required for --backend {args.backend} ({args.base_url}/v1/models gave no id)")
    try:
        return make_plan(args)
    except (TokenizerError, datasets.DatasetError) as exc:
        p.error(str(exc))


def announce(args: argparse.Namespace, plan: Plan, workers: int) -> None:
    log(f"#Input tokens: {plan.input_tokens}")
    log(f"#Output tokens: {plan.output_tokens}")
    log(
        f"loadgen {__version__}: {len(plan.main)} requests to {args.base_url}{plan.path}, workers={workers}, "
        f"max_concurrency={args.max_concurrency}, request_rate={args.request_rate or 'inf'}"
    )


def run_phases(
    args: argparse.Namespace, plan: Plan, workers: int, signals: runner.StopSignals
) -> tuple[runner.RunOutcome, dict | None]:
    """Warm-up, the optional cache flush and /metrics scrape, the main phase; (outcome, metrics)."""
    metrics: dict = {"before": None, "after": None}

    def before_main() -> None:
        if plan.warm:
            log(f"Warmup completed with {len(plan.warm)} sequences.")
        if args.flush_cache:
            ok, msg = serverapi.flush_cache(args.base_url, args.backend, args.flush_timeout)
            log(f"flush cache: {msg}")
            if not ok:
                raise runner.RunRefused(msg)
        if args.scrape_metrics:
            metrics["before"], _ = serverapi.scrape(args.base_url)
        write_phase(args.phase_file, "main")
        progress_file.start()
        log(MARKER)

    progress_file = progress.ProgressFile(args.progress_file, len(plan.main))
    if plan.warm:
        log(f"Starting warmup with {len(plan.warm)} sequences...")
    write_phase(args.phase_file, "warmup")
    out = runner.run(
        args.host,
        args.port,
        args.backend,
        workers,
        args.max_concurrency,
        args.request_timeout,
        plan.warm,
        plan.main,
        before_main,
        signals,
        use_uvloop=not args.no_uvloop,
        kernel_ts=args.timestamps == "kernel",
        on_progress=progress_file.update,
    )
    ignore_stop_signals()
    if args.scrape_metrics and not out.cut_short:
        metrics["after"], _ = serverapi.scrape(args.base_url)
    write_phase(args.phase_file, "done")
    progress_file.finish()
    if metrics["before"] is None or metrics["after"] is None:
        return out, None
    delta = serverapi.counter_deltas(metrics["before"], metrics["after"])
    return out, {"before": metrics["before"], "after": metrics["after"], "delta": delta}


def config_of(
    args: argparse.Namespace, clock: Clock, plan: Plan | None, out: runner.RunOutcome, workers: int
) -> dict:
    """The result's header: the run as asked, and what the plan and the workers made of it."""
    n = len(plan.main) if plan else args.num_prompts
    return {
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
        "prompt_format": ("ids" if plan.want_ids else "text") if plan else args.prompt_format,
        "num_prompts": n,
        "max_concurrency": args.max_concurrency,
        "request_rate": args.request_rate,
        "burstiness": args.burstiness,
        "arrival": args.arrival,
        "warmup_requests": args.warmup_requests,
        "seed": args.seed,
        "ignore_eos": not args.disable_ignore_eos,
        "timestamps": args.timestamps,
        "reads_without_kernel_stamp": out.unstamped_reads,
        "workers": max(1, min(workers, args.max_concurrency or workers, n)),
        "t0_epoch_s": clock.t0_epoch,
        "t0_monotonic_s": clock.t0_ns / 1e9,  # same origin on CLOCK_MONOTONIC (to match server-side logs)
        "interrupted_by": out.interrupted_by,
        "max_failed_fraction": args.max_failed_fraction,
        "dataset_info": plan.dataset_info if plan else {},
        "server_metrics": None,
        "warmup_failed": sum(1 for r in out.warm if r.error_class is not None),
        "connections": {
            "preopened": sum(x.opened for x in out.pool),
            "wanted": sum(x.wanted for x in out.pool),
            "opened_during_main": out.new_conns,
        },
    }


def reliability_reasons(out: runner.RunOutcome, records: list[RequestRecord]) -> list[str]:
    """Why the run's figures cannot be trusted as a whole, beyond the lag checks ``results.build`` adds."""
    reasons = [f"worker failure: {e}" for e in out.worker_errors]
    if out.interrupted_by:
        reasons.append(f"interrupted by {out.interrupted_by}: the run is incomplete")
    failed = [r.error_class for r in records if r.error_class is not None]
    if failed:
        classes = ", ".join(f"{c} {failed.count(c)}" for c in sorted(set(failed)))
        reasons.append(f"{len(failed)} of {len(records)} requests failed ({classes})")
    return reasons


def write_result(
    args: argparse.Namespace, clock: Clock, plan: Plan | None, out: runner.RunOutcome, workers: int,
    server_metrics: dict | None,
) -> dict:  # fmt: skip
    if out.unstamped_reads:
        warn(
            f"{out.unstamped_reads} reads came without a kernel receive timestamp (stamping not switched on "
            "yet, or this kernel does not stamp TCP receives); their events were timed at the read"
        )
    cfg = config_of(args, clock, plan, out, workers)
    cfg["server_metrics"] = server_metrics
    now = perf_counter_ns()
    res = results.build(
        cfg,
        out.main,
        clock.t0_ns,
        out.main_start_ns or now,
        out.main_over_ns or now,
        out.lags,
        args.output_details,
        out.interrupted_by is None,
        args.max_lag_ms,
        reliability_reasons(out, out.main),
    )
    if args.output_file:
        results.write_atomic(args.output_file, res)
    log(results.banner(res))
    return res


def exit_code(args: argparse.Namespace, res: dict, out: runner.RunOutcome) -> int:
    if out.interrupted_by:
        warn(f"interrupted by {out.interrupted_by}: the result is written with complete=false")
        return 128 + signal.Signals[out.interrupted_by].value
    n = res["num_prompts"]
    if res["failed"] > args.max_failed_fraction * n:
        warn(
            f"{res['failed']} of {n} requests failed ({res['errors_by_class']}), more than "
            f"--max-failed-fraction {args.max_failed_fraction:g}: exit 3"
        )
        return 3
    if args.strict and not res["reliable"]:
        warn("--strict: run unreliable: " + "; ".join(res["reliability"]["reasons"]))
        return 1
    return 0


def warn(msg: str) -> None:
    print(f"loadgen: {msg}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = make_parser()
    args = p.parse_args(argv)
    validate(p, args)
    clock = Clock(perf_counter_ns(), time.time())
    raise_open_files_limit()
    signals = runner.StopSignals()  # from here on a signal ends the run with what was measured
    signals.install()
    plan = None
    workers = args.workers if args.workers != "auto" else 1
    try:
        plan = plan_run(p, args)
        if args.workers == "auto":
            workers = auto_workers(args.max_concurrency, len(plan.main))
        announce(args, plan, workers)
        out, server_metrics = run_phases(args, plan, workers, signals)
    except runner.Interrupted as exc:  # before the workers ran: nothing measured, still said so
        ignore_stop_signals()
        write_phase(args.phase_file, "done")
        out, server_metrics = runner.RunOutcome(), None
        out.interrupted_by = exc.name
    if out.refused is not None:
        warn(f"run refused: --flush-cache: {out.refused}")
        return 3
    res = write_result(args, clock, plan, out, workers, server_metrics)
    return exit_code(args, res, out)


def entry() -> None:
    try:
        code = main()
    except BrokenPipeError:
        code = 0
    sys.exit(code)


if __name__ == "__main__":
    entry()
