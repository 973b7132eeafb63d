"""The runs of the pd_disagg lab, and where each variant's client is pointed.

Why: disaggregation pays a KV transfer per request to keep prefills off the decode instance, so
whether it wins depends on the prompt and output lengths; the lab runs every corner of
{short, long} prompts x {short, long} outputs, and a shared-prefix workload twice (prefix cache hit
and miss), against a baseline of one instance on the same GPUs. The P/D variant's client is sent to
the router, never to one instance (a result against the prefill port alone is not a P/D result);
the router cannot flush the instances' prefix caches, so the run script flushes both sides itself
(`flush_sides`) and the client does not.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from analysis.errors import InputError
from analysis.labs.client_args import random_dataset

# (run name, prompt length key, output length key): the four corners of the break-even grid
GRID = (
    ("short_in_short_out", "short_isl", "short_osl"),
    ("short_in_long_out", "short_isl", "long_osl"),
    ("long_in_short_out", "long_isl", "short_osl"),
    ("long_in_long_out", "long_isl", "long_osl"),
)
PREFIX_RUNS = ("prefix_miss", "prefix_warm", "prefix_hit")


def _int(w: dict[str, Any], key: str, where: str) -> int:
    v = w.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise InputError(None, f"{where}.{key}", f"got {v!r}, expected an integer >= 1")
    return v


def plan(r: Any, w: dict[str, Any], where: str) -> None:
    """The grid runs (random prompts), then the prefix runs (miss: flushed; hit: after a warm-up)."""
    keys = ("short_isl", "long_isl", "short_osl", "long_osl", "num_prompts", "concurrency")
    isl_s, isl_l, osl_s, osl_l, n, c = (_int(w, k, where) for k in keys)
    if not isl_s < isl_l:
        raise InputError(None, f"{where}.long_isl", f"got {isl_l}, expected more than short_isl {isl_s}")
    if not osl_s < osl_l:
        raise InputError(None, f"{where}.long_osl", f"got {osl_l}, expected more than short_osl {osl_s}")
    sizes = {"short_isl": isl_s, "long_isl": isl_l, "short_osl": osl_s, "long_osl": osl_l}
    for name, ik, ok in GRID:
        wl = {"isl": sizes[ik], "osl": sizes[ok], "concurrency": c, "num_prompts": n, "warmup": 0}
        r.add(name, wl, random_dataset(sizes[ik], sizes[ok]))
    plen, qlen, posl = (_int(w, k, where) for k in ("prefix_len", "question_len", "prefix_osl"))
    shared = r.ids(plen)
    hit = [{"prompt": shared + r.ids(qlen), "output_len": posl} for _ in range(n)]
    miss = [{"prompt": r.ids(plen) + r.ids(qlen), "output_len": posl} for _ in range(n)]
    warm = [{"prompt": shared + r.ids(qlen), "output_len": posl}]
    wl = {"isl": plen + qlen, "osl": posl, "concurrency": c, "num_prompts": n, "warmup": 0}
    jsonl = ["--dataset-name", "jsonl", "--dataset-path"]
    r.add("prefix_miss", wl | {"prefix": "miss"}, [*jsonl, r.dataset("prefix_miss", miss)])
    one = wl | {"concurrency": 1, "num_prompts": 1, "prefix": "warm"}
    r.add("prefix_warm", one, [*jsonl, r.dataset("prefix_warm", warm)])
    r.add("prefix_hit", wl | {"prefix": "hit"}, [*jsonl, r.dataset("prefix_hit", hit)], flush=False)


def _url(v: Any, where: str) -> str:
    if not isinstance(v, str) or urlsplit(v).scheme != "http" or urlsplit(v).port is None:
        raise InputError(None, where, f"got {v!r}, expected http://HOST:PORT")
    return v.rstrip("/")


def _fault(run: dict[str, Any], w: dict[str, Any], where: str) -> dict[str, Any] | None:
    """The fault run of the P/D variant: the long/long client with `fault_prompts` prompts, whose prefill
    instance is stopped `fault_after_s` into it (fault_prompts 0 = no fault run)."""
    n = w.get("fault_prompts", 0)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InputError(
            None, f"{where}.fault_prompts", f"got {n!r}, expected an integer >= 0 (0 = no fault run)"
        )
    if n == 0:
        return None
    after = w.get("fault_after_s")
    if isinstance(after, bool) or not isinstance(after, int | float) or not after > 0:
        raise InputError(None, f"{where}.fault_after_s", f"got {after!r}, expected seconds > 0")
    argv = list(run["argv"])
    argv[argv.index("--num-prompts") + 1] = str(n)
    return {
        "argv": argv,
        "after_s": float(after),
        "num_prompts": n,
        "workload": dict(run["workload"], num_prompts=n),
    }


def point_clients(
    variants: list[dict[str, Any]], pd: Any, where: str, workload: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Each variant's runs with --base-url set: the P/D variant's to the router, the baseline's to its
    own instance. The P/D variant's client does not flush (the router cannot); its run script flushes
    both instances instead (`flush_sides`). Neither variant's client counts tokens through the server (a
    router has no /tokenize): both send token-id prompts, so their client flags stay the same."""
    if not isinstance(pd, dict):
        raise InputError(None, where, f"got {pd!r}, expected {{router_url, baseline_url, prefill_port, ...}}")
    router, baseline = _url(pd.get("router_url"), f"{where}.router_url"), _url(pd.get("baseline_url"), where)
    port = urlsplit(router).port
    for side in ("prefill", "decode"):
        if port == pd.get(f"{side}_port"):
            raise InputError(
                None,
                "labs_pd_measure_url",
                f"got {router!r}: that is the {side} instance's port, not the router's; a result measured "
                "against one instance is not a P/D result and is refused",
            )
    out = []
    for v in variants:
        is_pd = bool(v.get("pd"))
        url = router if is_pd else baseline
        runs = []
        for run in v["runs"]:
            argv = list(run["argv"])
            argv[argv.index("--base-url") + 1] = url
            if "--tokenizer" in argv:  # the router has no /tokenize: both variants send token ids alike
                i = argv.index("--tokenizer")
                del argv[i : i + 2]
            extra = {}
            if is_pd:
                extra["flush_sides"] = "--flush-cache" in argv
                argv = [a for a in argv if a != "--flush-cache"]
            runs.append(dict(run, argv=argv, base_url=url, **extra))
        longest = next((r for r in runs if r["name"] == "long_in_long_out"), None)
        fault = _fault(longest, workload or {}, "labs_workloads.pd_disagg") if is_pd and longest else None
        out.append(dict(v, runs=runs) | ({"fault": fault} if fault else {}))
    return out
