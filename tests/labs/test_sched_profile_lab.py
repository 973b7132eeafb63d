"""sched_profile through its real command (`ansible-playbook labs.yml --tags sched_profile`) on
enginesim, both flavours: the scheduler child found under the server's recorded PID, real py-spy
profiles (flame graph + raw) at three loads, the engine profiler's trace read, and vLLM's
async-scheduling A/B planned because the emulated version's --help lists the switch. `--check` prints
every variant's server command and the py-spy commands, and starts nothing."""

from __future__ import annotations

import json
import re

import pytest
from test_labs_check_mode import playbook
from test_labs_enginesim import fail_text, run_labs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
TITLE = {"sglang": "sglang::scheduler_TP0", "vllm": "VLLM::EngineCore"}


@pytest.fixture(scope="module", params=["sglang", "vllm"])
def lab(request, tmp_path_factory) -> dict:
    engine = request.param
    tmp = tmp_path_factory.mktemp(f"sched_{engine}")
    workload = {
        "isl": 128, "osl": 16, "concurrency": 64, "rates": {"low": 2, "medium": 8, "high": 32},
        "duration_s": 3, "pyspy_rate_hz": 100,
    }  # fmt: skip
    proc, labs_dir = run_labs(
        tmp, engine, "sched_profile", f"sched_{engine}", labs_workloads={"sched_profile": workload}
    )
    assert proc.returncode == 0, fail_text(proc)
    doc = json.loads((labs_dir / "sched_profile" / "lab.json").read_text())
    return {"engine": engine, "dir": labs_dir / "sched_profile", "doc": doc}


def test_the_scheduler_child_of_our_server_is_profiled_at_three_loads(lab) -> None:
    doc, engine = lab["doc"], lab["engine"]
    variants = doc["figures"]["variants"]
    assert set(variants) == ({"default"} if engine == "sglang" else {"sync", "async"})
    for name, v in variants.items():
        p = v["scheduler_process"]
        assert p["found"] and p["cmdline"][0] == TITLE[engine]
        assert [t["pid"] for t in p["tree"]] == [p["pid"]] and p["tree"][0]["ppid"] == p["root"]["pid"]
        record = next((lab["dir"] / name / "server").glob("*.start1.server.json"))
        assert json.loads(record.read_text())["pid"] == p["root"]["pid"]  # the walk began at the recorded PID
        busy = []
        for load in ("low", "medium", "high"):
            s = v["loads"][load]["pyspy"]
            assert s["status"] == "read" and s["pid"] == p["pid"] and s["cpu_s"] is not None, s
            rdir = lab["dir"] / name / "runs" / f"load_{load}"
            if s["samples"] == 0:  # an idle scheduler at the low rate: told apart by its CPU time
                assert load != "high" and s["idle"] and (rdir / "profile.txt").stat().st_size == 0, s
            else:
                assert (rdir / "profile.txt").stat().st_size > 0
            if s["svg_error"] is None:
                assert (rdir / "flame.svg").read_text().lstrip().startswith("<?xml")
            else:  # py-spy's flame-graph run failed (seen once under load): named, never replaced
                assert any(s["svg_error"] in x for x in doc["pitfalls"])
            busy.append(s["busy"])
        assert busy[2] > busy[0]
        t = v["trace"]
        assert t["status"] == "read" and t["emulated"] and t["sched_spans"] > 0 and t["forward_us"] > 0
        assert t["overlap_us"] == 0.0
    assert doc["verdict"] == "supported", doc["reason"]
    assert any("overlap is 0 by construction" in x for x in doc["pitfalls"])


def test_async_scheduling_ab_only_where_the_cli_has_the_switch(lab) -> None:
    doc = lab["doc"]
    if lab["engine"] == "vllm":
        (comp,) = doc["comparisons"]
        assert (comp["baseline"], comp["treatment"]) == ("sync", "async")
        assert comp["verdict"] == "inconclusive" and "not comparable on enginesim" in comp["reason"]
        cmd = (lab["dir"] / "async" / "server" / "localhost.start1_server_cmd.txt").read_text()
        assert "--async-scheduling" in cmd
    else:
        assert doc["comparisons"] == []
        assert any("no comparable baseline exists" in x for x in doc["pitfalls"])
    report = (lab["dir"].parent / "report.md").read_text()
    assert "sched_profile" in report and "Pitfalls" in report


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_check_prints_each_variants_server_and_pyspy_commands(tmp_path, engine) -> None:
    proc = playbook(tmp_path, "--check", "--tags", "sched_profile", engine_name=engine, run_id="dry")
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:]
    scripts = re.findall(r"quickmap server start on localhost \(engine (\w+), runtime process", out)
    assert len(scripts) == (1 if engine == "sglang" else 2)
    assert out.count("record --pid") == 3 * len(scripts)  # the py-spy command of each of the three loads
    assert out.count("spy flamegraph flame.svg svg") == 3 * len(scripts)
    assert out.count("loadgen.pyz --backend") == 4 * len(scripts)
    if engine == "vllm":
        assert "--async-scheduling" in out
    assert not (tmp_path / "results" / "dry" / "labs").exists()
