"""``cu.quantize``: the quantization math (torchao's, checked against torchao's own primitives
where torchao is installed), the layer's errors, a small transformers Llama quantized to each
format and compiled with ``fallback="error"`` (logits and greedy tokens against the quantized
model's eager run, and the error against float32), and torchao-quantized models converted."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

import cuvil as cu
from cuvil.quantize import QuantizedLinear, quantize_weight
from cuvil_ir.graph_ir.ops.quant import QuantFormatError, round_activations, unpack_int4


def _torchao() -> Any:
    try:
        import torchao.quantization as tq
    except Exception as e:  # not installed, or built for another torch
        pytest.skip(f"torchao does not import here: {type(e).__name__}: {e}")
    return tq


# -- the math -----------------------------------------------------------------------------------


def test_int8_is_symmetric_per_channel() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, 50, generator=g) * torch.rand(6, 1, generator=g)
    q, s, z = quantize_weight(w, "int8")
    assert q.dtype == torch.int8 and z is None and s.shape == (6,)
    torch.testing.assert_close(s, w.abs().amax(1) / 127.5)
    # within half a step (the largest |w| sits at 127.5 steps: clamped to 127, half a step off)
    assert ((q.float() * s[:, None] - w).abs() <= s[:, None] * 0.5001).all()


def test_int4_is_asymmetric_per_group() -> None:
    w = torch.randn(4, 128, generator=torch.Generator().manual_seed(0)) + 0.5
    packed, s, z = quantize_weight(w, "int4", 32)
    assert packed.shape == (4, 64) and s.shape == z.shape == (4, 4)
    q = unpack_int4(packed).float().reshape(4, 4, 32)
    approx = (q - 8) * s[..., None] + z[..., None]
    assert ((approx - w.reshape(4, 4, 32)).abs() <= s[..., None] * 0.5001).all()
    # the group's extremes are representable: its min at code 0, its max at 15
    assert (q.amin(-1) == 0).all() and (q.amax(-1) == 15).all()


def test_the_math_is_torchaos() -> None:
    tq = _torchao()
    from torchao.quantization.quant_primitives import (
        MappingType,
        _choose_qparams_affine_tinygemm,
        _quantize_affine_tinygemm,
        choose_qparams_affine,
        quantize_affine,
    )

    w = torch.randn(8, 256, generator=torch.Generator().manual_seed(0))
    s8, zp = choose_qparams_affine(
        w,
        MappingType.SYMMETRIC,
        [1, 256],
        torch.int8,
        -128,
        127,
        torch.finfo(torch.float32).eps,
        torch.float32,
    )
    q8 = quantize_affine(w, [1, 256], s8, zp, torch.int8, -128, 127)
    q, s, _ = quantize_weight(w, "int8")
    assert torch.equal(q, q8) and torch.equal(s, s8.reshape(8))
    s4, z4 = _choose_qparams_affine_tinygemm(w, MappingType.ASYMMETRIC, [1, 64], torch.int32, 0, 15, 1e-6)
    q4 = _quantize_affine_tinygemm(w, [1, 64], s4, z4, torch.int32, 0, 15)
    packed, s, z = quantize_weight(w, "int4", 64)
    assert torch.equal(unpack_int4(packed).to(torch.int32), q4)
    assert torch.equal(s, s4.reshape(8, 4)) and torch.equal(z, z4.reshape(8, 4))
    assert tq is not None


# -- the layer and the entry point ----------------------------------------------------------------


def test_errors_name_the_layer_and_the_fix() -> None:
    model = nn.Sequential(nn.Linear(128, 96), nn.ReLU(), nn.Linear(96, 5))
    with pytest.raises(QuantFormatError, match=r"layer '2': int4: in_features 96 .* use group_size=32"):
        cu.quantize(copy.deepcopy(model), "int4", group_size=64)
    with pytest.raises(QuantFormatError, match="unknown format 'int2'"):
        cu.quantize(copy.deepcopy(model), "int2")
    with pytest.raises(QuantFormatError, match="group size 100 is not one of"):
        cu.quantize(copy.deepcopy(model), "int4", group_size=100)
    with pytest.raises(QuantFormatError, match="has none; pass a format"):
        cu.quantize(copy.deepcopy(model))
    with pytest.raises(TypeError, match="QuantizedLinear.from_linear"):
        cu.quantize(nn.Linear(4, 4), "int8")
    # nothing was replaced by the failed calls (layer '0' took int4 with groups of 64)
    assert isinstance(model[0], nn.Linear)


def test_filter_keeps_layers_and_state_dict_round_trips() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    cu.quantize(model, "int4", group_size=32, filter=lambda name, m: name != "2")
    assert isinstance(model[0], QuantizedLinear) and type(model[2]) is nn.Linear
    state = model.state_dict()
    assert state["0.weight"].dtype == torch.uint8 and state["0.zeros"].shape == (64, 2)
    other = cu.quantize(
        nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)),
        "int4",
        group_size=32,
        filter=lambda n, m: n != "2",
    )
    other.load_state_dict(state)
    x = torch.randn(2, 64)
    torch.testing.assert_close(other(x), model(x))


# -- a small Llama ----------------------------------------------------------------------------------


def _llama() -> Any:
    T = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = T.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    return T.LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("fmt", ["bf16", "int8", "int4", "int4-a8"])
@torch.no_grad()
def test_quantized_llama_compiles_and_matches_its_eager_run(fmt: str) -> None:
    fp32 = _llama()
    model = cu.quantize(copy.deepcopy(fp32), fmt, group_size=32)
    assert sum(isinstance(m, QuantizedLinear) for m in model.modules()) == 2 * 7 + 1  # lm_head too
    ids = torch.randint(0, 128, (1, 9))
    want = model(ids).logits  # eager: the dequantized reference
    m = cu.compile(model, target="cpu", fallback="error")
    got = m(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    kw: dict[str, Any] = {"max_new_tokens": 8, "do_sample": False}
    tokens = m.generate(ids, **kw)
    assert torch.equal(tokens, model.generate(ids, **kw))
    assert m.stats.fallbacks == 0, m.stats.recompile_reasons
    # against float32: the quantization error itself (docs/quantization.md states it per format)
    ref = fp32(ids).logits
    rel = ((want - ref).abs().max() / ref.abs().max()).item()
    assert rel < {"bf16": 0.02, "int8": 0.02, "int4": 0.2, "int4-a8": 0.2}[fmt], rel


def test_int4_a8_rounds_the_activations_and_keeps_int4s_weights() -> None:
    torch.manual_seed(0)
    lin = nn.Linear(64, 24)
    a8 = QuantizedLinear.from_linear(lin, "int4-a8", group_size=32)
    w4 = QuantizedLinear.from_linear(lin, "int4", group_size=32)
    assert torch.equal(a8.weight, w4.weight) and torch.equal(a8.scales, w4.scales)
    assert "fmt='int4-a8', group_size=32" in repr(a8)
    x = torch.randn(3, 64)
    want = nn.functional.linear(round_activations(x), w4.dequantized_weight(), lin.bias)
    torch.testing.assert_close(a8(x), want, rtol=0, atol=0)
    assert not torch.equal(a8(x), w4(x))  # the rounding is there
    with pytest.raises(QuantFormatError, match="int4-a8 group size 0"):
        QuantizedLinear.from_linear(lin, "int4-a8", group_size=0)


@torch.no_grad()
def test_a_layer_switched_to_another_format_recompiles() -> None:
    """A QuantizedLinear's format is an attribute its forward reads: changed after a compile
    (same buffers, same shapes), the next call must not run the old format's program."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.SiLU()).eval()
    cu.quantize(model, "int4", group_size=32)
    f = cu.compile(model, target="cpu", fallback="error")
    x = torch.randn(2, 64)
    torch.testing.assert_close(f(x), model(x))
    model[0].fmt = "int4-a8"
    torch.testing.assert_close(f(x), model(x), rtol=1e-5, atol=1e-6)
    assert f.stats.compiles == 2, f.stats.recompile_reasons


# -- torchao --------------------------------------------------------------------------------------


def _torchao_configs() -> list[tuple[str, Any, str, int]]:
    tq = _torchao()
    from torchao.prototype.quantization.int4.inference_workflow import PrototypeInt4WeightOnlyConfig

    return [
        ("Int8WeightOnlyConfig", tq.Int8WeightOnlyConfig(), "int8", 0),
        ("PrototypeInt4WeightOnlyConfig", PrototypeInt4WeightOnlyConfig(group_size=64), "int4", 64),
    ]


@torch.no_grad()
def test_torchao_models_convert_with_their_own_codes() -> None:
    configs = _torchao_configs()
    from torchao.quantization import quantize_

    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 64)).eval()
    x = torch.randn(3, 256)
    for name, config, fmt, group in configs:
        model = copy.deepcopy(base)
        quantize_(model, config)
        want = model(x)
        with pytest.raises(cu.CompileError, match=r"convert the model first with cu.quantize\(model\)"):
            cu.compile(model, target="cpu", fallback="error")(x)
        cu.quantize(model)
        ours = cu.quantize(copy.deepcopy(base), fmt, group_size=group or 128)
        for (k1, t1), (k2, t2) in zip(model.state_dict().items(), ours.state_dict().items()):
            assert k1 == k2 and torch.equal(t1, t2), f"{name}: {k1} differs from cu.quantize's"
        got = cu.compile(model, target="cpu", fallback="error")(x)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
