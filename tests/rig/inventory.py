"""The rig inventory: inventory/dual's groups and variables, with the hosts pointed at the rig.

Layout written into <rig>/inventory/:
- hosts.yml      the same groups and host names as inventory/dual (read with ansible-inventory), with
                 the rig's addresses, root, the throwaway key and the rig's known_hosts;
- group_vars     a symlink to inventory/dual/group_vars (the site values, unchanged);
- host_vars/     the rig's overrides per host (host_vars beat group_vars): node dirs, device and IB
                 dirs, model dir, enginesim time scale, a small case subset, short timeouts.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:
    from .core import Rig

DUAL = Path(__file__).resolve().parents[2] / "inventory" / "dual"
# The small case subset the rig runs by default (ids from scenarios/quick_map.tsv); -e case_ids wins.
DEFAULT_CASES = os.environ.get("QM_RIG_CASES", "cold_prefill_4k,short_decode_c1")
# enginesim speed-up on the rig (0.02 = 50x faster than the modelled hardware).
# Slower than inventory/local's 0.02 on purpose: the A/B's background must still be decoding when the
# injection goes out after marker + delay + a few SSH round trips, and emulated time costs no CPU
# (a longer stream of tokens would, on a shared 2-core box).
TIME_SCALE = os.environ.get("QM_RIG_TIME_SCALE", "0.2")
# The model as the engine sees it (enginesim catalogue name) and its stand-in directory on each host.
# DeepSeek-V3: the kind of model served TP16/EP2 over two nodes, and its 160K context takes the A/B's
# 128K injection (Qwen3-0.6B's 40960 does not).
MODEL = "deepseek-ai/DeepSeek-V3"


def read_dual() -> dict:
    """inventory/dual/hosts.yml as YAML (a minimal head/workers tree when it is missing)."""
    path = DUAL / "hosts.yml"
    if path.exists():
        return yaml.safe_load(path.read_text())
    return {
        "all": {
            "children": {
                "nodes": {
                    "children": {
                        "head": {"hosts": {"head": {"engine_node_rank": 0}}},
                        "workers": {"hosts": {"worker": {"engine_node_rank": 1}}},
                    }
                }
            }
        }
    }


def role_names(tree: dict | None = None) -> dict[str, str]:
    """Map the rig roles to inventory/dual's host names: head = first host of group `head`, worker =
    first host of group `workers`."""
    found: dict[str, str] = {}

    def walk(name: str, body: dict | None) -> None:
        body = body or {}
        hosts = list((body.get("hosts") or {}).keys())
        if name == "head" and hosts:
            found.setdefault("head", hosts[0])
        if name == "workers" and hosts:
            found.setdefault("worker", hosts[0])
        for child, sub in (body.get("children") or {}).items():
            walk(child, sub)

    walk("all", (tree or read_dual()).get("all"))
    return {"head": found.get("head", "head"), "worker": found.get("worker", "worker")}


def rig_tree(body: dict | None, keep: set[str]) -> dict:
    """dual's group tree with its inline host vars, minus the connection vars the rig overrides."""
    body = body or {}
    out: dict = {}
    hosts = {h: v for h, v in (body.get("hosts") or {}).items() if h in keep}
    if hosts:
        out["hosts"] = {
            h: {k: val for k, val in (v or {}).items() if not k.startswith("ansible_")} or None
            for h, v in hosts.items()
        }
    if body.get("vars"):
        out["vars"] = body["vars"]
    kids = body.get("children") or {}
    if kids:
        out["children"] = {k: rig_tree(v, keep) for k, v in kids.items()}
    return out


def host_overrides(rig: Rig, role: str) -> dict:
    """The rig's per-host variables (everything else comes from inventory/dual's group_vars)."""
    host = rig.host(role)
    head = rig.host("head")
    model_dir = host.path / "models" / MODEL.split("/")[-1]
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "README").write_text("quickmap rig stand-in for the model directory\n")
    return {
        # --- connection: real SSH into the namespace, throwaway key, the rig's known_hosts
        "ansible_host": host.address,
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(rig.key_file),
        "ansible_ssh_common_args": (
            f"-o UserKnownHostsFile={rig.known_hosts} -o StrictHostKeyChecking=yes "
            "-o IdentitiesOnly=yes -o PreferredAuthentications=publickey"
        ),
        "ansible_python_interpreter": "/usr/bin/python3",
        "ansible_remote_tmp": str(host.path / "tmp"),
        # Absolute: sshd gives sessions the host's own HOME, but async_status expands `~root` from
        # passwd while async_wrapper expands $HOME; an explicit dir keeps both on the same file.
        "ansible_async_dir": str(host.path / "home" / ".ansible_async"),
        # --- where things live on this host (never shared with the other host or the controller)
        "quickmap_node_results_dir": str(host.work_dir),
        # The node's tarballs (run, calibration) go to the host's own tmp, not the machine-wide /tmp that
        # every rig host shares: two rigs at once (xdist workers, another checkout) run the same run ids.
        "collect_tmp_dir": str(host.path / "tmp"),
        "calibrate_tmp_dir": str(host.path / "tmp"),
        "quickmap_results_dir": str(rig.path / "controller" / "results"),
        # The client zipapp needs httpx: the node's python is the project venv on the rig.
        "quickmap_node_python": str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "python"),
        "engine_rdma_device_dir": str(host.devices_dir / "infiniband"),
        "engine_model_path": MODEL,
        "engine_model_host_path": str(model_dir),
        "engine_cache_host_dir": str(host.path / "models"),
        "engine_served_model_name": "",
        # enginesim knobs reach the rank as docker -e variables, like any engine environment.
        "rig_time_scale": "{{ time_scale | default('" + TIME_SCALE + "') }}",
        "engine_env": {"ENGINESIM_TIME_SCALE": "{{ rig_time_scale }}", "ENGINESIM_IB_DIR": str(host.ib_dir)},
        "engine_start_timeout_s": 90,
        # Token counts from the server's /tokenize (the rig has no tokenizer files; same as inventory/local).
        "bench_tokenizer": "server",
        "bench_timeout_s": 120,
        "mixed_injection_delay_s": 1,
        # The A/B's decode stream, shortened for the rig: 64 prompts at C=32 (2 waves, about 12 s of
        # background at the rig's time scale); no warm-up request (it would add a 1K decode per run).
        "mixed_decode": {"isl": 1024, "osl": 1024, "concurrency": 32, "num_prompts": 64, "warmup": 0},
        # At most 2 prompts per fixed case (recorded as the case's num_prompts): a rig run proves the
        # orchestration, not the numbers.
        "bench_num_prompts_cap": "{{ num_prompts_cap | default(2) }}",
        "preflight_min_free_disk_gb": 1,
        # --- a small plan by default; -e case_ids / -e repetitions still win (same aliases as dual)
        "quickmap_case_ids": "{{ case_ids | default('" + DEFAULT_CASES + "') }}",
        "quickmap_repetitions": "{{ repetitions | default(1) }}",
        "quickmap_inventory_name": "rig",
        "rig_head_address": head.address,
    }


def write_inventory(rig: Rig) -> Path:
    """Write <rig>/inventory (hosts.yml, group_vars -> dual, host_vars/*) and return its path."""
    inv = rig.inventory
    (inv / "host_vars").mkdir(parents=True, exist_ok=True)
    if (DUAL / "group_vars").exists():
        os.symlink(DUAL / "group_vars", inv / "group_vars")
    hosts_doc = {"all": rig_tree(read_dual().get("all"), {h.name for h in rig.hosts})}
    (inv / "hosts.yml").write_text(
        "# Generated by tests/rig: inventory/dual's groups, the rig's hosts (see host_vars/).\n"
        + yaml.safe_dump(hosts_doc, sort_keys=False)
    )
    for host in rig.hosts:
        (inv / "host_vars" / f"{host.name}.yml").write_text(
            f"# Generated by tests/rig for {host.role} ({host.ns}, {host.address}).\n"
            + yaml.safe_dump(host_overrides(rig, host.role), sort_keys=False)
        )
    return inv
