"""engine_flags: a server flag the engine version's own --help does not list is refused before start.

The help texts come from enginesim's argparse parsers at the emulated versions (SGLang 0.5.6 and 0.5.23,
which differ in the CUDA-graph flags), run as a process exactly as the process runtime runs the engine;
one test reads an argparse help whose description mentions a flag the version does not take.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ansible.module_utils.engine_help import (
    apply_renames,
    flag_words,
    help_flags,
    parse_version,
    rename_map,
    unknown_flags,
    validate_renames,
)

SIM = [sys.executable, "-m", "enginesim", "sglang"]
RENAMES = {"--cuda-graph-max-bs": [{"since": "0.5.23", "flag": "--cuda-graph-max-bs-decode"}]}
SEED_FLAGS = ["--model-path", "/models/m", "--tp-size", "16", "--cuda-graph-max-bs-decode", "64"]
RENDERED = "--model-path /models/m --tp-size 16 --cuda-graph-max-bs 64 --chunked-prefill-size -1"


def sim_args(version: str, cache: Path, **extra: object) -> dict:
    return {
        "engine": "sglang",
        "runtime": "process",
        "help_command": [*SIM, "--sim-engine-version", version, "--help"],
        "version_command": [*SIM, "--sim-engine-version", version, "--sim-print-version"],
        "cache_dir": str(cache),
        **extra,
    }


def test_seed_spelling_refused_by_0_5_6_naming_flag_and_version(run, tmp_path: Path) -> None:
    status, res = run("engine_flags", sim_args("0.5.6", tmp_path, flags=SEED_FLAGS))
    assert status == "fail", res
    assert res["unknown"] == ["--cuda-graph-max-bs-decode"]
    assert res["msg"].startswith("--cuda-graph-max-bs-decode: a flag unknown to sglang 0.5.6"), res["msg"]
    assert res["version"] == "0.5.6"


def test_seed_spelling_accepted_by_0_5_23(run, tmp_path: Path) -> None:
    status, res = run("engine_flags", sim_args("0.5.23", tmp_path, flags=SEED_FLAGS))
    assert status == "exit", res
    assert res["unknown"] == [] and res["version"] == "0.5.23"


def test_inventory_rename_picks_the_spelling_of_the_detected_version(run, tmp_path: Path) -> None:
    args = sim_args("0.5.23", tmp_path / "a", flags_lines=[RENDERED], renames=RENAMES)
    status, res = run("engine_flags", args)
    assert status == "exit", res
    assert res["rename_map"] == {"--cuda-graph-max-bs": "--cuda-graph-max-bs-decode"}
    assert "--cuda-graph-max-bs-decode" in res["flags"] and "--cuda-graph-max-bs" not in res["flags"]
    status, res = run(
        "engine_flags", sim_args("0.5.6", tmp_path / "b", flags_lines=[RENDERED], renames=RENAMES)
    )
    assert status == "exit", res
    assert res["rename_map"] == {} and "--cuda-graph-max-bs" in res["flags"]


def test_help_is_cached_per_digest_and_not_written_in_check_mode(run, tmp_path: Path) -> None:
    status, res = run("engine_flags", sim_args("0.5.6", tmp_path, flags=SEED_FLAGS[:2]), check_mode=True)
    assert status == "exit" and not res["cached"] and not list(tmp_path.iterdir())
    status, res = run("engine_flags", sim_args("0.5.6", tmp_path, flags=SEED_FLAGS[:2]))
    assert status == "exit" and not res["cached"]
    cached = json.loads(Path(res["cache_file"]).read_text())
    assert "--cuda-graph-max-bs" in cached["help"] and cached["version_output"].strip() == "0.5.6"
    # docker runtime keys the cache by image id; for the process runtime by command + version, so the
    # second run of the same command re-runs it but finds the same key.
    assert Path(res["cache_file"]).name.startswith("cmd-")


def _fake_docker(tmp_path: Path, monkeypatch, image_id: str, body: str) -> Path:
    """A `docker` first on PATH that logs its arguments to the returned file, answers `image inspect`
    with `image_id` and runs the shell `body` for anything else."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    (bin_dir / "docker").write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\n'
        f'if [ "$1" = image ]; then echo \'[{{"Id": "{image_id}"}}]\'; exit 0; fi\n' + body
    )
    (bin_dir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return calls


def test_docker_runtime_reads_the_cache_of_the_image_digest(run, tmp_path: Path, monkeypatch) -> None:
    """A cached help for the image id is used without running the image (the resume path)."""
    calls = _fake_docker(tmp_path, monkeypatch, "sha256:abc", "exit 99\n")
    cache = tmp_path / "cache"
    cache.mkdir()
    help_text = (
        "usage: launch_server.py [-h] --model-path MODEL_PATH\n\noptions:\n  --model-path MODEL_PATH\n"
    )
    (cache / "sha256-abc.json").write_text(
        json.dumps({"version_output": "Version: 0.5.6\n", "help": help_text})
    )
    args = {
        "engine": "sglang",
        "runtime": "docker",
        "image": "lmsysorg/sglang:v0.5.6-cu129",
        "help_command": ["python3", "-m", "sglang.launch_server", "--help"],
        "version_command": ["python3", "-m", "pip", "show", "sglang"],
        "flags": ["--model-path", "m", "--tp-size", "2"],
        "cache_dir": str(cache),
    }
    status, res = run("engine_flags", args)
    assert status == "fail" and res["cached"] and res["unknown"] == ["--tp-size"], res
    assert "sglang 0.5.6 in lmsysorg/sglang:v0.5.6-cu129 (sha256:abc)" in res["msg"]
    assert calls.read_text().splitlines() == ["image inspect lmsysorg/sglang:v0.5.6-cu129"]


def test_help_that_fails_is_an_error_naming_the_command(run, tmp_path: Path) -> None:
    args = sim_args("0.5.6", tmp_path, flags=SEED_FLAGS)
    args["help_command"] = [*SIM, "--sim-engine-version", "9.9", "--help"]
    status, res = run("engine_flags", args)
    assert status == "fail" and "exited 2" in res["msg"] and "9.9" in res["msg"], res


HELP = """usage: launch_server.py [-h] --model-path MODEL_PATH [--tp-size TP_SIZE]
                        [--trust-remote-code | --no-trust-remote-code]

options:
  -h, --help            show this help message and exit
  --model-path MODEL_PATH, --model MODEL_PATH
                        The path of the model weights.
  --tp-size TP_SIZE, --tensor-parallel-size TP_SIZE, --tp TP_SIZE
                        The tensor parallelism size.
  --cuda-graph-max-bs CUDA_GRAPH_MAX_BS
                        Deprecated: use --cuda-graph-max-bs-decode
                        --speculative-ngram-capacity is not a flag here either.
  --compilation-config COMPILATION_CONFIG, -O COMPILATION_CONFIG
"""


def test_help_flags_reads_options_not_descriptions() -> None:
    flags = help_flags(HELP)
    assert {
        "--model-path",
        "--model",
        "--tp",
        "--tensor-parallel-size",
        "-h",
        "--no-trust-remote-code",
    } <= flags
    assert {"--cuda-graph-max-bs", "--compilation-config", "-O"} <= flags
    assert "--cuda-graph-max-bs-decode" not in flags and "--speculative-ngram-capacity" not in flags


def test_flag_words_unknown_and_renames() -> None:
    words = ["--chunked-prefill-size", "-1", "--tp=2", "--compilation-config.level", "3", "x"]
    assert flag_words(words) == ["--chunked-prefill-size", "--tp", "--compilation-config.level"]
    assert unknown_flags(words, help_flags(HELP)) == ["--chunked-prefill-size"]
    assert apply_renames(["--a=1", "--a", "2", "a"], {"--a": "--b"}) == ["--b=1", "--b", "2", "a"]


def test_versions_and_rename_rules() -> None:
    assert parse_version("Name: sglang\nVersion: 0.5.6.post2\n") == "0.5.6.post2"
    assert parse_version("0.11.2\n") == "0.11.2"
    assert rename_map(RENAMES, "0.5.22") == {} and rename_map(RENAMES, None) == {}
    assert rename_map(RENAMES, "0.5.23rc1") == {}
    assert rename_map(RENAMES, "0.5.30") == {"--cuda-graph-max-bs": "--cuda-graph-max-bs-decode"}
    assert "needs exactly since and flag" in validate_renames({"--a": [{"flag": "--b"}]})
    assert "is not a flag" in validate_renames({"--a": [{"since": "1.0", "flag": "b; rm"}]})
    assert validate_renames(RENAMES) is None


def test_docker_help_runs_with_the_servers_gpus(run, tmp_path: Path, monkeypatch) -> None:
    """vLLM's `vllm serve --help` and `vllm --version` fail in a container that sees no GPU (vLLM 0.11.2:
    "Failed to infer device type"); the image's help must run with the GPUs the server will get."""
    calls = _fake_docker(
        tmp_path,
        monkeypatch,
        "sha256:vv",
        'case " $* " in *" --gpus all "*) ;;\n'
        '  *) echo "RuntimeError: Failed to infer device type" >&2; exit 1;; esac\n'
        'case "$*" in *--version) echo 0.11.2;;\n'
        '  *--help) printf "options:\\n  --max-num-seqs MAX_NUM_SEQS\\n";; esac\n',
    )
    args = {
        "engine": "vllm",
        "runtime": "docker",
        "image": "vllm/vllm-openai:v0.11.2",
        "help_command": ["vllm", "serve", "--help"],
        "version_command": ["vllm", "--version"],
        "flags": ["--max-num-seqs", "256"],
        "cache_dir": str(tmp_path / "a"),
    }
    status, res = run("engine_flags", args)
    assert status == "fail" and "Failed to infer device type" in res["msg"], res
    gpus = dict(args, cache_dir=str(tmp_path / "b"), docker_args=["--gpus", "all"])
    status, res = run("engine_flags", gpus)
    assert status == "exit" and res["version"] == "0.11.2" and res["unknown"] == [], res
    runs = [line.split() for line in calls.read_text().splitlines() if line.startswith("run ")]
    image, gpu_opts = "vllm/vllm-openai:v0.11.2", ["--gpus", "all"]
    assert runs[-1] == ["run", "--rm", "--entrypoint", *gpu_opts, image, "vllm", "serve", "--help"]
