"""sched_profile's analysis: the overlap of scheduler CPU and forward time on a hand-made trace with a
known answer and on enginesim's own trace, py-spy's raw profile read into shares, the planner and its
A/B gate, and a py-spy that cannot attach (a PID that is gone) turning the lab inconclusive with
py-spy's own error, never into a profile."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from labs_helpers import REPO, config

sys.path.insert(0, str(REPO))
from analysis.errors import InputError
from analysis.labs import plan as lab_plan
from analysis.labs import sched_profile, sched_profile_pyspy, sched_profile_trace
from analysis.labs.sched_profile_plan import gate
from enginesim import profiling


def _x(name: str, ts: float, dur: float, cat: str, tid: int = 1) -> dict:
    return {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur, "pid": 0, "tid": tid}


def test_overlap_of_scheduler_and_forward_on_a_trace_with_a_known_answer() -> None:
    # scheduler CPU: [0, 10] with a nested call, [20, 30], and [100, 110] alone; kernels on two streams
    # covering [5, 25] (5-15 and 12-25 overlap each other): scheduler 30 us, forward 20 us, overlap
    # [5, 10] + [20, 25] = 10 us. A vLLM-named span and a non-X event must not count.
    doc = {
        "traceEvents": [
            _x("sglang/srt/managers/scheduler.py(1500): get_next_batch_to_run", 0, 10, "python_function"),
            _x("sglang/srt/managers/scheduler.py(1620): get_new_batch_prefill", 2, 5, "python_function"),
            _x("Scheduler.get_next_batch_to_run", 20, 10, "python_function", tid=2),
            _x("Scheduler.get_next_batch_to_run", 100, 10, "python_function", tid=2),
            _x("Scheduler.schedule", 40, 50, "python_function"),
            _x("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 5, 10, "kernel", tid=7),
            _x("flash_fwd_splitkv_kernel", 12, 13, "kernel", tid=8),
            {"name": "get_next_batch_to_run", "ph": "B", "ts": 0, "pid": 0, "tid": 1},
        ]
    }
    a = sched_profile_trace.analyse(doc, "sglang")
    assert (a["sched_cpu_us"], a["forward_us"], a["overlap_us"]) == (30.0, 20.0, 10.0)
    assert a["overlap_of_sched"] == round(10 / 30, 4)
    assert a["window_us"] == 110.0 and a["sched_spans"] == 3 and a["forward_blocks"] == 1
    v = sched_profile_trace.analyse(doc, "vllm")
    assert (v["sched_cpu_us"], v["overlap_us"]) == (50.0, 0.0)


def test_overlap_sweep_matches_a_brute_force_count() -> None:
    rng = np.random.default_rng(7)
    a = sched_profile_trace.merge(np.sort(rng.integers(0, 1000, (40, 2)), axis=1).astype(float))
    b = sched_profile_trace.merge(np.sort(rng.integers(0, 1000, (40, 2)), axis=1).astype(float))
    grid = np.arange(0, 1000) + 0.5
    inside = lambda s: np.any((grid[:, None] > s[:, 0]) & (grid[:, None] < s[:, 1]), axis=1)  # noqa: E731
    assert sched_profile_trace.overlap(a, b) == pytest.approx(float(np.sum(inside(a) & inside(b))))


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_enginesims_trace_has_the_scheduler_before_each_forward_pass(engine) -> None:
    steps = [
        {"start_s": 0.010 * i, "total_s": 0.008, "sched_s": 0.001, "gemm_s": 0.004, "attention_s": 0.002,
         "nccl_s": 0.0, "idle_s": 0.002, "tokens": 8, "prefill_tokens": 0, "decode_reqs": 8}
        for i in range(20)
    ]  # fmt: skip
    a = sched_profile_trace.analyse(profiling.chrome_trace(steps, 1, engine), engine)
    assert a["sched_spans"] == 20 and a["emulated"] is True
    assert a["sched_cpu_us"] == pytest.approx(20 * 1000.0)
    assert a["forward_us"] == pytest.approx(20 * 6000.0)
    assert a["overlap_us"] == 0.0  # the emulator prices the scheduler serially


def test_pyspy_raw_profile_shares_per_flavour(tmp_path: Path) -> None:
    raw = tmp_path / "profile.txt"
    raw.write_text(
        "main (enginesim/server.py:64);run (enginesim/engine.py:166);plan (enginesim/scheduler.py:331);"
        "_plan (enginesim/flavours/sglang.py:412);_prefill (enginesim/flavours/sglang.py:440) 6\n"
        "main (enginesim/server.py:64);run (enginesim/engine.py:166);apply (enginesim/scheduler.py:380) 3\n"
        "main (enginesim/server.py:64);_parse (enginesim/httpserver.py:90) 11\n"
        "event_loop_overlap (sglang/srt/managers/scheduler.py:900);"
        "get_next_batch_to_run (sglang/srt/managers/scheduler.py:1500) 5\n"
        "not a profile line\n"
    )
    s = sched_profile_pyspy.share(raw, "sglang", rate_hz=10, duration_s=5)
    assert s["samples"] == 25 and s["busy"] == 0.5
    assert (s["sched_samples"], s["output_samples"]) == (11, 3)
    assert s["sched_share"] == 0.44 and s["output_share"] == 0.12
    assert s["top_leaves"][0] == {"frame": "_parse (enginesim/httpserver.py:90)", "samples": 11}
    v = sched_profile_pyspy.share(raw, "vllm")
    assert v["sched_samples"] == 6 and v["busy"] is None  # SGLang's function is not vLLM's scheduler


def _cfg(engine: str, **over) -> dict:
    return config("sched_profile", engine, **over)


def test_plan_three_loads_sized_to_the_pyspy_duration_and_a_traced_run() -> None:
    p = lab_plan.build(_cfg("sglang"))
    runs = {r["name"]: r for r in p["variants"][0]["runs"]}
    assert list(runs) == ["load_low", "load_medium", "load_high", "trace"]
    w = p["workload"]
    for load in ("low", "medium", "high"):
        r = runs[f"load_{load}"]
        assert r["pyspy"] is True and r["profile"] is False
        assert r["workload"]["num_prompts"] == int(np.ceil(w["rates"][load] * w["duration_s"]))
        assert r["argv"][r["argv"].index("--request-rate") + 1] == str(float(w["rates"][load]))
    assert runs["trace"]["profile"] is True and runs["trace"]["pyspy"] is False
    bad = dict(w, rates={"low": 8, "medium": 2, "high": 32})
    with pytest.raises(InputError, match="low < medium < high"):
        lab_plan.build(_cfg("sglang", workload=bad))


def test_the_async_ab_runs_only_when_the_engines_help_lists_the_switch() -> None:
    with_flag = lab_plan.build(_cfg("vllm", engine_flags=["--async-scheduling", "--port"]))
    assert [v["name"] for v in with_flag["variants"]] == ["sync", "async"]
    assert list(with_flag["comparisons"][0]["differs"]) == ["--async-scheduling"]
    assert with_flag["dropped_variants"] == []
    without = lab_plan.build(_cfg("vllm", engine_flags=["--port"]))
    assert [v["name"] for v in without["variants"]] == ["sync"] and without["comparisons"] == []
    assert without["dropped_variants"][0]["reason"] == "the engine's --help does not list --async-scheduling"
    unread = lab_plan.build(_cfg("vllm"))
    assert "was not read" in unread["dropped_variants"][0]["reason"]
    definition = {"variants": [{"name": "a", "args": [], "requires_flags": "--x"}]}
    with pytest.raises(InputError, match="requires_flags"):
        gate(definition, [], "labs_definitions.sched_profile.vllm")


def _lab_dir(tmp: Path, pyspy_meta: dict, logs: dict[str, str]) -> Path:
    vdir = tmp / "default"
    (vdir / "scheduler_process.json").parent.mkdir(parents=True)
    (vdir / "scheduler_process.json").write_text(
        json.dumps({"found": True, "pid": 4242, "cmdline": ["sglang::scheduler_TP0"], "root": {"pid": 4241},
                    "tree": [], "matches": [{"pid": 4242}], "reason": ""})
    )  # fmt: skip
    for load in ("low", "medium", "high"):
        rdir = vdir / "runs" / f"load_{load}"
        rdir.mkdir(parents=True)
        (rdir / "pyspy.json").write_text(json.dumps(pyspy_meta))
        for kind, text in logs.items():
            (rdir / f"pyspy_{kind}.log").write_text(text)
    return tmp


def test_a_pyspy_that_cannot_attach_makes_the_lab_inconclusive_with_its_error(tmp_path: Path) -> None:
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    # what run.sh.j2 runs, against a PID that is gone
    logs, meta = {}, {"pid": gone.pid, "rate_hz": 100, "duration_s": 1}
    for kind, fmt, out in (("raw", "raw", "profile.txt"), ("svg", "flamegraph", "flame.svg")):
        p = subprocess.run(
            [pyspy, "record", "--pid", str(gone.pid), "--rate", "100", "--duration", "1", "--nonblocking",
             "--format", fmt, "-o", str(tmp_path / out)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        meta[f"{kind}_rc"] = p.returncode
        logs[kind] = p.stdout + p.stderr
    assert meta["raw_rc"] != 0 and logs["raw"].strip()
    lab_dir = _lab_dir(tmp_path / "lab", meta, logs)
    v = {
        "scheduler_process": sched_profile._process(lab_dir / "default"),
        "trace": {"status": "no trace file"},
    }
    v["loads"] = {
        load: {"request_rate": 1.0, "n": 1, "tpot_p50_ms": 1.0,
               "pyspy": sched_profile._pyspy(lab_dir / "default" / "runs" / f"load_{load}", "sglang")}
        for load in ("low", "medium", "high")
    }  # fmt: skip
    assert v["loads"]["low"]["pyspy"]["status"].startswith("failed: py-spy (raw) exited")
    said = next(ln for ln in logs["raw"].splitlines() if ln.startswith("Error"))
    assert said in v["loads"]["low"]["pyspy"]["status"]  # py-spy's own message
    assert "samples" not in v["loads"]["low"]["pyspy"]
    verdict = sched_profile.judge({"variants": {"default": v}}, [], {"isl": 1, "osl": 1}, {"margin": 0.1})
    assert verdict.verdict == "inconclusive"
    assert "default/low: py-spy failed: py-spy (raw) exited" in verdict.reason


def test_no_scheduler_process_is_inconclusive_with_the_walks_reason(tmp_path: Path) -> None:
    vdir = tmp_path / "default"
    vdir.mkdir()
    (vdir / "scheduler_process.json").write_text(
        json.dumps({"found": False, "reason": "no process under pid 9 has a title matching 'x'", "tree": []})
    )
    v = {"scheduler_process": sched_profile._process(vdir), "trace": {"status": "no trace file"}}
    v["loads"] = {
        k: {"pyspy": {"status": "not run: no scheduler process"}} for k in ("low", "medium", "high")
    }
    verdict = sched_profile.judge({"variants": {"default": v}}, [], {}, {})
    assert verdict.verdict == "inconclusive"
    assert (
        verdict.reason
        == "default: no scheduler process chosen (no process under pid 9 has a title matching 'x')"
    )


def _record_idle_process(tmp: Path) -> dict:
    """py-spy (as run.sh.j2 runs it) on a process that only sleeps, with its CPU ticks read the way
    the script reads them: an empty raw profile, a few ticks at most."""
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    ticks = f"sed 's/.*) //' /proc/{sleeper.pid}/stat | awk '{{print $12 + $13}}'"
    try:
        time.sleep(0.5)  # past the interpreter's start-up
        before = int(subprocess.run(["bash", "-c", ticks], capture_output=True, text=True).stdout)
        p = subprocess.run(
            [pyspy, "record", "--pid", str(sleeper.pid), "--rate", "100", "--duration", "1", "--nonblocking",
             "--format", "raw", "-o", str(tmp / "profile.txt")],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        after = int(subprocess.run(["bash", "-c", ticks], capture_output=True, text=True).stdout)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert p.returncode == 0, p.stdout + p.stderr
    assert (tmp / "profile.txt").read_text() == ""  # py-spy leaves out the samples where it waits
    return {"pid": sleeper.pid, "rate_hz": 100, "duration_s": 1, "raw_rc": 0, "svg_rc": 0,
            "cpu_ticks": after - before, "clk_tck": os.sysconf("SC_CLK_TCK"),
            "cpu_window_ns": 1_200_000_000}  # fmt: skip


def test_an_empty_profile_of_an_idle_scheduler_is_a_reading_and_of_a_busy_one_a_failure(
    tmp_path: Path,
) -> None:
    rdir = tmp_path / "load_low"
    rdir.mkdir()
    meta = _record_idle_process(rdir)
    (rdir / "pyspy.json").write_text(json.dumps(meta))
    idle = sched_profile._pyspy(rdir, "sglang")
    assert idle["status"] == "read" and idle["samples"] == 0 and idle["busy"] == 0.0, idle
    assert idle["cpu_s"] < 0.03 and idle["idle"].startswith("no py-spy sample: the process used")
    # the same empty profile while the process was on the CPU for 200 ms (20 samples' worth): py-spy
    # missed what was there, so the load is not read
    (rdir / "pyspy.json").write_text(json.dumps(meta | {"cpu_ticks": int(0.2 * meta["clk_tck"])}))
    missed = sched_profile._pyspy(rdir, "sglang")
    assert missed["status"] == (
        "failed: the raw profile has no samples while the process used 200 ms of CPU in the window, "
        "20.0 samples' worth at 100 Hz"
    )
    # the line: under 10 samples' worth an empty profile is what sampling gives, from 10 on it is not
    (rdir / "pyspy.json").write_text(json.dumps(meta | {"cpu_ticks": int(0.09 * meta["clk_tck"])}))
    assert sched_profile._pyspy(rdir, "sglang")["status"] == "read"
    (rdir / "pyspy.json").write_text(json.dumps(meta | {"cpu_ticks": int(0.10 * meta["clk_tck"])}))
    assert sched_profile._pyspy(rdir, "sglang")["status"].startswith("failed: the raw profile has no samples")
    # a reused PID (the run script wrote null) or a negative difference: no reading, so no "idle"
    for ticks in (None, -3):
        (rdir / "pyspy.json").write_text(json.dumps(meta | {"cpu_ticks": ticks}))
        assert sched_profile._pyspy(rdir, "sglang")["status"].startswith(
            "failed: the raw profile has no samples ("
        )
    # without the CPU reading (an older run script) nothing tells idle from missed
    (rdir / "pyspy.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "cpu_ticks"}))
    assert sched_profile._pyspy(rdir, "sglang")["status"].startswith("failed: the raw profile has no samples")
    # an idle low load and a sampled high load: the lab reads both and judges the rise
    high = dict(idle, samples=40, busy=0.4, sched_share=0.5, output_share=0.2)
    high.pop("idle")
    v = {"scheduler_process": {"found": True, "pid": 1, "cmdline": ["x"], "root": {"pid": 0}},
         "trace": {"status": "read", "sched_cpu_us": 1.0, "forward_us": 1.0, "overlap_us": 0.0,
                   "overlap_of_sched": 0.0, "window_us": 2.0},
         "loads": {k: {"request_rate": r, "n": 4, "tpot_p50_ms": 1.0, "pyspy": p}
                   for k, r, p in (("low", 2, idle), ("medium", 8, high), ("high", 32, high))}}  # fmt: skip
    verdict = sched_profile.judge({"variants": {"default": v}}, [], {"isl": 1, "osl": 1}, {"margin": 0.1})
    assert verdict.verdict == "supported", verdict.reason
    assert any("default/low:" in o and "no py-spy sample" in o for o in verdict.observations)


def test_the_run_scripts_cpu_reading_is_null_when_the_pid_became_another_process() -> None:
    """The two shell helpers of templates/run.sh.j2, run as rendered: the same process gives its tick
    difference; a process gone, or a PID reused by another process (another start time), gives null,
    never a difference of two processes' CPU times."""
    template = (REPO / "roles/labs/templates/run.sh.j2").read_text().splitlines()
    helpers = "\n".join(ln for ln in template if ln.startswith(("cpu_stat() ", "cpu_delta() ")))
    assert helpers.count("() {") == 2

    def run(script: str) -> str:
        return subprocess.run(["bash", "-c", helpers + "\n" + script], capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip

    # busy for a moment between the two reads: a difference of its own ticks
    same = run(
        'spid=$$; a=$(cpu_stat); for i in $(seq 200000); do :; done; b=$(cpu_stat); cpu_delta "$a" "$b"'
    )
    assert same.isdigit() and int(same) > 0, same
    assert run('cpu_delta "" "5 7"') == "null"  # gone at the first read
    assert run('cpu_delta "100 40" ""') == "null"  # gone at the second
    assert run('cpu_delta "100 40" "250 3"') == "null"  # the PID is another process now
    assert run('cpu_delta "100 40" "100 52"') == "12"
