"""Real models compile whole: transformers architectures built from small configs (random
init, no download), each compiled with ``fallback="error"``, matching eager at two
batch/sequence sizes with one compile. BERT and GPT-2 run in the fast suite; the rest
are marked slow (``nox -s slow``). ``transformers`` is a test dependency only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import cuvil as cu

T = pytest.importorskip("transformers")

V = 100  # vocabulary size


def _available(name: str) -> bool:
    from cuvil_runtime.registry import discover

    return any(i.name == name and i.available for i in discover())


TARGET = "cpu" if _available("cpu") else "reference"


def _ids(b: int, s: int) -> dict[str, Any]:
    return {"input_ids": torch.randint(0, V, (b, s))}


def _small(**kw: Any) -> dict[str, Any]:
    return {"num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64, **kw}


#: name -> (build the model, the call's keyword arguments for (batch, sequence))
ZOO: dict[str, tuple[Callable[[], Any], Callable[[int, int], dict[str, Any]]]] = {
    "bert": (lambda: T.BertModel(T.BertConfig(vocab_size=V, hidden_size=32, **_small())), _ids),
    "gpt2": (lambda: T.GPT2Model(T.GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=2)), _ids),
    # without a cache transformers checks for packed sequences on tensor data, unless
    # torch.compiler.is_compiling() ([Note: captures count as compiling])
    "gpt2_no_cache": (
        lambda: T.GPT2Model(T.GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=2, use_cache=False)),
        _ids,
    ),
    # decoder-only with rotary embeddings and grouped-query attention (4 heads, 2 kv heads)
    "llama": (
        lambda: T.LlamaModel(
            T.LlamaConfig(
                vocab_size=V, hidden_size=32, **_small(num_attention_heads=4), num_key_value_heads=2
            )
        ),
        _ids,
    ),
    "roberta": (
        lambda: T.RobertaModel(
            T.RobertaConfig(vocab_size=V, hidden_size=32, max_position_embeddings=70, **_small())
        ),
        _ids,
    ),
    "distilbert": (
        lambda: T.DistilBertModel(
            T.DistilBertConfig(vocab_size=V, dim=32, hidden_dim=64, n_layers=2, n_heads=2)
        ),
        _ids,
    ),
    # the text encoder of a multimodal model
    "clip_text": (lambda: T.CLIPTextModel(T.CLIPTextConfig(vocab_size=V, hidden_size=32, **_small())), _ids),
    "vit": (
        lambda: T.ViTModel(T.ViTConfig(hidden_size=32, image_size=32, patch_size=8, **_small())),
        lambda b, s: {"pixel_values": torch.randn(b, 3, 32, 32)},
    ),
    "whisper_encoder": (
        lambda: T.WhisperModel(
            T.WhisperConfig(
                vocab_size=V,
                d_model=32,
                encoder_layers=2,
                decoder_layers=2,
                encoder_attention_heads=2,
                decoder_attention_heads=2,
                encoder_ffn_dim=64,
                decoder_ffn_dim=64,
                num_mel_bins=16,
                max_source_positions=32,
                pad_token_id=0,
                bos_token_id=1,
                eos_token_id=2,
                decoder_start_token_id=1,
            )
        ).get_encoder(),
        lambda b, s: {"input_features": torch.randn(b, 16, 64)},  # Whisper fixes the frame count
    ),
    # encoder-decoder
    "t5": (
        lambda: T.T5Model(T.T5Config(vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=2)),
        lambda b, s: {
            "input_ids": torch.randint(0, V, (b, s)),
            "decoder_input_ids": torch.randint(0, V, (b, s - 2)),
        },
    ),
}
FAST = ("bert", "gpt2", "gpt2_no_cache")


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in ZOO])
@torch.no_grad()
def test_model_compiles_whole_and_matches_eager(name: str) -> None:
    torch.manual_seed(0)
    build, inputs = ZOO[name]
    model = build().eval()
    f = cu.compile(model, target=TARGET, fallback="error")
    for b, s in ((2, 8), (3, 5)):
        kwargs = inputs(b, s)
        got, want = f(**kwargs), model(**kwargs)
        assert type(got) is type(want)
        g, w = got.last_hidden_state, want.last_hidden_state
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    assert f.stats.compiles == 1, f.stats.recompile_reasons
    assert f.stats.fallbacks == 0
