"""The fast path of a cache hit (cuvil/fast_path.py, [Note: the fast path of a hit]):
every guard still holds or the call takes the full path.

Each test calls a compiled function twice first, so the fast path of its variant is
in place, then changes one thing the variant depends on and checks the next call
against eager (values and dtypes) and the recompile or fallback it must cause: a
call the fast path wrongly served would return a stale value.
"""

from __future__ import annotations

import threading

import pytest
import torch

import cuvil as cu
from cuvil import fast_path

TARGETS = ["cpu", "reference"]


def close(a, b):
    torch.testing.assert_close(a, b)
    assert a.dtype == b.dtype


def compiled(fn, target, **kw):
    if target == "reference":
        return cu.compile(fn, target="reference", opt_level=0, **kw)
    return cu.compile(fn, target=target, **kw)


def warm(cf, *args):
    """Two calls: a compile, then a hit through the full path that installs the fast path."""
    cf(*args)
    cf(*args)
    assert cf._fast is not None, "the fast path was not installed"
    return cf.stats.compiles


def add(x, y):
    return x + y


@pytest.mark.parametrize("target", TARGETS)
def test_hits_count_and_sizes_two_sizes_one_compile(target):
    f = compiled(add, target, fallback="error")
    x, y = torch.randn(4), torch.randn(4)
    warm(f, x, y)
    for n in (4, 7, 1, 13):
        a, b = torch.randn(n), torch.randn(n)
        close(f(a, b), a + b)
    assert f.stats.compiles == 1
    assert f.stats.cache_hits == 5
    assert f._last is f.artifacts[-1]


@pytest.mark.parametrize("target", TARGETS)
def test_dtype_rank_and_broadcast_changes_recompile(target):
    f = compiled(add, target, fallback="error")
    warm(f, torch.randn(4), torch.randn(4))
    a, b = torch.randn(4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    close(f(a, b), a + b)  # dtype
    assert f.stats.compiles == 2
    a, b = torch.randn(2, 4), torch.randn(2, 4)
    close(f(a, b), a + b)  # rank
    assert f.stats.compiles == 3
    a, b = torch.randn(3, 4), torch.randn(1, 4)
    close(f(a, b), a + b)  # the size assumption (x_0 == y_0) fails: broadcast variant
    assert f.stats.compiles == 4
    assert "size guard" in f.stats.recompile_reasons[-1]
    a, b = torch.ones(5, dtype=torch.int32), torch.ones(5, dtype=torch.int32)
    close(f(a, b), a + b)
    assert f.stats.compiles == 5


def test_shapes_are_guarded_without_dynamic():
    f = cu.compile(add, dynamic=False, fallback="error")
    warm(f, torch.randn(4), torch.randn(4))
    a, b = torch.randn(6), torch.randn(6)
    close(f(a, b), a + b)
    assert f.stats.compiles == 2


def test_static_dims_are_guarded():
    f = cu.compile(add, dims={"x": {0: None}}, fallback="error")
    warm(f, torch.randn(4), torch.randn(4))
    a, b = torch.randn(5), torch.randn(5)
    close(f(a, b), a + b)
    assert f.stats.compiles == 2
    assert "static size guard" in f.stats.recompile_reasons[-1]


def test_non_contiguous_and_parameter_arguments():
    f = cu.compile(add, fallback="error")
    warm(f, torch.randn(4, 3), torch.randn(4, 3))
    a, b = torch.randn(3, 4).t(), torch.randn(4, 3)
    close(f(a, b), a + b)
    p = torch.nn.Parameter(torch.randn(4, 3), requires_grad=False)
    close(f(p, b), p + b)
    assert f.stats.compiles == 1


def test_layout_guard_is_checked_on_the_fast_path():
    def g(x):
        return x * 2 if x.is_contiguous() else x + 1

    f = cu.compile(g, fallback="error")
    x = torch.randn(3, 4)
    warm(f, x)
    xt = torch.randn(4, 3).t()
    close(f(xt), g(xt))
    assert f.stats.compiles == 2
    close(f(x), g(x))


def test_read_guards_global_closure_and_lifted_tensor():
    scale = {"k": 2.0}
    table = torch.randn(4)

    def g(x):
        return x * scale["k"] + table

    f = cu.compile(g, fallback="error")
    x = torch.randn(4)
    warm(f, x)
    scale["k"] = 3.0  # a value read at capture changed
    close(f(x), g(x))
    assert f.stats.compiles == 2
    table.add_(1.0)  # a lifted tensor updated in place: read on every call, no recompile
    close(f(x), g(x))
    assert f.stats.compiles == 2


GLOBAL_W = torch.randn(4)
GLOBAL_K = 2


def _uses_globals(x):
    return x * GLOBAL_K + GLOBAL_W


def test_global_rebound_and_lifted_shape_change():
    global GLOBAL_W, GLOBAL_K
    f = cu.compile(_uses_globals, fallback="error")
    x = torch.randn(4)
    warm(f, x)
    old_w, old_k = GLOBAL_W, GLOBAL_K
    try:
        GLOBAL_K = 5
        close(f(x), _uses_globals(x))
        assert f.stats.compiles == 2
        GLOBAL_W = torch.randn(4)  # another tensor of the same metadata: read each call
        close(f(x), _uses_globals(x))
        GLOBAL_W = torch.randn(1)  # another shape: the graph was traced for (4,)
        close(f(x), _uses_globals(x))
        assert f.stats.compiles == 3
        GLOBAL_W = torch.randn(4, dtype=torch.float64)
        close(f(x), _uses_globals(x))
        assert f.stats.compiles == 4
    finally:
        GLOBAL_W, GLOBAL_K = old_w, old_k


def test_closure_cell_change():
    k = 2.0

    def g(x):
        return x * k

    f = cu.compile(g, fallback="error")
    x = torch.randn(4)
    warm(f, x)
    k = 7.0
    close(f(x), g(x))
    assert f.stats.compiles == 2


def test_module_state_changes():
    m = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Dropout(0.5)).eval()
    cm = cu.compile(m, fallback="error")
    x = torch.randn(3, 8)
    with torch.no_grad():
        warm(cm, x)
        m[0].weight.mul_(2.0)  # in place: seen, no recompile
        close(cm(x), m(x))
        m[0].bias = torch.nn.Parameter(torch.randn(4))  # replaced, same metadata
        close(cm(x), m(x))
        assert cm.stats.compiles == 1
        m[0].weight.data = torch.randn(4, 8, dtype=torch.float64)  # .data = another dtype
        m[0].weight.data = m[0].weight.data.float()
        close(cm(x), m(x))
        m[0] = torch.nn.Linear(8, 4).eval()  # a submodule replaced
        close(cm(x), m(x))
        assert cm.stats.compiles == 2
        m.train()  # the training flag: dropout now draws
        torch.manual_seed(0)
        out = cm(x)
        torch.manual_seed(0)
        ref = m(x)
        assert cm.stats.compiles == 3
        assert out.shape == ref.shape and bool((out == 0).any()) == bool((ref == 0).any())
        m.eval()
        close(cm(x), m(x))
        assert cm.stats.compiles == 3


def test_grad_mode_and_requires_grad():
    f = cu.compile(add)
    x, y = torch.randn(4), torch.randn(4)
    with torch.no_grad():
        warm(f, x, y)
    out = f(x, y)  # grad mode on, nothing requires grad: the compiled variant, no history
    close(out, x + y)
    assert not out.requires_grad and out.grad_fn is None
    assert torch.is_grad_enabled()  # turned back on after the run
    w = torch.randn(4, requires_grad=True)
    with pytest.warns(cu.CuvilFallbackWarning):
        out = f(w, y)  # records history: eager, as eager would
    assert out.requires_grad
    out.sum().backward()
    assert w.grad is not None
    with torch.no_grad():
        out = f(w, y)
    assert not out.requires_grad
    close(out, (w + y).detach())
    assert f.stats.compiles == 2


def test_grad_mode_restored_after_an_error():
    def g(x, y):
        return x // y

    f = cu.compile(g, fallback="error")
    a, b = torch.tensor([4, 9]), torch.tensor([2, 3])
    warm(f, a, b)
    with pytest.raises(ZeroDivisionError):
        f(a, torch.tensor([2, 0]))
    assert torch.is_grad_enabled()


def test_autocast_is_checked_on_the_fast_path():
    f = cu.compile(lambda x, w: x @ w)
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    warm(f, x, w)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = f(x, w)  # not the fp32 variant the fast path holds: its own, with autocast's casts
        ref = x @ w
    assert out.dtype == ref.dtype == torch.bfloat16
    assert f.stats.compiles == 2 and "autocast changed" in f.stats.recompile_reasons[-1]
    close(f(x, w), x @ w)


def test_layouts_subclasses_keywords_and_arity_take_the_full_path():
    def g(x, y=None):
        return x * 2 if y is None else x + y

    f = cu.compile(g)
    x = torch.randn(4)
    warm(f, x)
    close(f(x, x), g(x, x))  # another arity
    close(f(x, y=x), g(x, y=x))  # keywords
    close(f(x), g(x))
    sparse = torch.randn(4).to_sparse()
    with pytest.warns(cu.CuvilFallbackWarning):
        out = f(sparse)  # a sparse tensor never reaches a dense variant: eager
    assert out.layout is torch.sparse_coo
    close(out.to_dense(), g(sparse).to_dense())

    class Sub(torch.Tensor):
        pass

    s = torch.randn(4).as_subclass(Sub)
    out = f(s)  # not a plain tensor: the full path decides, as before
    close(torch.Tensor(out), g(torch.Tensor(s)))
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        f(3.0)


def test_fast_path_is_per_variant_and_follows_the_last_served():
    f = cu.compile(add, fallback="error")
    warm(f, torch.randn(4), torch.randn(4))
    first = f._fast
    a, b = torch.randn(4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    close(f(a, b), a + b)
    assert f._fast is not first  # the float64 variant's
    c, d = torch.randn(5), torch.randn(5)
    close(f(c, d), c + d)  # back to the float32 variant: its fast path again
    assert f._fast is first
    assert f.stats.compiles == 2


def test_fast_path_source_is_deterministic_and_matches_the_variant():
    def make():
        f = cu.compile(add, fallback="error")
        warm(f, torch.randn(4), torch.randn(4))
        return f.artifacts[-1].fast

    one, two = make(), make()
    assert isinstance(one, fast_path.FastPath)
    assert one.source == two.source
    assert "_s0 == _s1" in one.source  # the size assumption x_0 == y_0, written out


def test_threads_share_a_fast_path():
    f = cu.compile(add, fallback="error")
    warm(f, torch.randn(4), torch.randn(4))
    errors: list[BaseException] = []

    def work(n):
        try:
            for _ in range(50):
                a, b = torch.randn(n), torch.randn(n)
                close(f(a, b), a + b)
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(n,)) for n in (3, 8, 17, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert f.stats.compiles == 1


def test_results_keep_their_structure():
    def g(x):
        return x + 1, [x * 2, 3], {"a": x.sum()}, x.shape, x.shape[0] * 2 + 1

    f = cu.compile(g, fallback="error")
    x = torch.randn(3, 2)
    warm(f, x)
    out, ref = f(x), g(x)
    assert type(out) is tuple and type(out[1]) is list and type(out[2]) is dict
    assert type(out[3]) is torch.Size and out[3] == ref[3]
    assert type(out[4]) is int
    close(out[0], ref[0])
    close(out[1][0], ref[1][0])
    assert out[1][1] == 3
    close(out[2]["a"], ref[2]["a"])
    assert out[4] == ref[4]
    y = torch.randn(5, 2)  # another size: the number follows it
    assert f(y)[4] == 11 and f(y)[3] == y.shape
    two = cu.compile(lambda x: (x + 1, x - 1), fallback="error")
    warm(two, x)
    r = two(x)
    assert type(r) is tuple and len(r) == 2
    close(r[1], x - 1)


def test_keyword_calls_take_the_fast_path_with_their_guards():
    """``model(input_ids=ids, attention_mask=mask)`` is how transformers models are called:
    keyword tensors are served by the fast path too, each checked like a positional one,
    and only in the order and names the variant was compiled with."""

    def g(x, y, z=None):
        return x * 2 + y if z is None else x - z

    f = cu.compile(g, fallback="error")
    x, y = torch.randn(4), torch.randn(4)
    f(x, y=y)
    f(x, y=y)
    fast = f.artifacts[-1].fast
    assert isinstance(fast, fast_path.FastPath) and "kwargs" in fast.source
    hits = f.stats.cache_hits
    for n in (4, 7):  # sizes are symbols: one variant
        a, b = torch.randn(n), torch.randn(n)
        close(f(a, y=b), g(a, y=b))
    assert f.stats.cache_hits == hits + 2 and f.stats.compiles == 1
    assert f._fast is fast.fn
    close(f(x, y=y.double()), g(x, y=y.double()))  # a keyword's dtype: another variant
    assert f.stats.compiles == 2
    close(f(x, y=y), g(x, y=y))
    close(f(x, y=x, z=y), g(x, y=x, z=y))  # another keyword: another variant
    close(f(y=y, x=x), g(y=y, x=x))  # the same keywords in another order
    close(f(x, y), g(x, y))  # positional
    close(f(x, y=y), g(x, y=y))
    with pytest.raises(TypeError, match="multiple values"):
        f(x, x=y)


# -- attribute objects in the arguments (a decoder's cache): the structure walked as flatten does


class Layer:
    """A cache layer as transformers keeps one: tensors, an int length, a flag."""

    def __init__(self, keys: torch.Tensor, length: int, ready: bool = True) -> None:
        self.keys = keys
        self.length = length
        self.ready = ready


class Cache:
    def __init__(self, layers: list[Layer]) -> None:
        self.layers = layers


def _decode(x: torch.Tensor, cache: Cache, scale: float = 1.0) -> torch.Tensor:
    out = x
    for layer in cache.layers:
        layer.keys[layer.length] = out  # the cache written in place
        layer.length += 1  # an int attribute: a size symbol, written back
        seen = layer.keys[: layer.length]
        out = (seen.sum(0) * scale + out) if layer.ready else out - 1
    return out


def _cache(layers: int = 2, rows: int = 16, width: int = 4, length: int = 3) -> Cache:
    torch.manual_seed(0)
    return Cache([Layer(torch.randn(rows, width), length) for _ in range(layers)])


def _twin(c: Cache) -> Cache:
    return Cache([Layer(layer.keys.clone(), layer.length, layer.ready) for layer in c.layers])


def _same(mine: Cache, theirs: Cache) -> None:
    for a, b in zip(mine.layers, theirs.layers):
        torch.testing.assert_close(a.keys, b.keys)
        assert type(a.length) is int and a.length == b.length


def _no_full_path(f):
    def boom(*_a, **_k):
        raise AssertionError("the call took the full path")

    f._prepare = boom


@pytest.mark.parametrize("target", TARGETS)
def test_object_arguments_take_the_fast_path(target):
    """A call with a cache object (containers, attribute objects, int sizes, values) is
    served by the generated hit function: no flatten, no key; the writes into the cache,
    the int written back and the result as eager's, step after step at a growing length."""
    f = compiled(_decode, target, fallback="error")
    mine, theirs = _cache(), _cache()
    x = torch.randn(4)
    for _ in range(2):
        close(f(x, cache=mine), _decode(x, cache=theirs))
    fast = f.artifacts[-1].fast
    assert isinstance(fast, fast_path.FastPath)
    assert "__dict__" in fast.source and "_write_back" in fast.source
    _no_full_path(f)
    hits = f.stats.cache_hits
    for step in range(5):
        x = torch.randn(4) + step
        close(f(x, cache=mine), _decode(x, cache=theirs))
        _same(mine, theirs)
    assert f.stats.cache_hits == hits + 5 and f.stats.compiles == 1


@pytest.mark.parametrize(
    "change",
    [
        "new attribute",
        "attribute type",
        "flag",
        "zero length",
        "more layers",
        "shared layer",
        "list to tuple",
    ],
)
def test_object_structure_changes_miss_the_fast_path(change):
    """Each change to what the structure key holds makes the fast path decline; the full
    path then serves it as eager does (another variant, or the same one found again)."""
    f = compiled(_decode, "cpu", fallback="error")
    mine, theirs = _cache(), _cache()
    x = torch.randn(4)
    for _ in range(2):
        f(x, cache=mine)
        _decode(x, cache=theirs)
    assert isinstance(f.artifacts[-1].fast, fast_path.FastPath)
    hit = f.artifacts[-1].fast.fn
    for c in (mine, theirs):
        if change == "new attribute":
            c.layers[0].extra = 1
        elif change == "attribute type":
            c.layers[1].length = torch.tensor(c.layers[1].length)
        elif change == "flag":
            c.layers[0].ready = False
        elif change == "zero length":
            c.layers[0].length = 0
        elif change == "more layers":
            c.layers.append(Layer(torch.zeros(16, 4), 2))
        elif change == "shared layer":
            c.layers[1] = c.layers[0]
        else:
            c.layers = tuple(c.layers)
    assert hit((x,), {"cache": mine}) is fast_path.MISS
    if change == "attribute type":  # the traced code indexes with it: eager's own error or result
        return
    if change == "shared layer":  # one object in two places: the full path's own error
        with pytest.raises(cu.CompileError, match="not a pytree node"):
            f(x, cache=mine)
        return
    close(f(x, cache=mine), _decode(x, cache=theirs))
    _same(mine, theirs)


def test_generate_decode_steps_take_the_fast_path():
    """transformers' ``generate()`` with a static cache: the decode step (keyword tensors, the
    cache object of layers, its int sizes and flags) is served by the fast path, tokens as
    eager's."""
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 128, (1, 5))
    kw = {"max_new_tokens": 8, "do_sample": False, "cache_implementation": "static"}
    with torch.no_grad():
        want = model.generate(ids, **kw)
        f = cu.compile(model, target="cpu", fallback="error")
        f.generate(ids, **kw)
        decode = f.artifacts[-1]
        assert isinstance(decode.fast, fast_path.FastPath), "the decode step has no fast path"
        full = []
        prepare = f._prepare
        f._prepare = lambda *a, **k: full.append(1) or prepare(*a, **k)
        got = f.generate(ids, **kw)
    assert torch.equal(got, want)
    # the prompt's step and the first decode step after it (a new variant served last) only
    assert len(full) <= 2, len(full)


def _lists(x, caches, scale=None):
    out = x
    for c in caches:
        out = out + c.sum(0)
    return out if scale is None else out * scale


@pytest.mark.parametrize("target", TARGETS)
def test_lists_dicts_and_none_take_the_fast_path(target):
    """A paged step's lists of caches (cuvil-serve passes one per layer), a dict of options and
    a ``None``: walked by the fast path; a list's length, a dict's keys or a ``None`` turned
    into a tensor miss it."""
    f = compiled(lambda x, caches, opts, scale=None: _lists(x, caches, scale) * opts["k"], target)
    x = torch.randn(3)
    caches = [torch.randn(5, 3), torch.randn(2, 3)]
    opts = {"k": torch.tensor(2.0)}
    for _ in range(2):
        close(f(x, caches, opts, scale=None), _lists(x, caches) * 2)
    fast = f.artifacts[-1].fast
    assert isinstance(fast, fast_path.FastPath) and "kwargs" in fast.source
    for n in (4, 9):  # another length of one cache: a size symbol, the same variant
        caches[1] = torch.randn(n, 3)
        assert fast.fn((x, caches, opts), {"scale": None}) is not fast_path.MISS
    hit = fast.fn
    assert hit((x, [*caches, caches[0]], opts), {"scale": None}) is fast_path.MISS
    assert hit((x, tuple(caches), opts), {"scale": None}) is fast_path.MISS
    assert hit((x, caches, {"k": opts["k"], "j": 1}), {"scale": None}) is fast_path.MISS
    assert hit((x, caches, opts), {"scale": torch.tensor(3.0)}) is fast_path.MISS
    close(f(x, caches, opts, scale=torch.tensor(3.0)), _lists(x, caches, torch.tensor(3.0)) * 2)
