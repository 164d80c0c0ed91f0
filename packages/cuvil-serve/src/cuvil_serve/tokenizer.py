"""The shipped tokenizer (``data/tokenizer.json``): a Llama-2-style BPE trained offline on
the standard library by ``python -m benchmarks.llm_tokenizer --serve`` (no hub download),
loaded with ``tokenizers.Tokenizer.from_file``."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import decoders

#: the file shipped as package data
TOKENIZER_JSON = "tokenizer.json"


class Tokenizer:
    """Text <-> token ids. ``<unk>``, ``<s>``, ``</s>`` are ids 0, 1, 2 (as in Llama 2)."""

    def __init__(self, path: str | Path | None = None) -> None:
        where = (
            str(path)
            if path is not None
            else str(resources.files("cuvil_serve").joinpath("data", TOKENIZER_JSON))
        )
        self._tok = _HFTokenizer.from_file(where)
        # Llama 2's decoder strips the space the normalizer put before the text; a
        # completion continues a prompt, so its text keeps its leading space: the same
        # decoder without the strip (prompts are decoded with it, below)
        self._tok.decoder = decoders.Sequence(
            [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
        )
        self.unk_id = self._special("<unk>")
        self.bos_id = self._special("<s>")
        self.eos_id = self._special("</s>")
        #: the byte-fallback tokens ``<0x00>`` ... ``<0xFF>`` ([Note: stable text])
        self.byte_ids = frozenset(
            i
            for t, i in self._tok.get_vocab().items()
            if len(t) == 6 and t.startswith("<0x") and t.endswith(">")
        )
        #: tokens decoding drops (special ones): byte runs on both sides of one join up
        self.special_ids = frozenset(i for i, t in self._tok.get_added_tokens_decoder().items() if t.special)
        #: tokens after which the text of a list may still change ([Note: stable text])
        self.unstable_ids = self.byte_ids | self.special_ids

    def _special(self, token: str) -> int:
        i = self._tok.token_to_id(token)
        if i is None:
            raise ValueError(f"the tokenizer has no {token} token")
        return int(i)

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size())

    def encode(self, text: str, *, add_bos: bool = True) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids] if add_bos else list(ids)

    def decode(self, ids: list[int]) -> str:
        """The text of generated ids (leading space kept, special tokens dropped)."""
        return str(self._tok.decode(ids, skip_special_tokens=True))

    def decode_prompt(self, ids: list[int]) -> str:
        text = self.decode(ids)
        return text[1:] if text.startswith(" ") else text


class IncrementalDecoder:
    """The text of a growing list of ids, only as far as it can no longer change.

    [Note: stable text]
    Byte-fallback tokens (``<0xE4>``) are decoded in runs: a run of them becomes the UTF-8
    characters it spells, and ``\ufffd`` for each byte that spells none, so a run's text can
    change while the run grows (``<0xE4>`` alone is ``\ufffd``; with ``<0xBD> <0xA0>`` after
    it, one character). The decoder chain has no step that looks further (the leading-space
    strip is removed, ``Tokenizer.__init__``), so the text of ids up to the last token that
    is not a byte token is a prefix of the text of every longer list: that is the stable
    text. Special tokens are dropped before the byte runs are decoded (a run on each side
    of one is one run), so the stable end is also never just after a special token.
    Streamed deltas are taken from it only, so their concatenation is exactly the decode
    of the whole output.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self.text = ""
        #: ids whose text is in ``text`` (always at a stable end)
        self._done = 0

    def update(self, ids: list[int]) -> str:
        """The stable text's growth since the last call. Only the ids after the last stable
        end are decoded: the chain maps each token (or run of byte tokens) on its own, so
        the text of ids cut after a token that is neither a byte nor dropped (a special token,
        across which byte runs join) is the texts of the parts joined (a test checks it
        against decoding the whole list)."""
        unstable = self._tokenizer.unstable_ids
        k = len(ids)
        while k > self._done and ids[k - 1] in unstable:
            k -= 1
        if k <= self._done:
            return ""
        delta = self._tokenizer.decode(ids[self._done : k])
        self.text += delta
        self._done = k
        return delta


__all__ = ["IncrementalDecoder", "Tokenizer"]
