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
        if path is None:
            path = resources.files("cuvil_serve").joinpath("data", TOKENIZER_JSON)
        self._tok = _HFTokenizer.from_file(str(path))
        # Llama 2's decoder strips the space the normalizer put before the text; a
        # completion continues a prompt, so its text keeps its leading space: the same
        # decoder without the strip (prompts are decoded with it, below)
        self._tok.decoder = decoders.Sequence(
            [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
        )
        self.unk_id = self._tok.token_to_id("<unk>")
        self.bos_id = self._tok.token_to_id("<s>")
        self.eos_id = self._tok.token_to_id("</s>")

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
    """The text of a growing list of ids, given out as deltas. A delta never ends inside a
    character: text that ends in U+FFFD (bytes of a character still arriving) is held back."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self.text = ""

    def update(self, ids: list[int]) -> str:
        text = self._tokenizer.decode(ids)
        if text.endswith("\ufffd"):
            return ""
        delta = text[len(self.text) :] if text.startswith(self.text) else text
        self.text = text
        return delta


__all__ = ["IncrementalDecoder", "Tokenizer"]
