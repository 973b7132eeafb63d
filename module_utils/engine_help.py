# Copyright: quickmap contributors
# Apache-2.0
"""What an engine version accepts, read from its own ``--help``, and the inventory's per-version renames.

Why: engines rename flags between releases (SGLang's ``--cuda-graph-max-bs`` became
``--cuda-graph-max-bs-decode``); a flag the image does not know costs a failed start after minutes of
model loading. The image's own argparse help is the only list that cannot drift from the image, so
preflight reads it and refuses a rendered flag it does not list. Pure functions: the module
``engine_flags`` runs the commands, these judge the text.
"""

from __future__ import annotations

import re

# An option as argparse prints it: `-x`, `--long-name`, `--a.b` (vLLM's JSON dot keys are not
# listed, so they are matched by their base flag).
_OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][A-Za-z0-9_.-]*)")
_VERSION = re.compile(r"(?<![\w.])v?(\d+\.\d+(?:\.\d+)?(?:[A-Za-z0-9.+-]*)?)")
_NUMBER = re.compile(r"-\d")
# argparse indents an option 2 spaces and its help text to a column of 24 (up to 1/3 of the width);
# a description line that happens to start with a flag is indented far deeper than an option.
_OPTION_INDENT = 8


def help_flags(text: str) -> set[str]:
    """Every option spelling the help lists: the usage block and the option definition lines.

    Description text is not read (a line like "deprecated, use --x" must not make --x known): only
    the usage block and lines that start with '-' in argparse's option column (shallow indent).
    """
    flags: set[str] = set()
    in_usage = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.lower().startswith("usage:"):
            in_usage = True
        elif in_usage and not stripped:
            in_usage = False
        if in_usage:
            flags.update(m.group(1) for m in re.finditer(r"[\[|(]\s*(--?[A-Za-z][A-Za-z0-9_.-]*)", line))
            continue
        indent = len(line) - len(line.lstrip())
        if stripped.startswith("-") and indent <= _OPTION_INDENT:
            spec = re.split(r"\s{2,}", stripped, maxsplit=1)[0]
            for item in spec.split(","):
                m = _OPTION.match(item.strip())
                if m:
                    flags.add(m.group(1))
    return flags


def flag_words(words: list[str]) -> list[str]:
    """The option names among argv words (`--x=1` gives `--x`; values like `-1` are not options)."""
    out = []
    for word in words:
        if not word.startswith("-") or _NUMBER.match(word) or word in ("-", "--"):
            continue
        out.append(word.split("=", 1)[0])
    return out


def unknown_flags(words: list[str], known: set[str]) -> list[str]:
    """Option names in `words` that the help does not list, in order, each once.

    vLLM takes JSON sub-keys as `--compilation-config.level`: such a word is known when its base
    (`--compilation-config`) is.
    """
    out: list[str] = []
    for flag in flag_words(words):
        base = flag.split(".", 1)[0] if flag.startswith("--") else flag
        if flag not in known and base not in known and flag not in out:
            out.append(flag)
    return out


def parse_version(text: str) -> str | None:
    """The version in a version command's output: `Version: 0.5.6` (pip show), `0.11.2` (vllm --version)."""
    for line in text.splitlines():
        if line.lower().startswith("version:"):
            m = _VERSION.search(line.split(":", 1)[1])
            if m:
                return m.group(1)
    for line in text.splitlines():
        m = _VERSION.search(line)
        if m:
            return m.group(1)
    return None


def version_key(version: str) -> tuple:
    """Sortable key of a version string: numeric release parts; a pre-release (rc, dev) sorts first."""
    m = re.match(r"v?(\d+(?:\.\d+)*)(.*)$", version.strip())
    if not m:
        raise ValueError(f"version {version!r} is not like 0.5.6 (rule: digits separated by dots)")
    release = tuple(int(p) for p in m.group(1).split("."))
    release = release + (0,) * (4 - len(release))
    suffix = m.group(2)
    pre = 0 if re.match(r"[.-]?(rc|dev|a|b)\d*", suffix) else 1
    return (*release, pre)


def rename_map(renames: dict[str, list[dict]], version: str | None) -> dict[str, str]:
    """{rendered flag: spelling for `version`} from the inventory's renames.

    `renames` maps a flag as the templates render it to entries `{since: VERSION, flag: SPELLING}`;
    the entry with the highest `since` not above `version` wins. Unknown version: no rename (the
    check then names the flag and says the version is unknown).
    """
    out: dict[str, str] = {}
    if not version:
        return out
    have = version_key(version)
    for rendered, entries in renames.items():
        best = None
        for entry in entries:
            since = version_key(str(entry["since"]))
            if since <= have and (best is None or since > best[0]):
                best = (since, str(entry["flag"]))
        if best is not None and best[1] != rendered:
            out[rendered] = best[1]
    return out


def apply_renames(words: list[str], mapping: dict[str, str]) -> list[str]:
    """`words` with every option named in `mapping` respelled (`--x=1` keeps its value)."""
    out = []
    for word in words:
        name, eq, value = word.partition("=")
        if word.startswith("-") and name in mapping:
            out.append(mapping[name] + eq + value)
        else:
            out.append(word)
    return out


def validate_renames(renames: object) -> str | None:
    """A message naming the bad entry and the rule, or None when `renames` is well formed."""
    rule = "rule: {'--rendered-flag': [{since: '0.5.23', flag: '--new-spelling'}, ...]}"
    if not isinstance(renames, dict):
        return f"engine_flag_renames={renames!r} is not a mapping ({rule})"
    for rendered, entries in renames.items():
        if not isinstance(rendered, str) or not re.fullmatch(r"--?[A-Za-z][A-Za-z0-9_.-]*", rendered):
            return f"engine_flag_renames key {rendered!r} is not a flag ({rule})"
        if not isinstance(entries, list) or not entries:
            return f"engine_flag_renames[{rendered!r}] is not a non-empty list ({rule})"
        for entry in entries:
            if not isinstance(entry, dict) or set(entry) != {"since", "flag"}:
                return (
                    f"engine_flag_renames[{rendered!r}] entry {entry!r} needs exactly since and flag ({rule})"
                )
            if not re.fullmatch(r"--?[A-Za-z][A-Za-z0-9_.-]*", str(entry["flag"])):
                return f"engine_flag_renames[{rendered!r}] flag {entry['flag']!r} is not a flag ({rule})"
            try:
                version_key(str(entry["since"]))
            except ValueError as err:
                return f"engine_flag_renames[{rendered!r}] since: {err}"
    return None
