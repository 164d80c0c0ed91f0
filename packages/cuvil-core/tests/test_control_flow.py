"""Python control flow compiled into structured Graph IR: no graph breaks, no recompiles."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import cuvil as cu

W = torch.randn(3, 10)


def close(a, b):
    torch.testing.assert_close(a, b)
    assert a.dtype == b.dtype


def ops_of(graph):
    return [n.op for n in graph.walk()]


def test_mission_head_one_compile_for_every_batch_size():
    @cu.compile(fallback="error")
    def head(x):
        if x.size(0) > 1:  # a size predicate: both branches stay in the graph
            x = F.interpolate(x, scale_factor=0.5)
        return torch.softmax(x.mean((2, 3)) @ W, dim=-1)

    for b in range(1, 17):
        x = torch.randn(b, 3, 16, 16)
        close(head(x), head.__wrapped__(x))
    assert head.stats.compiles == 1, head.stats.recompile_reasons
    assert head.stats.cache_hits == 15
    assert "if" in ops_of(head.graphs[0])


def test_symbolic_if_result_shape_is_piecewise():
    @cu.compile(fallback="error")
    def f(x):
        if x.shape[0] > 2:
            x = x[:2]
        return x * 2

    for n in (1, 2, 3, 7):
        x = torch.randn(n, 4)
        close(f(x), f.__wrapped__(x))
    assert f.stats.compiles == 1
    assert "Piecewise" in f.graphs[0].text


def test_data_dependent_if_elif_else_and_early_return():
    @cu.compile(fallback="error")
    def f(x):
        if x.sum() > 0:
            y = x * 2
        elif x.mean() < -1:
            y = x - 1
        else:
            return x.abs()
        return y + 1

    for s in (1.0, -5.0, -0.1):
        x = torch.full((4,), s)
        close(f(x), f.__wrapped__(x))
    assert f.stats.compiles == 1
    assert ops_of(f.graphs[0]).count("if") == 2


def test_data_dependent_while_runs_different_trip_counts():
    @cu.compile(fallback="error")
    def f(x):
        steps = torch.zeros((), dtype=torch.int64)
        while x.norm() > 1.0:
            x = x / 2
            steps = steps + 1
        return x, steps

    for s in (0.1, 3.0, 1000.0):
        x = torch.full((5,), s)
        out, steps = f(x)
        ref, ref_steps = f.__wrapped__(x)
        close(out, ref)
        close(steps, ref_steps)
    assert f.stats.compiles == 1
    assert "while" in ops_of(f.graphs[0])


def test_for_over_symbolic_range_is_one_loop():
    @cu.compile(fallback="error")
    def f(x):
        acc = torch.zeros_like(x[0])
        for i in range(x.shape[0]):
            acc = acc + x[i] * 2
        return acc

    for n in (1, 3, 6):
        x = torch.randn(n, 4)
        close(f(x), f.__wrapped__(x))
    assert f.stats.compiles == 1
    assert "for" in ops_of(f.graphs[0])


def test_constant_loops_and_module_lists_unroll():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))

        def forward(self, x):
            for layer in self.layers:
                x = torch.relu(layer(x))
            for _ in range(2):
                x = x * 0.5
            return x

    m = Net().eval()
    cm = cu.compile(m, fallback="error")
    for n in (2, 5):
        x = torch.randn(n, 8)
        close(cm(x), m(x))
    assert cm.stats.compiles == 1
    assert ops_of(cm.graphs[0]).count("linear") == 3


def helper_with_branch(x, limit):
    if x.abs().max() > limit:
        x = x.clamp(-limit, limit)
    return x


def test_module_calling_helpers_with_control_flow():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            y = helper_with_branch(self.lin(x), 0.5)
            if y.shape[0] > 3:
                y = y[:3]
            return y

    m = M().eval()
    cm = cu.compile(m, fallback="error")
    for n in (2, 5):
        x = torch.randn(n, 4) * 3
        close(cm(x), m(x))
    assert cm.stats.compiles == 1


class Block(torch.nn.Module):
    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln1 = torch.nn.LayerNorm(d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.ff = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q = q.view(b, s, self.heads, d // self.heads).transpose(1, 2)
        k = k.view(b, s, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(b, s, self.heads, d // self.heads).transpose(1, 2)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, d))
        return x + self.ff(self.ln2(x))


def test_transformer_block_one_compile_across_sequence_lengths():
    torch.manual_seed(0)
    m = Block().eval()
    cm = cu.compile(m, fallback="error")
    for s in (7, 64, 129):
        x = torch.randn(2, s, 32)
        torch.testing.assert_close(cm(x), m(x), atol=1e-5, rtol=1e-5)
    assert cm.stats.compiles == 1, cm.stats.recompile_reasons


def test_variable_assigned_in_one_branch_then_used_is_an_error():
    @cu.compile(fallback="error")
    def f(x):
        if x.sum() > 0:
            y = x * 2
        return y

    with pytest.raises(cu.CompileError, match="'y' is used where it may not be assigned") as info:
        f(torch.randn(3))
    assert "test_control_flow.py" in str(info.value)


def test_branches_with_different_shapes_on_tensor_condition_are_rejected():
    @cu.compile(fallback="error")
    def f(x):
        if x.sum() > 0:
            x = x[:1]
        return x

    with pytest.raises(cu.CompileError, match="different shapes"):
        f(torch.randn(3))


def test_loop_changing_shape_is_rejected():
    @cu.compile(fallback="error")
    def f(x):
        while x.sum() > 0:
            x = torch.cat([x, x])
        return x

    with pytest.raises(cu.CompileError, match="changes the type of 'x'"):
        f(torch.ones(2))


def test_break_in_tensor_loop_is_rejected_with_location():
    @cu.compile(fallback="error")
    def f(x):
        while x.sum() > 0:
            x = x - 1
            if x.mean() < 0:
                break
        return x

    with pytest.raises(cu.CompileError) as info:
        f(torch.ones(2))
    assert "`while` on a tensor value" in str(info.value)


def test_python_conditions_stay_python_and_are_guarded():
    @cu.compile(fallback="error")
    def f(x, mode: str = "double"):
        if mode == "double":
            return x * 2
        return x + 1

    x = torch.randn(3)
    close(f(x), x * 2)
    close(f(x, "inc"), x + 1)
    assert f.stats.compiles == 2
    assert "argument mode" in f.stats.recompile_reasons[0]


def test_dims_names_shared_sizes():
    def f(x, y):
        return x + y

    c = cu.compile(f, dims={"x": {0: "B"}, "y": {0: "B"}}, fallback="error")
    for n in (4, 9):
        x, y = torch.randn(n, 3), torch.randn(n, 3)
        close(c(x, y), x + y)
    assert c.stats.compiles == 1
    g = c.graphs[0]
    assert str(g.inputs[0].type) == "Tensor[f32, (B, x_1), cpu]"
    assert str(g.inputs[1].type) == "Tensor[f32, (B, y_1), cpu]"
    with pytest.raises(ValueError, match="not parameters"):
        cu.compile(f, dims={"z": {0: "B"}})


def test_explain_lists_graph_guards_symbols_and_recompiles():
    @cu.compile
    def f(x, k: int):
        return x.reshape(-1, 2) * k

    f(torch.randn(4, 3), 2)
    text = cu.explain(f, torch.randn(6, 3), 3)
    assert "x_0 = x.shape[0]" in text
    assert "argument k: was int 2, now int 3" in text
    assert "graph @f(" in text and "reshape" in text
    assert "Eq(Mod(" in text  # the divisibility guard of the -1 reshape, with its reason


def _gen(x):
    yield x * 2


def _try(x):
    try:
        y = x * 2
    except RuntimeError:
        y = x
    return y


_G = 0


def _global(x):
    global _G
    _G = 1
    return x + 1


def _eval(x):
    return eval("x + 1")


@pytest.mark.parametrize(
    "fn, message, line",
    [
        (_gen, "a generator (`yield`)", "yield x * 2"),
        (_try, "`try`/`except`", "try:"),
        (_global, "writing a global variable", "global _G"),
        (_eval, "`eval`", 'return eval("x + 1")'),
    ],
)
def test_rejected_constructs_name_the_construct_and_line(fn, message, line):
    with pytest.raises(cu.CompileError) as info:
        cu.compile(fn, fallback="error")(torch.randn(3))
    text = str(info.value)
    assert f"{message} is not supported in compiled code" in text
    assert "test_control_flow.py:" in text and line in text and "^" in text and "hint:" in text


def test_supported_python_constructs():
    @cu.compile(fallback="error")
    def f(x, ys):
        with torch.no_grad():
            z = x * 2
        assert x.shape[-1] == 4, f"expected 4 features, got {x.shape}"
        assert isinstance(x, torch.Tensor)
        outs = [t + z for t in ys if t is not None]
        pairs = {k: v for k, v in zip("ab", outs)}
        return pairs["a"] - pairs["b"] if len(outs) > 1 else outs[0]

    x, ys = torch.randn(2, 4), [torch.randn(2, 4), None, torch.randn(2, 4)]
    close(f(x, ys), f.__wrapped__(x, ys))


def test_long_constant_range_becomes_one_loop():
    @cu.compile(fallback="error")
    def f(x):
        acc = torch.zeros_like(x[0])
        for i in range(20):  # above the unroll limit: one `for` op
            acc = acc * 0.5 + x[i]
        return acc

    for cols in (3, 5):
        x = torch.randn(20, cols)
        close(f(x), f.__wrapped__(x))
    assert f.stats.compiles == 1
    assert ops_of(f.graphs[0]).count("for") == 1


def test_size_predicate_the_sizes_prove_stays_python():
    lin = torch.nn.Linear(4, 8)

    @cu.compile(fallback="error")
    def f(x):
        y = lin(x)  # pins x_1 == 4; y's last size is 8
        if y.shape[-1] == 8:
            return y.relu()
        return y

    for n in (1, 3):
        x = torch.randn(n, 4)
        close(f(x), f.__wrapped__(x))
    assert f.stats.compiles == 1
    assert "if" not in ops_of(f.graphs[0])
