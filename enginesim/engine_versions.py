"""Which engine versions enginesim emulates, and the flags that differ between them.

Why: engines rename flags between releases; a deployment renders one spelling, and the engine in the
image accepts exactly its own. The emulator takes `--sim-engine-version` (or ENGINESIM_ENGINE_VERSION)
and then accepts exactly that version's spellings, and its `--help` lists exactly them, so quickmap's
preflight check (the image's own --help) is exercised against a real difference.

Sources (read for this table, see enginesim/README.md):
- SGLang v0.5.6 (late 2025): `--cuda-graph-max-bs` and `--cuda-graph-bs`, no per-phase CUDA-graph
  flags (python/sglang/srt/server_args.py of that period, as in the project's engine reference).
- SGLang after the CUDA-graph runner refactor (sgl-project/sglang PR #23906, merged June 2026):
  per-phase `--cuda-graph-max-bs-decode/-prefill`, `--cuda-graph-bs-decode/-prefill`,
  `--cuda-graph-backend-decode/-prefill`; the old `--cuda-graph-max-bs` and `--cuda-graph-bs` stay
  as deprecated aliases (DeprecatedAliasStoreAction, see PRs #29591 and #37920). Emulated as 0.5.23,
  the release the project's peer fixtures were written with (December 2026).
- vLLM 0.11.2: one version emulated (the flags of enginesim.cli.vllm_parser).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

SGLANG_VERSIONS = ("0.5.6", "0.5.23")
VLLM_VERSIONS = ("0.11.2",)
VERSIONS = {"sglang": SGLANG_VERSIONS, "vllm": VLLM_VERSIONS}
ENV = "ENGINESIM_ENGINE_VERSION"
FLAG = "--sim-engine-version"

_GRAPH_BACKENDS = ["full", "breakable", "disabled", "default"]


def default(flavour: str) -> str:
    """The newest emulated version of `flavour`."""
    return VERSIONS[flavour][-1]


def selected(flavour: str, argv: list[str], env: dict[str, str]) -> str:
    """The version asked for (the flag wins over the env var), else the newest.

    Read before the parser is built, because the parser itself depends on the version. An unknown
    version is refused by the parser's `choices` (the flag) or here (the env var), naming the choices.
    """
    value = None
    for i, word in enumerate(argv):
        if word == FLAG and i + 1 < len(argv):
            value = argv[i + 1]
        elif word.startswith(FLAG + "="):
            value = word.split("=", 1)[1]
    if value is None:
        value = env.get(ENV) or None
    if value is None:
        return default(flavour)
    if value not in VERSIONS[flavour]:
        raise ValueError(
            f"{FLAG}/{ENV}={value!r}: enginesim emulates {flavour} {', '.join(VERSIONS[flavour])} "
            "(rule: one of those versions)"
        )
    return value


def add_sglang_cuda_graph_flags(add: Callable[..., argparse.Action], version: str) -> None:
    """The CUDA-graph batch flags of `version` (dest names are the same for both spellings)."""
    if version == "0.5.6":
        add("--cuda-graph-max-bs", type=int, dest="cuda_graph_max_bs")
        add("--cuda-graph-bs", type=int, nargs="+", dest="cuda_graph_bs")
        return
    add(
        "--cuda-graph-max-bs-decode",
        "--cuda-graph-max-bs",
        type=int,
        dest="cuda_graph_max_bs",
        help="--cuda-graph-max-bs is a deprecated alias",
    )
    add("--cuda-graph-max-bs-prefill", type=int)
    add(
        "--cuda-graph-bs-decode",
        "--cuda-graph-bs",
        type=int,
        nargs="+",
        dest="cuda_graph_bs",
        help="--cuda-graph-bs is a deprecated alias",
    )
    add("--cuda-graph-bs-prefill", type=int, nargs="+")
    add("--cuda-graph-backend-decode", choices=_GRAPH_BACKENDS)
    add("--cuda-graph-backend-prefill", choices=_GRAPH_BACKENDS)
