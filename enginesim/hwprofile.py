"""Hardware-profile files: the schema `python -m enginesim.calibrate` writes and enginesim loads.

Why a file format of its own: a measured profile travels from a GPU node to wherever enginesim runs,
so it must say what it was measured on (a CPU figure must never pass for a GPU one) and be checked
field by field before an emulated engine starts. Standard library only: the emulator never needs torch.
"""

from __future__ import annotations

import json
import math
from typing import Any

SCHEMA = "enginesim.hardware-profile/1"
DEVICES = ("cuda", "cpu")

# Field -> (rule text, check). Every field the cost model and capacity read must be here.
_POSITIVE = ("peak_flops", "mem_bw", "mem_bytes", "intra_node_bw", "inter_node_bw")
_EFFICIENCIES = ("eff_compute", "eff_memory", "eff_network")
# The largest efficiency accepted: a measurement may beat a datasheet a little (boost clocks), never 2x.
MAX_EFFICIENCY = 1.5
OVERHEAD_KEYS = (
    "kernel_launch",
    "kernels_per_layer",
    "graph_replay",
    "allreduce_latency_intra",
    "allreduce_latency_inter",
)


class ProfileError(ValueError):
    """A profile file that cannot be used; the message names the file, the field, the value and the rule."""


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def validate(doc: Any, where: str = "profile") -> dict[str, Any]:
    """Check a whole profile document; return its `profile` object (the Hardware fields) unchanged."""

    def bad(field: str, value: Any, rule: str) -> ProfileError:
        return ProfileError(f"{where}: {field}={value!r}: must be {rule}")

    if not isinstance(doc, dict):
        raise bad("(document)", type(doc).__name__, "a JSON object")
    if doc.get("schema") != SCHEMA:
        raise bad("schema", doc.get("schema"), repr(SCHEMA))
    if doc.get("device") not in DEVICES:
        raise bad("device", doc.get("device"), f"one of {', '.join(DEVICES)}")
    prof = doc.get("profile")
    if not isinstance(prof, dict):
        raise bad("profile", prof, "a JSON object of hardware fields")
    key = prof.get("key")
    if not isinstance(key, str) or not key:
        raise bad("profile.key", key, "a non-empty string")
    if not isinstance(prof.get("name"), str) or not prof["name"]:
        raise bad("profile.name", prof.get("name"), "a non-empty string")
    for f in _POSITIVE:
        if not _number(prof.get(f)) or prof[f] <= 0:
            raise bad(f"profile.{f}", prof.get(f), "a finite number > 0")
    for f in _EFFICIENCIES:
        if not _number(prof.get(f)) or not 0 < prof[f] <= MAX_EFFICIENCY:
            raise bad(f"profile.{f}", prof.get(f), f"a number in (0, {MAX_EFFICIENCY}]")
    gpn = prof.get("gpus_per_node")
    if not isinstance(gpn, int) or isinstance(gpn, bool) or gpn < 1:
        raise bad("profile.gpus_per_node", gpn, "an integer >= 1")
    ov = prof.get("overheads_s")
    if not isinstance(ov, dict):
        raise bad("profile.overheads_s", ov, "a JSON object of seconds")
    for f in OVERHEAD_KEYS:
        if not _number(ov.get(f)) or ov[f] < 0:
            raise bad(f"profile.overheads_s.{f}", ov.get(f), "a finite number >= 0")
    for f, v in ov.items():
        if not _number(v) or v < 0:
            raise bad(f"profile.overheads_s.{f}", v, "a finite number >= 0")
    return prof


def read(path: str, allow_cpu: bool = False) -> dict[str, Any]:
    """The `profile` object of the file at `path`, ready to stand in for a hardware.json entry.

    A profile measured on a CPU (device=cpu: tiny shapes, no GPU) is refused unless `allow_cpu`: its
    figures describe no GPU, and an emulator priced by them would print them as if they did.
    """
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise ProfileError(f"{path}: cannot read the hardware profile ({e.strerror or e})") from e
    except ValueError as e:
        raise ProfileError(f"{path}: not a JSON document ({e})") from e
    prof = validate(doc, where=path)
    if doc["device"] == "cpu" and not allow_cpu:
        raise ProfileError(
            f"{path}: device='cpu': this profile was measured on a CPU with tiny shapes, not on a GPU; "
            "it is refused as a GPU profile (set --sim-allow-cpu-profile / ENGINESIM_ALLOW_CPU_PROFILE=1 "
            "to use it anyway, e.g. in tests)"
        )
    return dict(prof)
