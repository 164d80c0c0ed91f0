"""The shipped tokenizer: loads from package data with ``tokenizers`` alone, round-trips
text, streams text without splitting characters, and is the file its documented command
makes."""

from __future__ import annotations

import platform
import sys
from importlib import resources
from pathlib import Path

import pytest

from cuvil_serve.tokenizer import IncrementalDecoder, Tokenizer

#: the Python and tokenizers the shipped file was made with (its corpus is the standard library)
MADE_WITH = ("3.11.7", "0.23.3")


def test_special_ids_and_vocab():
    tok = Tokenizer()
    assert (tok.unk_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    assert tok.vocab_size == 2048
    size = resources.files("cuvil_serve").joinpath("data", "tokenizer.json").stat().st_size  # type: ignore[attr-defined]
    assert size < 100_000


@pytest.mark.parametrize("text", ["def f(x):\n    return x + 1", "naïve café — 你好 🙂", "  two  spaces"])
def test_round_trip(text):
    tok = Tokenizer()
    ids = tok.encode(text)
    assert ids[0] == tok.bos_id
    assert tok.decode_prompt(ids) == text


def test_incremental_decoding_never_splits_a_character():
    tok = Tokenizer()
    ids = tok.encode("🙂 ok", add_bos=False)  # the emoji is byte-fallback tokens
    dec = IncrementalDecoder(tok)
    deltas = [dec.update(ids[: i + 1]) for i in range(len(ids))]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == tok.decode(ids)


def test_streamed_text_is_a_prefix_of_the_whole_text():
    """Random ids, byte tokens among them forming invalid UTF-8 (what a random model writes):
    the stable text only grows, and is always a prefix of the whole output's text."""
    import random

    tok = Tokenizer()
    rng = random.Random(0)
    byte_ids = sorted(tok.byte_ids)
    for _ in range(200):
        ids = [
            rng.choice(byte_ids) if rng.random() < 0.4 else rng.randrange(3, tok.vocab_size)
            for _ in range(30)
        ]
        dec = IncrementalDecoder(tok)
        streamed = "".join(dec.update(ids[: i + 1]) for i in range(len(ids)))
        assert tok.decode(ids).startswith(streamed), ids


def test_the_parts_decoded_add_up_to_the_whole_text():
    """The decoder decodes only the ids after its last stable end: with byte runs, special
    tokens and ordinary ones mixed, the deltas joined are the whole list's text once it
    ends in a token that is not a byte."""
    import random

    tok = Tokenizer()
    rng = random.Random(1)
    byte_ids = sorted(tok.byte_ids)
    special = [tok.bos_id, tok.eos_id, tok.unk_id]
    for _ in range(300):
        ids = []
        for _ in range(rng.randrange(1, 40)):
            r = rng.random()
            ids.append(
                rng.choice(byte_ids)
                if r < 0.4
                else rng.choice(special)
                if r < 0.5
                else rng.randrange(3, tok.vocab_size)
            )
        ids.append(rng.randrange(3, tok.vocab_size))
        while ids[-1] in tok.byte_ids:
            ids[-1] = rng.randrange(3, tok.vocab_size)
        dec = IncrementalDecoder(tok)
        step = rng.randrange(1, 4)  # several tokens between updates, as after a preemption
        deltas = [dec.update(ids[:i]) for i in range(step, len(ids) + step, step)]
        assert "".join(deltas) == dec.text == tok.decode(ids), ids


@pytest.mark.skipif(
    (platform.python_version(), __import__("tokenizers").__version__) != MADE_WITH,
    reason=f"the file was made with Python and tokenizers {MADE_WITH}: another standard library is another corpus",
)
def test_the_shipped_file_is_what_the_command_makes(tmp_path, monkeypatch):
    root = Path(__file__).resolve().parents[3]
    monkeypatch.syspath_prepend(str(root))
    from benchmarks import llm_tokenizer

    out = tmp_path / "tokenizer.json"
    monkeypatch.setattr(llm_tokenizer, "SERVE_JSON", out)
    llm_tokenizer.main(["--serve"])
    shipped = resources.files("cuvil_serve").joinpath("data", "tokenizer.json").read_bytes()
    assert out.read_bytes() == shipped, "run `python -m benchmarks.llm_tokenizer --serve` and commit the file"
    assert sys.version_info[:2] == (3, 11)
