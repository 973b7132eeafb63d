"""Accuracy and speed of loadgen against truthserver's ground truth (and httpx/aiohttp/SGLang baselines).

For each client and concurrency C in (1, 64, 256, 1024): start truthserver (benchmarks/truthserver/:
TTFT 50 ms, ITL 10 ms, one token per SSE event, the true send time of every event logged), send 4·C
requests of 128 tokens in / 128 out on SGLang's native /generate, then compare the client's TTFT/ITL
with the truth: error = reported − truth (mean and p99). Plus max ingest: TTFT = ITL = 0, C = 256,
512 out, 1024 requests; the client's reported output tok/s vs what the server actually sent.

Clients (``--clients``, see benchmarks/loadgen_clients.py): ``loadgen`` (this tree, --workers auto),
``loadgen-wN``, ``loadgen-kernel`` / ``loadgen-read``, ``base`` / ``base-wN`` (another loadgen copy,
``--base-src DIR``, e.g. ``git archive <commit> loadgen | tar -x -C DIR``: an A/B of two versions in
one session, alternated in every rep), ``httpx``, ``aiohttp``, ``raw`` (max ingest only: a reader that
measures nothing, so the server's ceiling shows; "server not the bottleneck" needs it) and ``sglang``.

``sglang`` is optional: SGLang's own client (``sglang.benchmark.serving``, the code behind ``python -m
sglang.bench_serving``), run from an unpacked SGLang wheel without torch, for the max-ingest
comparison "at least the SGLang client's figure on the same box". Nothing of SGLang is in this repo;
without ``--sglang-src`` (env ``SGLANG_BENCH_SRC``) the run says ``client sglang SKIPPED`` and
prints no SGLang verdict. Set-up, once, in a directory of your choice ($SGL)::

    python -m venv $SGL/venv && $SGL/venv/bin/pip install aiohttp msgspec numpy orjson \\
        requests tqdm transformers tokenizers psutil pyzmq pybase64 pillow datasets
    pip download sglang==0.5.23 --no-deps -d $SGL && unzip -q $SGL/sglang-0.5.23-*.whl 'sglang/*' -d $SGL/src
    python benchmarks/bench_loadgen.py --clients loadgen,sglang --conc "" --reps 3 \\
        --sglang-src $SGL/src --sglang-python $SGL/venv/bin/python

The package's ``__init__`` files (they import torch) are bypassed (loadgen_clients.sglang_shim); the
client's own code runs unchanged, ``--backend sglang --dataset-name random-ids`` with the same lengths,
requests and concurrency, its default one warm-up request (dropped from the truth), and a tokenizer
directory in which every streamed word is one token (benchmarks/truthserver/tokdir.py).

``--shapes``: instead, the workload-shape sweep at C = 256 (4·C requests; 2·C for OSL 1024): one
factor at a time around the base shape (TTFT 50 ms, ITL 10 ms, OSL 128) — ITL 2, 5, 7, 10, 20, 50 ms;
TTFT 10, 80, 500 ms; OSL 16, 96, 1024. Targets on every shape (medians over reps): TTFT error mean
≤ 5 ms, p99 ≤ 25 ms, ITL p99 ≤ 1 ms. A shape (and, in the default run, a concurrency's target) that
misses them passes only as "beyond this box" when
the evidence says the box could not serve and read it at once — the server fell behind its own
schedule (truth-log lag p99 over 1 ms) or the host's CPUs were saturated (≥ 90% busy over the run,
every process counted) — **and** loadgen marked every such run unreliable; a missed target
reported as reliable fails.

``--parse-only``: no server; loadgen's receive path alone (benchmarks/loadgen_receive_path.py).

usage: python benchmarks/bench_loadgen.py [--clients loadgen,httpx,aiohttp,raw,sglang]
       [--conc 1,64,256,1024] [--reps 1] [--ingest-reps 3] [--no-ingest] [--json OUT] [--server-procs auto|N]
       python benchmarks/bench_loadgen.py --shapes [--clients loadgen] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.loadgen_clients import ClientFailed, Clients, Workload  # noqa: E402
from benchmarks.loadgen_receive_path import parse_only  # noqa: E402
from benchmarks.truthserver import tokdir, truth  # noqa: E402
from benchmarks.truthserver.launch import TruthServer  # noqa: E402

DEFAULT_CLIENTS = "loadgen,httpx,aiohttp,raw,sglang"


def host_cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies over every CPU of the host since boot (Linux /proc/stat); (0, 0) elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def one_case(
    clients: Clients,
    client: str,
    w: Workload,
    ttft: float,
    itl: float,
    procs: int,
    tpe: int = 1,
) -> dict:
    """Run ``client`` once against a fresh truthserver; its errors against the truth log."""
    log = os.path.join(clients.tmp, f"truth-{client}-{w.conc}-{time.time_ns()}.jsonl")
    t0 = time.monotonic()
    with TruthServer(
        log, ttft_ms=ttft, itl_ms=itl, tokens_per_event=tpe, extra=["--procs", str(procs)]
    ) as srv:
        t1 = time.monotonic()
        busy0, total0 = host_cpu_times()
        fig, cpu = clients.run(client, srv.port, w)
        busy1, total1 = host_cpu_times()
        client_wall = time.monotonic() - t1
        wall = time.monotonic() - t0
    srv_cpu = srv.report.get("cpu_s", math.nan)
    tr = truth.analyze(log, 1 if client == "sglang" else 0)  # sglang: its warm-up request
    os.unlink(log)
    if client == "raw":  # it reports nothing: what it read is what the server sent
        fig["tput"] = tr["output_tok_s"]
    toks = max(tr["output_tokens"], 1)
    return {
        "client": client,
        "conc": w.conc,
        "n": w.n,
        "ttft_err_mean": fig["mean_ttft"] - tr["ttft_ms"]["mean"],
        "ttft_err_p99": fig["p99_ttft"] - tr["ttft_ms"]["p99"],
        "itl_err_mean": fig["mean_itl"] - tr["itl_ms"].get("mean", math.nan),
        "itl_err_p99": fig["p99_itl"] - tr["itl_ms"].get("p99", math.nan),
        "max_active": tr["max_active"],
        "failed": fig["failed"],
        "reported_tok_s": fig["tput"],
        "server_tok_s": tr["output_tok_s"],
        "tput_err_pct": 100 * (fig["tput"] - tr["output_tok_s"]) / tr["output_tok_s"],
        "cpu_s_per_1k_tok": 1000 * cpu / toks,
        "srv_cpu_s_per_1k_tok": 1000 * srv_cpu / toks,
        # serving processes' CPU over the server's life (about the client's run): cores in use
        "srv_cpu_share": srv_cpu / wall,
        "client_cpu_share": cpu / client_wall,
        "box_cpu_share": (srv_cpu + cpu) / wall / (os.cpu_count() or 1),
        # every process on the host (other people's jobs included), over the client's run
        "host_cpu_busy": (busy1 - busy0) / (total1 - total0) if total1 > total0 else math.nan,
        "srv_lag_p99_ms": tr["lag_ms"].get("p99", math.nan),
        # share of events written while the connection still had unsent bytes (the client was behind)
        "srv_backlog_pct": 100 * tr["backlogged_events"] / max(tr["events"], 1),
        "reliable": fig.get("reliable"),
        "reasons": fig.get("reasons"),
        "read_together_pct": fig.get("read_together_pct", math.nan),
        # how far events read together can have moved the client's ITL p99 (loadgen's self-check)
        "itl_p99_ambiguity_ms": fig.get("itl_p99_ambiguity_ms", math.nan),
        "loop_lag_p99": fig.get("loop_lag_p99", math.nan),
        "workers": fig.get("workers"),
    }


def print_row(row: dict) -> None:
    print(
        f"{row['case']:>7} {row['client']:>10} ttft err mean {row['ttft_err_mean']:+8.2f} p99 "
        f"{row['ttft_err_p99']:+8.2f} | itl err mean {row['itl_err_mean']:+6.2f} p99 "
        f"{row['itl_err_p99']:+7.2f} | active {row['max_active']:>5} | tok/s rep "
        f"{row['reported_tok_s']:>9.0f} srv {row['server_tok_s']:>9.0f} ({row['tput_err_pct']:+.1f}%)"
        f" | cpu/1k {row['cpu_s_per_1k_tok']:.3f} srv {row['srv_cpu_s_per_1k_tok']:.3f}"
        f" share {row['srv_cpu_share']:.2f} lag p99 {row['srv_lag_p99_ms']:.2f}"
        f" backlog {row['srv_backlog_pct']:.0f}% | failed {row['failed']}"
        f" | reliable {row['reliable']} itl p99 ambiguity {row['itl_p99_ambiguity_ms']:.2f}",
        flush=True,
    )


def print_medians(rows: list[dict]) -> None:
    """One line per (case, client): medians over reps (the figures to quote)."""
    print("\nmedians over reps:")
    keys = (
        "ttft_err_mean",
        "ttft_err_p99",
        "itl_err_mean",
        "itl_err_p99",
        "reported_tok_s",
        "server_tok_s",
        "cpu_s_per_1k_tok",
        "srv_cpu_share",
        "srv_lag_p99_ms",
    )
    seen = list(dict.fromkeys((r["case"], r["client"]) for r in rows))
    for case, client in seen:
        sel = [r for r in rows if r["case"] == case and r["client"] == client]
        med = {k: statistics.median(r[k] for r in sel) for k in keys}
        unrel = sum(1 for r in sel if r.get("reliable") is False)
        print(
            f"  {case:>7} {client:>10} n={len(sel)} ttft err mean {med['ttft_err_mean']:+.2f} p99 "
            f"{med['ttft_err_p99']:+.2f} | itl err mean {med['itl_err_mean']:+.2f} p99 "
            f"{med['itl_err_p99']:+.2f} | tok/s {med['reported_tok_s']:.0f} "
            f"(server {med['server_tok_s']:.0f}) | cpu/1k {med['cpu_s_per_1k_tok']:.4f} | srv share "
            f"{med['srv_cpu_share']:.2f} lag p99 "
            f"{med['srv_lag_p99_ms']:.2f} | unreliable {unrel}"
        )


def print_ingest_vs_sglang(rows: list[dict]) -> None:
    """Max ingest, loadgen clients vs the SGLang client in the same rep: reported and achieved at the
    server, the per-rep ratio of achieved figures and its median (the same-box comparison)."""
    ing = [r for r in rows if r["case"] == "ingest"]
    sgl = {r["rep"]: r for r in ing if r["client"] == "sglang"}
    if not sgl:
        return
    print("\nmax ingest vs the SGLang client (tok/s reported / achieved at the server, per rep):")
    for client in dict.fromkeys(r["client"] for r in ing if r["client"] not in ("sglang", "raw")):
        ratios = []
        for r in (r for r in ing if r["client"] == client and r["rep"] in sgl):
            s = sgl[r["rep"]]
            ratios.append(r["server_tok_s"] / s["server_tok_s"])
            print(
                f"  rep {r['rep']}: {client} {r['reported_tok_s']:.0f} / {r['server_tok_s']:.0f} | sglang "
                f"{s['reported_tok_s']:.0f} / {s['server_tok_s']:.0f} | achieved ratio {ratios[-1]:.2f}"
            )
        if ratios:
            med = statistics.median(ratios)
            print(f"  {client}/sglang achieved-at-server ratio, median of {len(ratios)}: {med:.2f}")


# (case, figure, limit, description): loadgen's accuracy targets (--workers auto)
TARGETS = (
    ("c256", "ttft_err_mean", 5.0, "C=256 mean TTFT error <= 5 ms"),
    ("c256", "ttft_err_p99", 25.0, "C=256 p99 TTFT error <= 25 ms"),
    ("c256", "itl_err_p99", 1.0, "C=256 p99 ITL error <= 1 ms"),
    ("c1024", "ttft_err_mean", 25.0, "C=1024 mean TTFT error <= 25 ms"),
    ("c1024", "ttft_err_p99", 100.0, "C=1024 p99 TTFT error <= 100 ms"),
    ("c1024", "itl_err_p99", 5.0, "C=1024 p99 ITL error <= 5 ms"),
)


def check_targets(rows: list[dict]) -> int:
    """Print PASS/FAIL (or SKIPPED, with the reason) per target from the medians over reps of the
    'loadgen' rows; count FAILs."""
    lg = [r for r in rows if r["client"] == "loadgen"]
    failed = 0
    print("\ntargets (medians over reps of client 'loadgen'):")

    def verdict(ok: bool, text: str) -> None:
        nonlocal failed
        failed += not ok
        print(f"  {'PASS' if ok else 'FAIL'}  {text}")

    for case, key, limit, text in TARGETS:
        sel = [r for r in lg if r["case"] == case]
        if not sel:
            continue
        v = statistics.median(r[key] for r in sel)
        beyond = beyond_this_box(sel, [r for r in sel if abs(r[key]) > limit])
        if abs(v) > limit and beyond:
            print(f"  BEYOND THIS BOX  {text}: {v:+.2f} ({beyond})")
            continue
        verdict(abs(v) <= limit, f"{text}: {v:+.2f}")
    act = [r["max_active"] for r in lg if r["case"] == "c1024"]
    if act:
        verdict(min(act) >= 1024, f"C=1024 all streams open at once (truth max active): {min(act)}")
    ing = [r for r in lg if r["case"] == "ingest"]
    if not ing:
        return failed
    err = statistics.median(abs(r["tput_err_pct"]) for r in ing)
    verdict(err <= 2.0, f"max ingest reported within 2% of the server's: {err:.2f}%")
    tput = statistics.median(r["server_tok_s"] for r in ing)
    raw = [r["server_tok_s"] for r in rows if r["case"] == "ingest" and r["client"] == "raw"]
    if raw:
        verdict(
            statistics.median(raw) > tput,
            f"server not the bottleneck: it sent the raw reader {statistics.median(raw):.0f} tok/s, "
            f"loadgen {tput:.0f} (medians)",
        )
    else:
        print("  SKIPPED  server not the bottleneck: client 'raw' not in --clients")
    sgl = {r["rep"]: r["server_tok_s"] for r in rows if r["case"] == "ingest" and r["client"] == "sglang"}
    ratios = [r["server_tok_s"] / sgl[r["rep"]] for r in ing if r["rep"] in sgl]
    if ratios:
        med = statistics.median(ratios)
        verdict(
            med >= 1.0,
            f"max ingest >= the SGLang client's on this box, same run (achieved at the server): "
            f"{tput:.0f} vs {statistics.median(sgl.values()):.0f}, median ratio {med:.2f}",
        )
    else:
        print(
            "  SKIPPED  max ingest >= the SGLang client's on this box: no SGLang client in this run "
            "(optional: --clients ...,sglang --sglang-src DIR, see this script's docstring)"
        )
    return failed


# (name, TTFT ms, ITL ms, OSL): one factor at a time around the base shape TTFT 50 / ITL 10 / OSL 128
SHAPES = (
    ("itl2", 50.0, 2.0, 128),
    ("itl5", 50.0, 5.0, 128),
    ("itl7", 50.0, 7.0, 128),
    ("itl10", 50.0, 10.0, 128),
    ("itl20", 50.0, 20.0, 128),
    ("itl50", 50.0, 50.0, 128),
    ("ttft10", 10.0, 10.0, 128),
    ("ttft80", 80.0, 10.0, 128),
    ("ttft500", 500.0, 10.0, 128),
    ("osl16", 50.0, 10.0, 16),
    ("osl96", 50.0, 10.0, 96),
    ("osl1024", 50.0, 10.0, 1024),
)
SHAPE_CONC = 256
SHAPE_TARGETS = (("ttft_err_mean", 5.0), ("ttft_err_p99", 25.0), ("itl_err_p99", 1.0))
SERVER_BEHIND_MS = 1.0  # truth-log lag p99 above this: the server did not keep its own schedule
BOX_SATURATED = 0.9  # CPUs busy over the run (every process on the host), as a share of all of them


def beyond_this_box(sel: list[dict], missed: list[dict]) -> str:
    """Why a missed target is the box's and not loadgen's, or "" when it is not: the box could not serve
    and read the workload at once (the server fell behind its own schedule, or the CPUs were
    saturated), and loadgen marked every run that missed unreliable. A miss reported as reliable is
    always loadgen's."""
    if not missed or any(r["reliable"] is not False for r in missed):
        return ""
    lag = statistics.median(r["srv_lag_p99_ms"] for r in sel)
    cpu = statistics.median(r["host_cpu_busy"] for r in sel)
    why = []
    if lag > SERVER_BEHIND_MS:
        why.append(f"server lag p99 {lag:.1f} ms")
    if cpu >= BOX_SATURATED:
        why.append(f"CPUs {100 * cpu:.0f}% busy")
    return f"{', '.join(why)}; every missed run marked unreliable" if why else ""


def run_shapes(clients: Clients, names: list[str], reps: int, procs: int) -> list[dict]:
    rows = []
    for rep in range(reps):
        for shape, ttft, itl, osl in SHAPES:
            n = (2 if osl >= 1024 else 4) * SHAPE_CONC
            for client in names:
                row = one_case(clients, client, Workload(SHAPE_CONC, n, osl), ttft, itl, procs)
                row.update(case=shape, rep=rep, events_per_s=SHAPE_CONC / (itl / 1e3))
                rows.append(row)
                print_row(row)
    return rows


def shape_verdicts(rows: list[dict]) -> int:
    """One line per shape for client 'loadgen' (medians over reps); count the shapes that fail."""
    print(
        "\nshape sweep, C=256, client loadgen, medians over reps (targets: TTFT err mean <= 5, p99 <= 25, "
        "ITL err p99 <= 1 ms):"
    )
    print(
        "  shape    ev/s | ttft err mean   p99 | itl err p99 | read together | itl p99 ambiguity | "
        "srv lag p99 | host cpu | unreliable | verdict"
    )
    failed = 0
    for shape, *_ in SHAPES:
        sel = [r for r in rows if r["case"] == shape and r["client"] == "loadgen"]
        if not sel:
            continue
        med = {
            k: statistics.median(r[k] for r in sel)
            for k in ("ttft_err_mean", "ttft_err_p99", "itl_err_p99", "read_together_pct",
                      "itl_p99_ambiguity_ms", "srv_lag_p99_ms", "host_cpu_busy", "events_per_s")
        }  # fmt: skip
        met = all(abs(med[k]) <= limit for k, limit in SHAPE_TARGETS)
        unreliable = sum(1 for r in sel if r["reliable"] is False)
        missed = [r for r in sel if not all(abs(r[k]) <= limit for k, limit in SHAPE_TARGETS)]
        beyond = beyond_this_box(sel, missed)
        if met:
            verdict = "PASS"
        elif beyond:
            verdict = f"BEYOND THIS BOX ({beyond})"
        elif any(r["reliable"] is not False for r in missed):
            verdict = "FAIL: a run that missed the targets was reported as reliable"
        else:
            verdict = "FAIL: targets missed on a box that kept up"
        failed += verdict.startswith("FAIL")
        print(
            f"  {shape:>7} {med['events_per_s']:6.0f} | {med['ttft_err_mean']:+8.2f} "
            f"{med['ttft_err_p99']:+7.2f} | {med['itl_err_p99']:+8.2f}    | "
            f"{med['read_together_pct']:9.2f}%    | {med['itl_p99_ambiguity_ms']:13.2f}     | "
            f"{med['srv_lag_p99_ms']:8.2f}    | "
            f"{100 * med['host_cpu_busy']:5.0f}%  | {unreliable}/{len(sel)}"
            f"        | {verdict}"
        )
    return failed


def server_procs(flag: str, paced: bool) -> int:
    if flag != "auto":
        return int(flag)
    return 1 if paced else min(2, os.cpu_count() or 1)


def make_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", default=DEFAULT_CLIENTS)
    ap.add_argument("--conc", default="1,64,256,1024", help='accuracy cases ("" = only max ingest)')
    ap.add_argument("--reps", type=int, default=1, help="repetitions of the accuracy cases")
    ap.add_argument(
        "--ingest-reps",
        type=int,
        default=3,
        help="repetitions of max ingest (its targets are medians; one rep of loadgen varied 136-164k "
        "tok/s on the quiet box, the raw reader 152-153k)",
    )
    ap.add_argument("--no-ingest", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    ap.add_argument(
        "--server-procs",
        default="auto",
        help="truthserver serving processes; auto: 1 for paced cases (they need less than a CPU, and "
        "every extra process competes with the client for the CPUs), 2 for max ingest (the server "
        "must outrun the client)",
    )
    ap.add_argument("--base-src", default=None, help="dir holding another loadgen package (clients base*)")
    ap.add_argument("--parse-only", action="store_true", help="time the receive path only (no server)")
    ap.add_argument("--shapes", action="store_true", help="the C=256 workload-shape sweep instead")
    ap.add_argument(
        "--sglang-src",
        default=os.environ.get("SGLANG_BENCH_SRC"),
        help="dir holding the unpacked sglang package (client sglang); env SGLANG_BENCH_SRC",
    )
    ap.add_argument(
        "--sglang-python",
        default=os.environ.get("SGLANG_BENCH_PYTHON", sys.executable),
        help="python with the SGLang client's light deps (client sglang); env SGLANG_BENCH_PYTHON",
    )
    return ap


def pick_clients(ap: argparse.ArgumentParser, a: argparse.Namespace) -> list[str]:
    """The clients to run; ``sglang`` leaves with a SKIPPED line when SGLang's client is not set up."""
    clients = [c for c in a.clients.split(",") if c]
    if "sglang" in clients:
        if not a.sglang_src:
            print(
                "client sglang SKIPPED: no --sglang-src (or SGLANG_BENCH_SRC) given, so there is no "
                "same-box SGLang figure in this run (optional; see this script's docstring to set one up)",
                flush=True,
            )
            clients.remove("sglang")
        elif not os.path.isfile(os.path.join(a.sglang_src, "sglang", "benchmark", "serving.py")):
            ap.error(f"--sglang-src {a.sglang_src}: no sglang/benchmark/serving.py there (an unpacked wheel)")
        elif not (os.path.isfile(a.sglang_python) and os.access(a.sglang_python, os.X_OK)):
            ap.error(f"--sglang-python {a.sglang_python}: not an executable file")
    if not clients:
        ap.error("--clients: nothing left to run")
    return clients


def main() -> int:
    ap = make_parser()
    a = ap.parse_args()
    base_src = os.path.abspath(a.base_src) if a.base_src else None
    if base_src and not os.path.isfile(os.path.join(base_src, "loadgen", "__main__.py")):
        ap.error(f"--base-src {a.base_src}: no loadgen package there (expected DIR/loadgen/__main__.py)")
    if a.parse_only:
        parse_only(base_src)
        return 0
    for flag, value in (("--reps", a.reps), ("--ingest-reps", a.ingest_reps)):
        if value < 1:
            ap.error(f"{flag} must be an integer >= 1, got {value}")
    if a.server_procs != "auto" and not (a.server_procs.isdigit() and int(a.server_procs) >= 1):
        ap.error(f"--server-procs must be auto or an integer >= 1, got {a.server_procs!r}")
    if a.shapes:
        a.clients = a.clients if a.clients != DEFAULT_CLIENTS else "loadgen"
    names = pick_clients(ap, a)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-loadgen-") as tmp:
        clients = Clients(
            tmp=tmp,
            base_src=base_src,
            sglang_src=os.path.abspath(a.sglang_src) if "sglang" in names else None,
            sglang_python=a.sglang_python,
        )
        if "sglang" in names:
            clients.tokenizer_dir = os.path.join(tmp, "tok")
            tokdir.build(clients.tokenizer_dir)
        if a.shapes:
            rows = run_shapes(clients, names, a.reps, server_procs(a.server_procs, paced=True))
            if a.json:
                with open(a.json, "w") as f:
                    json.dump(rows, f, indent=1)
            failed = shape_verdicts(rows)
            return 1 if failed and a.strict else 0
        cases = [
            (f"c{c}", Workload(c, 4 * c, 128), 50.0, 10.0) for c in (int(x) for x in a.conc.split(",") if x)
        ]
        if not a.no_ingest:
            cases.append(("ingest", Workload(256, 1024, 512), 0.0, 0.0))
        peer_failures: list[str] = []
        for rep in range(max(a.reps, 0 if a.no_ingest else a.ingest_reps)):
            for case, w, ttft, itl in cases:
                if rep >= (a.ingest_reps if case == "ingest" else a.reps):
                    continue
                for client in names:
                    if client == "raw" and case != "ingest":
                        continue  # it measures nothing; only the ingest ceiling needs it
                    procs = server_procs(a.server_procs, paced=case != "ingest")
                    try:
                        row = one_case(clients, client, w, ttft, itl, procs)
                    except ClientFailed as e:  # a peer's crash is a result, not the benchmark's end
                        print(f"{case:>7} {client:>10} FAILED: {e}", flush=True)
                        peer_failures.append(f"{case} {client}: {e}")
                        continue
                    row["case"] = case
                    row["rep"] = rep
                    rows.append(row)
                    print_row(row)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    print_medians(rows)
    print_ingest_vs_sglang(rows)
    for failure in peer_failures:
        print(f"peer client FAILED (no figure from it in that row): {failure}", flush=True)
    failed = check_targets(rows)
    return 1 if failed and a.strict else 0


if __name__ == "__main__":
    sys.exit(main())
