"""The quick map with the engine switched to vLLM (`-e engine_name=vllm`), end to end on inventory/local.

enginesim's vLLM flavour (`python -m enginesim vllm serve MODEL <vllm flags>`) is driven through the
real playbooks: preflight -> engine (process runtime, roles/engine/templates/vllm_args.j2) -> NCCL gate
on vLLM's log -> two fixed cases with the OpenAI-completions client -> the A/B -> stop -> collect ->
report. Plus the refusals a user meets when a flag of the other engine is left in engine_extra_args,
and the engine's own refusal of an unknown flag surfacing at once (not after the start timeout).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import port_listening
from .runner import (
    LOCAL_INVENTORY,
    REPO,
    VENV_BIN,
    ansible_env,
    read_json,
    recorded_servers,
    run_cli,
    run_runner,
    server_still_running,
)

pytestmark = pytest.mark.slow

CASES = ("cold_prefill_4k", "short_decode_c1")
AB_ROLES = ("control", "decode_background", "prefill_injection")


def _assert_server_stopped(results: Path, port: int) -> None:
    assert not port_listening(port), f"server still listening on {port}"
    for rec in recorded_servers(results):
        assert not server_still_running(rec), f"server pid {rec['pid']} still alive"


def _samples(prom: Path) -> dict[str, float]:
    """Sum of every sample per metric name (labels folded) from a saved /metrics scrape."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(prom.read_text()):
        for s in fam.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def _check_bench(path: Path, requests: int, osl: int) -> subprocess.CompletedProcess[str]:
    """The analysis CLI's own validation of a result file (independent of the bench role's module)."""
    argv = [sys.executable, "-m", "analysis", "check-bench", str(path), "--expect-requests", str(requests)]
    return subprocess.run(
        [*argv, "--expect-output-len", str(osl)], cwd=REPO, capture_output=True, text=True, timeout=60
    )


def test_full_map_with_vllm(run_env: dict) -> None:
    """Two fixed cases + the A/B against enginesim's vLLM server, through ansible-runner."""
    ev = dict(run_env["extravars"], run_id="vllm", engine_name="vllm", case_ids=",".join(CASES))
    r = run_runner(run_env["tmp"] / "runner", ev)
    run_dir = run_env["results"] / "vllm"
    assert r.status == "successful", r.stdout.read() if hasattr(r.stdout, "read") else r.status

    manifest = read_json(run_dir / "manifest.json")
    assert manifest["status"] == "completed", (manifest.get("failed_cases"), manifest.get("abort_reasons"))
    assert manifest["case_counts"]["completed"] == len(CASES) + len(AB_ROLES)
    assert manifest["engine"] == "vllm" and manifest["engine_runtime"] == "process"
    flags = manifest["engine_flags"].split()
    # vLLM's names for the shared tunables; none of SGLang's spellings leaked into the command.
    for flag, value in (
        ("--tensor-parallel-size", "1"),
        ("--gpu-memory-utilization", "0.9"),
        ("--max-num-seqs", "256"),
        ("--max-model-len", "135168"),
    ):
        assert flags[flags.index(flag) + 1] == value, (flag, flags)
    assert flags[0] == "Qwen/Qwen3-0.6B"
    assert not {"--model-path", "--context-length", "--mem-fraction-static", "--enable-metrics"} & set(flags)
    assert manifest["engine_env"] == {"ENGINESIM_TIME_SCALE": "0.02", "VLLM_SERVER_DEV_MODE": "1"}

    # The server really ran as vLLM: the saved command is `enginesim vllm serve`, and the log carries
    # vLLM's own start-up lines with the flags as it parsed them.
    server = run_dir / "server"
    cmd = (server / "localhost.start1_server_cmd.txt").read_text()
    assert " -m enginesim vllm serve Qwen/Qwen3-0.6B " in cmd and "export VLLM_SERVER_DEV_MODE=1" in cmd
    assert manifest["engine_flags"] in cmd
    log = (server / "localhost.start1.log").read_text()
    assert "vLLM API server version" in log and "Starting vLLM API server 0 on" in log
    assert "'max_model_len': 135168" in log and "'max_num_seqs': 256" in log
    assert "GPU KV cache size:" in log and "Engine 000:" in log
    assert "Load weight end" not in log and "sglang" not in log.lower()
    gate = read_json(server / "localhost.start1_nccl_gate.json")
    assert gate["passed"] is True and gate["nnodes"] == 1
    (read,) = gate["logs"]
    assert read["exists"] is True and read["path"] == str(server / "localhost.start1.log")
    assert read["engine_errors"] == []

    # Every case: the vLLM client backend (OpenAI completions), a validated result, /metrics with
    # vLLM's names scraped before and after, the server's counters moved by the case's requests.
    runs = [(f"cases/{c}/rep1", None) for c in CASES] + [(f"mixed/rep1/{role}", role) for role in AB_ROLES]
    for rel, role in runs:
        d = run_dir / rel
        meta = read_json(d / "meta.json")
        assert meta["status"] == "completed", (rel, meta)
        bench = read_json(d / "bench.json")
        assert bench["backend"] == "vllm" and bench["complete"] is True, rel
        assert bench["completed"] == meta["num_prompts"] and bench["failed"] == 0, rel
        assert all(q["success"] and q["tokens_source"] == "server" for q in bench["requests"]), rel
        checked = _check_bench(d / "bench.json", meta["num_prompts"], meta["osl"])
        assert checked.returncode == 0, (rel, checked.stdout, checked.stderr)
        assert "--backend vllm" in meta["bench_cmd"]
        assert meta["bench_cmd"] in (d / "bench_cmd.txt").read_text()
        bench_log = (d / "bench.log").read_text()
        assert "/v1/completions" in bench_log, rel
        if role != "prefill_injection":  # every run starts on an empty prefix cache, except the injection
            assert "flush cache: /reset_prefix_cache succeeded" in bench_log, rel
        before, after = _samples(d / "metrics_before.prom"), _samples(d / "metrics_after.prom")
        # vLLM's own catalogue, plus the emulator's enginesim:* evidence (no other prefix)
        assert before and all(name.startswith(("vllm:", "enginesim:")) for name in before), (
            rel,
            sorted(before)[:5],
        )
        assert any(name.startswith("vllm:") for name in before), rel
        done_before = before["vllm:request_success_total"]
        if role in (None, "control"):  # nothing else ran on the server meanwhile
            assert after["vllm:request_success_total"] - done_before >= meta["num_prompts"], rel
            assert after["vllm:prompt_tokens_total"] > before["vllm:prompt_tokens_total"], rel

    # The A/B: the injection went out inside the background's main phase (both result files agree).
    inj = read_json(run_dir / "mixed/rep1/prefill_injection/meta.json")
    bg = read_json(run_dir / "mixed/rep1/decode_background/bench.json")
    sent = inj["injection_sent_epoch_s"]
    assert bg["t0_epoch_s"] + bg["main_start_s"] <= sent <= bg["t0_epoch_s"] + bg["main_end_s"]
    assert inj["background_main_started_epoch_s"] <= sent
    assert inj.get("overlap_proved") is True, inj

    # The report says which engine served the run, how, and with which flags.
    report = (run_dir / "report.md").read_text()
    assert "- engine: vllm (process runtime), command `" in report
    assert " -m enginesim vllm serve`" in report
    assert f"- engine flags: `{manifest['engine_flags']}`" in report
    summary = (run_dir / "summary.csv").read_text()
    for c in (*CASES, "mixed_control", "mixed_decode_background", "mixed_prefill_injection"):
        assert c in summary, c
    _assert_server_stopped(run_env["results"], run_env["port"])


REFUSALS = {
    "vllm_flag_to_sglang": (
        {"engine_name": "sglang", "engine_extra_args": ["--max-model-len", "4096"]},
        "engine_extra_args has --max-model-len, a flag of vLLM only, but engine_name=sglang (rule: extra "
        "flags must be the selected engine's own; SGLang would refuse it at start)",
    ),
    "sglang_flag_to_vllm": (
        {"engine_name": "vllm", "engine_extra_args": ["--context-length=4096", "--enforce-eager"]},
        "engine_extra_args has --context-length, a flag of SGLang only, but engine_name=vllm (rule: extra "
        "flags must be the selected engine's own; vLLM would refuse it at start)",
    ),
    "native_client_to_vllm": (
        {"engine_name": "vllm", "bench_backend": "sglang"},
        "bench_backend=sglang with engine_name=vllm (rule: vLLM has no native /generate",
    ),
    "flush_without_dev_mode": (
        {"engine_name": "vllm", "engine_vllm_dev_mode": False},
        "VLLM_SERVER_DEV_MODE is not 1 in the server's environment (rule: vLLM serves /reset_prefix_cache "
        "only in dev mode",
    ),
}


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_preflight_refuses_a_setting_of_the_other_engine(run_env: dict, name: str) -> None:
    extra, expect = REFUSALS[name]
    res = run_cli(dict(run_env["extravars"], run_id=f"refused_{name}", **extra), "--tags", "fixed")
    assert res.rc != 0
    assert expect in " ".join(res.output.split()), res.output[-3000:]
    assert not (run_env["results"] / ".state").exists(), "a server was started"
    assert not (run_env["results"] / f"refused_{name}").exists(), "the run was opened"
    assert not port_listening(run_env["port"])


def test_an_engine_that_refuses_its_flags_fails_the_start_with_its_own_message(run_env: dict) -> None:
    """A value preflight cannot judge (the flag is known to the engine's --help, the value is not an
    int) reaches vLLM, whose argument parser exits at once: the serve phase must say so with the
    engine's message, not wait out engine_start_timeout_s, and the run must end failed with the server
    stopped and its log kept. (An unknown flag is refused earlier, by preflight's --help check.)"""
    ev = dict(
        run_env["extravars"],
        run_id="badflag",
        engine_name="vllm",
        case_ids="short_decode_c1",
        engine_extra_args=["--block-size", "abc"],
        engine_start_timeout_s=300,
        report_summarize=False,
    )
    res = run_cli(ev, "--tags", "fixed")
    run_dir = run_env["results"] / "badflag"
    assert res.rc != 0
    manifest = read_json(run_dir / "manifest.json")
    assert manifest["status"] == "failed"
    (reason,) = manifest["abort_reasons"]
    assert reason.startswith("server did not become healthy on localhost: the server exited before"), reason
    assert "argument --block-size: invalid int value: 'abc'" in reason, reason
    assert (
        "argument --block-size: invalid int value: 'abc'"
        in (run_dir / "server/localhost.start1.log").read_text()
    )
    assert not (run_dir / "cases").exists(), "a case ran against a dead server"
    _assert_server_stopped(run_env["results"], run_env["port"])


RENDER_ONLY = """\
- name: Render the server command only (the engine role's render entry point)
  hosts: head
  gather_facts: false
  tasks:
    - name: Render
      ansible.builtin.include_role:
        name: engine
        tasks_from: render
    - name: Save it
      ansible.builtin.copy:
        content: "{{ engine_server_cmd }}"
        dest: "{{ out }}/single.sh"
        mode: "0644"
    - name: Render rank 1 of two nodes
      ansible.builtin.include_role:
        name: engine
        tasks_from: render
      vars:
        engine_nnodes: 2
        engine_node_rank: 1
        engine_head_address: 10.0.0.1
    - name: Save it
      ansible.builtin.copy:
        content: "{{ engine_server_cmd }}"
        dest: "{{ out }}/worker.sh"
        mode: "0644"
"""


def _docker_run_words(script: Path) -> list[str]:
    """The argv of the `docker run` in a rendered server script (line continuations joined)."""
    return shlex.split(script.read_text().split("docker run", 1)[1].replace("\\\n", " "))


def test_docker_runtime_runs_exactly_vllm_serve(tmp_path: Path) -> None:
    """The docker runtime wraps the same vLLM flags; the vllm/vllm-openai image's ENTRYPOINT
    ["vllm", "serve"] is cleared, else the container would run `vllm serve vllm serve MODEL` and die.
    On two nodes the worker rank runs headless (vLLM's multi-node mode: no API server there)."""
    playbook = tmp_path / "render.yml"
    playbook.write_text(RENDER_ONLY)
    out = tmp_path / "out"
    out.mkdir()
    ev = {
        "engine_name": "vllm",
        "engine_runtime": "docker",
        "engine_image": "vllm/vllm-openai:v0.11.2",
        "quickmap_run_id": "r",
        "quickmap_node_results_dir": str(tmp_path),
        "out": str(out),
    }
    argv = [
        str(VENV_BIN / "ansible-playbook"),
        "-i",
        str(LOCAL_INVENTORY),
        str(playbook),
        "-e",
        json.dumps(ev),
    ]
    p = subprocess.run(argv, cwd=REPO, env=ansible_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    words = _docker_run_words(out / "single.sh")
    opts, image_at = words[: words.index("vllm/vllm-openai:v0.11.2")], words.index("vllm/vllm-openai:v0.11.2")
    assert opts[opts.index("--entrypoint") + 1] == ""
    assert opts[opts.index("--name") + 1] == "quickmap-vllm"
    assert "VLLM_SERVER_DEV_MODE=1" in opts
    cmd = words[image_at + 1 :]
    assert cmd[:3] == ["vllm", "serve", "Qwen/Qwen3-0.6B"], cmd
    assert cmd[cmd.index("--max-model-len") + 1] == "135168" and "--context-length" not in cmd
    assert "--nnodes" not in cmd and "--headless" not in cmd
    worker = _docker_run_words(out / "worker.sh")
    wcmd = worker[worker.index("vllm/vllm-openai:v0.11.2") + 1 :]
    assert wcmd[:3] == ["vllm", "serve", "Qwen/Qwen3-0.6B"], wcmd
    i = wcmd.index("--nnodes")
    assert wcmd[i : i + 8] == [
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--master-addr",
        "10.0.0.1",
        "--master-port",
        "20000",
    ]
    assert wcmd[i + 8] == "--headless", wcmd
