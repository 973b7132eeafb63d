"""Prompt sets: random (exact lengths), shared-prefix groups, a JSONL file, a ShareGPT file.

Exact input length: when the backend takes token ids (SGLang /generate, /v1/completions) a random
prompt *is* a list of ids, so its length is exact by construction. Otherwise (chat) the prompt is
text; with a tokenizer it is decoded from ids and re-encoded, padding or trimming until it counts
exactly (up to 10 rounds, like vLLM), and the remaining mismatch is reported; the server's own
prompt count is recorded per request either way.

``--random-range-ratio`` has two meanings in the wild (docs/bench-clients.md), chosen by
``--range-ratio-semantics``:
  sglang: length uniform on [max(int(L*r), 1), L]   (r in [0, 1]; r = 0 -> [1, L]; r = 1 -> L)
  vllm:   length uniform on [floor(L*(1-r)), ceil(L*(1+r))]   (r in [0, 1); r = 0 -> L)
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass

DATASETS = ("random", "shared-prefix", "jsonl", "sharegpt")
SEMANTICS = ("sglang", "vllm")
# without a tokenizer, random ids are drawn from this range: ordinary tokens in every common
# vocabulary (Llama 2/3, Qwen, Mistral have >= 32000 entries, specials at the ends)
DEFAULT_ID_RANGE = (1000, 30000)
WORDS = [
    "time",
    "year",
    "people",
    "way",
    "day",
    "man",
    "thing",
    "woman",
    "life",
    "child",
    "world",
    "school",
    "state",
    "family",
    "student",
    "group",
    "country",
    "problem",
    "hand",
    "part",
    "place",
    "case",
    "week",
    "company",
    "system",
    "program",
    "question",
    "work",
    "government",
    "number",
    "night",
    "point",
    "home",
    "water",
    "room",
    "mother",
    "area",
    "money",
    "story",
    "fact",
    "month",
    "lot",
    "right",
    "study",
    "book",
    "eye",
    "job",
    "word",
    "business",
    "issue",
    "side",
    "kind",
    "head",
    "house",
    "service",
    "friend",
    "father",
    "power",
    "hour",
    "game",
    "line",
    "end",
    "member",
    "law",
    "car",
    "city",
    "community",
    "name",
    "president",
    "team",
    "minute",
    "idea",
    "kid",
    "body",
    "information",
    "back",
    "parent",
    "face",
    "others",
    "level",
    "office",
    "door",
    "health",
    "person",
    "art",
    "war",
    "history",
    "party",
    "result",
    "change",
    "morning",
    "reason",
    "research",
    "girl",
    "guy",
    "moment",
    "air",
    "teacher",
    "force",
    "education",
    "river",
    "garden",
    "light",
    "paper",
]


class DatasetError(Exception):
    """The dataset options or file cannot produce the asked prompts."""


@dataclass
class Prompt:
    """One request's input: text or token ids, with its input length (tokens) and output budget."""

    text: str | None
    ids: list[int] | None
    input_len: int
    output_len: int
    len_checked: bool = True  # False: input_len is a nominal length, not counted by a tokenizer


def sample_lens(full: int, ratio: float, semantics: str, n: int, rng: random.Random) -> list[int]:
    """Per-request lengths for target ``full`` under the named range-ratio semantics."""
    if semantics == "sglang":
        lo = max(int(full * ratio), 1)
        hi = full
    else:
        lo = max(math.floor(full * (1 - ratio)), 1)
        hi = max(math.ceil(full * (1 + ratio)), 1)
    if lo >= hi:
        return [hi] * n
    return [rng.randint(lo, hi) for _ in range(n)]


def len_window(full: int, ratio: float, semantics: str) -> tuple[int, int]:
    if semantics == "sglang":
        return max(int(full * ratio), 1), full
    return max(math.floor(full * (1 - ratio)), 1), max(math.ceil(full * (1 + ratio)), 1)


class PromptMaker:
    """Makes prompts of an exact token length, as ids or as (checked) text."""

    def __init__(self, tokenizer, want_ids: bool, rng: random.Random) -> None:
        self.tok = tokenizer
        self.want_ids = want_ids
        self.rng = rng
        allowed = getattr(tokenizer, "allowed_ids", None)
        self.allowed = allowed() if allowed is not None else list(range(*DEFAULT_ID_RANGE))
        self.mismatch = 0  # summed |actual - asked| over text prompts that could not be made exact

    def ids(self, n: int) -> list[int]:
        return self.rng.choices(self.allowed, k=n)

    def make(self, n: int, output_len: int) -> Prompt:
        if self.want_ids:
            return Prompt(None, self.ids(n), n, output_len)
        text, got, checked = self.text(n)
        return Prompt(text, None, got, output_len, checked)

    def text(self, n: int) -> tuple[str, int, bool]:
        """Text of ``n`` tokens: (text, counted length, whether a tokenizer counted it)."""
        tok = self.tok
        if tok is None:
            return " ".join(self.rng.choices(WORDS, k=n)), n, False
        if hasattr(tok, "decode"):
            ids = self.ids(n)
            text = tok.decode(ids)
            for _ in range(10):
                enc = tok.encode(text)
                if len(enc) == n:
                    break
                enc = enc[:n] if len(enc) > n else enc + self.ids(n - len(enc))
                text = tok.decode(enc)
            got = tok.count(text)
        else:  # server /tokenize: words, then add/remove words until the count is exact
            words = self.rng.choices(WORDS, k=n)
            text = " ".join(words)
            got = tok.count(text)
            for _ in range(10):
                if got == n:
                    break
                if got > n:
                    words = words[: max(1, len(words) - (got - n))]
                else:
                    words += self.rng.choices(WORDS, k=n - got)
                text = " ".join(words)
                got = tok.count(text)
        self.mismatch += abs(got - n)
        return text, got, True


def random_prompts(maker: PromptMaker, n: int, in_lens: list[int], out_lens: list[int]) -> list[Prompt]:
    return [maker.make(in_lens[i], out_lens[i]) for i in range(n)]


def shared_prefix_prompts(
    maker: PromptMaker, n: int, groups: int, system_len: int, question_len: int, output_len: int
) -> list[Prompt]:
    """Request i belongs to group i % groups: one shared system prefix per group + its own question."""
    out = []
    if maker.want_ids:
        prefixes = [maker.ids(system_len) for _ in range(groups)]
        for i in range(n):
            ids = prefixes[i % groups] + maker.ids(question_len)
            out.append(Prompt(None, ids, len(ids), output_len))
        return out
    prefixes = [maker.text(system_len) for _ in range(groups)]
    for i in range(n):
        ptext, plen, pchk = prefixes[i % groups]
        qtext, qlen, qchk = maker.text(question_len)
        text = ptext + "\n\n" + qtext
        got = plen + qlen
        if maker.tok is not None:
            got = maker.tok.count(text)
        out.append(Prompt(text, None, got, output_len, pchk and qchk))
    return out


def _count(tokenizer, text: str) -> tuple[int, bool]:
    if tokenizer is not None:
        return tokenizer.count(text), True
    return len(text.split()), False


def jsonl_prompts(
    path: str, n: int, default_output: int, tokenizer, want_ids: bool, rng: random.Random
) -> list[Prompt]:
    """Lines like {"prompt": "text" | [ids], "output_len": 128}; ids also as "input_ids"."""
    items = []
    try:
        fh = open(path, encoding="utf-8")  # noqa: SIM115 - the with below closes it
    except OSError as exc:
        raise DatasetError(f"--dataset-path {path!r}: {exc.strerror}") from exc
    with fh:
        for lineno, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise DatasetError(f"--dataset-path {path}:{lineno}: not JSON ({exc})") from exc
            if not isinstance(obj, dict):
                raise DatasetError(f"--dataset-path {path}:{lineno}: each line must be a JSON object")
            p = obj.get("prompt", obj.get("text", obj.get("input_ids", obj.get("prompt_token_ids"))))
            olen = obj.get("output_len", obj.get("max_tokens", default_output))
            if not isinstance(olen, int) or olen < 1:
                raise DatasetError(f"--dataset-path {path}:{lineno}: output_len must be an integer >= 1")
            if isinstance(p, str) and p:
                ilen, checked = _count(tokenizer, p)
                items.append(Prompt(p, None, ilen, olen, checked))
            elif isinstance(p, list) and p and all(isinstance(x, int) for x in p):
                if not want_ids:
                    if tokenizer is None or not hasattr(tokenizer, "decode"):
                        raise DatasetError(
                            f"--dataset-path {path}:{lineno}: token-id prompt, but this backend needs text "
                            "(give --tokenizer DIR to decode it)"
                        )
                    text = tokenizer.decode(p)
                    items.append(Prompt(text, None, tokenizer.count(text), olen))
                else:
                    items.append(Prompt(None, list(p), len(p), olen))
            else:
                raise DatasetError(
                    f"--dataset-path {path}:{lineno}: needs a non-empty 'prompt' (text or list of token ids)"
                )
    if not items:
        raise DatasetError(f"--dataset-path {path}: no prompts")
    return [items[i % len(items)] for i in range(n)]


def sharegpt_prompts(
    path: str, n: int, output_len: int | None, tokenizer, rng: random.Random
) -> list[Prompt]:
    """First human turn as prompt; output length = --sharegpt-output-len or the reply's length."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        raise DatasetError(f"--dataset-path {path!r}: {exc.strerror}") from exc
    except ValueError as exc:
        raise DatasetError(f"--dataset-path {path}: not a JSON file ({exc})") from exc
    if not isinstance(data, list):
        raise DatasetError(f"--dataset-path {path}: ShareGPT format is a JSON list of conversations")
    pairs = []
    for entry in data:
        conv = entry.get("conversations") or entry.get("conversation") if isinstance(entry, dict) else None
        if not isinstance(conv, list) or len(conv) < 2:
            continue
        a, b = conv[0], conv[1]
        p = a.get("value", a.get("content")) if isinstance(a, dict) else None
        r = b.get("value", b.get("content")) if isinstance(b, dict) else None
        if isinstance(p, str) and isinstance(r, str) and p.strip():
            pairs.append((p, r))
    if not pairs:
        raise DatasetError(f"--dataset-path {path}: no conversation with a prompt and a reply")
    rng.shuffle(pairs)
    out = []
    for p, r in pairs:
        ilen, checked = _count(tokenizer, p)
        olen = output_len if output_len else _count(tokenizer, r)[0]
        if ilen < 2 or olen < 2:
            continue  # SGLang's filter: too short to measure
        out.append(Prompt(p, None, ilen, olen, checked))
        if len(out) >= n:
            break
    if not out:
        raise DatasetError(f"--dataset-path {path}: every conversation is too short (< 2 tokens)")
    return [out[i % len(out)] for i in range(n)]
