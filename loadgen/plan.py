"""The run's plan, made before anything is sent: the prompts, their arrival times and the request bytes.

Everything slow that does not measure happens here (tokenizing, sampling lengths, serializing each
request once), so a worker only hands ready bytes to a socket at the scheduled time.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass

from . import arrivals, backends, datasets, serverapi
from .httpconn import build_request
from .tokenizer import load_tokenizer

WARMUP_OUTPUT_CAP = 16


@dataclass
class Plan:
    """What to send: (index, offset ns, request bytes, input len, output len) per request."""

    main: list[tuple]
    warm: list[tuple]
    input_tokens: int  # planned (dataset) input tokens of the main phase
    output_tokens: int
    want_ids: bool  # prompts are token ids (exact lengths) rather than text
    dataset_info: dict
    path: str  # the endpoint the requests go to


def log(msg: str) -> None:
    print(msg, flush=True)


def make_prompts(args: argparse.Namespace, tok, want_ids: bool) -> tuple[list, list, dict]:
    """(main prompts, warm-up prompts, dataset info) for the chosen dataset."""
    rng = random.Random(args.seed)
    maker = datasets.PromptMaker(tok, want_ids, rng)
    n = args.num_prompts
    info: dict = {}
    if args.dataset_name == "random":
        lo, hi = datasets.len_window(
            args.random_input_len, args.random_range_ratio, args.range_ratio_semantics
        )
        olo, ohi = datasets.len_window(
            args.random_output_len, args.random_range_ratio, args.range_ratio_semantics
        )
        log(
            f"Sampling input_len from [{lo}, {hi}] and output_len from [{olo}, {ohi}] "
            f"({args.range_ratio_semantics} range-ratio semantics, ratio {args.random_range_ratio:g})"
        )
        ins = datasets.sample_lens(
            args.random_input_len, args.random_range_ratio, args.range_ratio_semantics, n, rng
        )
        outs = datasets.sample_lens(
            args.random_output_len, args.random_range_ratio, args.range_ratio_semantics, n, rng
        )
        main = datasets.random_prompts(maker, n, ins, outs)
    elif args.dataset_name == "shared-prefix":
        main = datasets.shared_prefix_prompts(
            maker,
            n,
            args.gsp_num_groups,
            args.gsp_system_prompt_len,
            args.gsp_question_len,
            args.gsp_output_len,
        )
    elif args.dataset_name == "jsonl":
        main = datasets.jsonl_prompts(args.dataset_path, n, args.random_output_len, tok, want_ids, rng)
    else:
        main = datasets.sharegpt_prompts(args.dataset_path, n, args.sharegpt_output_len, tok, rng)
    # warm-up prompts are fresh random ones (other seed) so they do not prime the prefix cache
    wmaker = datasets.PromptMaker(tok, want_ids, random.Random(args.seed + 7919))
    warm = []
    for i in range(args.warmup_requests):
        ref = main[i % len(main)]
        warm.append(wmaker.make(max(1, min(ref.input_len, 4096)), min(ref.output_len, WARMUP_OUTPUT_CAP)))
    info["prompt_len_mismatch_tokens"] = maker.mismatch
    info["input_lens_checked"] = all(pr.len_checked for pr in main)
    return main, warm, info


def discover_model(args: argparse.Namespace) -> str | None:
    """The model name OpenAI endpoints need: --model, else the server's first /v1/models id."""
    if args.model is not None or backends.api_kind(args.backend) == "native":
        return args.model
    return serverapi.first_model(args.base_url)


def make_plan(args: argparse.Namespace) -> Plan:
    """Tokenizer, prompts, arrival schedule and request bytes (raises TokenizerError/DatasetError)."""
    tok = load_tokenizer(args.tokenizer, args.base_url, args.model or "")
    want_ids = backends.accepts_ids(args.backend) and args.prompt_format != "text"
    if args.prompt_format == "auto" and args.dataset_name in ("jsonl", "sharegpt"):
        want_ids = want_ids and args.dataset_name == "jsonl"
    main_prompts, warm_prompts, dinfo = make_prompts(args, tok, want_ids)
    n = len(main_prompts)
    offsets = arrivals.schedule(n, args.request_rate, args.arrival, args.burstiness, args.seed)
    ignore_eos = not args.disable_ignore_eos
    path = backends.PATHS[args.backend]
    hostport = f"{args.host}:{args.port}"

    def payload(pr: datasets.Prompt) -> bytes:
        body = backends.build_body(args.backend, args.model or "", pr.text, pr.ids, pr.output_len, ignore_eos)
        return build_request("POST", hostport, path, body)

    main = [
        (i, int(offsets[i] * 1e9), payload(pr), pr.input_len, pr.output_len)
        for i, pr in enumerate(main_prompts)
    ]
    warm = [(-1 - i, 0, payload(pr), pr.input_len, pr.output_len) for i, pr in enumerate(warm_prompts)]
    return Plan(
        main=main,
        warm=warm,
        input_tokens=sum(pr.input_len for pr in main_prompts),
        output_tokens=sum(pr.output_len for pr in main_prompts),
        want_ids=want_ids,
        dataset_info=dinfo,
        path=path,
    )
