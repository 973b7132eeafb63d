"""A Hugging Face tokenizer directory that reads and writes text exactly as enginesim's tokeniser does.

Why: a client that insists on a local tokenizer (SGLang's ``bench_serving``, ``vllm bench serve``)
turns its random prompt ids into text with that tokenizer and the server counts the text again. With
any other vocabulary the server sees a different prompt length than the client planned (on enginesim
a whole-word test tokenizer gave 3,788 tokens for 1,024 planned ids), and the side-by-side with
loadgen compares two workloads. This directory holds enginesim's own vocabulary for a model (ids from
256 up are the words " a", " b", ..., as ``enginesim/tokenizer.py`` defines them; 0..127 are the ASCII
bytes; 128..255, which enginesim shows as U+FFFD on their own, get unique placeholders), decodes by
concatenation, and splits text with the same pattern, so a prompt of word ids decodes to text that
enginesim reads back as the same ids.

    python -m enginesim tokenizer-dir OUT_DIR --model-path Qwen/Qwen3-0.6B
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from .catalog import load_model
from .tokenizer import Tokenizer

UNK = "<unk>"
# the placeholder of a byte id 128..255 (enginesim decodes a lone one as U+FFFD, which cannot be unique)
HIGH_BYTE = "<0x{:02X}>"


def vocabulary(vocab_size: int) -> dict[str, int]:
    """Token string -> id, enginesim's ids for `vocab_size`, plus <unk> after them."""
    tok = Tokenizer(vocab_size)
    vocab = {}
    for tid in range(vocab_size):
        text = tok.token_str(tid)
        vocab[HIGH_BYTE.format(tid) if 128 <= tid < 256 else text] = tid
    vocab[UNK] = vocab_size
    return vocab


def write_dir(out_dir: str, tok: Any, specials: dict[str, str], vocab_size: int) -> None:
    """Write a `tokenizers.Tokenizer` as a directory `transformers.AutoTokenizer` loads
    (``PreTrainedTokenizerFast``), with a plain chat template and a config.json for the clients that
    read the context length from it."""
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 1 << 20,
        "clean_up_tokenization_spaces": False,
        "chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}",
        **specials,
    }
    files = {
        "tokenizer_config.json": config,
        "special_tokens_map.json": specials,
        "config.json": {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "vocab_size": vocab_size,
            "max_position_embeddings": 1 << 20,
        },
    }
    for name, obj in files.items():
        path = os.path.join(out_dir, name)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=1)
        os.replace(path + ".tmp", path)


def build(out_dir: str, vocab_size: int) -> dict[str, int]:
    """Write the directory for a model of `vocab_size` ids; returns the vocabulary."""
    from tokenizers import Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    vocab = vocabulary(vocab_size)
    tok = HFTokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # enginesim's split (tokenizer.py, _WORD_RE): a space and up to four letters, any other run, a space
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r" [a-z]{1,4}|[^ ]+| "), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([UNK])
    write_dir(out_dir, tok, {"unk_token": UNK}, len(vocab))
    return vocab


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m enginesim tokenizer-dir", description=__doc__.splitlines()[0]
    )
    ap.add_argument("out_dir")
    ap.add_argument("--model-path", required=True, help="the model enginesim serves (its vocabulary size)")
    args = ap.parse_args(argv)
    vocab = build(args.out_dir, load_model(args.model_path).vocab)
    print(f"{args.out_dir}: enginesim's vocabulary for {args.model_path}, {len(vocab)} tokens")
    return 0
