"""Token counting for prompt generation: a local HF tokenizer (``tokenizers``) or the server.

Only the client side of prompt *preparation* uses these (never the measured run). ``tokenizers``
is optional so the zipapp needs only the standard library; without it, ``--tokenizer`` still works
when the server has ``/tokenize`` (vLLM; newer SGLang).
"""

from __future__ import annotations

import json
import os
import sys

from .serverapi import post_json


class TokenizerError(Exception):
    """The tokenizer named by --tokenizer cannot be used."""


class HFTokenizer:
    """A HuggingFace ``tokenizer.json`` loaded with the ``tokenizers`` library."""

    def __init__(self, path: str) -> None:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        f = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
        if not os.path.isfile(f):
            raise TokenizerError(f"no tokenizer.json at {path!r} (give a local HF tokenizer directory)")
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise TokenizerError("the 'tokenizers' package is not installed") from exc
        self.tok = Tokenizer.from_file(f)
        self.name = path
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        special = set()
        try:
            with open(f, encoding="utf-8") as fh:
                added = json.load(fh).get("added_tokens", [])
            for t in added:
                if t.get("special"):
                    special.add(int(t["id"]))
        except (OSError, ValueError):
            pass
        self.special_ids = special

    def count(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=False).ids)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)

    def allowed_ids(self) -> list[int]:
        return [i for i in range(self.vocab_size) if i not in self.special_ids]


class ServerTokenizer:
    """The server's ``/tokenize`` endpoint (vLLM, newer SGLang): counts only, no vocabulary."""

    def __init__(self, base_url: str, model: str) -> None:
        self.base_url = base_url
        self.model = model
        self.name = f"{base_url}/tokenize"
        self.vocab_size = None
        self.special_ids: set[int] = set()

    def probe(self) -> bool:
        try:
            self.count("hello world")
            return True
        except (OSError, ValueError, KeyError):
            return False

    def count(self, text: str) -> int:
        status, obj = post_json(
            self.base_url + "/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False}
        )
        if status != 200 or not isinstance(obj, dict):
            raise ValueError(f"/tokenize answered HTTP {status}")
        if "count" in obj:
            return int(obj["count"])
        return len(obj["tokens"])


def _warn(msg: str) -> None:
    print(f"loadgen: warning: {msg}", file=sys.stderr, flush=True)


def load_tokenizer(spec: str | None, base_url: str, model: str) -> HFTokenizer | ServerTokenizer | None:
    """--tokenizer DIR -> local HF tokenizer; 'server' -> /tokenize; None -> no tokenizer.

    A hub-style name (``org/model``, not a local path) cannot be downloaded here, and a local dir
    cannot be read without the ``tokenizers`` package (bare nodes running the zipapp): both fall
    back, with a warning, to the server's /tokenize when it answers, else to no tokenizer. That is
    harmless for token-id backends (exact lengths need no tokenizer); text prompts are then
    counted by the server or marked unchecked. A path that does not exist is an error.
    """
    if not spec:
        return None
    if spec == "server":
        t = ServerTokenizer(base_url, model)
        if not t.probe():
            raise TokenizerError(f"--tokenizer server: {base_url}/tokenize is not available")
        return t
    if os.path.exists(spec):
        try:
            return HFTokenizer(spec)
        except TokenizerError as exc:
            why = f"--tokenizer {spec!r}: {exc}"
    elif spec.startswith(("/", "./", "../", "~")):
        raise TokenizerError(f"--tokenizer {spec!r}: no such directory")
    else:
        why = f"--tokenizer {spec!r} is not a local directory (hub downloads are not supported)"
    t = ServerTokenizer(base_url, model)
    if t.probe():
        _warn(f"{why}; counting with the server's /tokenize instead")
        return t
    _warn(f"{why}; continuing without a tokenizer")
    return None
