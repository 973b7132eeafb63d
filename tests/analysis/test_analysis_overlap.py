"""check-overlap: the A/B counts only when the injection was sent inside the background's main phase."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.__main__ import main

T0 = 1_800_000_000.0


def _rep(tmp_path: Path, sent_after_t0: float) -> Path:
    rep = tmp_path / "run" / "mixed" / "rep1"
    bg, inj = rep / "decode_background", rep / "prefill_injection"
    for d in (bg, inj):
        d.mkdir(parents=True)
        (d / "meta.json").write_text(
            json.dumps({"status": "completed", "ended_at": "2027-01-15T08:00:00Z", "history": [1, 2]})
        )
    (bg / "bench.json").write_text(json.dumps({"t0_epoch_s": T0, "main_start_s": 2.0, "main_end_s": 10.0}))
    (inj / "bench.json").write_text(
        json.dumps({"t0_epoch_s": T0 + 5.0, "requests": [{"send_s": sent_after_t0 - 5.0}]})
    )
    return rep


def _meta(rep: Path, role: str) -> dict:
    return json.loads((rep / role / "meta.json").read_text())


def test_injection_inside_the_main_phase_is_proved_and_nothing_else_changes(tmp_path, capsys):
    rep = _rep(tmp_path, sent_after_t0=6.0)
    assert main(["check-overlap", str(rep)]) == 0
    assert "4.000 s into a 8.000 s main phase" in capsys.readouterr().out
    for role in ("decode_background", "prefill_injection"):
        meta = _meta(rep, role)
        assert meta["status"] == "completed" and meta["overlap_proved"] is True
        assert meta["injection_sent_epoch_s"] == pytest.approx(T0 + 6.0)
        assert meta["background_main_end_epoch_s"] == pytest.approx(T0 + 10.0)
        assert meta["ended_at"] == "2027-01-15T08:00:00Z" and meta["history"] == [1, 2]


@pytest.mark.parametrize("sent", [10.5, 1.0], ids=["after-the-end", "before-the-start"])
def test_injection_outside_the_main_phase_fails_both_roles(tmp_path, capsys, sent):
    """The race the liveness check cannot close: the background ended while the injection went out."""
    rep = _rep(tmp_path, sent_after_t0=sent)
    assert main(["check-overlap", str(rep)]) == 1
    assert capsys.readouterr().out.startswith("no overlap: injection sent at")
    for role in ("decode_background", "prefill_injection"):
        meta = _meta(rep, role)
        assert meta["status"] == "failed" and meta["error_type"] == "BACKGROUND_FINISHED_BEFORE_INJECTION"
        assert meta["overlap_proved"] is False


def test_missing_or_malformed_result_is_a_clear_input_error(tmp_path, capsys):
    rep = _rep(tmp_path, sent_after_t0=6.0)
    (rep / "prefill_injection" / "bench.json").write_text(json.dumps({"t0_epoch_s": T0, "requests": []}))
    assert main(["check-overlap", str(rep)]) == 2
    err = capsys.readouterr().err
    assert "prefill_injection/bench.json" in err and "requests" in err
    (rep / "decode_background" / "bench.json").unlink()
    assert main(["check-overlap", str(rep)]) == 2
    assert "decode_background/bench.json" in capsys.readouterr().err
    assert _meta(rep, "decode_background")["status"] == "completed"
