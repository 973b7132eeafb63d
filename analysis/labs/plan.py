"""A lab's plan: its server variants, the loadgen runs every variant gets, and the comparisons.

Why one place: the role loops over what this module writes (plan.json), so the variants' flags, the
runs' client commands and the comparisons are derived once, validated before anything starts, and
kept with the results. Rules enforced here (each failure names the value and the rule):
- names that become directories are plain (letters, digits, `_`), flags are lists of strings;
- one independent variable per comparison: the two variants' flags differ in exactly one flag name
  (or exactly the `flags` the comparison declares as one variable, e.g. two flags that each turn
  one kind of CUDA graph off), and their engine settings are equal; the difference is recorded;
- every variant gets the same runs (same prompts, seeds and sizes), so nothing else differs.
"""

from __future__ import annotations

import random
import re
import time
from pathlib import Path
from typing import Any

import orjson

from analysis.atomic import write_bytes, write_json
from analysis.errors import InputError
from analysis.labs import pd_disagg_plan, quant_plan, sched_profile_plan, tp_plan
from analysis.labs.client_args import random_dataset
from analysis.labs.definitions import GOALS, LABS

PLAN_SCHEMA = "quickmap.labs.plan/1"
_NAME = re.compile(r"[a-z0-9][a-z0-9_]{0,63}")
# A variant's own checkpoint (quant_matrix): a hub name or an absolute path, no spaces or shell words.
_MODEL = re.compile(r"[A-Za-z0-9_./-][A-Za-z0-9_.:/+-]{0,255}")
# Engine settings a variant may set besides flags (rendered by roles/engine's templates).
ENGINE_VARS = (
    "engine_context_length",
    "engine_max_running_requests",
    "engine_mem_fraction_static",
    "engine_cuda_graph_max_bs",
    "engine_tp_size",
)
# Token ids for generated prompts: ordinary tokens in every common vocabulary (as loadgen's default).
ID_RANGE = (1000, 30000)


def _fail(where: str, rule: str) -> InputError:
    return InputError(None, where, rule)


def _pos_int(v: Any, where: str, allow_zero: bool = False) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < (0 if allow_zero else 1):
        raise _fail(where, f"got {v!r}, expected an integer >= {0 if allow_zero else 1}")
    return v


def _pos_num(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
        raise _fail(where, f"got {v!r}, expected a number > 0")
    return float(v)


def _name(v: Any, where: str) -> str:
    if not isinstance(v, str) or not _NAME.fullmatch(v):
        raise _fail(
            where, f"got {v!r}, expected a name of lower-case letters, digits and '_' (it names a directory)"
        )
    return v


def _args(v: Any, where: str) -> list[str]:
    if not isinstance(v, list) or not all(
        isinstance(a, str | int | float) and not isinstance(a, bool) for a in v
    ):
        raise _fail(where, f"got {v!r}, expected a list of flag words")
    return [str(a) for a in v]


def flag_values(args: list[str]) -> dict[str, list[str]]:
    """Flag name -> the words after it up to the next flag ("--x=1" counts as --x with value 1)."""
    out: dict[str, list[str]] = {}
    current: str | None = None
    for word in args:
        if word.startswith("-") and not _is_number(word):
            name, eq, value = word.partition("=")
            current = name
            out.setdefault(name, [])
            if eq:
                out[name].append(value)
        elif current is not None:
            out[current].append(word)
        else:
            out.setdefault("", []).append(word)
    return out


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def differing_flags(a: list[str], b: list[str]) -> dict[str, dict[str, list[str] | None]]:
    """Flags whose presence or value differs: name -> {"baseline": words|None, "treatment": words|None}."""
    fa, fb = flag_values(a), flag_values(b)
    out = {}
    for name in sorted(set(fa) | set(fb)):
        if fa.get(name) != fb.get(name):
            out[name] = {"baseline": fa.get(name), "treatment": fb.get(name)}
    return out


def validate_definition(lab: str, engine: str, definition: Any) -> dict[str, Any]:
    """The variants and comparisons of one lab for one engine, checked."""
    where = f"labs_definitions.{lab}.{engine}"
    if not isinstance(definition, dict):
        raise _fail(where, f"got {definition!r}, expected a mapping with variants (and comparisons)")
    common = _args(definition.get("common_args", []), f"{where}.common_args")
    raw = definition.get("variants")
    if not isinstance(raw, list) or not raw:
        raise _fail(f"{where}.variants", "expected a non-empty list of {name, args}")
    variants = []
    seen: set[str] = set()
    for i, v in enumerate(raw):
        w = f"{where}.variants[{i}]"
        if not isinstance(v, dict):
            raise _fail(w, f"got {v!r}, expected a mapping with name and args")
        name = _name(v.get("name"), f"{w}.name")
        if name in seen:
            raise _fail(f"{w}.name", f"{name!r} appears twice (rule: variant names are unique)")
        seen.add(name)
        engine_vars = v.get("engine", {}) or {}
        if not isinstance(engine_vars, dict) or not set(engine_vars) <= set(ENGINE_VARS):
            raise _fail(f"{w}.engine", f"got {engine_vars!r}, expected keys among {', '.join(ENGINE_VARS)}")
        for key, value in engine_vars.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise _fail(f"{w}.engine.{key}", f"got {value!r}, expected a number >= 0")
        model = v.get("model")
        if model is not None and (not isinstance(model, str) or not _MODEL.fullmatch(model) or ".." in model):
            raise _fail(
                f"{w}.model",
                f"got {model!r}, expected a checkpoint name or absolute path "
                "(letters, digits, . _ - / : +; no '..')",
            )
        # pd_disagg: the variant is a prefill/decode/router trio (roles/pd_launch), not one server
        pd = v.get("pd", False)
        if not isinstance(pd, bool):
            raise _fail(f"{w}.pd", f"got {pd!r}, expected true or false")
        variants.append(
            {
                "name": name,
                "args": common + _args(v.get("args", []), f"{w}.args"),
                "variant_args": _args(v.get("args", []), f"{w}.args"),
                "engine_vars": engine_vars,
            }
            | ({"model": model} if model else {})
            | ({"pd": True} if pd else {})
        )
    by_name = {v["name"]: v for v in variants}
    comparisons = []
    for i, c in enumerate(definition.get("comparisons", []) or []):
        w = f"{where}.comparisons[{i}]"
        if not isinstance(c, dict):
            raise _fail(w, f"got {c!r}, expected {{baseline, treatment[, flags, expect]}}")
        a, b = c.get("baseline"), c.get("treatment")
        if a not in by_name or b not in by_name or a == b:
            raise _fail(
                w, f"baseline={a!r} treatment={b!r}: expected two different variants of {sorted(by_name)}"
            )
        va, vb = by_name[a], by_name[b]
        engine_diff = {
            k: {side: None if x is None else [str(x)] for side, x in (("baseline", ea), ("treatment", eb))}
            for k in sorted(set(va["engine_vars"]) | set(vb["engine_vars"]))
            if (ea := va["engine_vars"].get(k)) != (eb := vb["engine_vars"].get(k))
        }
        # an engine setting may be part of a declared variable (TP=n vs n data-parallel replicas at TP=1)
        if engine_diff and not set(engine_diff) <= set(c.get("flags") or []):
            raise _fail(
                w,
                f"{a} and {b} differ in engine settings {va['engine_vars']} vs {vb['engine_vars']} "
                "(rule: one independent variable per comparison, and it is a flag)",
            )
        diff = differing_flags(va["args"], vb["args"]) | engine_diff
        if va.get("model") != vb.get("model"):
            # the checkpoint is part of the variable (one checkpoint per weight format)
            diff["model"] = {"baseline": va.get("model"), "treatment": vb.get("model")}
        if va.get("pd", False) != vb.get("pd", False):
            # disaggregated vs one instance: part of the variable (with the GPU split it implies)
            diff["pd"] = {"baseline": [str(va.get("pd", False))], "treatment": [str(vb.get("pd", False))]}
        declared = c.get("flags")
        if declared is not None:
            declared = _args(declared, f"{w}.flags")
            if set(diff) != set(declared):
                raise _fail(
                    w,
                    f"{a} vs {b} differ in {sorted(diff)}, not in the declared variable {sorted(declared)} "
                    "(rule: one independent variable per comparison)",
                )
        elif len(diff) != 1:
            raise _fail(
                w,
                f"{a} vs {b} differ in {sorted(diff) or 'nothing'} (rule: exactly one flag differs; "
                "declare `flags` when one variable takes several flags)",
            )
        expect = c.get("expect", "lower")
        if expect not in ("higher", "lower"):
            raise _fail(
                f"{w}.expect", f"got {expect!r}, expected higher or lower (how the treatment's figure moves)"
            )
        comparisons.append(
            {
                "baseline": a,
                "treatment": b,
                "differs": diff,
                "expect": expect,
                "variable": c.get("variable") or ", ".join(sorted(diff)),
            }
        )
    return {"variants": variants, "comparisons": comparisons, "common_args": common}


class _Runs:
    """Collects the runs of one lab (identical for every variant) and the datasets they read."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.client = cfg["client"]
        self.runs: list[dict[str, Any]] = []
        self.datasets: dict[str, list[dict[str, Any]]] = {}
        self.rng = random.Random(cfg.get("seed", 1))
        self.seed = int(cfg.get("seed", 1))

    def ids(self, n: int) -> list[int]:
        return [self.rng.randrange(*ID_RANGE) for _ in range(n)]

    def dataset(self, name: str, lines: list[dict[str, Any]]) -> str:
        self.datasets[name] = lines
        return f"{self.cfg['node_lab_dir']}/datasets/{name}.jsonl"

    def add(
        self,
        name: str,
        workload: dict[str, Any],
        data: list[str],
        *,
        flush: bool = True,
        sample: bool = False,
        phase: int = 1,
        rate_from: str | None = None,
        request_rate: str = "inf",
        extra: list[str] | None = None,
        expect_output_len: int | None = None,
        profile: bool = False,
        pyspy: bool = False,
    ) -> None:
        c = self.client
        argv = [
            c["python"],
            c["pyz"],
            "--backend",
            c["backend"],
            "--base-url",
            c["base_url"],
            "--model",
            c["model"],
            "--tokenizer",
            c["tokenizer"],
            *data,
            "--num-prompts",
            str(workload["num_prompts"]),
            "--max-concurrency",
            str(workload["concurrency"]),
            "--warmup-requests",
            str(workload.get("warmup", 0)),
            "--seed",
            str(self.seed + len(self.runs)),
            "--output-file",
            "bench.json",
            "--phase-file",
            "phase.json",
            "--output-details",
            "--scrape-metrics",
            *(extra or []),
        ]
        if rate_from is None:
            argv += ["--request-rate", request_rate]
        if flush:
            argv.append("--flush-cache")
        argv += [str(a) for a in c.get("extra_args", [])]
        self.runs.append(
            {
                "name": name,
                "argv": argv,
                "workload": workload,
                "expect_requests": workload["num_prompts"],
                "expect_output_len": expect_output_len
                if expect_output_len is not None
                else workload.get("osl", 1),
                "flush": flush,
                "sample_metrics": sample,
                "phase": phase,
                "rate_from": rate_from,
                "profile": profile,
                "pyspy": pyspy,
            }
        )


def _jsonl(path: str) -> list[str]:
    return ["--dataset-name", "jsonl", "--dataset-path", path]


def _sizes(w: dict[str, Any], where: str, *keys: str) -> None:
    for k in keys:
        _pos_int(w.get(k), f"{where}.{k}")


def _plan_sweep(r: _Runs, w: dict[str, Any], where: str) -> None:
    _sizes(w, where, "isl", "osl", "num_prompts")
    _pos_int(w.get("warmup", 0), f"{where}.warmup", allow_zero=True)
    cs = w.get("concurrencies")
    if not isinstance(cs, list) or not cs:
        raise _fail(f"{where}.concurrencies", f"got {cs!r}, expected a non-empty list of integers >= 1")
    for c in cs:
        _pos_int(c, f"{where}.concurrencies")
        wl = {
            "isl": w["isl"],
            "osl": w["osl"],
            "concurrency": c,
            "num_prompts": w["num_prompts"],
            "warmup": w.get("warmup", 0),
        }
        r.add(f"c{c}", wl, random_dataset(w["isl"], w["osl"]))


def _plan_prefill(r: _Runs, w: dict[str, Any], where: str) -> None:
    _sizes(w, where, "osl", "num_prompts", "concurrency")
    isls = w.get("isls")
    if not isinstance(isls, list) or not isls:
        raise _fail(f"{where}.isls", f"got {isls!r}, expected a non-empty list of integers >= 1")
    for isl in isls:
        _pos_int(isl, f"{where}.isls")
        wl = {
            "isl": isl,
            "osl": w["osl"],
            "concurrency": w["concurrency"],
            "num_prompts": w["num_prompts"],
            "warmup": w.get("warmup", 0),
        }
        r.add(f"isl{isl}", wl, random_dataset(isl, w["osl"]))


def _plan_prefix(r: _Runs, w: dict[str, Any], where: str) -> None:
    _sizes(
        w,
        where,
        "identical_len",
        "identical_osl",
        "chat_system_len",
        "chat_question_len",
        "chat_osl",
        "chat_measured",
    )
    ident = r.dataset("identical", [{"prompt": r.ids(w["identical_len"]), "output_len": w["identical_osl"]}])
    one = {
        "isl": w["identical_len"],
        "osl": w["identical_osl"],
        "concurrency": 1,
        "num_prompts": 1,
        "warmup": 0,
    }
    r.add("identical_first", one, _jsonl(ident), flush=True)
    r.add("identical_second", one, _jsonl(ident), flush=False)
    system = r.ids(w["chat_system_len"])
    warm = r.dataset(
        "chat_warm", [{"prompt": system + r.ids(w["chat_question_len"]), "output_len": w["chat_osl"]}]
    )
    measured = r.dataset(
        "chat",
        [
            {"prompt": system + r.ids(w["chat_question_len"]), "output_len": w["chat_osl"]}
            for _ in range(w["chat_measured"])
        ],
    )
    isl = w["chat_system_len"] + w["chat_question_len"]
    r.add(
        "chat_warm",
        {"isl": isl, "osl": w["chat_osl"], "concurrency": 1, "num_prompts": 1, "warmup": 0},
        _jsonl(warm),
        flush=True,
    )
    r.add(
        "chat",
        {"isl": isl, "osl": w["chat_osl"], "concurrency": 1, "num_prompts": w["chat_measured"], "warmup": 0},
        _jsonl(measured),
        flush=False,
    )


def _plan_chunk(r: _Runs, w: dict[str, Any], where: str) -> None:
    _sizes(
        w, where, "stream_isl", "stream_osl", "inject_isl", "inject_osl", "inject_after_events", "repetitions"
    )
    if w["inject_after_events"] >= w["stream_osl"] - 1:
        raise _fail(
            f"{where}.inject_after_events",
            f"got {w['inject_after_events']}, expected fewer than "
            f"stream_osl - 1 = {w['stream_osl'] - 1} (the stream must still run after the injection)",
        )
    stream = {"prompt": r.ids(w["stream_isl"]), "output_len": w["stream_osl"]}
    probe = r.dataset("stream", [stream])
    pair = r.dataset(
        "stream_and_injection", [stream, {"prompt": r.ids(w["inject_isl"]), "output_len": w["inject_osl"]}]
    )
    r.add(
        "probe",
        {
            "isl": w["stream_isl"],
            "osl": w["stream_osl"],
            "concurrency": 1,
            "num_prompts": 1,
            "warmup": w.get("warmup", 1),
        },
        _jsonl(probe),
    )
    for rep in range(1, w["repetitions"] + 1):
        r.add(
            f"rep{rep}",
            {
                "isl": w["stream_isl"],
                "osl": w["stream_osl"],
                "concurrency": 2,
                "num_prompts": 2,
                "warmup": 0,
                "inject_isl": w["inject_isl"],
                "inject_osl": w["inject_osl"],
                "inject_after_events": w["inject_after_events"],
            },
            _jsonl(pair),
            phase=2,
            rate_from="probe",
            extra=["--arrival", "constant"],
            expect_output_len=min(w["inject_osl"], w["stream_osl"]),
        )


def _plan_budget(r: _Runs, w: dict[str, Any], where: str) -> None:
    _sizes(w, where, "short_isl", "short_osl", "short_count", "long_isl", "long_osl", "repetitions")
    for rep in range(1, w["repetitions"] + 1):
        lines = [
            {"prompt": r.ids(w["short_isl"]), "output_len": w["short_osl"]} for _ in range(w["short_count"])
        ]
        lines.append({"prompt": r.ids(w["long_isl"]), "output_len": w["long_osl"]})
        path = r.dataset(f"together_rep{rep}", lines)
        n = w["short_count"] + 1
        r.add(
            f"rep{rep}",
            {
                "isl": w["short_isl"],
                "osl": w["short_osl"],
                "concurrency": n,
                "num_prompts": n,
                "warmup": w.get("warmup", 0) if rep == 1 else 0,
                "short_count": w["short_count"],
                "long_isl": w["long_isl"],
                "long_osl": w["long_osl"],
            },
            _jsonl(path),
            expect_output_len=min(w["short_osl"], w["long_osl"]),
        )


def _plan_kv(r: _Runs, w: dict[str, Any], where: str) -> None:
    steps = w.get("runs")
    if not isinstance(steps, list) or not steps:
        raise _fail(
            f"{where}.runs", f"got {steps!r}, expected a list of {{name, isl, osl, concurrency, num_prompts}}"
        )
    for i, s in enumerate(steps):
        ws = f"{where}.runs[{i}]"
        if not isinstance(s, dict):
            raise _fail(ws, f"got {s!r}, expected a mapping")
        _name(s.get("name"), f"{ws}.name")
        _sizes(s, ws, "isl", "osl", "concurrency", "num_prompts")
        ratio = s.get("range_ratio", 1.0)
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 < ratio <= 1:
            raise _fail(f"{ws}.range_ratio", f"got {ratio!r}, expected a number in (0, 1]")
        wl = {k: s[k] for k in ("isl", "osl", "concurrency", "num_prompts")} | {
            "warmup": 0,
            "range_ratio": ratio,
        }
        # loadgen draws input and output lengths from [int(L * ratio), L] (SGLang's semantics)
        r.add(
            s["name"],
            wl,
            random_dataset(s["isl"], s["osl"], ratio),
            sample=True,
            expect_output_len=max(int(s["osl"] * ratio), 1),
        )


def _plan_ngram(r: _Runs, w: dict[str, Any], where: str) -> None:
    _sizes(w, where, "osl", "samples", "repetitive_repeat")
    words = w.get("repetitive_words")
    if not isinstance(words, list) or not words or not all(isinstance(x, str) and x for x in words):
        raise _fail(f"{where}.repetitive_words", f"got {words!r}, expected a list of words")
    prose = w.get("prose")
    if not isinstance(prose, str) or len(prose.split()) < 20:
        raise _fail(f"{where}.prose", "expected an ordinary prose paragraph of at least 20 words")
    prompts = {"repetitive": " ".join(words * w["repetitive_repeat"]), "prose": prose.strip()}
    for kind, text in prompts.items():
        path = r.dataset(kind, [{"prompt": text, "output_len": w["osl"]}])
        for s in range(1, w["samples"] + 1):
            r.add(
                f"{kind}_s{s}",
                {
                    "osl": w["osl"],
                    "concurrency": 1,
                    "num_prompts": 1,
                    "warmup": 0,
                    "prompt": kind,
                    "prompt_words": len(text.split()),
                },
                _jsonl(path),
            )
    tp = w.get("throughput")
    engines = w.get("throughput_engines", ["vllm"])
    if tp and r.cfg["engine"] in engines:
        _sizes(tp, f"{where}.throughput", "isl", "osl", "num_prompts", "concurrency")
        r.add(
            "throughput",
            {k: tp[k] for k in ("isl", "osl", "concurrency", "num_prompts")} | {"warmup": 0},
            random_dataset(tp["isl"], tp["osl"]),
        )


_PLANNERS = {
    "eager_vs_graph": _plan_sweep,
    "decode_sweep": _plan_sweep,
    "prefill_sweep": _plan_prefill,
    "prefix_cache": _plan_prefix,
    "chunk_interference": _plan_chunk,
    "token_budget": _plan_budget,
    "kv_pressure": _plan_kv,
    "fp8_kv": None,
    "ngram_spec": _plan_ngram,
    "quant_matrix": quant_plan.plan,
    "tp_scaling": tp_plan.plan,
    "sched_profile": sched_profile_plan.plan,
    "pd_disagg": pd_disagg_plan.plan,
}


def build(cfg: dict[str, Any]) -> dict[str, Any]:
    """The plan of one lab on one engine (pure: the datasets come back in the plan, not on disk)."""
    lab, engine = cfg.get("lab"), cfg.get("engine")
    if lab not in LABS:
        raise _fail("lab", f"got {lab!r}, expected one of {', '.join(LABS)}")
    if engine not in ("sglang", "vllm"):
        raise _fail("engine", f"got {engine!r}, expected sglang or vllm")
    for key in ("python", "pyz", "backend", "base_url", "model", "tokenizer"):
        if not isinstance(cfg.get("client", {}).get(key), str) or not cfg["client"][key]:
            raise _fail(f"client.{key}", "expected a non-empty string")
    # a variant whose switch the engine's --help lacks is left out, and the plan says so
    gated, dropped = sched_profile_plan.gate(
        cfg.get("definition"), cfg.get("engine_flags"), f"labs_definitions.{lab}.{engine}"
    )
    definition = validate_definition(lab, engine, gated)
    workload = cfg.get("workload") or {}
    if not isinstance(workload, dict):
        raise _fail(f"labs_workloads.{lab}", f"got {workload!r}, expected a mapping")
    runs = _Runs(cfg)
    planner = _PLANNERS[lab]
    if planner is not None:
        planner(runs, workload, f"labs_workloads.{lab}")
    variants = [
        v | {"runs": [dict(run, rel=f"{v['name']}/runs/{run['name']}") for run in runs.runs]}
        for v in definition["variants"]
    ]
    if lab == "pd_disagg":
        variants = pd_disagg_plan.point_clients(variants, cfg.get("pd"), "pd", workload)
    return {
        "schema": PLAN_SCHEMA,
        "lab": lab,
        "engine": engine,
        "goal": GOALS[lab],
        "common_args": definition["common_args"],
        "variants": variants,
        "comparisons": definition["comparisons"],
        "dropped_variants": dropped,
        "workload": workload,
        "client": {k: v for k, v in cfg["client"].items() if k != "extra_args"},
        "thresholds": cfg.get("thresholds", {}),
        "sample_interval_s": _pos_num(cfg.get("sample_interval_s", 0.25), "sample_interval_s"),
        "datasets": {name: f"datasets/{name}.jsonl" for name in runs.datasets},
        "_dataset_lines": runs.datasets,
    }


def write(plan: dict[str, Any], lab_dir: str | Path) -> None:
    """plan.json (stamped with the time the lab started) and the datasets under LAB_DIR (atomic)."""
    lab_dir = Path(lab_dir)
    plan["planned_at_epoch_s"] = round(time.time(), 3)
    lines = plan.pop("_dataset_lines", {})
    for name, rows in lines.items():
        write_bytes(lab_dir / "datasets" / f"{name}.jsonl", b"".join(orjson.dumps(r) + b"\n" for r in rows))
    write_json(lab_dir / "plan.json", plan)
