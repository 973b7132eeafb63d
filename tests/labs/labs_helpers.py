"""Helpers of the labs tests: the role's default lab configuration as `analysis labs plan` receives it."""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import jinja2
import yaml

REPO = Path(__file__).resolve().parents[2]
DEFAULTS = yaml.safe_load((REPO / "roles" / "labs" / "defaults" / "main.yml").read_text())
LABS_VARS = yaml.safe_load((REPO / "playbooks" / "vars" / "labs.yml").read_text())


def rendered(obj, context: dict | None = None):
    """A defaults value with its Jinja strings rendered against the role's defaults, as Ansible would
    (a string that renders to a list or mapping becomes one)."""
    ctx = DEFAULTS if context is None else context
    if isinstance(obj, dict):
        return {k: rendered(v, ctx) for k, v in obj.items()}
    if isinstance(obj, list):
        return [rendered(v, ctx) for v in obj]
    if isinstance(obj, str) and ("{{" in obj or "{%" in obj):
        text = jinja2.Environment(extensions=["jinja2.ext.do"]).from_string(obj).render(**ctx)
        try:
            return ast.literal_eval(text.strip())
        except (ValueError, SyntaxError):
            return text
    return obj


def config(lab: str, engine: str = "sglang", **over) -> dict:
    """What roles/labs/templates/plan_config.j2 renders, from the role's defaults."""
    cfg = {
        "lab": lab,
        "engine": engine,
        "node_lab_dir": f"/runs/r1/labs/{lab}",
        "definition": rendered(copy.deepcopy(DEFAULTS["labs_definitions"][lab][engine])),
        "workload": rendered(copy.deepcopy(DEFAULTS["labs_workloads"][lab])),
        "client": {
            "python": "/usr/bin/python3",
            "pyz": "/runs/r1/bin/loadgen.pyz",
            "backend": engine,
            "base_url": "http://127.0.0.1:30000",
            "model": "m",
            "tokenizer": "server",
            "extra_args": [],
        },
        "seed": 1,
        "sample_interval_s": 0.25,
        "thresholds": DEFAULTS["labs_thresholds"],
    }
    if lab == "pd_disagg":  # plan_config.j2 adds where each variant's client goes
        ports = DEFAULTS["labs_pd_ports"]
        cfg["pd"] = {
            "router_url": f"http://127.0.0.1:{ports['router']}",
            "baseline_url": "http://127.0.0.1:30000",
            "prefill_port": ports["prefill"],
            "decode_port": ports["decode"],
        }
    cfg.update(over)
    return cfg
