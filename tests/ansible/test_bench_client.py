"""The reference client beside loadgen (issue 15 item 4), through quick_map.yml on inventory/local.

SGLang's own `python3 -m sglang.bench_serving` (the sglang wheel's client, installed without the engine
by `make sglang-client` into .sglang-client/) and vLLM's `vllm bench serve` (the whole vllm wheel with
torch, `make vllm-client` into .vllm-client/) really run against enginesim after loadgen, on the same
workload, and the report puts both side by side. A runtime without the client is refused by preflight,
naming the client's version command, before anything starts.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from enginesim import tokenizer_dir
from enginesim.catalog import load_model

from .runner import REPO, VENV_BIN, ansible_env, read_json, run_cli

pytestmark = pytest.mark.slow

SGLANG_CLIENT = REPO / ".sglang-client" / "venv" / "bin" / "python"
VLLM_CLIENT = REPO / ".vllm-client" / "venv" / "bin" / "vllm"


def _tokenizer(run_env: dict) -> Path:
    """enginesim's own vocabulary as a tokenizer directory: the prompt text reads back as the planned ids."""
    tok = run_env["tmp"] / "tok"
    if not tok.is_dir():
        tokenizer_dir.build(str(tok), load_model("Qwen/Qwen3-0.6B").vocab)
    return tok


def _sglang_ev(run_env: dict, run_id: str, **extra: object) -> dict:
    if not SGLANG_CLIENT.is_file():
        pytest.fail(f"{SGLANG_CLIENT} missing: run `make sglang-client` (make test does)")
    tok = _tokenizer(run_env)
    return dict(
        run_env["extravars"],
        run_id=run_id,
        case_ids="short_decode_c1",
        bench_reference_tokenizer=str(tok),
        bench_sglang_client_command=[str(SGLANG_CLIENT), "-m", "sglang.bench_serving"],
        **extra,
    )


@pytest.mark.parametrize("choice", [{"bench_client": "sglang"}, {"bench_cross_check": True}], ids=str)
def test_the_real_sglang_client_runs_each_case_beside_loadgen(run_env: dict, choice: dict) -> None:
    ev = _sglang_ev(run_env, "ref", **choice)
    res = run_cli(ev, "--tags", "fixed", timeout=600)
    assert res.rc == 0, res.output[-4000:]
    assert "flags checked against sglang client 0.5.6" in res.stdout, res.stdout[-3000:]
    run_dir = run_env["results"] / "ref"
    case = run_dir / "cases" / "short_decode_c1" / "rep1"
    # Evidence: the exact commands (both clients), the client's own log, exit code and result file.
    script = (case / "bench_cmd.txt").read_text()
    assert "loadgen.pyz" in script and "-m sglang.bench_serving --backend sglang" in script
    assert "--dataset-name random-ids --random-input-len 1024 --random-output-len 1024" in script
    assert "--num-prompts 1 --max-concurrency 1" in script
    assert (case / "bench_sglang.rc").read_text().strip() == "0", (case / "bench_sglang.log").read_text()[
        -2000:
    ]
    line = (case / "bench_sglang.jsonl").read_text().strip().splitlines()[-1]
    result = json.loads(line)
    assert result["backend"] == "sglang" and result["completed"] == 1 and result["output_lens"] == [1024]
    assert read_json(case / "meta.json")["status"] == "completed"
    # The client's own --help and version, cached in the run dir by preflight.
    cached = [read_json(f) for f in (run_dir / "bench" / "client_help").glob("*.json")]
    assert len(cached) == 1 and "--random-input-len" in cached[0]["help"], cached
    assert "Version: 0.5.6" in cached[0]["version_output"]
    report = (run_dir / "report.md").read_text()
    section = report.split("## Reference client side by side", 1)[1].split("\n## ", 1)[0]
    assert "### short_decode_c1 rep1: loadgen vs sglang" in section
    rows = {r.split(" | ")[0][2:]: r.split(" | ") for r in section.splitlines() if r.startswith("| ")}
    # Each client's own /metrics window, scraped around it and judged by the emulator's verdict: at time
    # scale 0.02 this box cannot keep a C=1 decode step's schedule, so both windows are saturated.
    for name in ("metrics_before_sglang.prom", "metrics_after_sglang.prom"):
        assert "enginesim:steps_total" in (case / name).read_text()
    assert rows["emulator verdict"][1].startswith("saturated") and rows["emulator verdict"][2].startswith(
        "saturated"
    )
    # SGLang's random-ids prompt goes out as text decoded with the client's tokenizer and the server
    # counts its own tokens: with enginesim's vocabulary in the client's tokenizer both clients' prompts
    # arrive at the planned length (once 3,788 tokens for 1,024 with a whole-word test tokenizer), so
    # the only reason a TPOT is not comparable here is the saturated windows.
    assert rows["prompt tokens/request (server)"][1] == "1024.00"
    assert rows["prompt tokens/request (client)"][2] == "1024.00"
    assert float(rows["prompt tokens/request (server)"][2]) == pytest.approx(1024, rel=0.05), rows
    assert "workload" not in rows["TPOT mean ms"][3], rows["TPOT mean ms"]
    assert rows["TPOT mean ms"][3].startswith("not comparable (emulator: loadgen window saturated; ")
    assert "sglang window saturated" in rows["TPOT mean ms"][3]
    assert rows["TTFT mean ms"][3].startswith("not comparable")
    tpot_lg, tpot_sgl = float(rows["TPOT mean ms"][1]), float(rows["TPOT mean ms"][2])
    assert tpot_sgl == pytest.approx(result["mean_tpot_ms"], abs=0.01)  # SGLang's own figure
    assert tpot_lg > 0 and tpot_sgl > 0


def test_the_real_vllm_client_runs_each_case_beside_loadgen(run_env: dict) -> None:
    if not VLLM_CLIENT.is_file():
        pytest.fail(f"{VLLM_CLIENT} missing: run `make vllm-client` (make test does)")
    ev = dict(
        run_env["extravars"],
        engine_name="vllm",
        run_id="refv",
        case_ids="short_decode_c1",
        bench_client="vllm",
        bench_reference_tokenizer=str(_tokenizer(run_env)),
        bench_vllm_client_command=[str(VLLM_CLIENT), "bench", "serve"],
    )
    res = run_cli(ev, "--tags", "fixed", timeout=900)
    assert res.rc == 0, res.output[-4000:]
    # The version is read beside the client's own script: `vllm --version` fails without a GPU.
    assert "flags checked against vllm client 0.11.2" in res.stdout, res.stdout[-3000:]
    run_dir = run_env["results"] / "refv"
    case = run_dir / "cases" / "short_decode_c1" / "rep1"
    script = (case / "bench_cmd.txt").read_text()
    assert "loadgen.pyz" in script and "/vllm bench serve --backend vllm" in script
    assert "--dataset-name random --random-input-len 1024 --random-output-len 1024" in script
    assert (case / "bench_vllm.rc").read_text().strip() == "0", (case / "bench_vllm.log").read_text()[-3000:]
    result = read_json(case / "bench_vllm.json")
    # vLLM's own result file: every request completed with the planned output length.
    assert result["completed"] == 1, result["completed"]
    assert result["output_lens"] == [1024] and result["input_lens"] == [1024]
    assert read_json(case / "meta.json")["status"] == "completed"
    cached = [read_json(f) for f in (run_dir / "bench" / "client_help").glob("*.json")]
    assert len(cached) == 1 and "--random-input-len" in cached[0]["help"], cached
    assert cached[0]["version_output"].strip() == "Version: 0.11.2"
    report = (run_dir / "report.md").read_text()
    section = report.split("## Reference client side by side", 1)[1].split("\n## ", 1)[0]
    assert "### short_decode_c1 rep1: loadgen vs vllm" in section, section[:2000]
    rows = {r.split(" | ")[0][2:]: r.split(" | ") for r in section.splitlines() if r.startswith("| ")}
    for name in ("metrics_before_vllm.prom", "metrics_after_vllm.prom"):
        assert "vllm:prompt_tokens_total" in (case / name).read_text()
    # Both clients sent the planned prompt: vLLM's random dataset decodes ids with the tokenizer, and
    # enginesim counts its own tokens of that text.
    assert float(rows["prompt tokens/request (server)"][2]) == pytest.approx(1024, rel=0.05), rows
    tpot_vllm = float(rows["TPOT mean ms"][2])
    assert tpot_vllm == pytest.approx(result["mean_tpot_ms"], abs=0.01)  # vLLM's own figure


def test_preflight_refuses_vllm_bench_serve_when_the_runtime_cannot_run_it(run_env: dict) -> None:
    ev = dict(
        run_env["extravars"],
        run_id="novllm",
        case_ids="short_decode_c1",
        bench_client="vllm",
        bench_reference_tokenizer=str(Path(run_env["tmp"]) / "tok"),
    )
    res = run_cli(ev, "--tags", "fixed")
    assert res.rc != 0
    # The runtime has no vLLM: its version command (run first, by the python3 on PATH) fails, named.
    assert "vllm client version command `python3 -c " in res.output, res.output[-3000:]
    assert "No package metadata was found for vllm" in res.output, res.output[-3000:]
    assert not (run_env["results"] / "novllm" / "manifest.json").exists(), "refused after the run opened"
    assert not (run_env["results"] / "novllm" / "server").exists() or not any(
        (run_env["results"] / "novllm" / "server").glob("*.start1.log")
    ), "a server started"


def test_preflight_refuses_a_reference_client_without_a_local_tokenizer(run_env: dict) -> None:
    ev = dict(run_env["extravars"], run_id="notok", case_ids="short_decode_c1", bench_cross_check=True)
    res = run_cli(ev, "--tags", "fixed")
    assert res.rc != 0
    assert 'bench_reference_tokenizer="server"' in res.output, res.output[-3000:]


RUN = {"case_id": "c", "suite": "fixed", "rep": 1, "rel": "cases/c/rep1", "isl": 512, "osl": 64,
       "concurrency": 8, "num_prompts": 32, "warmup": 2, "stage": "short_decode"}  # fmt: skip
COMMON = ["--base-url", "http://10.0.0.1:30000", "--model", "served-m", "--tokenizer", "/tok dir",
          "--num-prompts", "32", "--max-concurrency", "8", "--request-rate", "inf", "--seed", "7",
          "--disable-tqdm"]  # fmt: skip


def _render(tmp: Path, client: str, **extra: object) -> list[str]:
    """reference_args.j2 through the roles' own template lookup, with the role defaults loaded."""
    out = tmp / f"out-{client}"
    out.mkdir()
    ev = {
        "render_out": str(out),
        "render_templates": [{"src": str(REPO / "roles/bench/templates/reference_args.j2"), "name": "args"}],
        "bench_run": RUN, "bench_client": client, "engine_name": "sglang", "engine_model_path": "/models/m",
        "engine_served_model_name": "served-m", "bench_server_host": "10.0.0.1", "bench_seed": 7,
        "bench_reference_tokenizer": "/tok dir", "quickmap_node_results_dir": "/r",
        "quickmap_results_dir": "/r",
        "quickmap_run_id": "x",
        **extra,
    }  # fmt: skip
    (tmp / f"ev-{client}.json").write_text(json.dumps(ev))
    cmd = [str(VENV_BIN / "ansible-playbook"), str(REPO / "tests/security/render_templates.yml"),
           "-e", f"@{tmp / f'ev-{client}.json'}"]  # fmt: skip
    p = subprocess.run(cmd, cwd=REPO, env=ansible_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:]
    return json.loads((out / "args").read_text())


def test_both_clients_render_the_same_workload_flag_by_flag(tmp_path: Path) -> None:
    sglang = _render(tmp_path, "sglang")
    assert sglang == ["--backend", "sglang", *COMMON, "--dataset-name", "random-ids",
                      "--random-input-len", "512", "--random-output-len", "64", "--random-range-ratio", "1.0",
                      "--warmup-requests", "2", "--output-file", "bench_sglang.jsonl", "--output-details",
                      "--flush-cache"]  # fmt: skip
    vllm = _render(tmp_path, "vllm")
    assert vllm == ["--backend", "vllm", *COMMON, "--dataset-name", "random",
                    "--random-input-len", "512", "--random-output-len", "64", "--random-range-ratio", "0",
                    "--ignore-eos", "--num-warmups", "2", "--save-result", "--save-detailed",
                    "--result-dir", ".", "--result-filename", "bench_vllm.json"]  # fmt: skip
