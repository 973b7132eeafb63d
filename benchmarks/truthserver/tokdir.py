"""A local HuggingFace tokenizer directory in which every word truthserver streams is one token.

Only clients that insist on a tokenizer need it (SGLang's ``bench_serving`` loads one to count the
streamed text again); loadgen's benchmark sends token ids and needs none. Built with ``tokenizers``
alone: a WordLevel model over the streamed words plus a few hundred common English words, split on
whitespace and punctuation (``\\w+|[^\\w\\s]+``), so "w1 w2 ... wn" encodes to exactly n tokens and
words outside the vocabulary are one ``[UNK]`` each. ``transformers.AutoTokenizer`` loads the
directory through ``tokenizer_config.json`` (``PreTrainedTokenizerFast``).

    python -m benchmarks.truthserver.tokdir OUT_DIR
"""

from __future__ import annotations

import sys

from enginesim.tokenizer_dir import write_dir

from .words import stream_words

SPECIALS = ["[UNK]", "<pad>", "<s>", "</s>"]
# common English words too, so that text prompts are not all [UNK]
COMMON_TEXT = (
    "the of and to in is was that it for as with his he on be at by had not are but from or have an they",
    "which one you were her all she there would their we him been has when who will more no if out so",
    "said what up its about into than them can only other new some could time these two may then do",
    "first any my now such like our over man me even most made after also did many before must through",
)


def build(out_dir: str) -> dict[str, int]:
    """Write tokenizer.json, tokenizer_config.json, special_tokens_map.json and config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab: dict[str, int] = {}
    common = [w for line in COMMON_TEXT for w in line.split()]
    for w in SPECIALS + common + stream_words():
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with single spaces
    for s in SPECIALS:
        tok.add_special_tokens([s])
    special = {"unk_token": "[UNK]", "pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>"}
    write_dir(out_dir, tok, special, len(vocab))
    return vocab


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(f"{sys.argv[1]}: vocabulary of {len(build(sys.argv[1]))} tokens")
