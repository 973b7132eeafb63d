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

from . import catalog, engine_versions, hwprofile, quantization


@dataclass
class SimKnobs:
    """Emulator-only knobs (ENGINESIM_* env or --sim-* flags; the flag wins)."""

    time_scale: float = 1.0
    auto_scale: bool = False  # "auto": each case's scale is chosen by POST /enginesim/pace
    pace_max_case_s: float | None = None  # auto: no case's chosen scale makes it longer than this
    hardware: str = "h200"
    hw_override: dict[str, Any] = field(default_factory=dict)
    hardware_file: str | None = None
    ib_dir: str = "/sys/class/infiniband"
    crash_after: int | None = None
    oom_at_start: bool = False
    start_delay_s: float = 0.0
    hang_after: int | None = None
    seed: int = 0
    scheduler_process: bool = False  # the engine runs in a child process titled like the engine's scheduler


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


def add_sim_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("enginesim (emulator-only knobs; env ENGINESIM_* is the fallback)")
    # Read before the parser is built (engine_versions.selected); here so --help lists it.
    g.add_argument(engine_versions.FLAG, default=None, help="the engine version emulated")
    g.add_argument("--sim-print-version", action="store_true", help="print the emulated version and exit")
    g.add_argument("--sim-time-scale", type=_scale, default=None, help="wall s per emulated s, or auto")
    g.add_argument("--sim-pace-max-case-s", type=float, default=None)
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
    g.add_argument(
        "--sim-scheduler-process",
        action="store_true",
        default=None,
        help="run the scheduler in a child process (sglang::scheduler_TP0 / VLLM::EngineCore)",
    )


AUTO_INITIAL_SCALE = 1.0  # the scale of an `auto` server until its first /enginesim/pace


def _scale(v: str) -> float:
    """A time scale: a number, or `auto` (returned as -1.0)."""
    if v.strip().lower() == "auto":
        return -1.0
    try:
        x = float(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number > 0 or 'auto', got {v!r}") from None
    if not x > 0 or x != x or x == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number > 0 or 'auto', got {v!r}")
    return x


def _bool_str(v: str) -> bool:
    return v.lower() in ("1", "true", "yes", "on")


def sim_knobs(ns: argparse.Namespace, env: dict[str, str], err: Any) -> SimKnobs:
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
    v = pick(ns.sim_time_scale, "ENGINESIM_TIME_SCALE", _scale_env, "a number > 0 or auto", lambda x: True)
    if v is not None and v < 0:
        k.auto_scale = True
        k.time_scale = AUTO_INITIAL_SCALE
    elif v is not None:
        k.time_scale = v
    k.pace_max_case_s = pick(
        ns.sim_pace_max_case_s, "ENGINESIM_PACE_MAX_CASE_S", float, "a number > 0", lambda x: x > 0
    )
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
    v = pick(ns.sim_scheduler_process, "ENGINESIM_SCHEDULER_PROCESS", _bool_str, "0 or 1", lambda x: True)
    k.scheduler_process = bool(v)
    return k


def _scale_env(v: str) -> float:
    try:
        return _scale(v)
    except argparse.ArgumentTypeError:
        raise ValueError(v) from None


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


def positive(name: str) -> Any:
    def conv(s: str) -> int:
        v = int(s)
        if v <= 0:
            raise ValueError(f"{name} must be > 0")
        return v

    conv.__name__ = "positive int"
    return conv


def kv_bytes(dtype: str, model_bytes: int) -> int:
    if dtype.startswith("fp8"):
        return 1
    if dtype == "fp4_e2m1":
        return 1  # packed fp4 + scales; the emulator rounds to one byte
    return 2 if model_bytes <= 2 else model_bytes


def parse(argv: list[str], env: dict[str, str] | None = None) -> Config:
    """`argv` after `python -m enginesim`: `sglang ...` or `vllm serve MODEL ...`. Exits 2 on bad input."""
    from . import flavours  # the engines' modules build on this one

    env = dict(os.environ if env is None else env)
    top = argparse.ArgumentParser(prog="python -m enginesim", add_help=True)
    flavour = flavours.for_argv(argv)
    if flavour is None:
        top.print_usage(sys.stderr)
        top.exit(
            2,
            "python -m enginesim: error: first argument must be "
            + " or ".join(repr(f.argv_head[0]) for f in flavours.FLAVOURS.values())
            + f" (got {argv[0] if argv else 'nothing'!r})\n",
        )
    if tuple(argv[: len(flavour.argv_head)]) != flavour.argv_head:
        form = " ".join(flavour.argv_head)
        top.exit(2, f"python -m enginesim: error: the {flavour.title} form is `{form} <model> [flags]`\n")
    try:
        version = engine_versions.selected(flavour.argv_head[0], argv, env)
    except ValueError as e:
        top.exit(2, f"python -m enginesim: error: {e}\n")
    if "--sim-print-version" in argv[1:]:
        print(version)
        sys.exit(0)
    return flavour.parse(argv, env, version)


def check_model(p: argparse.ArgumentParser, flag: str, value: str) -> catalog.ModelSpec:
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


def check_dist(p: argparse.ArgumentParser, nnodes: int, rank: int, addr: str | None, flag: str) -> None:
    if not 0 <= rank < nnodes:
        p.error(f"argument --node-rank: {rank} must be in [0, --nnodes={nnodes})")
    if nnodes > 1:
        if not addr:
            p.error(f"argument {flag}: required when --nnodes > 1")
        host, _, port = addr.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            p.error(f"argument {flag}: {addr!r} must be HOST:PORT")
