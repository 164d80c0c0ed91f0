"""``torch.compile(m, backend="cuvil")``: Dynamo's graphs compiled by Cuvil, found
through the ``torch_dynamo_backends`` entry point (no ``import cuvil`` needed), against
eager at several sizes, with Dynamo's symbolic sizes kept symbolic (one Cuvil compile,
no Dynamo recompile). Dynamo's cold compiles take seconds here: three fast cases, the
rest slow."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cuvil as cu
from cuvil import fx_backend


def _available(name: str) -> bool:
    from cuvil_runtime.registry import discover

    return any(i.name == name and i.available for i in discover())


TARGETS = ["reference"] + (["cpu"] if _available("cpu") else [])


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


def _dynamo_graphs() -> int:
    """Graphs Dynamo compiled (each one a call of the backend) since the fixture reset."""
    import torch._dynamo

    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def _new_graphs(before: list[cu.CompiledFunction]) -> list[cu.CompiledFunction]:
    return [c for c in fx_backend.compiled_graphs() if all(c is not b for b in before)]


def _same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        h = F.gelu(self.fc1(x))
        # a size read in Python: Dynamo passes it as a SymInt graph input
        return torch.softmax(self.fc2(h), dim=-1).reshape(x.shape[0], -1) * x.shape[0]


@pytest.mark.parametrize("target", TARGETS)
def test_mlp_new_batch_size_compiles_nothing_again(target):
    torch.manual_seed(0)
    m = MLP().eval()
    before = fx_backend.compiled_graphs()
    f = torch.compile(m, backend="cuvil", dynamic=True, options={"target": target})
    with torch.no_grad():
        for batch in (2, 5, 3):
            x = torch.randn(batch, 4)
            _same(f(x), m(x))
    assert _dynamo_graphs() == 1
    (cf,) = _new_graphs(before)
    assert cf.stats.compiles == 1 and cf.stats.fallbacks == 0
    assert cf.artifacts[-1].target == target
    # the batch dimension is Dynamo's size symbol in the Cuvil graph, not a constant
    (x_in,) = [v for v in cf.graphs[0].inputs if v.name == "l_x_"]
    assert not isinstance(x_in.type.shape[0], int)
    # every Dynamo graph runs the same wrapper code: never one for the warm store
    assert cf.artifacts[-1].captured.storable is False


def test_sizes_dynamo_keeps_static_are_static_in_cuvil():
    """Dynamic shapes are not all or nothing: the batch is Dynamo's symbol in the Cuvil
    graph, while weight sizes and the feature size (plain ints in Dynamo's examples)
    are constants there, guarded per call."""
    torch.manual_seed(0)
    m = MLP().eval()
    before = fx_backend.compiled_graphs()
    f = torch.compile(m, backend="cuvil", dynamic=True, options={"target": TARGETS[-1]})
    with torch.no_grad():
        for batch in (2, 5, 3):
            x = torch.randn(batch, 4)
            _same(f(x), m(x))
    (cf,) = _new_graphs(before)
    assert cf.stats.compiles == 1
    types = {v.name: v.type.shape for v in cf.graphs[0].inputs}
    x_shape = types.pop("l_x_")
    assert not isinstance(x_shape[0], int) and x_shape[1] == 4
    assert sorted(types.values()) == [(3,), (3, 8), (8,), (8, 4)]
    # the static sizes are guarded per call, not assumed: another feature size misses
    (check,) = {a.captured.check for a in cf.artifacts}
    params = dict(m.named_parameters())

    def leaves(features):
        return [
            torch.randn(7, features) if v.name == "l_x_" else params[_param_name(v.name)]
            for v in cf.graphs[0].inputs
        ]

    assert check.holds(leaves(4)) and not check.holds(leaves(5))
    assert "l_x_.shape[1] is 5, it was 4" in check.explain(leaves(5))


@pytest.mark.parametrize("target", TARGETS)
def test_dims_none_keeps_a_size_static(target):
    """The mechanism under the backend's static sizes, through ``cu.compile`` itself."""

    def f(x, w):
        return torch.relu(x @ w) * x.shape[1]

    c = cu.compile(f, target=target, fallback="error", dims={"w": {0: None, 1: None}, "x": {-1: None}})
    w = torch.randn(4, 3)
    for batch in (2, 5, 7):
        x = torch.randn(batch, 4)
        _same(c(x, w), f(x, w))
    assert c.stats.compiles == 1
    x_in, w_in = c.graphs[0].inputs
    assert not isinstance(x_in.type.shape[0], int) and x_in.type.shape[1] == 4 and w_in.type.shape == (4, 3)
    w6 = torch.randn(4, 6)  # another static size: a recompile, never the graph typed for 3
    _same(c(x, w6), f(x, w6))
    assert c.stats.compiles == 2 and "static size guard: w.shape[1] is 6" in c.stats.recompile_reasons[-1]


def _param_name(graph_input: str) -> str:
    """``l_self_modules_fc1_parameters_weight_`` -> ``fc1.weight``."""
    inner = graph_input.removeprefix("l_self_modules_").removesuffix("_")
    module, _, param = inner.partition("_parameters_")
    return f"{module}.{param}"


def branchy(x):
    if x.shape[0] > 3:  # Dynamo guards on this and compiles each side once
        return (x * 2).sum(-1)
    return torch.relu(x) + 1


def test_size_dependent_branch():
    before = fx_backend.compiled_graphs()
    f = torch.compile(branchy, backend="cuvil", dynamic=True, options={"target": TARGETS[-1]})
    for n in (2, 5, 3, 7):
        x = torch.randn(n, 3)
        _same(f(x), branchy(x))
    assert _dynamo_graphs() == 2
    graphs = _new_graphs(before)
    assert [c.stats.compiles for c in graphs] == [1, 1]
    assert [c.stats.cache_hits for c in graphs] == [2, 2]  # the compile at Dynamo's compile counts one


def test_options_choose_the_target_and_bad_ones_fail_loudly():
    import torch._dynamo

    before = fx_backend.compiled_graphs()
    f = torch.compile(branchy, backend="cuvil", dynamic=True, options={"target": "reference", "opt_level": 1})
    x = torch.randn(2, 3)
    _same(f(x), branchy(x))
    (cf,) = _new_graphs(before)
    assert cf.artifacts[-1].target == "reference" and cf.opt_level == 1
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="unknown target 'nope'"):
        torch.compile(branchy, backend="cuvil", options={"target": "nope"})(torch.randn(2, 3))
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match=r"\['colour'\]"):
        torch.compile(branchy, backend="cuvil", options={"colour": "blue"})(torch.randn(2, 3))


def test_the_entry_point_names_this_backend():
    from importlib.metadata import entry_points

    import torch._dynamo

    assert entry_points(group="torch_dynamo_backends")["cuvil"].load() is fx_backend.backend
    assert "cuvil" in torch._dynamo.list_backends()


@pytest.mark.slow
def test_loading_the_entry_point_does_not_import_dynamo():
    # import cuvil must stay fast: Dynamo calls the backend, never the reverse
    code = (
        "import sys\n"
        "from importlib.metadata import entry_points\n"
        "entry_points(group='torch_dynamo_backends')['cuvil'].load()\n"
        "assert 'torch._dynamo' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- slow: more of what Dynamo hands a backend -----------------------------------------


class Block(nn.Module):
    """Attention block: layer_norm's ``eps`` reaches the graph as an unspecialized float."""

    def __init__(self, d: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.ln = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.ff = nn.Sequential(nn.Linear(d, 32), nn.GELU(), nn.Linear(32, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln(x)).chunk(3, dim=-1)
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.out(a)
        return x + self.ff(x)


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
def test_attention_block(target):
    torch.manual_seed(0)
    m = Block().eval()
    before = fx_backend.compiled_graphs()
    f = torch.compile(m, backend="cuvil", dynamic=True, options={"target": target})
    with torch.inference_mode():
        for b, t in ((2, 3), (3, 7), (2, 5)):
            x = torch.randn(b, t, 16)
            _same(f(x), m(x))
    assert _dynamo_graphs() == 1
    (cf,) = _new_graphs(before)
    assert cf.stats.compiles == 1


@pytest.mark.slow
def test_python_numbers_dynamo_leaves_symbolic():
    def f(x, scale: float, n: int):
        return x * scale + torch.full((2,), scale).sum() + n

    before = fx_backend.compiled_graphs()
    g = torch.compile(f, backend="cuvil", dynamic=True, options={"target": TARGETS[-1]})
    for rows, scale, n in ((2, 0.5, 3), (5, 0.5, 3), (4, 0.25, 3), (4, 0.25, 7)):
        x = torch.randn(rows, 3, dtype=torch.float64)
        _same(g(x, scale, n), f(x, scale, n))
    assert _dynamo_graphs() == 1
    (cf,) = _new_graphs(before)
    # a new float value is a Cuvil recompile (specialized, guarded by value); a new int
    # Dynamo made dynamic is a size symbol on Cuvil's side too, as a new size is
    # ([Note: Dynamo's SymInt inputs])
    assert cf.stats.compiles == 2, cf.stats.recompile_reasons
    assert "l_scale_" in cf.stats.recompile_reasons[0]


@pytest.mark.slow
def test_graph_break_static_shapes_and_dtypes():
    def f(x, i):
        y = (x.to(torch.float64) * i).sum(0)
        print("graph break")
        return y.cos(), i // 2, torch.argmax(x, dim=-1)

    before = fx_backend.compiled_graphs()
    g = torch.compile(f, backend="cuvil", dynamic=False, options={"target": TARGETS[-1]})
    for rows in (2, 5):
        x, i = torch.randn(rows, 3), torch.arange(rows * 3).view(rows, 3)
        for got, want in zip(g(x, i), f(x, i)):
            _same(got, want)
    graphs = _new_graphs(before)
    assert _dynamo_graphs() == len(graphs) == 4  # two sides of the break, per size
    assert all(not c.dynamic and c.stats.compiles == 1 for c in graphs)


@pytest.mark.slow
def test_what_cuvil_cannot_run_fails_dynamos_compile_or_runs_eagerly():
    import torch._dynamo

    def bump(x):
        x.add_(1)
        return x * 2

    # an argument updated in place is written back (cuvil/frontend/input_writes.py)
    x = torch.randn(3)
    x0 = x.clone()
    out = torch.compile(bump, backend="cuvil")(x)
    assert torch.equal(out, (x0 + 1) * 2) and torch.equal(x, x0 + 1)
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="requires grad while grad mode is on"):
        torch.compile(nn.Linear(3, 2), backend="cuvil")(torch.randn(2, 3))
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="Inductor setting"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.compile(branchy, backend="cuvil", mode="max-autotune")(torch.randn(2, 3))


def _transformer(name: str) -> nn.Module:
    T = pytest.importorskip("transformers")
    small = {"vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2, "intermediate_size": 64}
    if name == "bert":
        return T.BertModel(T.BertConfig(num_attention_heads=2, **small))
    # rotary embeddings, grouped-query attention (4 heads, 2 kv heads)
    return T.LlamaModel(T.LlamaConfig(num_attention_heads=4, num_key_value_heads=2, **small))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert", "llama"])
def test_transformers_model_is_one_graph_and_one_compile(name):
    torch.manual_seed(0)
    m = _transformer(name).eval()
    before = fx_backend.compiled_graphs()
    f = torch.compile(m, backend="cuvil", dynamic=True, options={"target": TARGETS[-1]})
    with torch.inference_mode():
        for b, s in ((2, 8), (3, 13)):
            ids = torch.randint(0, 100, (b, s))
            _same(f(input_ids=ids).last_hidden_state, m(input_ids=ids).last_hidden_state)
    assert _dynamo_graphs() == 1
    (cf,) = _new_graphs(before)
    assert cf.stats.compiles == 1 and cf.stats.fallbacks == 0


def autocast_mm(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return torch.mm(x, x.t())


@pytest.mark.slow
def test_autocast_is_refused_at_the_users_line_never_run_in_float32():
    import torch._dynamo

    with pytest.raises(
        torch._dynamo.exc.BackendCompilerFailed, match=r"(?s)_enter_autocast.*mm\(x, x.t\(\)\)"
    ):
        torch.compile(autocast_mm, backend="cuvil")(torch.randn(3, 3))
    torch._dynamo.reset()
    x = torch.randn(3, 3)
    with pytest.warns(cu.CuvilFallbackWarning, match="_enter_autocast"):
        out = torch.compile(autocast_mm, backend="cuvil", options={"fallback": "eager"})(x)
    _same(out, autocast_mm(x))


@pytest.mark.slow
def test_higher_order_ops_are_refused_at_the_users_line():
    import torch._dynamo

    def f(x):
        return torch.cond(x.sum() > 0, lambda y: y * 2, lambda y: y - 1, (x,))

    with pytest.raises(
        torch._dynamo.exc.BackendCompilerFailed, match=r"(?s)higher-order op `cond`.*torch.cond"
    ):
        torch.compile(f, backend="cuvil", dynamic=True)(torch.ones(3))


@pytest.mark.slow
def test_no_grad_blocks_and_size_checks_in_the_graph():
    def f(x, w):
        with torch.no_grad():
            z = torch.ones(3) + torch.arange(3)
        torch._check(x.shape[0] > 1)  # Dynamo's aten._assert_scalar: a Cuvil assumption
        return x @ w + 1, z

    before = fx_backend.compiled_graphs()
    g = torch.compile(f, backend="cuvil", dynamic=True, options={"target": TARGETS[-1]})
    for rows in (2, 5):
        x, w = torch.randn(rows, 3), torch.randn(3, 4)
        for got, want in zip(g(x, w), f(x, w)):
            _same(got, want)
    (cf,) = _new_graphs(before)
    assert cf.stats.compiles == 1
    # the check is an assumption of the graph over x's first dimension, false for 1
    (x_in,) = [v for v in cf.graphs[0].inputs if v.name == "l_x_"]
    rows = x_in.type.shape[0]
    assert any(
        fact.free_symbols == {rows} and bool(fact.subs(rows, 1)) is False for fact in cf.graphs[0].assumptions
    )
