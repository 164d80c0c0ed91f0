"""The ``cpu`` target end to end: fusion, symbolic sizes, dtypes, views, the arena, threads,
control flow and deterministic output, each result checked against eager PyTorch.

Kernels land in the content-addressed kernel cache (``CUVIL_CACHE_DIR`` or the default
one), so a second run of this file compiles nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import cuvil as cu
from cuvil_backend_cpu.testing import executable_of as executable
from cuvil_runtime.pipeline import ProgramExecutable

# -- helpers --------------------------------------------------------------------------


def compiled(fn: Callable[..., Any]) -> Any:
    return cu.compile(fn, target="cpu", fallback="error")


def assert_same(got: Any, expected: Any) -> None:
    """``got`` matches ``expected`` in structure, dtype, shape and (closely) value."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor), type(got)
        assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
        assert got.shape == expected.shape, (got.shape, expected.shape)
        torch.testing.assert_close(got, expected, equal_nan=True)
    elif isinstance(expected, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(expected), (got, expected)
        for g, e in zip(got, expected):
            assert_same(g, e)
    else:
        assert got == expected, (got, expected)


def check(fn: Callable[..., Any], *args: Any, cf: Any = None) -> Any:
    """Compile ``fn`` for the cpu target (or reuse ``cf``), call it and compare with eager."""
    cf = cf or compiled(fn)
    assert_same(cf(*args), fn(*args))
    assert cf.stats.fallbacks == 0
    return cf


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=gen(seed))


def randint(lo: int, hi: int, *shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(lo, hi, shape, generator=gen(seed))


def nonzero_ints(*shape: int, seed: int = 1) -> torch.Tensor:
    """Divisors: 1..4 in magnitude, either sign."""
    g = gen(seed)
    mag = torch.randint(1, 5, shape, generator=g)
    sign = torch.where(torch.rand(shape, generator=g) > 0.5, 1, -1)
    return mag * sign


# -- fusion and symbolic sizes --------------------------------------------------------


def softmax_last(x):
    return torch.softmax(x, dim=-1)


def test_softmax_last_dim_is_one_kernel_without_temporaries_for_every_size():
    cf = compiled(softmax_last)
    for shape in ((2, 16), (5, 7), (9, 33)):
        check(softmax_last, randn(*shape), cf=cf)
    assert cf.stats.compiles == 1, cf.stats.recompile_reasons
    ex = executable(cf)
    assert ex.report.kernels == 1 and ex.report.externs == 0
    assert ex.program.plan.peak == 0 and ex.report.peak_arena_bytes == "0"
    assert not ex.program.plan.slots
    (kernel,) = ex.program.kernels()
    assert len(kernel.domain) == 2 and all(not isinstance(d, int) for d in kernel.domain)  # symbolic
    # sizes are kernel arguments: one binary serves every shape
    assert "int64_t s_x_0" in ex.stages["c"] and "int64_t s_x_1" in ex.stages["c"]
    assert "s_x_0, s_x_1)" in ex.stages["wrapper"]


def ln_gelu(x, w, b):
    return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b, 1e-5))


def test_layer_norm_then_gelu_is_one_kernel():
    cf = compiled(ln_gelu)
    for rows in (3, 6):
        check(ln_gelu, randn(rows, 24), randn(24, seed=1), randn(24, seed=2), cf=cf)
    assert cf.stats.compiles == 1
    ex = executable(cf)
    assert (ex.report.kernels, ex.report.externs) == (1, 0)
    assert ex.program.plan.peak == 0
    assert "erff(" in ex.stages["c"]  # the exact gelu, fused into the normalization's store loop


def gelu_mlp(x, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)


def test_gelu_mlp_is_two_linear_externs_and_one_fused_kernel():
    w1, b1 = randn(32, 16, seed=1) * 0.3, randn(32, seed=2)
    w2, b2 = randn(16, 32, seed=3) * 0.3, randn(16, seed=4)
    cf = compiled(gelu_mlp)
    for batch in (2, 5):
        check(gelu_mlp, randn(batch, 3, 16), w1, b1, w2, b2, cf=cf)
    assert cf.stats.compiles == 1
    ex = executable(cf)
    assert (ex.report.kernels, ex.report.externs) == (1, 2)
    assert ex.stages["tensor_ir"].count("extern e") == 2


# -- reductions, dtypes, views: a table of small programs ------------------------------


def _mask(rows: int, cols: int) -> torch.Tensor:
    m = torch.rand(rows, cols, generator=gen(5)) > 0.5
    m[0] = True  # a row of all True (all) and
    m[1] = False  # a row of all False (any)
    m[:, 0] = True  # a column of all True
    return m


def r_sum_dim0(x):
    return x.sum(0), x.sum(0, keepdim=True)


def r_sum_middle(x):
    return x.sum(1), x.mean((0, 2))


def r_mean_all(x):
    return x.mean(), x.sum()


def r_var_std(x):
    return (
        torch.var(x, dim=1, correction=0),
        torch.std(x, dim=0, correction=1, keepdim=True),
        torch.var(x, dim=(0, 1), correction=2),
        torch.std(x),
    )


def r_logsumexp(x):
    return torch.logsumexp(x, -1), torch.logsumexp(x, 0, keepdim=True)


def r_amax_amin(x):
    return x.amax(-1), x.amin(0), x.amax(), x.amin(-1, keepdim=True)


def r_any_all(m):
    return m.any(-1), m.all(-1), m.all(0), m.any(), m.all()


def r_prod(x):
    return x.prod(-1), x.prod(0)


def r_int_reductions(a):
    return a.sum(-1), a.amax(0), a.amin(), (a > 0).sum(-1)


def i_arith(a, b):
    return a + b, a * b, a - b, torch.floor_divide(a, b), torch.remainder(a, b), a // b, a % b


def i_compare(a, b):
    return a < b, a == b, a >= b, a > 3, a != -2


def m_where(x, m):
    return torch.where(m, x, -x), torch.where(x > 0.5, x, 0.0), (m & (x > 0)) | ~m


def m_masked_softmax(x, m):
    return torch.softmax(x.masked_fill(m, float("-inf")), dim=-1)


def p_int_to_float(a, x):
    return a / 2 + x * a, a.float().mean(-1), a + 1.5, (a > 0) * 1.5, a.to(torch.float64) * x


def v_views(x):
    return (
        torch.cat([x[:, :3], x.flip(0)[:, 2:]], dim=1),
        x[1] + x[:, 2].sum(),
        x.t()[1:4],
        x.t().reshape(-1) * 2,
        x[:, :1].expand(5, 7) + x,
        x.permute(1, 0)[::2].reshape(4, 5).sum(0),
    )


def v_views_3d(x):
    return (
        x.permute(2, 0, 1).reshape(4, 6) + 1,
        x.transpose(0, 1)[:, 1].flip(-1),
        x.unsqueeze(1).expand(2, 3, 3, 4),
    )


def z_zero_dim(x, s):
    return x * s + 1, (s * 2).exp(), x.sum() + s, torch.where(s > 0, x, s)


def b_size_one_broadcast(x, y, z):
    return x + y, z * x, (x * y).sum(1)


CASES: list[tuple[str, Callable[..., Any], Callable[[], tuple[Any, ...]]]] = [
    ("sum_dim0", r_sum_dim0, lambda: (randn(5, 7),)),
    ("sum_middle", r_sum_middle, lambda: (randn(3, 4, 5),)),
    ("mean_all", r_mean_all, lambda: (randn(5, 7),)),
    ("var_std", r_var_std, lambda: (randn(5, 7),)),
    ("logsumexp", r_logsumexp, lambda: (randn(5, 7) * 4,)),
    ("amax_amin", r_amax_amin, lambda: (randn(5, 7),)),
    ("any_all", r_any_all, lambda: (_mask(5, 7),)),
    ("prod", r_prod, lambda: (1 + 0.1 * randn(5, 7),)),
    ("int_reductions", r_int_reductions, lambda: (randint(-50, 50, 5, 7),)),
    ("int64_arith", i_arith, lambda: (randint(-20, 20, 5, 7), nonzero_ints(5, 7))),
    ("int64_compare", i_compare, lambda: (randint(-5, 5, 5, 7), randint(-5, 5, 5, 7, seed=1))),
    ("where_masks", m_where, lambda: (randn(5, 7), _mask(5, 7))),
    ("int_to_float", p_int_to_float, lambda: (randint(-9, 9, 5, 7), randn(5, 7))),
    ("views", v_views, lambda: (randn(5, 7),)),
    ("views_3d", v_views_3d, lambda: (randn(2, 3, 4),)),
    ("zero_dim", z_zero_dim, lambda: (torch.tensor(3.0), torch.tensor(-0.5))),
    ("size_one_broadcast", b_size_one_broadcast, lambda: (randn(4, 1, 3), randn(1, 5, 3), randn(4, 5, 1))),
]


@pytest.mark.parametrize(("fn", "make"), [pytest.param(f, m, id=n) for n, f, m in CASES])
def test_program_matches_eager(fn, make):
    cf = check(fn, *make())
    assert executable(cf).report.kernels >= 1


def test_int64_arith_uses_integer_kernels():
    cf = check(i_arith, randint(-20, 20, 5, 7), nonzero_ints(5, 7))
    c = executable(cf).stages["c"]
    assert "cu_floordiv(" in c and "cu_mod(" in c and "int64_t* restrict p_" in c
    # the same binary at another shape, negative numerators and divisors included
    a = torch.tensor([[-7, 7, -7, 7, 0, -1, 9]])
    b = torch.tensor([[2, -2, -2, 2, -3, 4, -4]])
    check(i_arith, a, b, cf=cf)


def test_masked_fill_minus_inf_then_softmax_rows_masked_but_one():
    x = randn(5, 7)
    m = torch.ones(5, 7, dtype=torch.bool)
    m[torch.arange(5), torch.tensor([0, 3, 6, 2, 1])] = False  # one position left per row
    m[4, 4:] = False  # ... and one row with several
    cf = check(m_masked_softmax, x, m)
    out = cf(x, m)
    assert torch.equal(out[:4].amax(-1), torch.ones(4))  # a single survivor gets all the mass
    assert (executable(cf).report.kernels, executable(cf).report.externs) == (1, 0)


def test_non_contiguous_inputs():
    base = randn(7, 5)

    def f(x):
        return torch.softmax(x, -1), x.sum(0), x * 2 + 1

    cf = compiled(f)
    check(f, base.t(), cf=cf)  # transposed
    check(f, randn(5, 14, seed=3)[:, ::2], cf=cf)  # strided slice
    check(f, randn(5, 7, seed=4), cf=cf)  # contiguous again


def scalar_args(x, a: float, n: int):
    return x * a + n, (x - n).sum(-1) / a, x * n


def test_python_scalar_arguments():
    cf = compiled(scalar_args)
    x = randn(3, 4)
    check(scalar_args, x, 0.5, 3, cf=cf)
    check(scalar_args, x, -1.25, -4, cf=cf)
    out = cf(x, 2.0, 7)
    assert [t.dtype for t in out] == [torch.float32] * 3


def size_arith(x):
    n = x.shape[0]
    return x * n + x.shape[1], x.shape[1] * 2.5 - x


def test_sizes_used_as_values():
    cf = compiled(size_arith)
    for rows in (2, 5):
        check(size_arith, randn(rows, 3), cf=cf)
    assert cf.stats.compiles == 1


# -- the arena ----------------------------------------------------------------------


def chain(x):
    a = (x * 0.5).mean(-1, keepdim=True)  # a reduction used three times: realized
    h = torch.exp(x - a.amax()) + torch.log(a.abs() + 1)  # costly, used twice: realized
    b = h.sum(-1, keepdim=True)
    c = torch.tanh(h / b) * 3  # an extern's operand: realized, in place over h
    return c.cumsum(-1) + a, torch.sigmoid(b * 0.1) * x + a


def test_arena_temporaries_and_outputs_survive_the_next_call():
    cf = compiled(chain)
    x1, x2 = randn(4, 6, seed=1), randn(4, 6, seed=2)
    first = cf(x1)
    kept = [t.clone() for t in first]
    assert_same(first, chain(x1))
    second = cf(x2)
    assert_same(second, chain(x2))
    for out, k in zip(first, kept):
        assert torch.equal(out, k)  # not overwritten by the second call
        assert all(out.data_ptr() != s.data_ptr() for s in second)
    third = cf(randn(3, 9, seed=3))  # another size binding: another arena
    assert_same(third, chain(randn(3, 9, seed=3)))
    assert cf.stats.compiles == 1
    plan = executable(cf).program.plan
    assert len(plan.slot_of) >= 3 and len(plan.slots) < len(plan.slot_of)  # a slot is reused
    assert plan.peak != 0 and plan.peak != plan.unplanned


def test_threads_share_a_compiled_function():
    def f(x):
        a = x.sum(-1, keepdim=True)
        return torch.softmax(x - a, -1) * a, x * 2 - a

    cf = compiled(f)
    cf(randn(2, 5))
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        g = gen(seed)
        try:
            for i in range(20):
                x = torch.randn(2 + (i + seed) % 4, 5 + seed, generator=g)
                assert_same(cf(x), f(x))
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors[0]
    assert cf.stats.compiles == 1


# -- control flow ---------------------------------------------------------------------


def cf_if(x):
    if x.sum() > 0:
        y = torch.softmax(x, -1)
    else:
        y = x.exp() - 1
    return y * 2


def cf_for(x):
    acc = torch.zeros_like(x[0])
    for i in range(x.shape[0]):
        acc = acc * 0.5 + x[i].tanh()
    return acc


def cf_while(x):
    steps = torch.zeros((), dtype=torch.int64)
    while x.abs().amax() > 1.0:
        x = x / 2
        steps = steps + 1
    return x, steps


def test_tensor_predicate_if():
    cf = compiled(cf_if)
    check(cf_if, randn(3, 4) + 3, cf=cf)
    check(cf_if, randn(3, 4) - 3, cf=cf)
    assert cf.stats.compiles == 1
    assert "control c0 = if(" in executable(cf).stages["tensor_ir"]


def test_for_over_symbolic_range_carries_a_tensor():
    cf = compiled(cf_for)
    for n in (1, 3, 6):
        check(cf_for, randn(n, 4, seed=n), cf=cf)
    assert cf.stats.compiles == 1
    assert "control c0 = for(" in executable(cf).stages["tensor_ir"]


def test_while_on_a_tensor_condition():
    cf = compiled(cf_while)
    for scale in (0.1, 3.0, 1000.0):
        check(cf_while, randn(5) * scale, cf=cf)
    assert cf.stats.compiles == 1
    assert "control c0 = while(" in executable(cf).stages["tensor_ir"]


# -- options and determinism -----------------------------------------------------------


def test_opt_level_0_has_no_threads_and_no_simd():
    """``cu.compile(opt_level=0)`` runs the reference target, so the cpu target's own
    ``opt_level=0`` is reached through the target API."""
    from cuvil_runtime.registry import get_target
    from cuvil_runtime.target import CompileOptions

    cf = check(chain, randn(4, 6))
    graph = cf.graphs[0]
    ex = get_target("cpu").compile(graph, CompileOptions(opt_level=0))
    assert isinstance(ex, ProgramExecutable)
    loop_ir, c = ex.stages["loop_ir"], ex.stages["c"]
    assert " vec " not in loop_ir and "parvec" not in loop_ir
    assert "omp simd" not in c
    assert all(
        "if(" in line and f">= {1 << 62})" in line for line in c.splitlines() if "omp parallel" in line
    )  # a threshold no work reaches: one thread
    for x in (randn(4, 6, seed=7), randn(2, 3, seed=8)):
        assert_same(tuple(ex(x)), chain(x))


_HASHES = """
import hashlib, json, sys
import torch
import torch.nn.functional as F
import cuvil as cu

def f(x, w, b):
    h = F.layer_norm(x, (x.shape[-1],), w, b)
    m = torch.ones_like(x, dtype=torch.bool).triu(1)
    return (torch.softmax(h.masked_fill(m, float("-inf")), -1) + F.gelu(h),
            (x * 2).sum(0), torch.cat([x, x.flip(0)], 0).amax(-1), torch.var(x, 0))

cf = cu.compile(f, target="cpu", fallback="error")
cf(torch.randn(3, 8), torch.randn(8), torch.randn(8))
ex = cf.artifacts[-1].executable
r = ex.report
sha = lambda s: hashlib.sha256(s.encode()).hexdigest()
print(json.dumps({"tensor_ir": r.tensor_ir_hash, "kernels": r.kernel_hashes,
                  "loop_text": sha(ex.stages["loop_ir"]), "c_text": sha(ex.stages["c"]),
                  "wrapper": sha(ex.stages["wrapper"])}, sort_keys=True))
"""


def test_stage_texts_do_not_depend_on_the_hash_seed(tmp_path):
    script = tmp_path / "hashes.py"
    script.write_text(_HASHES)
    procs = []
    for seed in ("0", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "CUVIL_PROGRESS": "0"}
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 0, err
    a, b = (json.loads(out.strip().splitlines()[-1]) for out, _ in results)
    assert len(a["kernels"]["loop_ir"]) >= 3 and set(a["kernels"]["loop_ir"]) == set(a["kernels"]["c"])
    assert a == b


# -- NaN propagation, views of the arena, integer division edge cases --------------------


def test_amax_amin_propagate_nan():
    x = torch.tensor([[1.0, float("nan"), 2.0], [3.0, 1.0, 2.0]])
    check(r_amax_amin, x)


def nan_elementwise(x, y):
    return torch.maximum(x, y), torch.minimum(x, y), x.clamp(-1.0, 1.0), torch.relu(x)


def test_elementwise_max_min_clamp_relu_propagate_nan():
    nan = float("nan")
    check(nan_elementwise, torch.tensor([nan, 2.0, nan]), torch.tensor([1.0, nan, nan]))


def extern_alias(x):
    r = torch.real(x.exp() * 3)  # an extern whose result aliases its (arena) operand
    c = (x * 2).sum(-1, keepdim=True)  # a later temporary that reuses that arena slot
    return (r + c.exp()) * c.exp()


def test_extern_result_aliasing_an_arena_temporary_within_a_call():
    check(extern_alias, randn(3, 4))


def real_of_temp(x):
    return torch.real(x.exp() * 3)


def test_extern_alias_output_survives_the_next_call():
    cf = compiled(real_of_temp)
    x = randn(2, 3)
    first = cf(x)
    kept = first.clone()
    cf(torch.zeros(2, 3))
    assert torch.equal(first, kept)


_INT_DIV = """
import sys, torch
import cuvil as cu
case = sys.argv[1]

def f(a, b):
    return torch.floor_divide(a, b), torch.remainder(a, b)

if case == "zero":  # eager raises; a compiled call must raise too, not kill the process
    a, b = torch.tensor([5, -5, 7]), torch.tensor([2, 0, 3])
    cf = cu.compile(f, target="cpu", fallback="error")
    try:
        cf(a, b)
    except Exception as e:
        print("raised", type(e).__name__)
    else:
        print("no error")
else:  # INT64_MIN // -1 wraps to INT64_MIN in eager
    a, b = torch.tensor([-2**63, 4]), torch.tensor([-1, 2])
    cf = cu.compile(f, target="cpu", fallback="error")
    got, ref = cf(a, b), f(a, b)
    print("equal" if all(torch.equal(g, r) for g, r in zip(got, ref)) else f"differs {got} {ref}")
"""


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        pytest.param("zero", "raised"),  # eager raises; the compiled call must raise, not SIGFPE
        pytest.param("int64_min", "equal"),  # INT64_MIN // -1 wraps as in eager
    ],
)
def test_integer_division_edge_cases_do_not_crash(tmp_path, case, expected):
    script = tmp_path / "int_div.py"
    script.write_text(textwrap.dedent(_INT_DIV))
    env = {**os.environ, "CUVIL_PROGRESS": "0"}
    proc = subprocess.run(
        [sys.executable, str(script), case], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, f"exit status {proc.returncode}: {proc.stderr[-2000:]}"
    assert proc.stdout.split()[0] == expected, proc.stdout


# -- channels-last convolutions -----------------------------------------------------------


class ConvBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.pool = torch.nn.MaxPool2d(2)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return self.pool(torch.relu(self.conv2(y) + y)).mean((2, 3)), y


def test_conv_chain_runs_channels_last_and_returns_row_major():
    torch.manual_seed(0)
    m = ConvBlock().eval()
    for p in m.parameters():
        p.requires_grad_(False)
    m.bn1.running_mean.uniform_(-0.5, 0.5)
    m.bn1.running_var.uniform_(0.5, 1.5)
    cf = cu.compile(m, target="cpu", fallback="error")
    for batch in (1, 3):
        x = randn(batch, 3, 10, 12)
        got, ref = cf(x), m(x)
        for g, r in zip(got, ref):
            torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)
        assert got[1].is_contiguous()  # eager's layout, though computed channels-last
    assert cf.stats.compiles == 1
    program = cf.artifacts[0].executable.program
    assert any(b.order == (0, 2, 3, 1) for b in program.buffers.values())
    # the prepacked channels-last weights follow in-place updates of the parameters
    with torch.no_grad():
        m.conv1.weight.mul_(-1.5)
    x = randn(2, 3, 10, 12)
    for g, r in zip(cf(x), m(x)):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)


# -- train-mode dropout (Philox) and tiled transposes --------------------------------------


def softmax_dropout_train(x):
    return F.dropout(torch.softmax(x, -1), p=0.25, training=True)


def test_train_dropout_is_counter_based_reproducible_and_fused():
    cf = compiled(softmax_dropout_train)
    x = randn(64, 96)
    torch.manual_seed(7)
    a = cf(x)
    torch.manual_seed(7)
    b = cf(x)
    c = cf(x)
    assert torch.equal(a, b)  # torch.manual_seed makes runs reproducible
    assert not torch.equal(b, c)  # a new seed every call
    kept = a != 0
    assert 0.70 < kept.float().mean().item() < 0.80  # p = 0.25
    torch.testing.assert_close(a[kept], (torch.softmax(x, -1) / 0.75)[kept])
    ex = executable(cf)
    assert ex.report.kernels == 1 and ex.program.plan.peak == 0  # softmax and dropout: one loop nest
    assert "cu_rand(" in ex.stages["c"]


def transpose_add(x, y):
    return x.transpose(0, 1) + y


def test_transposing_access_is_tiled():
    cf = compiled(transpose_add)
    for n, m in ((70, 45), (3, 5), (64, 64)):
        x, y = randn(n, m), randn(m, n)
        torch.testing.assert_close(cf(x, y), transpose_add(x, y))
    loop_ir = executable(cf).stages["loop_ir"]
    assert "_t0 in" in loop_ir and "_t1 in" in loop_ir and "Min(" in loop_ir


def resize(x):
    return (
        F.interpolate(x, scale_factor=0.5),
        F.interpolate(x, scale_factor=2.0),
        F.interpolate(x, scale_factor=3.0),
    )


def test_nearest_interpolate_by_powers_of_two_is_an_index_map():
    cf = compiled(resize)
    for shape in ((2, 3, 7, 9), (1, 2, 8, 5)):
        x = randn(*shape)
        for g, r in zip(cf(x), resize(x)):
            torch.testing.assert_close(g, r, rtol=0, atol=0)
    program = executable(cf).program
    externs = [s.node.op for s in program.steps if type(s).__name__ == "Extern"]
    assert externs == ["interpolate"]  # the factor-3 one runs through torch


def erf_and_gelu(x):
    return torch.erf(x), F.gelu(x)


def test_float_erf_matches_torch_everywhere():
    cf = compiled(erf_and_gelu)
    x = torch.cat(
        [torch.linspace(-6, 6, 100001), torch.tensor([0.0, -0.0, 1e-30, float("inf"), -float("inf")])]
    )
    got, ref = cf(x), erf_and_gelu(x)
    torch.testing.assert_close(got[0], ref[0], rtol=0, atol=5e-7)
    # GELU's negative tail is 1 + erf(x) ~ 0: erf's absolute error shows (as with any erf);
    # at +-inf torch's own kernel gives nan, not the limits
    finite = x.isfinite()
    torch.testing.assert_close(got[1][finite], ref[1][finite], rtol=2e-6, atol=2e-6)
    assert got[0].abs().max() <= 1.0
    assert torch.isnan(cf(torch.tensor([float("nan")]))[0]).all()


def column_stats(x):
    return x.sum(0), x.mean(0), x.amax(0), torch.softmax(x, -1).sum(0)


def test_reductions_over_a_leading_dimension_accumulate_rows():
    cf = compiled(column_stats)
    for shape in ((300, 70), (5, 3), (64, 1)):
        x = randn(*shape)
        for g, r in zip(cf(x), column_stats(x)):
            torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)
    loop_ir = executable(cf).stages["loop_ir"]
    # the reduced rows run outside, the output tile is the accumulator
    assert "seq _r" in loop_ir and "par _t0 in" in loop_ir


def test_large_linears_run_through_onednn_and_follow_weight_updates(monkeypatch):
    from cuvil_backend_cpu import externs, gemm_choice

    if not externs.FAST_EXTERNS:
        pytest.skip("torch built without oneDNN")
    monkeypatch.setenv(gemm_choice.GEMM_ENV, "onednn")  # not what measuring picks here
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 64)).eval()
    cf = compiled(m)
    x = randn(40, 256)
    with torch.no_grad():
        torch.testing.assert_close(cf(x), m(x), rtol=1e-4, atol=1e-4)
        m[0].weight.mul_(0.5)  # the packed weight is rebuilt for the new version
        torch.testing.assert_close(cf(x), m(x), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(cf(x[:3]), m(x[:3]), rtol=1e-4, atol=1e-4)  # another row count
