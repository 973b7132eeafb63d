"""The disaggregation flags of both engines, as their sources spell them (enginesim/README.md cites
the files), plus the emulator's link knobs. disagg.py gives them their behaviour.

SGLang (`python/sglang/srt/server_args.py`): `--disaggregation-mode {null,prefill,decode}` (default
null), `--disaggregation-transfer-backend` (default mooncake), `--disaggregation-bootstrap-port`
(default 8998), `--disaggregation-ib-device`. vLLM (`vllm/config/kv_transfer.py`): `--kv-transfer-config`
a JSON KVTransferConfig; `kv_role` one of kv_producer / kv_consumer / kv_both, required with a connector.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

DISAGG_MODES = ["null", "prefill", "decode"]
TRANSFER_BACKENDS = ["mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp"]
KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
KV_CONFIG_KEYS = frozenset(
    {
        "kv_connector",
        "engine_id",
        "kv_buffer_device",
        "kv_buffer_size",
        "kv_role",
        "kv_rank",
        "kv_parallel_size",
        "kv_ip",
        "kv_port",
        "kv_connector_extra_config",
        "kv_connector_module_path",
        "kv_load_failure_policy",
    }
)


def _port(v: str) -> int:
    try:
        x = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {v!r}") from None
    if not 0 < x < 65536:
        raise argparse.ArgumentTypeError(f"{x} must be a TCP port (1-65535)")
    return x


def kv_transfer_config(text: str) -> dict[str, Any]:
    """argparse type of `--kv-transfer-config`: a JSON object with KVTransferConfig's fields only."""
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise argparse.ArgumentTypeError(f"{text!r} must be a JSON object")
    unknown = sorted(set(obj) - KV_CONFIG_KEYS)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown KVTransferConfig field {unknown[0]!r}")
    role = obj.get("kv_role")
    if role is not None and role not in KV_ROLES:
        raise argparse.ArgumentTypeError(f"Unsupported kv_role: {role}. Supported roles are {KV_ROLES}")
    if obj.get("kv_connector") is not None and role is None:
        raise argparse.ArgumentTypeError(
            f"Please specify kv_role when kv_connector is set, supported roles are {KV_ROLES}"
        )
    return obj


def _link(a: Any) -> None:
    a("--sim-kv-link-gbps", type=float, default=None, help="emulated KV link bandwidth, GB/s (default 25)")
    a("--sim-kv-transfer-fixed-ms", type=float, default=None, help="fixed cost per KV transfer (default 2)")


def add_sglang(a: Any) -> None:
    a("--disaggregation-mode", choices=DISAGG_MODES, default="null")
    a("--disaggregation-transfer-backend", choices=TRANSFER_BACKENDS, default="mooncake")
    a("--disaggregation-bootstrap-port", type=_port, default=8998)
    a("--disaggregation-ib-device")
    _link(a)


def add_vllm(a: Any) -> None:
    a("--kv-transfer-config", type=kv_transfer_config)
    _link(a)
