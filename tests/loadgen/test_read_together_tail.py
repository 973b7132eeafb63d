"""A few late reads can move the ITL p99 by more than its 1 ms target: then it is not reported reliable.

Issue 15 item 8: at C=256 with TTFT 80 ms, loadgen's ITL p99 read +2 ms against the server's truth
while fewer than 0.5% of the events were read together with the next one (the share past which a run
was already unreliable), so the wrong p99 was called reliable. Each such read stretches one gap by
the gap(s) it swallowed, and those stretched gaps land in the tail: a handful of them moves the p99
when the tail is steep. The self-check now spreads every run of events read together back out
(``spread_together``) and reports how far that moves the ITL p99 (``itl_p99_ambiguity_ms``); past
1 ms the run is ``reliable: false``, naming the figure.
"""

from __future__ import annotations

import itertools
import math

from loadgen.records import RequestRecord
from loadgen.results import build, pct

MS = 1_000_000
STREAMS, EVENTS = 40, 128  # 5080 event gaps
ITL_P99_TARGET_MS = 1.0
COUNT_LIMIT = 0.005  # share of gaps read together past which a run was already unreliable
GOLDEN = (math.sqrt(5) - 1) / 2


def server_gap_ns(n: int) -> int:
    """The n-th gap the server kept, spread evenly over its distribution (golden-ratio sequence, no
    randomness): a body of 10-10.5 ms and a 1.5% tail up to 20 ms, as a loaded server's. The p99 sits
    on the tail's slope, where a few extra long gaps move it."""
    u = (n * GOLDEN) % 1
    ms = 10 + 0.5 * u / 0.985 if u < 0.985 else 11 + 9 * (u - 0.985) / 0.015
    return round(ms * MS)


def true_streams() -> list[list[int]]:
    """Every stream's event send times (ns)."""
    streams, n = [], 0
    for i in range(STREAMS):
        t = 50 * MS + i * 1000
        times = [t]
        for _ in range(EVENTS - 1):
            n += 1
            t += server_gap_ns(n)
            times.append(t)
        streams.append(times)
    return streams


def read_late(streams: list[list[int]], behind: int, at: int) -> list[list[int]]:
    """What the client saw when it fell one event behind ``behind`` streams at event ``at`` (a busy
    moment): that event came back in one read with the next, so it carries the next one's time."""
    out = [list(s) for s in streams]
    for s in out[:behind]:
        s[at] = s[at + 1]
    return out


def record(index: int, ev_times: list[int]) -> RequestRecord:
    return RequestRecord(index, 0, 0, 1, ev_times[-1] + 1, 200, None, None, ev_times, [1] * len(ev_times),
                         len(ev_times), 8, "server", 0, 1, 0)  # fmt: skip


def result_of(streams: list[list[int]]) -> dict:
    cfg = {"t0_epoch_s": 0.0, "backend": "sglang"}
    recs = [record(i, s) for i, s in enumerate(streams)]
    return build(cfg, recs, 0, 0, 10**10, [0.001] * 10, False, True, 25.0, [])


def itl_p99_ms(streams: list[list[int]]) -> float:
    return pct(sorted((b - a) / MS for s in streams for a, b in itertools.pairwise(s)), 99)


def test_late_reads_below_the_count_limit_that_move_the_itl_p99_make_the_run_unreliable():
    truth = true_streams()
    for at in (30, 60, 100):
        res = result_of(read_late(truth, behind=24, at=at))
        rel = res["reliability"]
        # the premise: too few reads together for the count rule (24 of 5080 gaps), yet the reported
        # ITL p99 is more than its 1 ms target off the server's (+2.7..2.8 ms here)
        assert rel["events_read_together"] == 24 < COUNT_LIMIT * rel["event_gaps"]
        error = res["p99_itl_ms"] - itl_p99_ms(truth)
        assert error > 2 * ITL_P99_TARGET_MS
        assert res["reliable"] is False, f"ITL p99 off by {error:+.2f} ms reported as reliable"
        # the ambiguity found is the error made (the late reads are its only source here)
        assert abs(rel["itl_p99_ambiguity_ms"] - error) < 0.1
        reason = [r for r in rel["reasons"] if r.startswith("ITL p99 ambiguity")]
        assert reason and "> 1 ms" in reason[0] and "24 events read together" in reason[0], rel["reasons"]


def test_the_same_streams_read_on_time_stay_reliable():
    res = result_of(true_streams())
    assert res["reliable"] is True, res["reliability"]["reasons"]
    assert res["reliability"].get("itl_p99_ambiguity_ms") == 0.0


def test_events_the_server_wrote_at_once_after_an_ordinary_gap_move_nothing():
    """A server that sends two events in one write after its usual gap: the run is split evenly,
    the tail does not move, and the run stays reliable (the count rule still applies past 0.5%)."""
    seen = [list(s) for s in true_streams()]
    for s in seen[:5]:
        s[60] = s[61] = s[59] + 10 * MS
    res = result_of(seen)
    assert res["reliability"]["events_read_together"] == 5
    assert res["reliability"].get("itl_p99_ambiguity_ms", 9.9) < 0.2
    assert res["reliable"] is True


def test_spread_together_gives_a_late_run_its_streams_usual_spacing():
    from loadgen.results import spread_together

    # 10 ms gaps; the events at 30 and 40 ms were read with the one at 50 ms
    assert spread_together([10 * MS, 20 * MS, 50 * MS, 50 * MS, 50 * MS, 60 * MS], 0) == [
        10 * MS, 20 * MS, 30 * MS, 40 * MS, 50 * MS, 60 * MS]  # fmt: skip
    # never before the previous event: an ordinary gap is split evenly
    assert spread_together([10 * MS, 20 * MS, 30 * MS, 30 * MS, 40 * MS, 50 * MS], 0)[2] == 25 * MS
    # a run that opens the stream is bounded by the send time
    assert spread_together([4 * MS, 4 * MS, 14 * MS, 24 * MS], 0)[0] == 2 * MS  # 0..4 ms split evenly
    evt = [10 * MS, 20 * MS]
    assert spread_together(evt, 0) is evt
