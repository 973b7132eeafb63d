"""enginesim's tokenizer directory: a client's ids -> text -> enginesim's ids keeps the prompt length.

SGLang's random-ids prompt is a window of consecutive ids decoded by the client's tokenizer; the server
counts the text again. With the whole-word test tokenizer that came to 3,788 tokens for 1,024 ids."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tokenizers
from es_helpers import REPO

from enginesim.catalog import load_model
from enginesim.tokenizer import Tokenizer

MODEL = "Qwen/Qwen3-0.6B"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    out = tmp_path_factory.mktemp("tok")
    cp = subprocess.run(
        [sys.executable, "-m", "enginesim", "tokenizer-dir", str(out), "--model-path", MODEL],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert "151937 tokens" in cp.stdout, cp.stdout
    return out, load_model(MODEL).vocab


@pytest.mark.parametrize("offset", [256, 1000, 77777, 150000])
def test_a_window_of_word_ids_decodes_to_text_enginesim_reads_as_the_same_ids(built, offset: int) -> None:
    out, vocab = built
    hf = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    ids = list(range(offset, offset + 1024))
    text = hf.decode(ids, skip_special_tokens=False)
    assert Tokenizer(vocab).encode(text) == ids


def test_a_window_over_the_byte_ids_keeps_its_length_within_the_placeholders(built) -> None:
    """Ids 128..255 are lone bytes enginesim cannot receive as text: each comes back as its 6-byte
    placeholder; every other id comes back as itself."""
    out, vocab = built
    hf = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    ids = list(range(200, 1224))
    got = Tokenizer(vocab).encode(hf.decode(ids, skip_special_tokens=False))
    assert len(got) == 1024 + 5 * (256 - 200)
    assert got[-(1224 - 256) :] == list(range(256, 1224))


def test_streamed_text_is_counted_as_the_tokens_enginesim_sent(built) -> None:
    out, vocab = built
    hf = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    es = Tokenizer(vocab)
    ids = [256 + (i * 7919) % (vocab - 256) for i in range(2000)]
    assert hf.encode(es.decode(ids)).ids == ids


def test_the_directory_has_what_transformers_autotokenizer_reads(built) -> None:
    """(tests/ansible/test_bench_client.py loads it with SGLang's own client.)"""
    out, _ = built
    config = (out / "tokenizer_config.json").read_text()
    assert '"tokenizer_class": "PreTrainedTokenizerFast"' in config
    assert (out / "config.json").is_file() and (out / "special_tokens_map.json").is_file()
