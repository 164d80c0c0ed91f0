"""A Llama-2-style tokenizer made here, with no hub download, for exporting a model to peers.

    python -m benchmarks.llm_tokenizer OUT_DIR [--vocab 8000]
    python -m benchmarks.llm_tokenizer --serve     the tokenizer cuvil-serve ships (below)

The peers of ``benchmarks.llm`` load a model from a Hugging Face folder, and their
converters insist on a tokenizer in it: onnxruntime-genai's model builder saves one
beside the ONNX model, and llama.cpp's ``convert_hf_to_gguf.py`` writes the vocabulary
into the GGUF file. The models are random-weight ones built from a config, so any
tokenizer of the model's vocabulary size will do; the benchmark feeds token ids, never
text. This one is trained with the ``tokenizers`` package (a dependency of
transformers) on the Python standard library's own sources, offline: a BPE with byte
fallback, the ``▁`` metaspace and the decoder of Llama 2's ``tokenizer.json``, so
llama.cpp's converter takes its Llama path (``LlamaHfVocab``) without needing a known
pre-tokenizer hash, and ``<unk>``, ``<s>``, ``</s>`` are ids 0, 1, 2 as in the model's
config.

``--serve`` writes the tokenizer the serving package ships
(``packages/cuvil-serve/src/cuvil_serve/data/tokenizer.json``, docs/serving.md): the same
training with a 2048-token vocabulary on the first 1 MB of the standard library, only
``tokenizer.json`` (loaded with ``tokenizers.Tokenizer.from_file``, no transformers needed).
Training is deterministic: the same Python (its standard library is the corpus) and the
same ``tokenizers`` give the same file, byte for byte.
"""

from __future__ import annotations

import argparse
import json
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SPECIALS = ["<unk>", "<s>", "</s>"]
BYTES = [f"<0x{i:02X}>" for i in range(256)]


def _corpus(max_bytes: int) -> Iterator[str]:
    """Lines of the standard library's ``.py`` files, in a fixed order, up to ``max_bytes``."""
    root = Path(sysconfig.get_paths()["stdlib"])
    seen = 0
    for path in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        yield from text.splitlines()
        seen += len(text)
        if seen >= max_bytes:
            return


#: where ``--serve`` writes, and its vocabulary and corpus sizes
SERVE_JSON = (
    Path(__file__).resolve().parent.parent / "packages/cuvil-serve/src/cuvil_serve/data/tokenizer.json"
)
SERVE_VOCAB = 2048
SERVE_CORPUS_BYTES = 1_000_000


def train_tokenizer(vocab: int, corpus_bytes: int = 4_000_000) -> Any:
    """A ``tokenizers.Tokenizer`` trained on the standard library, ``vocab`` ids exactly."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab - len(BYTES), special_tokens=SPECIALS, show_progress=False, limit_alphabet=200
    )
    tok.train_from_iterator(_corpus(corpus_bytes), trainer=trainer)
    # The 256 byte tokens as ordinary vocabulary after the specials (as Llama 2 has them),
    # not as special tokens, which decoding with skip_special_tokens would drop.
    state = json.loads(tok.to_str())
    learned = state["model"]["vocab"]
    shifted = {t: i if i < len(SPECIALS) else i + len(BYTES) for t, i in learned.items()}
    shifted.update({b: len(SPECIALS) + i for i, b in enumerate(BYTES)})
    state["model"]["vocab"] = shifted
    tok = Tokenizer.from_str(json.dumps(state))
    if tok.get_vocab_size() != vocab:
        raise RuntimeError(f"trained {tok.get_vocab_size()} tokens, not {vocab}: give it more text")
    return tok


def make_tokenizer(out_dir: str | Path, vocab: int, corpus_bytes: int = 4_000_000) -> Path:
    """Train the tokenizer on the standard library and save it (``tokenizer.json`` and
    transformers' ``tokenizer_config.json``) into ``out_dir``; ``vocab`` ids exactly."""
    from transformers import PreTrainedTokenizerFast

    tok = train_tokenizer(vocab, corpus_bytes)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", add_bos_token=True
    )
    out = Path(out_dir)
    fast.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", nargs="?")
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--serve", action="store_true", help=f"write {SERVE_JSON.name} for cuvil-serve")
    args = p.parse_args(argv)
    if args.serve:
        tok = train_tokenizer(SERVE_VOCAB, SERVE_CORPUS_BYTES)
        # compact JSON: the file is package data, kept small
        SERVE_JSON.write_text(tok.to_str(pretty=False) + "\n", encoding="utf-8")
        print(SERVE_JSON, SERVE_JSON.stat().st_size, "bytes")
        return
    if not args.out:
        p.error("OUT_DIR is required unless --serve")
    print(make_tokenizer(args.out, args.vocab))


if __name__ == "__main__":
    main()
