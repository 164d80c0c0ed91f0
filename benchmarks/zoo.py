"""The model zoo as benchmark workloads: transformers architectures built from small
but realistically shaped configs (random init, no download), the same architectures
``packages/cuvil-core/tests/test_model_zoo.py`` checks for correctness.

Each model is wrapped so that it returns its ``last_hidden_state`` tensor: the four
implementations (eager, torch.compile, Cuvil, onnxruntime) are then compared on the
same tensor. The wrapper changes nothing Cuvil compiles (it converts ``forward`` and
calls into the model as the user's code would). ``transformers`` is a benchmark and
test dependency only; without it the zoo is empty.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

#: vocabulary size, sequence length and width shared by the text models
VOCAB, SEQ, WIDTH, LAYERS, HEADS, FFN = 1000, 128, 256, 4, 4, 1024


class LastHidden(nn.Module):
    """``model(*args).last_hidden_state``, the arguments passed by keyword."""

    def __init__(self, model: nn.Module, names: tuple[str, ...]) -> None:
        super().__init__()
        self.model = model
        self.names = names

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.model(**dict(zip(self.names, args, strict=True))).last_hidden_state


def _ids(b: int, s: int = SEQ, offset: int = 7) -> torch.Tensor:
    return torch.randint(0, VOCAB, (b, s), generator=torch.Generator().manual_seed(offset))


def _text(**kw: Any) -> dict[str, Any]:
    return {
        "vocab_size": VOCAB,
        "hidden_size": WIDTH,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "intermediate_size": FFN,
        **kw,
    }


class _Lazy:
    """``transformers``, imported at the first attribute read: listing the workloads (every
    benchmark child process does) does not pay for the import."""

    def __getattr__(self, name: str) -> Any:
        import transformers

        return getattr(transformers, name)


def _models() -> dict[str, tuple[str, Callable[[], nn.Module], Callable[[int], tuple[Any, ...]]]]:
    """name -> (description, build the wrapped model, its arguments at a batch size)."""
    T = _Lazy()
    ids = ("input_ids",)
    text = f"seq {SEQ}, d {WIDTH}, {LAYERS} layers, {HEADS} heads, FFN {FFN}"
    return {
        "bert": (
            f"BertModel: {text}",
            lambda: LastHidden(T.BertModel(T.BertConfig(**_text())), ids),
            lambda b: (_ids(b),),
        ),
        "gpt2": (
            f"GPT2Model (no cache): {text}",
            lambda: LastHidden(
                T.GPT2Model(
                    T.GPT2Config(
                        vocab_size=VOCAB, n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS, use_cache=False
                    )
                ),
                ids,
            ),
            lambda b: (_ids(b),),
        ),
        "llama": (
            f"LlamaModel (rotary, GQA 8 heads / 2 kv heads, no cache): seq {SEQ}, d {WIDTH}, {LAYERS} layers",
            lambda: LastHidden(
                T.LlamaModel(
                    T.LlamaConfig(
                        **_text(num_attention_heads=8, intermediate_size=688),
                        num_key_value_heads=2,
                        use_cache=False,
                    )
                ),
                ids,
            ),
            lambda b: (_ids(b),),
        ),
        "distilbert": (
            f"DistilBertModel: seq {SEQ}, d {WIDTH}, {LAYERS} layers",
            lambda: LastHidden(
                T.DistilBertModel(
                    T.DistilBertConfig(
                        vocab_size=VOCAB, dim=WIDTH, hidden_dim=FFN, n_layers=LAYERS, n_heads=HEADS
                    )
                ),
                ids,
            ),
            lambda b: (_ids(b),),
        ),
        "clip_text": (
            f"CLIPTextModel (causal text encoder of a multimodal model): seq 77, d {WIDTH}, {LAYERS} layers",
            lambda: LastHidden(T.CLIPTextModel(T.CLIPTextConfig(**_text())), ids),
            lambda b: (_ids(b, 77),),
        ),
        "vit": (
            f"ViTModel: 224x224 image, patch 16 (197 tokens), d {WIDTH}, {LAYERS} layers",
            lambda: LastHidden(
                T.ViTModel(T.ViTConfig(**{k: v for k, v in _text().items() if k != "vocab_size"})),
                ("pixel_values",),
            ),
            lambda b: (torch.randn(b, 3, 224, 224, generator=torch.Generator().manual_seed(7)),),
        ),
        "whisper_encoder": (
            "Whisper-tiny-like encoder: 80 mel bins x 3000 frames (1500 positions), d 384, 4 layers, 6 heads",
            lambda: LastHidden(
                T.WhisperModel(
                    T.WhisperConfig(
                        vocab_size=VOCAB,
                        d_model=384,
                        encoder_layers=4,
                        decoder_layers=1,
                        encoder_attention_heads=6,
                        decoder_attention_heads=6,
                        encoder_ffn_dim=1536,
                        decoder_ffn_dim=1536,
                        pad_token_id=0,
                        bos_token_id=1,
                        eos_token_id=2,
                        decoder_start_token_id=1,
                    )
                ).get_encoder(),
                ("input_features",),
            ),
            lambda b: (torch.randn(b, 80, 3000, generator=torch.Generator().manual_seed(7)),),
        ),
        "t5": (
            f"T5Model (encoder-decoder): source {SEQ}, target 32, d {WIDTH}, {LAYERS}+{LAYERS} layers",
            lambda: LastHidden(
                T.T5Model(
                    T.T5Config(
                        vocab_size=VOCAB,
                        d_model=WIDTH,
                        d_kv=WIDTH // HEADS,
                        d_ff=FFN,
                        num_layers=LAYERS,
                        num_heads=HEADS,
                        use_cache=False,
                    )
                ),
                ("input_ids", "decoder_input_ids"),
            ),
            lambda b: (_ids(b), _ids(b, 32, offset=8)),
        ),
    }


def zoo_workloads(workload: type) -> list[Any]:
    """The zoo as ``workload`` instances named ``zoo_<model>``; none without transformers."""
    if importlib.util.find_spec("transformers") is None:
        return []
    models = _models()
    return [
        workload(
            f"zoo_{name}",
            "zoo",
            f"{description}; batch 1",
            make=build,
            inputs=inputs,
            default_size=1,
            sweep=(1, 2, 4),
        )
        for name, (description, build, inputs) in models.items()
    ]
