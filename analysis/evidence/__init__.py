"""Evidence a server leaves behind, parsed: what the labs base their verdicts on.

- `prom`: Prometheus text (`/metrics` scrapes, a file of timed samples) -> samples by name, totals,
  peaks, counter deltas, gauge time series;
- `startup`: a server log's start-up lines (both engines, every known form) -> KV capacity in tokens,
  the line it came from, KV dtype and FP8 platform notes;
- `events`: a server log's run-time lines -> retraction / preemption lines, KV usage printed in batch
  and stats lines, cache flush lines;
- `requests`: a loadgen result (`quickmap.loadgen/1`) -> per-request cached tokens, SGLang `spec_*`
  fields, n-gram acceptance from either engine;
- `honesty`: enginesim's own evidence (`/server_info` -> `enginesim`, its shutdown line) -> the
  emulator's realtime verdict: ok / degraded / saturated.

Every function here is pure (text or parsed objects in, values out) except the small `read_*`
helpers, so each rule is unit-tested on real engine output.
"""
