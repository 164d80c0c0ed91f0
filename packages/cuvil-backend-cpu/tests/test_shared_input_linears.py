"""Linears of one input as one call (``cuvil_backend_cpu.shared_input_linears``): the grouped
GEMV of ``quant_linear.c`` against a float64 reference for every format, odd sizes, bias and
strided rows, every tiling; the rewrite's groups; compiled functions and a quantized decoder
against eager, on the grouped kernel (few rows) and member by member (more rows). ``nox -s
tests_isa`` runs this file with ``CUVIL_CPU_ISA=avx2`` and ``portable`` too."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

import cuvil as cu
import cuvil.api
from cuvil_backend_cpu import quant_linear, shared_input_linears
from cuvil_backend_cpu.kernel_cache import KernelCache
from cuvil_backend_cpu.quant_linear import QuantLinearKernel
from cuvil_backend_cpu.testing import Weight, executable_of, native_runs_here, native_runs_used
from cuvil_ir.graph_ir.ops.quant import round_activations, weight_only_linear
from cuvil_runtime.cache import CompileCache


@pytest.fixture(scope="module", params=[None, 16, 4], ids=["host", "lanes16", "lanes4"])
def ql(request: pytest.FixtureRequest) -> QuantLinearKernel:
    if request.param is None:
        return quant_linear.kernel(KernelCache())
    return QuantLinearKernel(KernelCache(), lanes=request.param)


class F32Weight:
    """A float32 weight with :class:`Weight`'s interface."""

    def __init__(self, n: int, k: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.weight = torch.randn(n, k, generator=g)
        self.w64 = self.weight.double()
        self.fmt = "f32"

    def params(self) -> tuple[torch.Tensor, ...]:
        return ()

    check = Weight.check


#: (fmt, the members' N, K, group): N off every tile, K off the vector width where allowed
GROUPS = [
    ("f32", (13, 5, 5), 37, 0),
    ("bf16", (9, 3), 70, 0),
    ("int8", (16, 4, 4), 130, 0),
    ("int4", (7, 33), 192, 64),
    ("int4", (4, 4, 8, 1), 128, 128),
]


def _weights(fmt: str, ns: tuple[int, ...], k: int, group: int) -> list[Any]:
    return [
        F32Weight(n, k, i) if fmt == "f32" else Weight(fmt, n, k, group, seed=i) for i, n in enumerate(ns)
    ]


@pytest.mark.parametrize("fmt,ns,k,group", GROUPS)
@pytest.mark.parametrize("rows", [1, 3, 6])
@pytest.mark.parametrize("bias", [False, True])
def test_the_grouped_kernel_against_float64(ql, fmt, ns, k, group, rows, bias) -> None:
    ws = _weights(fmt, ns, k, group)
    g = torch.Generator().manual_seed(rows)
    wide = torch.randn(rows, k + 3, generator=g)
    x = wide[:, :k]  # rows k + 3 apart: the kernel reads x by its row stride
    biases = [torch.randn(w.weight.shape[0], generator=g) if bias else None for w in ws]
    outs = [torch.full((rows, w.weight.shape[0]), float("nan")) for w in ws]
    members = [(w.weight, *w.params(), *([b] if b is not None else [])) for w, b in zip(ws, biases)]
    assert ql.group_into(outs, x, members, fmt, group)
    for w, out, b in zip(ws, outs, biases):
        w.check(out, x, b)


def test_the_rewrite_groups_linears_of_one_input() -> None:
    def qkv(x, wq, wk, wv, w_other, y):  # type: ignore[no-untyped-def]
        q, k, v = F.linear(x, wq), F.linear(x, wk), F.linear(x, wv)
        h = F.linear(y, w_other)  # another input: its own call
        return q.sum(-1) + k.sum(-1) + v.sum(-1) + h.sum(-1)

    def late_weight(x, wq, wk):  # type: ignore[no-untyped-def]
        q = F.linear(x, wq)
        w2 = wk * 2  # defined after the first linear: not in its group
        return q.sum(-1) + F.linear(x, w2).sum(-1)

    f = cu.compile(qkv, target="cpu", fallback="error")
    g = cu.compile(late_weight, target="cpu", fallback="error")
    args = (
        torch.randn(2, 16),
        torch.randn(8, 16),
        torch.randn(4, 16),
        torch.randn(4, 16),
        torch.randn(3, 16),
    )
    y = torch.randn(2, 16)
    torch.testing.assert_close(f(*args, y), qkv(*args, y))
    text = executable_of(f).program.graph.text
    # the three of x as one group; the one of y (rows [batch, features], not one position per
    # sequence) keeps its GEMM choice
    assert text.count("cpu_linear_group") == 1 and "count = 3" in text and text.count("= linear(") == 1, text
    a = (torch.randn(2, 16), torch.randn(8, 16), torch.randn(8, 16))
    torch.testing.assert_close(g(*a), late_weight(*a))
    assert "cpu_linear_group" not in executable_of(g).program.graph.text
    # float32 rows of (batch, sequence), an encoder's: each linear keeps its own GEMM
    e = cu.compile(qkv, target="cpu", fallback="error")
    enc = (torch.randn(2, 7, 16), *args[1:4], torch.randn(3, 16))
    torch.testing.assert_close(e(*enc, torch.randn(2, 7, 16) * 0), qkv(*enc, torch.randn(2, 7, 16) * 0))
    assert "cpu_linear_group" not in executable_of(e).program.graph.text


@pytest.mark.parametrize("native", [True, False], ids=["native-runs", "python-steps"])
@pytest.mark.parametrize("fmt", ["f32", "bf16", "int8", "int4"])
def test_compiled_groups_match_eager_on_both_paths(fmt, native, monkeypatch) -> None:
    ws = _weights(fmt, (32, 8, 8), 64, 32)

    def three(x, *flat):  # type: ignore[no-untyped-def]
        out = []
        for i, w in enumerate(ws):
            weight = flat[i]
            if fmt == "f32":
                out.append(F.linear(x, weight, flat[3 + i]))
            else:
                out.append(
                    weight_only_linear(
                        x,
                        weight,
                        *w.params(),
                        bias=flat[3 + i],
                        fmt=fmt,
                        group_size=32 if fmt == "int4" else 0,
                    )
                )
        return torch.cat(out, -1)

    flat = (*(w.weight for w in ws), *(torch.randn(w.weight.shape[0]) for w in ws))
    monkeypatch.setenv("CUVIL_NATIVE_RUNS", "1" if native else "0")
    monkeypatch.setattr(cuvil.api, "_EXECUTABLES", CompileCache())  # (a wrapper made under the setting)
    f = cu.compile(three, target="cpu", fallback="error")
    grouped: list[int] = []
    real = QuantLinearKernel.group_into

    def spy(self, *a, **kw):  # type: ignore[no-untyped-def]
        done = real(self, *a, **kw)
        grouped.append(int(done))
        return done

    monkeypatch.setattr(QuantLinearKernel, "group_into", spy)
    for rows in (2, 6, 80):  # the grouped GEMV, then member by member
        x = torch.randn(rows, 64)
        want = three(x, *flat)
        for _ in range(2):  # (with native runs: a binding's first call from Python, then natively)
            got = f(x, *flat)
            assert got.dtype == want.dtype
            torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    assert f.stats.compiles == 1
    assert "cpu_linear_group" in executable_of(f).program.graph.text
    limit = (
        shared_input_linears.F32_GROUP_ROWS
        if fmt == "f32"
        else quant_linear.kernel(KernelCache()).gemv_max_rows
    )
    # rows of x: 2, 6, 80; the grouped kernel runs up to the limit, members one at a time beyond;
    # with native runs the step runner calls the grouped kernel (no Python call of it)
    used = native_runs_used(f)
    if (
        native and native_runs_here()
    ):  # the first call of each binding from Python, the second by the step runner
        assert grouped == [1 for rows in (2, 6, 80) if rows <= limit], grouped
        assert sorted(used.values()) == sorted([[rows <= limit] for rows in (2, 6, 80)]), used
    else:
        assert grouped == [1 for rows in (2, 6, 80) if rows <= limit for _ in range(2)], grouped
        assert used == {}, used


def test_a_quantized_decoder_generates_as_eager() -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = cu.quantize(transformers.LlamaForCausalLM(cfg).eval(), "int4", group_size=32)
    compiled = cu.compile(model, target="cpu", fallback="error")
    ids = torch.randint(0, 64, (2, 5))
    kw = {"max_new_tokens": 8, "min_new_tokens": 8, "do_sample": False, "cache_implementation": "static"}
    with torch.no_grad():
        assert torch.equal(compiled.generate(ids, **kw), model.generate(ids, **kw))
    texts = [a.executable.program.graph.text for a in compiled.artifacts if a.captured is not None]
    # per layer: q, k, v as one call and gate, up as another
    assert all(t.count("cpu_linear_group") == 2 * cfg.num_hidden_layers for t in texts)


def test_a_float32_decoder_groups_its_decode_step_only() -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    compiled = cu.compile(model, target="cpu", fallback="error")
    ids = torch.randint(0, 64, (1, 5))
    kw = {"max_new_tokens": 6, "min_new_tokens": 6, "do_sample": False, "cache_implementation": "static"}
    with torch.no_grad():
        assert torch.equal(compiled.generate(ids, **kw), model.generate(ids, **kw))
    counts = sorted(a.executable.program.graph.text.count("cpu_linear_group") for a in compiled.artifacts)
    # the prefill's rows are (batch, prompt): separate GEMMs; the step's (batch, 1): grouped,
    # the output and down projections and the LM head each a group of one
    assert counts == [0, 4 * cfg.num_hidden_layers + 1], counts


def _product64(w: Any, x: torch.Tensor) -> torch.Tensor:
    """``x @ W^T`` in float64 for ``w`` (a :class:`Weight` or :class:`F32Weight`)."""
    if w.fmt == "int4-a8":
        x = round_activations(x)
    return x.double() @ w.w64.t()


@pytest.mark.parametrize(
    "fmt,n,k,group",
    [
        ("f32", 13, 37, 0),
        ("bf16", 9, 70, 0),
        ("int8", 33, 130, 0),
        ("int4", 7, 192, 64),
        ("int4-a8", 20, 128, 32),
    ],
)
@pytest.mark.parametrize("rows", [1, 3])
def test_the_grouped_kernel_applies_silu_gate(ql, fmt, n, k, group, rows) -> None:
    """``epilogue="silu_mul"``: ``silu(x W_g^T) * (x W_u^T)`` against float64, output sizes off
    every vector width (the last partial vector of a row) and gate values far out on both sides."""
    gate, up = _weights("int4" if fmt == "int4-a8" else fmt, (n, n), k, group)
    gate.fmt = up.fmt = fmt
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, k + 5, generator=g)[:, :k] * 3
    out = torch.full((rows, n), float("nan"))
    members = [(w.weight, *w.params()) for w in (gate, up)]
    assert ql.group_into([out], x, members, fmt, group, "silu_mul")
    a, b = _product64(gate, x), _product64(up, x)
    want = a * torch.sigmoid(a) * b
    tol = 2e-5 * (want.abs().max().item() + (x.double().abs() @ gate.w64.abs().t()).max().item())
    assert out.dtype == torch.float32
    err = (out.double() - want).abs().max().item()
    assert err <= tol, f"{fmt}: error {err:.3g} > {tol:.3g}"
    # the epilogue's own arithmetic: exact products in, eager's silu * mul out (within rounding)
    z = torch.tensor([[-200.0, -30.0, -1.5, -0.0, 0.0, 1e-30, 2.5, 40.0, 90.0]])
    w_id = torch.eye(9)
    got = torch.empty(1, 9)
    assert ql.group_into([got], z, [(w_id,), (w_id,)], "f32", 0, "silu_mul")
    torch.testing.assert_close(got, F.silu(z) * z, rtol=3e-7, atol=0)


def test_the_rewrite_fuses_a_gated_mlp() -> None:
    def mlp(x, wg, wu, wd):  # type: ignore[no-untyped-def]
        return F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)

    def up_first(x, wg, wu, wd):  # type: ignore[no-untyped-def]
        return F.linear(F.linear(x, wu) * F.silu(F.linear(x, wg)), wd)

    def gate_read_twice(x, wg, wu, wd):  # type: ignore[no-untyped-def]
        g = F.linear(x, wg)
        return F.linear(F.silu(g) * F.linear(x, wu), wd) + g.sum()

    args = (torch.randn(2, 24), torch.randn(40, 24), torch.randn(40, 24), torch.randn(24, 40))
    for fn, fused in ((mlp, True), (up_first, True), (gate_read_twice, False)):
        f = cu.compile(fn, target="cpu", fallback="error")
        got, want = f(*args), fn(*args)
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
        text = executable_of(f).program.graph.text
        assert text.count("cpu_linear_group") == 1, text
        assert ('epilogue = "silu_mul"' in text) == fused and ("silu(" not in text) == fused, text


@pytest.mark.parametrize("native", [True, False], ids=["native-runs", "python-steps"])
@pytest.mark.parametrize("fmt", ["int4", "int4-a8", "int8"])
def test_a_fused_quantized_mlp_matches_eager_on_both_paths(fmt, native, monkeypatch) -> None:
    """A quantized gated MLP: the grouped kernel's epilogue for few rows, the members one at a
    time and the epilogue after them for more rows (the prefill's), equal to eager."""
    torch.manual_seed(0)
    mlp = torch.nn.ModuleDict(
        {"gate": torch.nn.Linear(64, 96, bias=False), "up": torch.nn.Linear(64, 96, bias=False)}
    )
    down = torch.nn.Linear(96, 64, bias=False)

    class MLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate, self.up, self.down = mlp["gate"], mlp["up"], down

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.down(F.silu(self.gate(x)) * self.up(x))

    model = cu.quantize(MLP().eval(), fmt, group_size=32)
    monkeypatch.setenv("CUVIL_NATIVE_RUNS", "1" if native else "0")
    monkeypatch.setattr(cuvil.api, "_EXECUTABLES", CompileCache())  # (a wrapper made under the setting)
    f = cu.compile(model, target="cpu", fallback="error")
    calls: list[str] = []
    real = QuantLinearKernel.group_into

    def spy(self, outs, x, members, fmt_, group_size, epilogue=""):  # type: ignore[no-untyped-def]
        done = real(self, outs, x, members, fmt_, group_size, epilogue)
        calls.append(f"{epilogue}:{int(done)}")
        return done

    monkeypatch.setattr(QuantLinearKernel, "group_into", spy)
    limit = quant_linear.kernel(KernelCache()).gemv_max_rows
    with torch.no_grad():
        for rows in (1, 5, limit + 3):
            x = torch.randn(rows, 64)
            want = model(x)
            for _ in range(2):  # (with native runs: a binding's first call from Python, then natively)
                torch.testing.assert_close(f(x), want, rtol=2e-5, atol=2e-5)
    # the third binding: more rows than the GEMV takes
    if (
        native and native_runs_here()
    ):  # the second calls: the step runner calls the grouped kernel and the down projection's GEMV
        assert calls == ["silu_mul:1", "silu_mul:1"], calls
        assert sorted(native_runs_used(f).values()) == [[False], [True], [True]]
    else:
        assert calls == ["silu_mul:1"] * 4, calls
    assert 'epilogue = "silu_mul"' in executable_of(f).program.graph.text


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("forced", ["grouped", "members", None], ids=["grouped", "members", "measured"])
def test_half_linears_of_one_input_group_at_any_rows(dtype, forced, monkeypatch) -> None:
    """Half-precision projections of an encoder's (batch, sequence) rows are one group
    ([Note: grouped GEMMs] in half_gemm.py): one oneDNN GEMM on the weights packed together
    where this CPU's oneDNN takes the type, or the members; each matches eager, with a bias,
    a gated MLP's gate and up (its ``silu(gate) * up`` stays a fused kernel: no grouped GEMV
    runs half groups), and after a weight changes in place."""
    from cuvil_backend_cpu import gemm_choice, half_gemm

    if forced is not None:
        monkeypatch.setenv(gemm_choice.GEMM_ENV, forced)
    torch.manual_seed(0)
    lin = [torch.nn.Linear(48, n).to(dtype) for n in (32, 16, 16)]
    gate, up = torch.nn.Linear(48, 40, bias=False).to(dtype), torch.nn.Linear(48, 40, bias=False).to(dtype)

    def layer(x):  # type: ignore[no-untyped-def]
        q, k, v = (m(x) for m in lin)
        return torch.cat([q, k, v], -1), F.silu(gate(x)) * up(x)

    f = cu.compile(layer, target="cpu", fallback="error")
    ran: list[str] = []
    real = half_gemm.group_into

    def spy(*a, **kw):  # type: ignore[no-untyped-def]
        ran.append("group")
        return real(*a, **kw)

    monkeypatch.setattr(half_gemm, "group_into", spy)
    with torch.no_grad():
        for step in range(3):
            if step == 2:
                lin[1].weight.mul_(-0.5)  # a packed group weight is rebuilt for the new version
            x = torch.randn(2, 9 if step != 1 else 5, 48).to(dtype)  # (a symbolic sequence length)
            for got, want in zip(f(x), layer(x)):
                assert got.dtype == want.dtype and got.shape == want.shape
                torch.testing.assert_close(got.float(), want.float(), rtol=2**-6, atol=2**-6)
    text = executable_of(f).program.graph.text
    assert text.count("cpu_linear_group") == 2 and "silu_mul" not in text, text
    assert "= linear(" not in text, text
    assert len(ran) == 6  # two groups a call
    assert f.stats.compiles == 1
    from cuvil_backend_cpu import externs

    packed_together = [k for k in half_gemm._GROUPS if id(lin[0].weight) in k or id(gate.weight) in k]
    if forced == "grouped" and externs._ONEDNN and half_gemm._onednn_takes(dtype):
        assert len(packed_together) == 2  # (the projections' and the MLP's; the first version's gone)
    elif forced == "members":
        assert not packed_together


def test_a_lone_linear_of_one_position_is_a_group_of_one() -> None:
    """A float32 linear alone on ``[batch, 1, hidden]`` (a decode step's output projection or
    LM head) is a group of one (its GEMV a native run's step); on ``[batch, features]`` (an
    MLP's batch) it keeps its GEMM choice. Both against eager at several batches."""

    def head(h, w, b):  # type: ignore[no-untyped-def]
        return F.linear(h, w, b) * 2

    w, b = torch.randn(40, 24), torch.randn(40)
    # (the position axis static, as a decode step's is pinned to 1 by the code that reads it)
    one = cu.compile(head, target="cpu", fallback="error", dims={"h": {1: None}})
    flat = cu.compile(head, target="cpu", fallback="error")
    for batch in (1, 3, 9):  # the GEMV up to F32_GROUP_ROWS rows, the GEMM choice and a copy past it
        h = torch.randn(batch, 1, 24)
        torch.testing.assert_close(one(h, w, b), head(h, w, b), rtol=2e-5, atol=2e-5)
        torch.testing.assert_close(flat(h[:, 0], w, b), head(h[:, 0], w, b), rtol=2e-5, atol=2e-5)
    text = executable_of(one).program.graph.text
    assert "cpu_linear_group" in text and "count = 1" in text and "= linear(" not in text, text
    assert "cpu_linear_group" not in executable_of(flat).program.graph.text
