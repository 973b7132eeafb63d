"""Statistics of what truthserver really sent, from its truth log (one JSON line per request).

Definitions (the same as loadgen's, measured at the server instead of the client):
  TTFT  = first event's send time - the request's arrival (fully received)
  ITL   = every gap between consecutive events of a request, pooled over requests (one per event)
  E2E   = last event's send time - arrival
  lag   = an event's send time - its due time (arrival + TTFT + j x ITL): how far the server itself
          was behind its schedule (a loaded box, or a client that did not read)
  output tok/s = tokens of the counted requests / (last event sent - first request arrived)
Percentiles use linear interpolation (numpy's default).

    python -m benchmarks.truthserver.truth truth.jsonl [--skip-first N]
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np


def stats(values: list[float] | np.ndarray) -> dict:
    a = np.asarray(values, dtype=float)
    if not len(a):
        return {"n": 0}
    return {
        "n": len(a),
        "mean": float(a.mean()),
        "p50": float(np.percentile(a, 50)),
        "p90": float(np.percentile(a, 90)),
        "p99": float(np.percentile(a, 99)),
        "min": float(a.min()),
        "max": float(a.max()),
    }


def load(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def max_active(recs: list[dict]) -> int:
    """Most requests in flight at once at the server: a sweep over [arrival, last byte written)."""
    points = []
    for r in recs:
        points.append((r["arrival_ns"], 1))
        points.append((r["arrival_ns"] + r["done_us"] * 1000, -1))
    points.sort()
    best = cur = 0
    for _, d in points:
        cur += d
        best = max(best, cur)
    return best


def analyze(path: str, skip_first: int = 0, min_events: int = 2) -> dict:
    """Truth statistics of the streamed requests in ``path``.

    ``skip_first`` drops the first N streamed requests by arrival (a client's warm-up); requests with
    fewer than ``min_events`` events are dropped too (pool warm-ups and probes), as are aborted ones
    (counted apart).
    """
    recs = sorted(load(path), key=lambda r: r["arrival_ns"])
    streamed = [r for r in recs if r.get("stream") and not r.get("aborted")]
    kept = [r for r in streamed[skip_first:] if len(r["t_us"]) >= min_events]
    ttft, itl, e2e, lag = [], [], [], []
    tokens = backlog = 0
    first_arrival = last_send = None
    for r in kept:
        t = np.asarray(r["t_us"], dtype=float) / 1e3
        ttft.append(t[0])
        e2e.append(t[-1])
        itl.append(np.diff(t))
        due = (r["ttft_us"] + r["itl_us"] * np.arange(len(t))) / 1e3
        lag.append(t - due)
        tokens += r["n"]
        backlog += r.get("backlog", 0)
        a = r["arrival_ns"]
        end = a + r["t_us"][-1] * 1000
        first_arrival = a if first_arrival is None else min(first_arrival, a)
        last_send = end if last_send is None else max(last_send, end)
    span_s = (last_send - first_arrival) / 1e9 if kept else 0.0
    events = sum(len(r["t_us"]) for r in kept)
    return {
        "file": path,
        "records": len(recs),
        "requests": len(kept),
        "skipped": len(streamed) - len(kept),
        "aborted": sum(1 for r in recs if r.get("aborted")),
        "events": events,
        "output_tokens": tokens,
        "span_s": span_s,
        "output_tok_s": tokens / span_s if span_s > 0 else float("nan"),
        "ttft_ms": stats(ttft),
        "itl_ms": stats(np.concatenate(itl) if itl else []),
        "e2e_ms": stats(e2e),
        "lag_ms": stats(np.concatenate(lag) if lag else []),
        "backlogged_events": backlog,
        "max_active": max_active(kept),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log")
    ap.add_argument("--skip-first", type=int, default=0)
    a = ap.parse_args(argv)
    print(json.dumps(analyze(a.log, a.skip_first), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
