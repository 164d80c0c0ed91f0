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


class _TinyResNet(torch.nn.Module):
    """ResNet-18's stem and one basic block per stage width (convolutions, batch norm,
    ReLU, residual adds, max and average pooling, the classifier)."""

    def __init__(self) -> None:
        super().__init__()
        nn = torch.nn
        self.stem = nn.Sequential(
            nn.Conv2d(3, 8, 7, 2, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
        )
        self.blocks = nn.ModuleList()
        for cin, cout, stride in ((8, 8, 1), (8, 16, 2)):
            body = nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout),
            )  # fmt: skip
            down = (
                nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                if stride > 1
                else nn.Identity()
            )
            self.blocks.append(nn.ModuleDict({"body": body, "down": down}))
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for b in self.blocks:
            x = torch.relu(b["body"](x) + b["down"](x))
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


HALF_ZOO = {
    **{n: ZOO[n] for n in ZOO},
    "resnet": (_TinyResNet, lambda b, s: {"x": torch.randn(b, 3, 4 * s, 4 * s)}),
}


@pytest.mark.parametrize("mode", ["bfloat16", "autocast"])
@pytest.mark.parametrize(
    "name", [n if n in (*FAST, "resnet") else pytest.param(n, marks=pytest.mark.slow) for n in HALF_ZOO]
)
@torch.no_grad()
def test_model_in_half_precision_matches_eager(name: str, mode: str) -> None:
    """The zoo and a ResNet in bfloat16 (``model.to(torch.bfloat16)``) and called under
    ``torch.autocast("cpu", dtype=torch.bfloat16)``: one compile, eager's dtypes, values within
    the half tolerances of the conformance kit (issue 30's models end to end)."""
    import contextlib

    from cuvil.testing.conformance import TOLERANCES

    torch.manual_seed(0)
    build, inputs = HALF_ZOO[name]
    model = build().eval()
    if mode == "bfloat16":
        model = model.to(torch.bfloat16)
    f = cu.compile(model, target=TARGET, fallback="error")
    for b, s in ((2, 8), (3, 5)):
        kwargs = inputs(b, s)
        if mode == "bfloat16":
            kwargs = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in kwargs.items()}
        region = (
            torch.autocast("cpu", dtype=torch.bfloat16) if mode == "autocast" else contextlib.nullcontext()
        )
        with region:
            got, want = f(**kwargs), model(**kwargs)
        g = got if isinstance(got, torch.Tensor) else got.last_hidden_state
        w = want if isinstance(want, torch.Tensor) else want.last_hidden_state
        assert g.dtype == w.dtype and g.shape == w.shape  # (under autocast a norm's result is float32)
        assert mode == "autocast" or g.dtype == torch.bfloat16
        torch.testing.assert_close(g.float(), w.float(), **TOLERANCES[torch.bfloat16])
    assert f.stats.compiles == 1, f.stats.recompile_reasons
    assert f.stats.fallbacks == 0
