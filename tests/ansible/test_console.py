"""The console callback (callback_plugins/quickmap_console.py) as a person sees it: real
`ansible-playbook quick_map.yml` runs on inventory/local, their stdout read line by line."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from .runner import REPO, run_cli

pytestmark = pytest.mark.slow

sys.path.insert(0, str(REPO / "callback_plugins"))
import quickmap_console  # noqa: E402  (the plugin file itself, for its pure formatting functions)


def test_one_line_per_phase_and_case_progress_failures_and_the_report_last(run_env: dict) -> None:
    ev = dict(
        run_env["extravars"],
        run_id="console",
        case_ids="short_decode_c1,short_decode_c32,long_decode_8k_c32",
        bench_case_timeouts={"long_decode_8k_c32": 1},  # a case that needs several seconds: TIMEOUT
        quickmap_fail_on_case_failure=False,  # the failed case is accepted: the run exits 0
        # 25x slower than the other runs' 0.02: short_decode_c32 must outlast a few progress ticks (0.5 s).
        # At 0.02 it took 0.7 s once loadgen read SGLang's cumulative stream at full speed, and no tick
        # fell inside it.
        engine_env={"ENGINESIM_TIME_SCALE": "0.5"},
    )
    res = run_cli(ev, "--tags", "fixed", env={"QUICKMAP_CONSOLE_PROGRESS_INTERVAL": "0.5"})
    run_dir = run_env["results"] / "console"
    lines = res.stdout.splitlines()
    assert res.rc == 0, res.output[-3000:]
    assert "TASK [" not in res.stdout and "PLAY RECAP" not in res.stdout, res.stdout
    phases = [line.split()[1:3] for line in lines if line.startswith("phase ")]
    assert phases == [
        ["Preflight", "ok"],
        ["Calibrate", "skipped"],  # --tags calibrate only
        ["Serve", "ok"],
        ["Fixed", "ok"],
        ["Mixed", "skipped"],
        ["Stop", "ok"],
        ["Collect", "ok"],
        ["Report", "ok"],
    ], lines
    fixed = next(line for line in lines if line.startswith("phase Fixed"))
    assert fixed.endswith("(1 case(s) failed)"), fixed
    done = next(line for line in lines if line.startswith("case cases/short_decode_c1/rep1 "))
    m = re.fullmatch(
        r"case cases/short_decode_c1/rep1  completed  [\d.]+s  out ([\d.]+) tok/s  TTFT p50 ([\d.]+) ms"
        r"  verdict (.+)",
        done,
    )
    assert m, done
    meta = json.loads((run_dir / "cases/short_decode_c1/rep1/meta.json").read_text())
    assert m.group(3) == quickmap_console.verdict_of(meta), (done, meta.get("emulation"))
    bench = json.loads((run_dir / "cases/short_decode_c1/rep1/bench.json").read_text())
    assert m.groups()[:2] == (f"{bench['output_throughput']:.1f}", f"{bench['median_ttft_ms']:.1f}"), done
    # While short_decode_c32 ran: progress lines fed by loadgen's --progress-file, counting up.
    # (counting up mid-run is tested on loadgen's side: test_progress_file_counts_while_the_main_phase_runs;
    # at this time scale a case's main phase can end before its first 2-second rewrite)
    total = json.loads((run_dir / "cases/short_decode_c32/rep1/meta.json").read_text())["num_prompts"]
    shape = rf"  \.\.\. cases/short_decode_c32/rep1  (\d+)/{total} requests  ([\d.]+) tok/s so far  .*"
    progress = [re.fullmatch(shape, line) for line in lines]
    counts = [int(p.group(1)) for p in progress if p]
    assert counts and counts == sorted(counts), lines
    failed = next(line for line in lines if line.startswith("case cases/long_decode_8k_c32/rep1 "))
    assert "FAILED (TIMEOUT)" in failed and "reason: " in failed, failed
    assert failed.endswith(f"evidence: {run_dir}/cases/long_decode_8k_c32/rep1"), failed
    assert lines[-1] == f"Report: {run_dir}/report.md", lines[-3:]
    assert len(lines) < 40, lines  # the default callback prints hundreds of lines for this run


def test_default_callback_still_available_and_check_mode_ends_on_the_plan(run_env: dict) -> None:
    ev = dict(run_env["extravars"], run_id="dry", case_ids="short_decode_c1")
    console = run_cli(ev, "--check", "--tags", "fixed")
    assert console.rc == 0, console.output[-3000:]
    last = console.stdout.splitlines()[-1]
    assert last.startswith("Dry run: nothing started. Plan and every command: ") and last.endswith("plan.txt")
    assert "setsid nohup" in console.stdout  # the server command check mode prints, still printed
    default = run_cli(ev, "--check", "--tags", "fixed", env={"ANSIBLE_STDOUT_CALLBACK": "default"})
    assert default.rc == 0, default.output[-3000:]
    assert "TASK [bench : Bench | print the case plan and commands]" in default.stdout, default.stdout[-3000:]
    assert "PLAY RECAP" in default.stdout and "phase Preflight" not in default.stdout


def test_a_failed_phase_names_its_reason_and_evidence(run_env: dict) -> None:
    """A refused configuration: the phase fails, the rule is printed once, the last line says no report."""
    res = run_cli(
        dict(run_env["extravars"], run_id="bad", case_ids="short_decode_c1,no_such_case"), "--tags", "fixed"
    )
    lines = res.stdout.splitlines()
    assert res.rc != 0
    failed = [line for line in lines if line.startswith("FAILED Preflight | localhost | ")]
    assert failed and "no_such_case" in failed[0] and failed[0].endswith("/bad/run.log)"), lines
    assert next(line for line in lines if line.startswith("phase Preflight")).split()[2] == "FAILED"
    assert lines[-1].startswith("Report: not written"), lines[-3:]


@pytest.mark.parametrize(
    "meta,expected",
    [
        ({}, "n/a"),
        ({"emulation": {"verdict": "faithful", "realtime_factor": 0.98}}, "faithful (realtime x0.98)"),
        ({"verdict": "degraded"}, "degraded"),
    ],
)
def test_verdict_is_read_when_recorded_and_na_otherwise(meta: dict, expected: str) -> None:
    assert quickmap_console.verdict_of(meta) == expected


def test_a_case_without_result_figures_prints_na(tmp_path: Path) -> None:
    (tmp_path / "meta.json").write_text('{"status": "completed"}')
    line = quickmap_console.case_line("cases/x/rep1", tmp_path, 2.0, None)
    assert line == "case cases/x/rep1  completed  2.0s  out n/a  TTFT p50 n/a  verdict n/a"
