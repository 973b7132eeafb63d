"""Out-of-band calls to the server (not timed): model list, /metrics, cache flush, /tokenize.

Blocking standard-library HTTP on purpose: these run before or after the measured phase, and
urllib keeps the zipapp free of dependencies.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request

COUNTER_SUFFIXES = ("_total", "_count", "_sum")
# The server under test is reached directly: an http_proxy in the environment must not carry (or
# break) the flush, the tokenizer or the metrics scrape.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _open(req: urllib.request.Request, timeout: float) -> tuple[int, bytes]:
    try:
        with _OPENER.open(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read() or b""


def get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    return _open(urllib.request.Request(url, method="GET"), timeout)


def post_json(url: str, obj: dict | None, timeout: float = 30.0) -> tuple[int, object]:
    data = json.dumps(obj).encode() if obj is not None else b""
    req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    status, body = _open(req, timeout)
    try:
        return status, json.loads(body) if body else None
    except ValueError:
        return status, body.decode("utf-8", "replace")


def first_model(base_url: str) -> str | None:
    """The first id from /v1/models (what --model defaults to for OpenAI backends)."""
    try:
        status, body = get(base_url + "/v1/models", timeout=10.0)
        if status == 200:
            data = json.loads(body).get("data") or []
            if data:
                return str(data[0]["id"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text -> {metric name: value summed over label sets} (histogram buckets dropped).

    Summing over labels gives one number per metric across TP ranks / engines, which is what a
    before/after delta of a counter needs. A tiny parser instead of prometheus_client so the
    zipapp stays dependency-free; it handles the exposition format's quoting and optional
    timestamps.
    """
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name = line[: line.index("{")]
            # skip to the closing brace, honouring quoted label values
            i = line.index("{") + 1
            inq = False
            while i < len(line):
                c = line[i]
                if inq:
                    if c == "\\":
                        i += 1
                    elif c == '"':
                        inq = False
                elif c == '"':
                    inq = True
                elif c == "}":
                    break
                i += 1
            rest = line[i + 1 :].split()
        else:
            parts = line.split()
            name, rest = parts[0], parts[1:]
        if not rest or name.endswith("_bucket") or name.endswith("_created"):
            continue
        try:
            v = float(rest[0])
        except ValueError:
            continue
        if math.isnan(v):
            continue
        out[name] = out.get(name, 0.0) + v
    return out


def scrape(base_url: str) -> tuple[dict[str, float] | None, str | None]:
    """GET /metrics -> (parsed samples, raw text); (None, None) when unavailable."""
    try:
        status, body = get(base_url + "/metrics", timeout=10.0)
    except OSError:
        return None, None
    if status != 200:
        return None, None
    text = body.decode("utf-8", "replace")
    return parse_prometheus(text), text


def counter_deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """after - before for counter-like samples (``*_total``, histogram ``_count``/``_sum``)."""
    out = {}
    for k, v in after.items():
        if k.endswith(COUNTER_SUFFIXES) or k.startswith("sglang:num_retract"):
            out[k] = v - before.get(k, 0.0)
    return out


def flush_cache(base_url: str, backend: str, timeout_s: float, interval_s: float = 0.5) -> tuple[bool, str]:
    """Flush the server's prefix cache, retrying while it answers busy, for up to ``timeout_s``.

    SGLang refuses (HTTP 400) while requests are running or queued; vLLM's /reset_prefix_cache
    exists only with VLLM_SERVER_DEV_MODE=1 (404 otherwise, which never succeeds).
    """
    path = "/flush_cache" if backend.startswith("sglang") else "/reset_prefix_cache"
    deadline = time.monotonic() + timeout_s
    attempts = 0
    last = ""
    while True:
        attempts += 1
        try:
            status, body = post_json(base_url + path, None, timeout=max(1.0, min(10.0, timeout_s)))
            if status == 200:
                return True, f"{path} succeeded after {attempts} attempt(s)"
            last = f"HTTP {status}: {str(body)[:200]}"
        except OSError as exc:
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() + interval_s > deadline:
            return False, f"{path} did not succeed in {timeout_s:g} s ({attempts} attempts; last: {last})"
        time.sleep(interval_s)
