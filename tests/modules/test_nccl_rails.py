"""The NCCL gate's both-rails rule (min_hcas) judged on real NCCL NET/IB lines (fixtures/nccl_rails).

Real NCCL given NCCL_IB_HCA with one listed HCA missing uses the others without a word (net_ib.cc
skips what it cannot find): the log shows fewer HCAs on its NET/IB line, and only a count rule sees it.
"""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "nccl_rails"
TWO = str(FIXTURES / "nccltests228_two_hcas.log")
ONE = str(FIXTURES / "nccl1029_one_hca_sharp.log")


def gate(run, log: str, min_hcas: int, expected: list[str] | None = None):
    args = {"log": log, "nnodes": 2, "timeout": 0, "expected_hcas": expected or [], "min_hcas": min_hcas}
    return run("nccl_transport", args)


def test_two_rails_on_a_real_line_pass_the_rule(run) -> None:
    kind, res = gate(run, TWO, 2, ["mlx5_0:1", "mlx5_2:1"])
    assert kind == "exit" and res["passed"], res["msg"]
    assert res["logs"][0]["hcas"] == ["mlx5_0:1", "mlx5_2:1"]


def test_one_rail_fails_the_rule_that_any_hca_would_pass(run) -> None:
    kind, res = gate(run, ONE, 0)
    assert kind == "exit" and res["passed"], res["msg"]  # any HCA: one rail is IB, so it passed
    kind, res = gate(run, ONE, 2)
    assert kind == "fail" and not res["passed"]
    assert "NET/IB uses 1 HCA(s) (mlx5_9:1), fewer than min_hcas=2" in res["msg"], res["msg"]


def test_a_missing_expected_rail_is_named(run) -> None:
    kind, res = gate(run, TWO, 3, ["mlx5_0:1", "mlx5_2:1", "mlx5_3:1"])
    assert kind == "fail"
    assert (
        "expected HCA mlx5_3:1 missing" in res["msg"]
        and "fewer than min_hcas=3" in res["logs"][0]["problems"][-1]
    )


def test_negative_min_hcas_is_refused(run) -> None:
    kind, res = gate(run, TWO, -1)
    assert kind == "fail" and "min_hcas=-1 (rule: >= 0)" in res["msg"]
