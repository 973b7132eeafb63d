"""bench_case: one task runs a case, keeps its command, and judges it by its result file.

Unit tests drive the module's main(); the last tests run the action plugin of the same name inside a
real ansible-playbook on localhost, which is what the bench role does per case (controller meta.json,
fetch, classification).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from tests.modules.test_bench_result import loadgen_result
from tests.rig.procs import alive

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK_BIN = REPO / ".venv" / "bin" / "ansible-playbook"


def writer_script(result: dict | None, rc: int = 0, extra: str = "") -> str:
    """A case script that writes ``result`` as bench.json (the client's job) and exits with ``rc``."""
    lines = ["#!/usr/bin/env bash", "echo client-log > bench.log", extra]
    if result is not None:
        lines.append(f"printf '%s' {shlex.quote(json.dumps(result))} > bench.json")
    lines.append(f"exit {rc}")
    return "\n".join(lines) + "\n"


def base_args(case_dir: Path, script: str, **extra: object) -> dict:
    args = {
        "case_dir": str(case_dir),
        "script": script,
        "timeout_s": 30,
        "expect_requests": 64,
        "expect_output_len": 128,
    }
    args.update(extra)
    return args


def test_good_result_passes_and_the_exact_command_is_kept(run, tmp_path: Path) -> None:
    script = writer_script(loadgen_result(64, 128))
    status, res = run("bench_case", base_args(tmp_path, script))
    assert status == "exit", res["msg"]
    assert res["passed"] and res["changed"] and res["rc"] == 0 and not res["timed_out"]
    assert (tmp_path / "bench_cmd.txt").read_text() == script
    assert res["completed"] == 64 and res["format"] == "loadgen"
    assert res["started_at"] <= res["ended_at"] and res["wall_s"] >= 0


def test_exit_code_zero_with_a_short_result_fails(run, tmp_path: Path) -> None:
    status, res = run("bench_case", base_args(tmp_path, writer_script(loadgen_result(63, 128))))
    assert status == "fail"
    assert res["reason"] == "count" and res["rc"] == 0
    assert "completed 63 != expected 64" in res["msg"]


def test_a_good_result_counts_even_when_the_client_exit_code_is_not_zero(run, tmp_path: Path) -> None:
    status, res = run("bench_case", base_args(tmp_path, writer_script(loadgen_result(64, 128), rc=3)))
    assert status == "exit" and res["passed"] and res["rc"] == 3


def test_timeout_kills_the_whole_process_group(run, tmp_path: Path) -> None:
    # The script leaves a grandchild behind; the timeout must end it too.
    script = "sleep 60 & echo $! > child.pid\nwait\n"
    t0 = time.monotonic()
    status, res = run("bench_case", base_args(tmp_path, script, timeout_s=1, kill_after_s=1))
    assert time.monotonic() - t0 < 20
    assert status == "fail" and res["timed_out"] and res["rc"] is None
    assert "ran past the safety limit of 1 s" in res["msg"] and res["limit"] == "safety_limit"
    child = int((tmp_path / "child.pid").read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"child {child} of the timed-out case is still running")


def test_timeout_exit_code_of_the_script_counts_as_timed_out(run, tmp_path: Path) -> None:
    status, res = run("bench_case", base_args(tmp_path, writer_script(None, rc=124)))
    assert status == "fail" and res["timed_out"] and res["reason"] == "missing"


def test_the_case_timeout_is_named_and_what_the_client_wrote_is_kept(run, tmp_path: Path) -> None:
    """`timeout` ends the client at the case's own limit (4 s here); the client writes the records it
    has on SIGTERM. The failure names that limit, not the safety limit above it, and the partial result
    stays, judged (3 of 64 completed)."""
    partial = loadgen_result(3, 128)
    partial["complete"] = False
    (tmp_path / "partial.json").write_text(json.dumps(partial))
    (tmp_path / "client.sh").write_text("trap 'cp partial.json bench.json; exit 143' TERM\nsleep 30 & wait\n")
    script = "timeout -k 2 1 bash client.sh\n"
    status, res = run(
        "bench_case", base_args(tmp_path, script, timeout_s=44, case_timeout_s=4, kill_after_s=2)
    )
    assert status == "fail" and res["timed_out"] and res["limit"] == "case_timeout"
    assert "ran past its case timeout of 4 s" in res["msg"]
    assert "44 s" not in res["msg"]
    assert json.loads((tmp_path / "bench.json").read_text())["completed"] == 3
    assert res["completed"] == 3 and "completed 3" in res["msg"]


def test_a_secret_in_the_case_command_is_saved_masked_and_still_runs(run, tmp_path: Path) -> None:
    canary = "CANARY-bench-5151"
    script = f"echo --api-key {canary} > seen.txt\n" + writer_script(loadgen_result(64, 128))
    status, res = run("bench_case", base_args(tmp_path, script))
    assert status == "exit", res["msg"]
    assert canary not in (tmp_path / "bench_cmd.txt").read_text()
    assert "--api-key ***" in (tmp_path / "bench_cmd.txt").read_text()
    assert (tmp_path / "seen.txt").read_text().strip() == f"--api-key {canary}", "the real text did not run"


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def health_url() -> str:
    server = HTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/health"
    server.shutdown()
    server.server_close()


def test_failure_probes_the_server_from_the_node(run, tmp_path: Path, health_url: str) -> None:
    status, res = run("bench_case", base_args(tmp_path, writer_script(None), health_url=health_url))
    assert status == "fail" and res["server_alive"] is True
    dead = "http://127.0.0.1:9/health"
    status, res = run("bench_case", base_args(tmp_path, writer_script(None), health_url=dead))
    assert status == "fail" and res["server_alive"] is False


def test_run_false_judges_without_running(run, tmp_path: Path) -> None:
    (tmp_path / "bench.json").write_text(json.dumps(loadgen_result(64, 128)))
    status, res = run("bench_case", base_args(tmp_path, None, run=False, rc=0))
    assert status == "exit" and res["passed"]
    assert not (tmp_path / "bench_cmd.txt").exists()


def test_check_mode_writes_and_runs_nothing(run, tmp_path: Path) -> None:
    status, res = run("bench_case", base_args(tmp_path, "touch ran\n"), check_mode=True)
    assert status == "exit" and not res["changed"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"timeout_s": 0}, "timeout_s=0 (rule: >= 1 second)"),
        ({"expect_requests": 0}, "expect_requests=0 (rule: >= 1)"),
        ({"result_file": "../x.json"}, "result_file='../x.json' (rule: a path inside case_dir)"),
        ({"min_output_fraction": 1.5}, "min_output_fraction=1.5 (rule: 0 < f <= 1)"),
    ],
)
def test_bad_arguments_are_refused_before_anything_runs(
    run, tmp_path: Path, extra: dict, needle: str
) -> None:
    status, res = run("bench_case", base_args(tmp_path, "touch ran\n", **extra))
    assert status == "fail" and needle in res["msg"]
    assert not (tmp_path / "ran").exists()


# ------------------------------------------------------------------ the action plugin, in real Ansible

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: cases
      bench_case:
        label: "{{ item.rel }}"
        case_dir: "{{ node }}/{{ item.rel }}"
        controller_case_dir: "{{ ctrl }}/{{ item.rel }}"
        node_is_controller: false
        script: "{{ item.script }}"
        timeout_s: "{{ item.timeout | default(30) }}"
        kill_after_s: 1
        expect_requests: "{{ item.expect | default(64) }}"
        expect_output_len: 128
        health_url: "{{ item.health | default(health) }}"
        server_log: "{{ node }}/server.log"
        meta: {case_id: "{{ item.rel }}", isl: 1024, bench_cmd: "HF_TOKEN=hf_abcdefghijklmnopqrstuv loadgen"}
      loop: "{{ cases }}"
      register: out
      ignore_errors: true
    - name: keep the results
      ansible.builtin.copy:
        content: "{{ out | to_json }}"
        dest: "{{ ctrl }}/out.json"
        mode: "0644"
"""


CONNECTION_PLUGINS = Path(__file__).resolve().parent / "connection_plugins"


def run_play(
    tmp_path: Path,
    cases: list[dict],
    health: str,
    connection: str = "local",
    play: str = PLAY,
    env_extra: dict | None = None,
) -> list[dict]:
    """Run PLAY over ``cases``; ``connection=quickmap_module_local`` forces the module path locally."""
    node, ctrl = tmp_path / "node", tmp_path / "ctrl"
    for c in cases:
        (node / c["rel"]).mkdir(parents=True)
    (node / "server.log").write_text("server up\n")
    ctrl.mkdir()
    (tmp_path / "play.yml").write_text(play)
    (tmp_path / "vars.json").write_text(
        json.dumps({"node": str(node), "ctrl": str(ctrl), "cases": cases, "health": health})
    )
    env = dict(os.environ, LC_ALL="C.UTF-8", ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    env["ANSIBLE_HOME"] = str(tmp_path / "ansible_home")
    env["ANSIBLE_CONNECTION_PLUGINS"] = str(CONNECTION_PLUGINS)
    env.update(env_extra or {})
    argv = [str(PLAYBOOK_BIN), "-i", "localhost,", "-c", connection, str(tmp_path / "play.yml")]
    argv += ["-e", f"ansible_python_interpreter={sys.executable}", "-e", f"@{tmp_path / 'vars.json'}"]
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return json.loads((ctrl / "out.json").read_text())["results"]


@pytest.mark.skipif(not PLAYBOOK_BIN.exists(), reason=f"{PLAYBOOK_BIN} not installed (make venv)")
def test_action_records_meta_fetches_and_classifies(tmp_path: Path, health_url: str) -> None:
    cases = [
        {"rel": "good", "script": writer_script(loadgen_result(64, 128))},
        {"rel": "short", "script": writer_script(loadgen_result(64, 100))},
        {"rel": "slow", "script": "sleep 30\n", "timeout": 1},
    ]
    results = run_play(tmp_path, cases, health_url)
    ctrl = tmp_path / "ctrl"
    good = json.loads((ctrl / "good" / "meta.json").read_text())
    assert good["status"] == "completed" and good["isl"] == 1024
    assert [h["status"] for h in good["history"]] == ["running", "completed"]
    assert "hf_abcdefghijklmnopqrstuv" not in json.dumps(good)  # secrets never land in meta
    assert good["started_at"] < good["ended_at"]
    # a remote head: the result file was brought to the controller
    assert json.loads((ctrl / "good" / "bench.json").read_text())["completed"] == 64
    assert not results[0].get("failed")

    short = json.loads((ctrl / "short" / "meta.json").read_text())
    assert short["status"] == "failed" and short["error_type"] == "BENCH_FAILED"
    assert "have fewer than 128 output tokens" in short["reason"]
    assert results[1]["failed"] and results[1]["case_failed"]["error_type"] == "BENCH_FAILED"
    # the evidence of a failure is on the controller
    assert (ctrl / "short" / "bench.log").read_text() == "client-log\n"
    assert (ctrl / "short" / "server_log_at_failure.log").read_text() == "server up\n"

    slow = json.loads((ctrl / "slow" / "meta.json").read_text())
    assert slow["status"] == "failed" and slow["error_type"] == "TIMEOUT"


@pytest.mark.skipif(not PLAYBOOK_BIN.exists(), reason=f"{PLAYBOOK_BIN} not installed (make venv)")
def test_action_calls_a_dead_server_dead(tmp_path: Path) -> None:
    results = run_play(tmp_path, [{"rel": "c", "script": writer_script(None)}], "http://127.0.0.1:9/health")
    meta = json.loads((tmp_path / "ctrl" / "c" / "meta.json").read_text())
    assert meta["error_type"] == "SERVER_DEAD"
    assert results[0]["case_failed"]["error_type"] == "SERVER_DEAD"


@pytest.mark.skipif(not PLAYBOOK_BIN.exists(), reason=f"{PLAYBOOK_BIN} not installed (make venv)")
def test_a_remote_head_returns_the_case_files_with_its_answer(tmp_path: Path, health_url: str) -> None:
    """The case's files come back inside the module's answer: only a file over 1 MiB costs a transfer of
    its own, and the twelve absent reference-client files cost none (each was a failed SSH transfer and
    its fallbacks, most of a case's Ansible time on the rig)."""
    extra = (
        "printf 'enginesim:steps_total 7\\n' > metrics_before.prom\n"
        "head -c 1100000 /dev/zero | tr '\\0' x > metrics_after.prom\n"
        "echo outside-secret > ../../outside.txt && ln -s ../../outside.txt bench_vllm.log"
    )
    cases = [{"rel": "good", "script": writer_script(loadgen_result(64, 128), extra=extra)}]
    log = tmp_path / "fetches.log"
    run_play(
        tmp_path,
        cases,
        health_url,
        connection="quickmap_module_local",
        env_extra={"QM_TEST_FETCH_LOG": str(log)},
    )
    node, ctrl = tmp_path / "node" / "good", tmp_path / "ctrl" / "good"
    for name in ("bench.json", "bench.log", "metrics_before.prom", "metrics_after.prom"):
        assert (ctrl / name).read_bytes() == (node / name).read_bytes(), name
    assert log.read_text().splitlines() == [str(node / "metrics_after.prom")]
    assert not (ctrl / "bench_vllm.log").exists()  # a link in the case dir is never followed
    assert json.loads((ctrl / "meta.json").read_text())["status"] == "completed"


# --------------------------------------------- in-process (local head) and module path: one result

_VOLATILE = ("started_at", "ended_at", "wall_s")


def _comparable(tmp_path: Path, results: list[dict]) -> list[dict]:
    """Per case: the node-side result and meta.json's verdict, with times and the run's root masked."""
    out = []
    for res in results:
        case = {k: v for k, v in res.get("case", {}).items() if k not in _VOLATILE}
        meta = json.loads((Path(res["case_dir"]) / "meta.json").read_text())
        verdict = {k: meta.get(k) for k in ("status", "error_type", "reason")}
        row = {
            "case": case,
            "meta": verdict,
            "failed": bool(res.get("failed")),
            "case_failed": res.get("case_failed"),
        }
        out.append(json.loads(json.dumps(row).replace(str(tmp_path), "<root>")))
    return out


@pytest.mark.skipif(not PLAYBOOK_BIN.exists(), reason=f"{PLAYBOOK_BIN} not installed (make venv)")
def test_in_process_and_module_paths_give_identical_results(tmp_path: Path, health_url: str) -> None:
    """The same eleven cases (ok, short, timeouts, dead and live server, unreadable output, a secret, a
    broken rule) run in-process (connection local) and through the shipped module: same results."""
    dead = "http://127.0.0.1:9/health"
    garbage = "echo client-log > bench.log\nprintf '{\"completed\": ' > bench.json\n"
    cases = [
        {"rel": "ok", "script": writer_script(loadgen_result(64, 128))},
        {"rel": "ok_rc3", "script": writer_script(loadgen_result(64, 128), rc=3)},
        {"rel": "short_output", "script": writer_script(loadgen_result(64, 100))},
        {"rel": "count", "script": writer_script(loadgen_result(63, 128))},
        {"rel": "no_result_server_dead", "script": writer_script(None), "health": dead},
        {"rel": "no_result_server_alive", "script": writer_script(None)},
        {"rel": "bad_output", "script": garbage},
        {"rel": "case_timeout_rc124", "script": writer_script(None, rc=124)},
        {"rel": "safety_limit", "script": "sleep 30\n", "timeout": 1},
        {
            "rel": "secret",
            "script": "echo --api-key CANARY-77 > seen.txt\n" + writer_script(loadgen_result(64, 128)),
        },
        {"rel": "broken_rule", "script": "touch ran\n", "expect": 0},
    ]
    in_process = run_play(tmp_path / "a", cases, health_url)
    module = run_play(tmp_path / "b", cases, health_url, connection="quickmap_module_local")
    assert [r["node_side"] for r in in_process] == ["in_process"] * len(cases)
    assert [r["node_side"] for r in module] == ["module"] * len(cases)
    got_in, got_mod = _comparable(tmp_path / "a", in_process), _comparable(tmp_path / "b", module)
    for case, a, b in zip(cases, got_in, got_mod, strict=True):
        assert a == b, f"case {case['rel']}: in-process {a} != module {b}"
    # the outcomes really vary (a broken comparison would pass on eleven identical failures)
    kinds = {(row["meta"]["status"], row["meta"]["error_type"]) for row in got_in}
    assert {
        ("completed", None),
        ("failed", "BENCH_FAILED"),
        ("failed", "SERVER_DEAD"),
        ("failed", "TIMEOUT"),
    } <= kinds
    assert not (tmp_path / "a" / "node" / "broken_rule" / "ran").exists()
    assert "CANARY-77" not in (tmp_path / "a" / "node" / "secret" / "bench_cmd.txt").read_text()


@pytest.mark.skipif(not PLAYBOOK_BIN.exists(), reason=f"{PLAYBOOK_BIN} not installed (make venv)")
def test_a_task_environment_takes_the_module_path_and_reaches_the_script(
    tmp_path: Path, health_url: str
) -> None:
    """In-process would run the script with the controller's environment, not the task's: a task with
    `environment:` ships the module (as does become or async), and the variable reaches the script."""
    script = 'echo "$QM_PROBE" > probe.txt\n' + writer_script(loadgen_result(64, 128))
    play = PLAY.replace("      loop:", '      environment: {QM_PROBE: "from-the-task"}\n      loop:', 1)
    assert play != PLAY
    results = run_play(tmp_path, [{"rel": "env", "script": script}], health_url, play=play)
    assert results[0]["node_side"] == "module" and not results[0].get("failed")
    assert (tmp_path / "node" / "env" / "probe.txt").read_text().strip() == "from-the-task"


def test_a_stop_ends_the_client_that_timeout_put_in_a_group_of_its_own(run, tmp_path: Path) -> None:
    """`timeout` makes itself and the client a process group of their own; the safety limit must end
    that group too, not only the script's (the client used to run on, an orphan loadgen)."""
    script = "timeout -k 5 60 bash -c 'echo $$ > client.pid; sleep 60; true' > client.log 2>&1\n"
    t0 = time.monotonic()
    status, res = run("bench_case", base_args(tmp_path, script, timeout_s=2, kill_after_s=2))
    assert time.monotonic() - t0 < 20, "the stop waited for the client to end by itself"
    assert status == "fail" and res["limit"] == "safety_limit"
    client = int((tmp_path / "client.pid").read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and alive(client):
        time.sleep(0.05)
    assert not alive(client), f"client {client} (timeout's own process group) outlived the stop"
