"""What every emulated engine provides: one object per engine (or engine version) with its flags, log
lines, HTTP details, metric catalogue and scheduler policy.

Why: the emulator used to ask "is this SGLang?" in 50-odd places across the API, the engine, the
server and the logs, and the two answers had started to drift. Everything an engine does its own way
now sits behind the object its command line selects (`flavours.for_argv`); the shared machinery (the
scheduler's KV pool and step application, the HTTP server, the sinks, the cost model) asks it. Adding
an engine version is one file: subclass its flavour and change what differs.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - annotations only
    from ..capacity import Capacity
    from ..catalog import Hardware, ModelSpec
    from ..cli import Config
    from ..logs import Logger
    from ..scheduler import Req, Scheduler


class Flavour:
    """The defaults are SGLang-neutral; each engine's module overrides what it does differently."""

    name = ""
    title = ""  # as people write it (SGLang, vLLM)
    version = ""
    argv_head: tuple[str, ...] = ()  # what follows `python -m enginesim` (e.g. ("vllm", "serve"))
    owned_by = ""
    # scheduler policy: how a step's KV and tokens are accounted (see scheduler.Scheduler.apply)
    prefill_joins_running = False  # a finished prefill joins the running batch (SGLang keeps two lists)
    decode_kv_at_apply = False  # decode tokens get their KV when the step is applied, not planned
    drafts_at_verify = False  # speculative drafts are proposed at verification, not at planning
    decode_in_token_budget = False  # decode tokens use the step's token budget (vLLM), not only prefill
    # `<engine>:prompt_tokens_total` counts a request's whole prompt (its cached part too) once: SGLang
    # when it finishes (TokenizerMetricsCollector), vLLM when its first token comes out (IterationStats)
    prompt_tokens_at_first_token = False
    # cost model: CUDA graphs also cover steps with prefill tokens (vLLM: any step up to the capture size)
    graph_covers_mixed = False
    # HTTP details
    min_max_tokens = 1  # the smallest max_tokens an OpenAI request may ask for
    dead_status = 503  # status of a request to a dead engine

    # ---- flags --------------------------------------------------------------------------------------
    def parser(self, version: str | None = None) -> argparse.ArgumentParser:
        raise NotImplementedError

    def config(
        self, p: argparse.ArgumentParser, ns: argparse.Namespace, argv: list[str], env: dict[str, str]
    ) -> Config:
        raise NotImplementedError

    def parse(self, argv: list[str], env: dict[str, str], version: str | None = None) -> Config:
        p = self.parser(version)
        # vLLM's own parser lists every option only for --help=all (plain --help shows groups).
        args = ["--help" if a == "--help=all" else a for a in argv[len(self.argv_head) :]]
        cfg = self.config(p, p.parse_args(args), argv, env)
        from .. import catalog, dp  # dp builds on the engine, which builds on the flavours

        why = dp.check(cfg, catalog.load_hardware(cfg.sim.hardware, cfg.sim.hw_override).gpus_per_node)
        if why:
            p.error(why)
        return cfg

    # ---- KV capacity at start -----------------------------------------------------------------------
    def capacity(self, cfg: Config, model: ModelSpec, hw: Hardware) -> Capacity:
        raise NotImplementedError

    def prefill_graph_max_tokens(self, cfg: Config) -> int:
        """Steps with prefill tokens up to this many run under piecewise CUDA graphs (0: eager)."""
        return 0

    def mem_fraction(self, cfg: Config) -> float:
        """The memory fraction /server_info reports (the flag, else the engine's default)."""
        raise NotImplementedError

    # ---- log lines ----------------------------------------------------------------------------------
    def format(self, msg: str, level: str, rank_suffix: str, pid: int, src: str, proc: str) -> str:
        raise NotImplementedError

    def preamble(self, cfg: Config, log: Logger, model: ModelSpec, hw: Hardware) -> None:
        """Lines printed before the weights load."""

    def capacity_line(self, log: Logger, line: str) -> None:
        log.info(line)

    def quantization_line(self, cfg: Config, log: Logger, line: Any) -> None:
        """A start-up line naming the quantization method or kernel (enginesim.quantization)."""
        log.line(line.text, rank=True, level=line.level)

    def graph_lines(self, log: Logger) -> None:
        """Lines printed when CUDA graphs are captured."""

    def ready_lines(self, cfg: Config, log: Logger) -> None:
        """Lines printed when the server is ready."""

    def startup_failure(self, log: Logger, message: str) -> None:
        """The lines of a failed start (weights or KV pool do not fit), before exit 1."""

    def fatal(self, log: Logger, message: str) -> None:
        """The lines of an engine that dies while serving (injected crash)."""

    def peer_lost(self, log: Logger, message: str) -> None:
        """The line of a head whose node rank went away."""

    def shutdown(self, log: Logger) -> None:
        """The line printed on SIGTERM."""

    # ---- HTTP -----------------------------------------------------------------------------------------
    def error_body(self, status: int, message: str, kind: str) -> dict[str, Any]:
        raise NotImplementedError

    def bad_id(self, t: int, vocab: int) -> str:
        raise NotImplementedError

    def empty_prompt(self) -> str:
        raise NotImplementedError

    def missing_prompt(self) -> str:
        raise NotImplementedError

    def length_error(self, n_in: int, max_new: int, ctx: int, cap: int) -> str | None:
        """Why a request of n_in prompt tokens and max_new new ones is refused, or None."""
        raise NotImplementedError

    def routes(self, app: Any) -> dict[tuple[str, str], Any]:
        """The engine's own routes on top of the OpenAI ones every engine serves."""
        return {}

    def serves_metrics(self, cfg: Config) -> bool:
        return True

    def check_model(self, requested: Any, served: str) -> str | None:
        """Why a request naming model `requested` is refused (404), or None."""
        return None

    def model_card(self, card: dict[str, Any], created: int) -> dict[str, Any]:
        return card

    def server_info(self, info: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
        return out

    async def health(self, app: Any) -> Any:
        """/health once the engine is ready and alive."""
        raise NotImplementedError

    def choice_extras(self, choice: dict[str, Any], r: Req) -> None:
        """Engine-specific fields of a non-streamed OpenAI choice."""

    def usage_in_last_chunk(self) -> bool:
        """Whether a streamed OpenAI response repeats usage in its finishing chunk."""
        return False

    # ---- /metrics -------------------------------------------------------------------------------------
    def exposition(self, app: Any) -> str:
        raise NotImplementedError

    def histogram_buckets(self) -> dict[str, list[float]]:
        """Buckets of the request histograms: ttft, itl, e2e, queue."""
        raise NotImplementedError

    # ---- scheduler policy -----------------------------------------------------------------------------
    def plan(self, s: Scheduler) -> tuple[list[tuple[Req, int]], list[Req], int, int]:
        """The next batch: (prefill chunks, decode requests, decode tokens, decode context sum)."""
        raise NotImplementedError

    def proposed_drafts(self, s: Scheduler, draft: list[int]) -> int:
        return len(draft)

    def after_step(
        self,
        s: Scheduler,
        prefill: list[tuple[Req, int]],
        decode: list[Req],
        new_tokens: int,
        graph: bool,
        dt: float,
        now: float,
    ) -> None:
        """Periodic log lines after a step."""


def clock_stamp(fmt: str) -> str:
    return time.strftime(fmt)
