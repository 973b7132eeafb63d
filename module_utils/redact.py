# Copyright: quickmap contributors
# Apache-2.0
"""The one secret rule of quickmap: what counts as a secret, and how it is masked (stdlib only).

Every place that saves or prints something a secret could reach calls this module: the manifest,
case meta and report (``analysis.state.redact``), the saved server and client commands (the
``server_process`` and ``bench_case`` modules), run.log (the ``quickmap_runlog`` callback) and the
engine templates (the ``quickmap_*`` filters, which keep secret values out of rendered commands).
One rule in one place means a new kind of secret is taught once and is masked everywhere.

A key is secret when one of its ``_ - . space`` separated words is one of ``SECRET_WORDS`` (so
``HF_TOKEN``, ``api_key`` and ``--api-key`` are, ``tokenizer`` and ``max_tokens`` are not). Masked
values read ``***``. Module code runs on the nodes' Python, so this file stays 3.8-compatible.
"""

from __future__ import annotations

import re
import shlex

SECRET_WORDS = frozenset({"TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "APIKEY", "CREDENTIALS"})
MASK = "***"
# Prefix of the environment variables that carry secret flag values into a server command.
SECRET_ARG_ENV_PREFIX = "QUICKMAP_SECRET_"

_WORD_SPLIT = re.compile(r"[_\-.\s]+")
_QUOTED = r"\"(?:[^\"\\]|\\.)*\"|'[^']*'"
# Each pattern matches a key and looks ahead at its value without consuming it, so a key nested in
# another one's value (server_args=ServerArgs(api_key='...')) is still found.
# NAME=value (shell assignment, env listing, Python repr); the value may be quoted.
_ASSIGN = re.compile(r"(?<![A-Za-z0-9_])([A-Za-z0-9_]+)=(?=(" + _QUOTED + r"|[^\s'\")]+))")
# "name": value / 'name': value / name: value (JSON, Python repr, YAML).
_MAPPING = re.compile(r"([\"']?)([A-Za-z0-9_.-]+)\1\s*:\s*(?=(" + _QUOTED + r"|[^\s,{}\[\]]+))")
# --flag value, --flag=value, and the list spellings "--flag", "value" / '--flag','value'.
_FLAG = re.compile(
    r"(--[A-Za-z][A-Za-z0-9_-]*)(?:=|\s+|[\"']\s*,\s*)(?=(" + _QUOTED + r"|(?!--)[^\s,'\"\]]+))"
)
_HF_TOKEN = re.compile(r"\bhf_[A-Za-z0-9]{16,}\b")


def is_secret_key(key: object) -> bool:
    """True when ``key`` (an env name, a dict key or a ``--flag``) names a secret."""
    text = str(key).strip().lstrip("-").upper()
    if not text:
        return False
    if any(part in SECRET_WORDS for part in _WORD_SPLIT.split(text)):
        return True
    return re.sub(r"[_\-.]", "", text) in SECRET_WORDS


def _masked_value(value: str) -> str:
    """``***`` in the quoting style of the value it replaces."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[0] + MASK + value[0]
    return MASK


def _mask_values(text: str, pattern: re.Pattern, key_group: int, value_group: int) -> str:
    """Replace the value of every match whose key is secret (values already masked stay as they are)."""
    spans = []
    for m in pattern.finditer(text):
        start, end = m.span(value_group)
        if spans and start < spans[-1][1]:
            continue  # inside a value masked already
        if is_secret_key(m.group(key_group)) and m.group(value_group).strip("\"'") != MASK:
            spans.append((start, end))
    out, last = [], 0
    for start, end in spans:
        out += [text[last:start], _masked_value(text[start:end])]
        last = end
    return "".join(out) + text[last:]


def redact_text(text: str, values: list[str] | tuple[str, ...] = ()) -> str:
    """Mask secret assignments, mapping entries, flag values, HF tokens and the given literal values."""
    out = str(text)
    for value in sorted((v for v in values if v), key=len, reverse=True):
        out = out.replace(value, MASK)
    out = _mask_values(out, _ASSIGN, 1, 2)
    out = _mask_values(out, _MAPPING, 2, 3)
    out = _mask_values(out, _FLAG, 1, 2)
    return _HF_TOKEN.sub("hf_" + MASK, out)


def redact(obj: object, values: list[str] | tuple[str, ...] = ()) -> object:
    """A copy of ``obj`` with secret keys dropped and every string masked by :func:`redact_text`."""
    if isinstance(obj, dict):
        return {k: redact(v, values) for k, v in obj.items() if not is_secret_key(k)}
    if isinstance(obj, (list, tuple)):
        return [redact(v, values) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj, values)
    return obj


def mask_argv(argv: list) -> list[str]:
    """``argv`` with the value of every secret flag replaced by ``***`` (for saved command lines)."""
    out: list[str] = []
    secret_next = False
    for raw in argv:
        arg = str(raw)
        if secret_next and not arg.startswith("--"):
            out.append(MASK)
            secret_next = False
            continue
        secret_next = False
        flag, sep, _value = arg.partition("=")
        if flag.startswith("--") and is_secret_key(flag):
            if sep:
                out.append(flag + "=" + MASK)
            else:
                out.append(arg)
                secret_next = True
            continue
        out.append(arg)
    return out


def split_env(env: dict) -> tuple[dict, dict]:
    """(public, secret) halves of an environment mapping, by key name."""
    public = {k: v for k, v in env.items() if not is_secret_key(k)}
    secret = {k: v for k, v in env.items() if is_secret_key(k)}
    return public, secret


def _arg_env_name(flag: str, taken: dict) -> str:
    base = SECRET_ARG_ENV_PREFIX + re.sub(r"[^A-Za-z0-9]+", "_", flag.lstrip("-")).strip("_").upper()
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    return name


def shell_args(args: list) -> tuple[list[str], dict]:
    """Shell words for an argv list, with the values of secret flags kept out of the text.

    Returns (words, env): every word is already shell-quoted; a secret flag's value is replaced by
    ``"${QUICKMAP_SECRET_<FLAG>}"`` and ``env`` maps that name to the value, so the caller hands it to
    the process environment and the rendered command never holds it.
    """
    words: list[str] = []
    env: dict = {}
    pending: str | None = None
    for raw in args:
        arg = str(raw)
        if pending is not None and not arg.startswith("--"):
            name = _arg_env_name(pending, env)
            env[name] = arg
            words.append('"${' + name + '}"')
            pending = None
            continue
        pending = None
        flag, sep, value = arg.partition("=")
        if flag.startswith("--") and is_secret_key(flag):
            if sep:
                name = _arg_env_name(flag, env)
                env[name] = value
                words.append(shlex.quote(flag + "=") + '"${' + name + '}"')
            else:
                words.append(shlex.quote(arg))
                pending = flag
            continue
        words.append(shlex.quote(arg))
    return words, env
