"""ITL per event and per token: the per-token list is split only where a later event carried
several tokens; otherwise it is the per-event list itself (results.build relies on that)."""

from __future__ import annotations

import pytest

from loadgen.results import itl_samples

MS = 1_000_000  # ns


def test_one_token_per_event_gives_the_same_list():
    ev, tok = itl_samples([0, 10 * MS, 30 * MS], [1, 1, 1])
    assert ev == pytest.approx([0.010, 0.020]) and tok is ev


def test_extra_tokens_in_the_first_event_add_no_gap():
    ev, tok = itl_samples([0, 10 * MS, 30 * MS], [3, 1, 1])
    assert ev == pytest.approx([0.010, 0.020]) and tok is ev


def test_a_later_multi_token_event_splits_its_gap():
    ev, tok = itl_samples([0, 10 * MS, 30 * MS], [1, 2, 1])
    assert ev == pytest.approx([0.010, 0.020])
    assert tok == pytest.approx([0.005, 0.005, 0.020])
