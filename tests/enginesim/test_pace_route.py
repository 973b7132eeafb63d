"""POST /enginesim/pace: the case's replay runs inside the server (no replay process per case) and
answers as `python -m enginesim replay` would, refusals included."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from test_fidelity import FLAGS, embedded_env


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_pace_replays_in_process_and_refuses_a_case_beyond_the_context(start) -> None:
    srv = start(FLAGS, env=embedded_env())
    code, out = _post(srv.url + "/enginesim/pace", {"isl": 200000, "osl": 256, "num_prompts": 2})
    assert code == 400 and "--isl 200000 + --osl 256 exceeds the context length 40960" in json.dumps(out), out
    code, out = _post(
        srv.url + "/enginesim/pace", {"isl": 1024, "osl": 256, "concurrency": 32, "num_prompts": 64}
    )
    assert code == 200 and out["applied"] is True, out
    assert out["replay"]["median_tpot_ms"] > 0 and out["replay_profile"]["replay_wall_s"] < 5.0, out
    assert out["time_scale"] > 0
    with urllib.request.urlopen(srv.url + "/health", timeout=10) as r:
        assert r.status == 200
