"""Float16 and bfloat16 in fused kernels: bits in memory, float in registers, rounding
where eager rounds ([Note: opmath], [Note: half precision in C]).

Every case is compared with eager on the same inputs, values and dtypes. Ops whose
float32 math is exact before the rounding (add, mul, div, casts, where, max ...)
must give eager's bits; transcendental ones (exp, tanh, softmax ...) may differ by
the last float32 bit before rounding, so they are held to half-precision
tolerance, and NaN, inf and zero stay where eager puts them. The inputs carry the
values rounding gets wrong first: NaN, infinities, signed zeros, subnormals, ties
and (float16) overflow. ``nox -s tests_isa`` runs this file with kernels built for
``CUVIL_CPU_ISA=avx2`` and ``portable`` too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import cuvil as cu
from cuvil_backend_cpu.testing import executable_of
from cuvil_ir.tensor_ir.program import Control, Extern, TensorProgram

HALVES = (torch.bfloat16, torch.float16)


def _specials(x: torch.Tensor) -> torch.Tensor:
    """``x`` (float32, 2-d) with the values rounding gets wrong first written into row 0."""
    x = x.clone()
    f16_tiny = [6e-8, 3e-8, 2**-24 * 1.5, 2**-14 * 0.999, 65519.0, 65520.0, 7e4]
    bf16_tiny = [1e-39, 9.2e-41, 1 + 2**-8, 1 + 3 * 2**-8]
    values = [float("nan"), float("inf"), float("-inf"), -0.0, 0.0, *f16_tiny, *bf16_tiny]
    values += [-v for v in values[5:]]
    n = min(len(values), x.shape[1])
    x[0, :n] = torch.tensor(values[:n])
    return x


def inputs(dtype: torch.dtype, rows: int = 19, cols: int = 67, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = _specials(torch.randn(rows, cols, generator=g) * 3)
    y = torch.randn(rows, cols, generator=g) + 0.25
    return x.to(dtype), y.to(dtype)


def assert_eager(got: Any, want: Any, exact: bool) -> None:
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert_eager(a, b, exact)
        return
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape)
    if exact:
        same = (got == want) | (got.isnan() & want.isnan())
        assert bool(same.all()), (
            f"{int((~same).sum())} elements differ: {got[~same][:5]} vs {want[~same][:5]}"
        )
        if want.is_floating_point():  # and the sign of every zero
            assert torch.equal(torch.signbit(got[want == 0]), torch.signbit(want[want == 0]))
        return
    torch.testing.assert_close(got, want, equal_nan=True)
    if want.is_floating_point():
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(got.isinf(), want.isinf())


def externs(program: TensorProgram) -> list[str]:
    """The ops of every extern call, in regions too."""
    out: list[str] = []
    for s in program.steps:
        if isinstance(s, Extern):
            out.append(s.node.op)
        elif isinstance(s, Control):
            for r in s.regions:
                out.extend(externs(r))
    return out


def check(fn: Callable[..., Any], args: tuple[Any, ...], exact: bool) -> None:
    compiled = cu.compile(fn, target="cpu", fallback="error")
    assert_eager(compiled(*args), fn(*args), exact)
    program = executable_of(compiled).program
    assert not externs(program), f"externs {externs(program)}:\n{program}"


# ops whose float32 result is exact before the one rounding: eager's bits
EXACT: dict[str, Callable[..., Any]] = {
    "add": lambda x, y: x + y,
    "scalars": lambda x, y: (x - 0.1, 0.3 + x, x > 0.1, x * 0.1, x / 0.3, x // 0.3, torch.fmod(y, 0.3)),
    "tensor_scalars": lambda x, y: (x - torch.tensor(0.1), x * torch.tensor(1.1) + y),
    "pow_scalar": lambda x, y: y.abs() ** 1.7,
    "mul": lambda x, y: x * y,
    "div": lambda x, y: x / y,
    "chain": lambda x, y: (x * y + x) / y - 2.5,  # rounds after every op, as eager
    "neg_abs": lambda x, y: (-x).abs() + y,
    # relu(-0.0) is -0.0 in eager, +0.0 in Cuvil (max(x, 0), float32 alike): x + 0.0 has no -0.0
    "relu_clamp": lambda x, y: torch.relu(x + 0.0).clamp(max=0.7) + x.clamp(-0.3, 0.2),
    "maximum": lambda x, y: torch.maximum(x, y) - torch.minimum(x, y),
    "where": lambda x, y: torch.where(x > y, x, y * 2),
    "compare": lambda x, y: ((x >= y) | (x == 0), x != x),
    "square": lambda x, y: x.square() + x * x * x,
    "sqrt": lambda x, y: y.abs().sqrt(),
    "to_float": lambda x, y: x.float() * 3.1 + y.double(),
    "from_float": lambda x, y: (x.float() * 3.1).to(x.dtype),
    # y, not x (inf and NaN have no int32), and |y|: gcc turns (float)(int)v into trunc(v),
    # -0.0 for v = -0.5 where eager has +0.0 (float32 alike)
    "round_trip": lambda x, y: (y.abs().to(torch.int32).to(x.dtype), x.round() + x.floor()),
    "other_half": lambda x, y: x.to(torch.float16 if x.dtype == torch.bfloat16 else torch.bfloat16),
    "bool": lambda x, y: x.bool().to(x.dtype) + (x > 0),
    "amax": lambda x, y: (x.nan_to_num(0.0).amax(-1), y.amin(0)),
    "copy_twice": lambda x, y: (x, x),
    "transpose": lambda x, y: x.t() + y.t(),
    "cat_pad": lambda x, y: torch.cat([x, F.pad(y, (1, 2))], 1),
    "tril": lambda x, y: x.tril() * 2,
    "mixed": lambda x, y: x + y.float(),  # promotes to float32
}

# transcendental and reduced ops: within half tolerance (one rounding of a float32
# result that may differ from eager's in its last bit; sums reassociate)
APPROX: dict[str, Callable[..., Any]] = {
    "exp_log": lambda x, y: x.exp() + y.abs().log(),
    "tanh_sigmoid": lambda x, y: x.tanh() * y.sigmoid(),
    # y: eager's gelu(inf) is NaN, Cuvil's inf (float32 alike)
    "gelu": lambda x, y: F.gelu(y) + F.gelu(y * 3, approximate="tanh"),
    "silu_softplus": lambda x, y: F.silu(x) - F.softplus(y),
    "erf": lambda x, y: torch.erf(x),
    "sum": lambda x, y: (y.sum(-1), y.sum(0, keepdim=True), y.sum()),
    "mean": lambda x, y: y.mean(-1) + y.mean(),
    "sum_to_float": lambda x, y: y.sum(-1, dtype=torch.float32),
    "softmax": lambda x, y: (torch.softmax(y, -1), torch.log_softmax(y, 0)),
    "softmax_specials": lambda x, y: torch.softmax(x, -1),
    "layer_norm": lambda x, y: F.layer_norm(y, (y.shape[-1],), eps=1e-5),
    "rms_norm": lambda x, y: F.rms_norm(y, (y.shape[-1],), eps=1e-6),
    "var": lambda x, y: y.var(-1),
}


@pytest.mark.parametrize("dtype", HALVES, ids=str)
@pytest.mark.parametrize("name", sorted(EXACT))
def test_exact_ops_give_eagers_bits(name: str, dtype: torch.dtype) -> None:
    check(EXACT[name], inputs(dtype), exact=True)


@pytest.mark.parametrize("dtype", HALVES, ids=str)
@pytest.mark.parametrize("name", sorted(APPROX))
def test_math_within_half_tolerance(name: str, dtype: torch.dtype) -> None:
    check(APPROX[name], inputs(dtype), exact=False)


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_module_in_half(dtype: torch.dtype) -> None:
    """A module converted with ``.to(dtype)``: its linears stay torch's, everything
    between them is fused kernels in the half type."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Linear(40, 64), torch.nn.LayerNorm(64), torch.nn.GELU(), torch.nn.Linear(64, 8)
    ).eval()
    m = m.to(dtype)
    x = torch.randn(5, 40).to(dtype)
    compiled = cu.compile(m, target="cpu", fallback="error")
    with torch.no_grad():
        assert_eager(compiled(x), m(x), exact=False)
    assert set(externs(executable_of(compiled).program)) <= {"linear"}


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_one_compile_serves_other_sizes(dtype: torch.dtype) -> None:
    def f(x, y):
        return torch.softmax(x * y + 1, -1)

    compiled = cu.compile(f, target="cpu", fallback="error")
    for rows, cols in ((3, 5), (64, 1031), (1, 1)):
        x, y = inputs(dtype, rows, cols, seed=rows)
        assert_eager(compiled(x, y), f(x, y), exact=False)
    assert compiled.stats.compiles == 1


def test_every_half_store_rounds_every_element() -> None:
    """All 65536 float16 and bfloat16 bit patterns through a fused add of zero (rounds each
    element once more: must be the identity, NaN for NaN) and a cast from float32 of every
    pattern plus a small offset (rounding, ties, overflow): eager's bits."""
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)

    def narrow(t, like):
        return t.to(like.dtype)

    for dtype in HALVES:
        x = bits.view(dtype)
        check(lambda t: t + 0.0, (x,), exact=True)
        check(narrow, (x.float() * (1 + 2**-9), x[:1]), exact=True)


def test_probe_finds_wrong_conversions(tmp_path, monkeypatch) -> None:
    """The toolchain's probe checks the helpers against torch's bits: helpers that round
    ties away from zero (a wrong bias) are caught, and the right ones pass."""
    from cuvil_backend_cpu import half
    from cuvil_backend_cpu.toolchain import find_toolchain

    tc = find_toolchain()
    assert tc.half and half.probe(tc.cc, tc.flags, str(tmp_path)) is None
    monkeypatch.setattr(half, "_PROBE", half._PROBE.replace("0x7FFFu + ((u >> 16) & 1u)", "0x8000u"))
    reason = half.probe(tc.cc, tc.flags, str(tmp_path))
    assert reason is not None and "bf16 disagree with torch" in reason


def test_no_half_kernels_where_the_probe_failed() -> None:
    """A toolchain whose half conversions failed the probe keeps half ops torch's (externs)
    and says so in its identity (so kernels and programs of the two never mix)."""
    from dataclasses import replace

    from cuvil_backend_cpu.kernel_cache import KernelCache
    from cuvil_backend_cpu.target import CpuTarget
    from cuvil_backend_cpu.toolchain import find_toolchain
    from cuvil_ir.graph_ir.types import DType
    from cuvil_ir.tensor_ir.lower import lower
    from cuvil_runtime.target import CompileOptions

    tc = find_toolchain()
    off = replace(tc, half=False)
    assert off.identity != tc.identity
    policy = CpuTarget(KernelCache(off)).fusion_policy(CompileOptions())
    assert DType.bf16 not in policy.dtypes and DType.f32 in policy.dtypes

    def f(x):
        return x * 2 + 1

    graph = cu.compile(f, target="reference")
    graph(torch.ones(3, dtype=torch.bfloat16))
    assert externs(lower(graph.graphs[0], policy)) == ["mul", "add"]
    assert externs(lower(graph.graphs[0], CpuTarget().fusion_policy(CompileOptions()))) == []


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_half_row_kernels_keep_their_float32_values_in_a_scratch_row(dtype: torch.dtype) -> None:
    """A half softmax computes ``exp`` once: the sum phase keeps ``exp(x - max)`` in a
    float32 Scratch row (its output cannot hold it unrounded) and the store reads it back;
    rows longer than the stack part of the scratch go to the heap. Results are eager's
    within half tolerance at both lengths."""
    from cuvil_backend_cpu.codegen import SCRATCH_STACK

    def f(x):
        return torch.softmax(x * 0.125, -1)

    compiled = cu.compile(f, target="cpu", fallback="error")
    for cols in (77, SCRATCH_STACK + 3):
        x = inputs(dtype, 5, cols)[0]
        assert_eager(compiled(x), f(x), exact=False)
    (kernel,) = executable_of(compiled).kernel_texts.values()
    assert "scratch %st0: f32" in kernel["loop_ir"] and kernel["c"].count("expf(") == 2  # sum, store
    assert kernel["loop_ir"].count("exp(") == 1  # once per element: the store reads the row
