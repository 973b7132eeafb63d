"""Each lab variant's realtime verdict comes from its own runs' /metrics scrapes (issue 13, one judge).

One small lab (eager_vs_graph, C=1, 6 prompts) through its real command on enginesim: every run of
every variant is judged by module_utils/emulation_verdict.py from that run's metrics_before.prom /
metrics_after.prom, and the variant's verdict is those runs' combination, not the server life's
schedule lag (the fallback reader, used only for a run without scrapes).
"""

from __future__ import annotations

import json

import pytest
from labs_helpers import DEFAULTS
from test_labs_enginesim import fail_text, run_labs

from module_utils import emulation_verdict

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_each_variant_is_judged_from_its_own_runs_scrapes(tmp_path) -> None:
    w = json.loads(json.dumps(DEFAULTS["labs_workloads"]))
    w["eager_vs_graph"].update(concurrencies=[1], num_prompts=6, warmup=1)
    proc, labs_dir = run_labs(tmp_path, "sglang", "eager_vs_graph", "rt", labs_workloads=w)
    assert proc.returncode == 0, fail_text(proc)
    doc = json.loads((labs_dir / "eager_vs_graph" / "lab.json").read_text())
    for v in doc["setup"]["variants"]:
        detail = doc["evidence"][v["name"]]["realtime_runs"]
        runs = sorted(p for p in (labs_dir / "eager_vs_graph" / v["name"] / "runs").iterdir() if p.is_dir())
        assert runs and set(detail["reads"]) == {p.name for p in runs}
        assert set(detail["reads"].values()) == {"scrapes"}, detail["reads"]
        own = {p.name: emulation_verdict.read_case(str(p)) for p in runs}
        for name, verdict in own.items():
            assert verdict is not None and verdict["emulated"] is True
            assert detail["runs"][name]["verdict"] == verdict["verdict"], name
            assert detail["runs"][name]["realtime_factor"] == pytest.approx(verdict["realtime_factor"])
        assert v["realtime"] == emulation_verdict.combine(list(own.values()))["verdict"]
        assert not any(p.startswith(f"VERDICT_READS {v['name']}") for p in doc["pitfalls"])
        if v["realtime"] in ("saturated", "unknown"):
            assert doc["verdict"] == "inconclusive", doc["reason"]
