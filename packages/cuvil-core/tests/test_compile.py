"""cu.compile end to end: results vs eager, stats, guards, fallback, errors."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import cuvil as cu

W = torch.randn(16, 4)


def close(a, b):
    torch.testing.assert_close(a, b)
    assert a.dtype == b.dtype


def test_issue_example_function():
    @cu.compile
    def f(x, y):
        return torch.softmax(x @ y + 1.0, dim=-1).sum(0)

    for n in (8, 3):
        x, y = torch.randn(n, 16), torch.randn(16, 4)
        close(f(x, y), torch.softmax(x @ y + 1.0, dim=-1).sum(0))
    assert f.stats.compiles == 1
    assert f.stats.cache_hits == 1
    assert f.stats.fallbacks == 0
    assert f.stats.recompile_reasons == []


def test_bare_and_called_forms_and_reference_target():
    def f(x):
        return x * 2 + 1

    for c in (cu.compile(f), cu.compile()(f), cu.compile(target="reference", opt_level=0)(f)):
        x = torch.randn(3, 5)
        close(c(x), f(x))


def test_module_parameters_are_inputs_not_constants():
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU()).eval()
    cm = cu.compile(m, fallback="error")
    x = torch.randn(5, 16)
    close(cm(x), m(x))
    g = cm.graphs[0]
    assert [v.name for v in g.inputs] == ["input", "self.0.weight", "self.0.bias"]
    with torch.no_grad():
        m[0].weight.mul_(2.0)  # updated in place: the compiled module sees it
    close(cm(x), m(x))
    m[0].bias = torch.nn.Parameter(torch.randn(32))  # replaced: also seen
    close(cm(x), m(x))
    assert cm.stats.compiles == 1
    assert cm.eval() is cm  # chainable module methods return the compiled wrapper


def test_module_training_flag_is_guarded():
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5)).eval()
    cm = cu.compile(m, fallback="error")
    x = torch.randn(4, 8)
    close(cm(x), m(x))
    cm.train()
    torch.manual_seed(0)
    out = cm(x)
    assert out.shape == (4, 8)
    assert cm.stats.compiles == 2
    assert "module state changed" in cm.stats.recompile_reasons[0]


def test_specialized_value_recompiles_with_reason():
    @cu.compile(fallback="error")
    def f(x):
        return x.reshape(int(x.shape[0]), -1) * 2

    f(torch.randn(4, 3))
    f(torch.randn(4, 3))
    f(torch.randn(5, 3))
    assert f.stats.compiles == 2
    assert f.stats.cache_hits == 1
    (reason,) = f.stats.recompile_reasons
    assert "Eq(x_0, 4)" in reason and "x_0 = 5" in reason and "test_compile.py" in reason


def test_python_scalar_arguments_are_guarded_by_value():
    @cu.compile(fallback="error")
    def f(x, k: int, flag=True):
        return x * k if flag else x - k

    x = torch.randn(3)
    close(f(x, 2), x * 2)
    close(f(x, 3), x * 3)
    close(f(x, 3, flag=False), x - 3)
    assert f.stats.compiles == 3
    assert "argument k: was int 2, now int 3" in f.stats.recompile_reasons[0]


def test_dtype_change_recompiles():
    @cu.compile(fallback="error")
    def f(x):
        return x + 1

    f(torch.randn(3))
    close(f(torch.arange(3)), torch.arange(3) + 1)
    assert "was a f32 tensor of rank 1" in f.stats.recompile_reasons[0]


def test_dynamic_false_specializes_sizes():
    @cu.compile(dynamic=False, fallback="error")
    def f(x):
        return x.sum(0)

    f(torch.randn(2, 3))
    f(torch.randn(4, 3))
    assert f.stats.compiles == 2
    assert "shape [2, 3]" in f.stats.recompile_reasons[0]


def test_global_tensor_is_read_on_every_call():
    global W

    @cu.compile(fallback="error")
    def f(x):
        return x @ W

    x = torch.randn(2, 16)
    close(f(x), x @ W)
    old = W
    W = torch.randn(16, 4)
    try:
        close(f(x), x @ W)
        W = torch.randn(16, 6)
        close(f(x), x @ W)
        assert f.stats.compiles == 2
    finally:
        W = old


def test_closure_and_helper_function():
    scale = torch.tensor(3.0)

    def helper(a, b):
        return F.relu(a) * b

    @cu.compile(fallback="error")
    def f(x):
        return helper(x, scale) + 1

    x = torch.randn(4, 4)
    close(f(x), F.relu(x) * 3 + 1)


def test_wrong_arity_and_non_tensor_are_type_errors():
    @cu.compile
    def f(x, y):
        return x + y

    f(torch.randn(2), torch.randn(2))
    with pytest.raises(TypeError, match="missing a required argument"):
        f(torch.randn(2))
    with pytest.raises(TypeError, match="argument x must be a torch.Tensor"):
        f("nope", torch.randn(2))


def test_unsupported_control_flow_error_has_location():
    @cu.compile(fallback="error")
    def f(x):
        if x.sum() > 0:
            x = x[:1]
        return x

    with pytest.raises(cu.CompileError) as info:
        f(torch.randn(3))
    msg = str(info.value)
    assert "test_compile.py:" in msg and "produce different shapes" in msg
    assert "if x.sum() > 0:" in msg and "^^^" in msg


def test_tensor_for_and_item_errors():
    @cu.compile(fallback="error")
    def f(x):
        total = x[0]
        for row in x:
            total = total + row
        return total

    with pytest.raises(cu.CompileError, match="`for` on a tensor"):
        f(torch.randn(3, 2))

    @cu.compile(fallback="error")
    def g(x):
        return x * x.sum().item()

    with pytest.raises(cu.CompileError, match="`item` needs the value of a tensor"):
        g(torch.randn(3))


def test_fallback_eager_warns_once_and_counts():
    @cu.compile
    def f(x):
        if x.sum() > 0:
            x = x[:1]
        return x

    x = torch.ones(3)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        close(f(x), x[:1])
        close(f(x), x[:1])
    assert f.stats.fallbacks == 2
    assert f.stats.compiles == 1  # the failure is remembered, not retried every call
    assert len([x for x in w if issubclass(x.category, cu.CuvilFallbackWarning)]) == 1
    assert "produce different shapes" in f.stats.fallback_reasons[0]


def test_inplace_on_intermediate_is_functionalized_and_on_input_written_back():
    @cu.compile(fallback="error")
    def f(x):
        y = x * 2
        y.add_(1)
        y += 3
        y[0] = 0.0
        return F.relu(y, inplace=True)

    x = torch.randn(4, 3)
    expected = (x * 2 + 4).clone()
    expected[0] = 0.0
    close(f(x), F.relu(expected))

    def g(x, i, v):
        x.add_(1)
        x.index_copy_(0, i, v)
        return x.sum(0)

    cg = cu.compile(g, fallback="error")
    for n in (5, 7):  # one variant: the caller's tensor ends as eager leaves it
        x, i, v = torch.randn(n, 3), torch.tensor([1, 3]), torch.randn(2, 3)
        want_x = x.clone()
        want = g(want_x, i, v)
        data = x.data_ptr()
        close(cg(x, i, v), want)
        assert x.data_ptr() == data  # the same storage, updated in place
        close(x, want_x)
    assert cg.stats.compiles == 1

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", torch.zeros(()))

        def forward(self, x):
            self.count.add_(1)
            return x + self.count

    with pytest.raises(cu.CompileError, match=r"in-place update of the input %self.count(.|\n)*read-only"):
        cu.compile(M(), fallback="error")(torch.randn(2))


def test_nested_outputs_and_constants():
    @cu.compile(fallback="error")
    def f(x, y):
        return {"sum": x + y, "pair": (x * y, None), "n": 3}

    x, y = torch.randn(2), torch.randn(2)
    out = f(x, y)
    close(out["sum"], x + y)
    close(out["pair"][0], x * y)
    assert out["pair"][1] is None and out["n"] == 3


def test_size_arithmetic_stays_symbolic():
    @cu.compile(fallback="error")
    def f(x):
        b = x.shape[0]
        return x.reshape(b * 2, -1).sum(-1)

    for n in (2, 3, 6):
        x = torch.randn(n, 8)
        close(f(x), x.reshape(n * 2, -1).sum(-1))
    assert f.stats.compiles == 1


def test_unknown_target_fails_loudly():
    with pytest.raises(Exception, match="nope"):
        cu.compile(lambda x: x, target="nope")


def test_method_decorated_in_class():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return torch.tanh(self.lin(x)) + super().__class__.__name__.__len__()

    m = M().eval()
    cm = cu.compile(m, fallback="error")
    x = torch.randn(3, 4)
    close(cm(x), m(x))


def test_replaced_submodule_recompiles_instead_of_reading_the_old_one():
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    cm = cu.compile(m, fallback="error")
    x = torch.randn(3, 4)
    close(cm(x), m(x))
    m[0] = torch.nn.Linear(4, 4)  # same parameter shapes, a different module
    close(cm(x), m(x))
    assert cm.stats.compiles == 2
    assert "submodules" in cm.stats.recompile_reasons[0]


def test_identical_graphs_share_one_executable():
    from cuvil.api import _EXECUTABLES

    def make():
        def f(x):
            return torch.tanh(x) * 3 + 1

        return f

    a, b = cu.compile(make(), fallback="error"), cu.compile(make(), fallback="error")
    x = torch.randn(2, 5)
    close(a(x), torch.tanh(x) * 3 + 1)
    close(b(x), torch.tanh(x) * 3 + 1)
    assert a.graphs[0].hash == b.graphs[0].hash
    assert a.artifacts[0].executable is b.artifacts[0].executable
    assert len(_EXECUTABLES) >= 1


def test_module_guard_notices_data_reassignment_and_flag_changes_cheaply() -> None:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2)).eval()
    cf = cu.compile(m, target="reference", fallback="error")
    x = torch.randn(5, 4)
    with torch.no_grad():
        torch.testing.assert_close(cf(x), m(x))
        m[2].weight.mul_(2.0)  # in place: same structure, new values are read
        torch.testing.assert_close(cf(x), m(x))
        assert cf.stats.compiles == 1
        m[2].weight.data = torch.randn(3, 3)  # same Parameter object, new shape
        m[2].bias.data = torch.randn(3)
        torch.testing.assert_close(cf(x), m(x))
        assert cf.stats.compiles == 2
        m.train()  # a training flag: recompiles (dropout/batch norm behave differently)
        cf(x)
        assert cf.stats.compiles == 3


def test_warmup_does_the_one_time_imports() -> None:
    import sys

    cu.warmup()
    assert "torch.fx.experimental.symbolic_shapes" in sys.modules and "torch._dynamo" in sys.modules
    assert cu.warmup() < 0.5  # the second time there is nothing left to import


def test_defaults_that_name_locals_of_an_enclosing_function() -> None:
    def helper(x):
        return x * 2

    def wrap():
        h, k = helper, 3.0

        def f(x, g=h, *, scale=k):
            return g(x) + scale

        return f

    f = wrap()
    cf = cu.compile(f, target="reference", fallback="error")
    x = torch.randn(3)
    torch.testing.assert_close(cf(x), f(x))
    torch.testing.assert_close(cf(x, scale=1.0), f(x, scale=1.0))


def test_a_compiled_function_called_from_compiled_code_is_inlined() -> None:
    # hooks learns CompiledFunction from cuvil.api (an injected class, not an import)
    inner = cu.compile(lambda x: torch.sin(x) * 2, target="reference", fallback="error")

    def outer(x):
        return inner(x) + 1

    cf = cu.compile(outer, target="reference", fallback="error")
    x = torch.randn(4)
    torch.testing.assert_close(cf(x), torch.sin(x) * 2 + 1)
    assert inner.stats.compiles == 0  # traced through, not compiled (or called) on its own
    assert "sin(" in str(cf.graphs[0]) and "extern" not in str(cf.graphs[0])


def _seeds_globally(x):
    torch.manual_seed(0)
    return x + torch.rand(3)


def _seeds_a_generator(x):
    gen = torch.Generator().manual_seed(0)
    return x + torch.rand(3, generator=gen)


@pytest.mark.parametrize("fn", [_seeds_globally, _seeds_a_generator])
def test_seeding_inside_compiled_code_is_a_located_error(fn):
    # it would run once, at capture: later calls would draw other numbers than eager
    with pytest.raises(cu.CompileError, match="would run once") as e:
        cu.compile(fn, target="reference", fallback="error")(torch.zeros(3))
    assert "test_compile.py" in str(e.value) and "manual_seed" in str(e.value)
    with pytest.warns(cu.CuvilFallbackWarning):
        f = cu.compile(fn, target="reference")
        f(torch.zeros(3))
    for _ in range(2):  # the eager fallback seeds on every call, like eager
        torch.testing.assert_close(f(torch.zeros(3)), fn(torch.zeros(3)))


def test_a_capture_counts_as_compiling():
    # libraries leave data-dependent checks out when compiling ([Note: captures count as
    # compiling]); the flag is set only while the capture runs
    def f(x):
        return x * 2 if torch.compiler.is_compiling() else x * 3

    c = cu.compile(f, target="reference", fallback="error")
    torch.testing.assert_close(c(torch.ones(2)), torch.full((2,), 2.0))
    assert not torch.compiler.is_compiling()
