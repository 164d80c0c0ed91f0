"""Python state read from outside the compiled call: guarded or read per call, never stale.

Globals, closure variables, attributes of long-lived objects and the contents of
containers read during capture are guarded (a change recompiles, with a readable
reason); tensors among them are graph inputs read on every call. Writes to such
state, ``nonlocal`` included, are located errors; recursion on Python values is
unrolled; ``print`` shows example values, at capture.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import cuvil as cu


def _available(name: str) -> bool:
    from cuvil_runtime.registry import discover

    return any(i.name == name and i.available for i in discover())


TARGETS = ("reference", "cpu") if _available("cpu") else ("reference",)


def close(a, b):
    torch.testing.assert_close(a, b)
    assert a.dtype == b.dtype


def compiled(fn, target):
    return cu.compile(fn, target=target, fallback="error")


K = 1.0
MODE = "relu"
W = torch.ones(3)
WEIGHTS = [torch.ones(3), 2.0]


class Cfg:
    scale = 1.0


CFG = Cfg()


def uses_global(x):
    return x * K


def uses_mode(x):
    if MODE == "relu":
        return F.relu(x)
    return torch.tanh(x)


def helper(x):
    return x + K


def calls_helper(x):
    return helper(x) * 2


@pytest.mark.parametrize("target", TARGETS)
def test_global_scalar_change_recompiles_with_a_reason(target):
    global K
    f = compiled(uses_global, target)
    x = torch.randn(4)
    try:
        close(f(x), x * 1.0)
        K = 5.0
        close(f(x), uses_global(x))
        assert f.stats.compiles == 2
        assert f.stats.recompile_reasons == ["global 'K' changed: 1.0 -> 5.0"]
        K = 1.0  # the first artifact is still valid for the old value
        close(f(x), uses_global(x))
        assert f.stats.compiles == 2
    finally:
        K = 1.0


@pytest.mark.parametrize("target", TARGETS)
def test_global_read_by_a_helper_and_a_branch_is_guarded(target):
    global K, MODE
    f, g = compiled(calls_helper, target), compiled(uses_mode, target)
    x = torch.randn(5)
    try:
        close(f(x), calls_helper(x))
        close(g(x), uses_mode(x))
        K, MODE = 3.0, "tanh"
        close(f(x), calls_helper(x))
        close(g(x), uses_mode(x))
        assert g.stats.recompile_reasons == ["global 'MODE' changed: 'relu' -> 'tanh'"]
    finally:
        K, MODE = 1.0, "relu"


@pytest.mark.parametrize("target", TARGETS)
def test_closure_cell_and_list_contents_are_guarded(target):
    def make():
        c = 1.0
        scale = [1.0]

        def f(x):
            return x * c * scale[0]

        def set_c(v):
            nonlocal c
            c = v

        return f, set_c, scale

    f, set_c, scale = make()
    cf = compiled(f, target)
    x = torch.randn(2, 3)
    close(cf(x), f(x))
    set_c(3.0)
    close(cf(x), f(x))
    assert cf.stats.recompile_reasons[-1] == "closure variable 'c' changed: 1.0 -> 3.0"
    scale[0] = 7.0
    close(cf(x), f(x))
    assert cf.stats.recompile_reasons[-1] == "closure variable 'scale' changed: [1.0] -> [7.0]"
    assert cf.stats.compiles == 3


@pytest.mark.parametrize("target", TARGETS)
def test_lambda_reading_a_global_and_a_cell(target):
    global K
    s = [2.0]
    f = compiled(lambda x: x * K + s[0], target)
    x = torch.randn(3)
    try:
        close(f(x), x * 1.0 + 2.0)
        K = 5.0
        s[0] = -1.0
        close(f(x), x * 5.0 - 1.0)
    finally:
        K = 1.0


@pytest.mark.parametrize("target", TARGETS)
def test_global_tensor_is_read_per_call(target):
    global W

    def f(x):
        return x + W

    cf = compiled(f, target)
    x = torch.randn(3)
    try:
        close(cf(x), f(x))
        W.mul_(4)  # an in-place update is seen: W is a graph input
        close(cf(x), f(x))
        W = torch.full((3,), -2.0)  # rebinding to a tensor of the same type: no recompile
        close(cf(x), f(x))
        assert cf.stats.compiles == 1
        W = torch.ones(3, dtype=torch.float64)  # now the result promotes to f64
        close(cf(x), f(x))
        assert "global 'W' changed" in cf.stats.recompile_reasons[-1]
    finally:
        W = torch.ones(3)


@pytest.mark.parametrize("target", TARGETS)
def test_container_with_tensors_and_object_attributes(target):
    def f(x):
        return x * WEIGHTS[0] * WEIGHTS[1] * CFG.scale

    cf = compiled(f, target)
    x = torch.randn(3)
    try:
        close(cf(x), f(x))
        WEIGHTS[0].add_(1)
        close(cf(x), f(x))
        WEIGHTS[0] = torch.full((3,), 3.0)
        WEIGHTS[1] = 0.5
        close(cf(x), f(x))
        CFG.scale = 10.0
        close(cf(x), f(x))
        assert cf.stats.recompile_reasons[-1] == "attribute 'CFG.scale' changed: 1.0 -> 10.0"
    finally:
        WEIGHTS[:] = [torch.ones(3), 2.0]
        CFG.scale = 1.0


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.temperature = 2.0

    def forward(self, x):
        return self.lin(x) / self.temperature


class Stack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


@pytest.mark.parametrize("target", TARGETS)
def test_module_python_attributes_are_guarded(target):
    m = Stack().eval()
    cm = compiled(m, target)
    x = torch.randn(2, 4)
    with torch.no_grad():
        close(cm(x), m(x))
        m.blocks[1].temperature = 0.5
        close(cm(x), m(x))
    assert cm.stats.recompile_reasons == ["attribute 'self.blocks.1.temperature' changed: 2.0 -> 0.5"]


@pytest.mark.parametrize("target", TARGETS)
def test_object_argument_attributes_are_guarded(target):
    def f(x, cfg):
        return x * cfg.scale

    cf = compiled(f, target)
    cfg = Cfg()
    x = torch.randn(3)
    close(cf(x, cfg), f(x, cfg))
    cfg.scale = 4.0
    close(cf(x, cfg), f(x, cfg))
    assert cf.stats.compiles == 2


def test_nonlocal_write_is_a_located_error():
    def make():
        count = 0

        def f(x):
            nonlocal count
            count += 1
            return x + count

        return f

    with pytest.raises(cu.CompileError) as e:
        cu.compile(make(), fallback="error")(torch.ones(2))
    assert "nonlocal" in str(e.value) and "test_reads.py:" in str(e.value)
    # with the default fallback, eager runs every call: eager's result each time
    f, eager = make(), make()
    cf = cu.compile(f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            close(cf(torch.ones(2)), eager(torch.ones(2)))


@pytest.mark.parametrize("target", TARGETS)
def test_nonlocal_inside_the_compiled_function_runs_per_call(target):
    def f(x):
        total = 0

        def add(v):
            nonlocal total
            total += v

        add(2)
        add(3)
        return x * total

    cf = compiled(f, target)
    close(cf(torch.ones(3)), f(torch.ones(3)))


def test_writes_to_outer_objects_are_located_errors():
    def bump(x):
        bump.calls += 1
        return x + 1

    bump.calls = 0
    state = {"n": 0}
    hist: list[float] = []

    def put(x):
        state["n"] = 1
        return x

    def push(x):
        hist.append(1.0)
        return x

    def set_attr(x):
        setattr(CFG, "scale", 3.0)  # noqa: B010 - the setattr builtin is what is tested
        return x

    for fn, needle in (
        (bump, "bump.calls += 1"),
        (put, 'state["n"] = 1'),
        (push, "hist.append(1.0)"),
        (set_attr, 'setattr(CFG, "scale", 3.0)'),
    ):
        with pytest.raises(cu.CompileError) as e:
            cu.compile(fn, fallback="error")(torch.ones(2))
        assert "test_reads.py:" in str(e.value) and needle in str(e.value), str(e.value)
    assert bump.calls == 0 and state == {"n": 0} and hist == [] and CFG.scale == 1.0


def rec(x, n):
    if n == 0:
        return x
    return rec(x * 2, n - 1)


@cu.compile(target="reference", fallback="error")
def rec_compiled(x, n):
    if n <= 0:
        return x + 1
    return rec_compiled(x - 1, n - 1)


def endless(x, n):
    return endless(x, n + 1)


@pytest.mark.parametrize("target", TARGETS)
def test_recursion_on_a_python_int_is_unrolled(target):
    f = compiled(rec, target)
    x = torch.randn(3)
    for n in (0, 3, 5):
        close(f(x, n), rec(x, n))
    assert f.stats.compiles == 3  # n is a Python value: one graph per n
    close(rec_compiled(x, 4), rec_compiled.__wrapped__(x, 4))


def test_unbounded_recursion_is_a_located_error():
    with pytest.raises(cu.CompileError) as e:
        cu.compile(endless, fallback="error")(torch.ones(2), 0)
    msg = str(e.value)
    assert "calls itself more than" in msg and "return endless(x, n + 1)" in msg and "test_reads.py:" in msg


def test_print_and_fstrings_show_example_values_at_capture(capsys):
    def f(x):
        print("rows", x.shape[0], f"cols={x.shape[1] * 2}")
        return x + 1

    cf = cu.compile(f, target="reference", fallback="error")
    with pytest.warns(UserWarning, match="runs once, while the function is captured"):
        close(cf(torch.ones(4, 3)), torch.ones(4, 3) + 1)
    assert capsys.readouterr().out == "rows 4 cols=6\n"
    cf(torch.ones(7, 3))  # same graph: nothing printed
    assert cf.stats.compiles == 1 and capsys.readouterr().out == ""


@pytest.mark.parametrize("target", TARGETS)
def test_two_helpers_closing_over_tensors_of_the_same_name(target):
    def make(v):
        w = torch.full((3,), v)

        def helper(x):
            return x * w

        return helper

    a, b = make(2.0), make(3.0)

    def f(x):
        return a(x) + b(x)

    cf = compiled(f, target)
    x = torch.randn(3)
    close(cf(x), f(x))


class _Scaler:
    def __init__(self) -> None:
        self.k = 2.0
        self.offset = torch.zeros(3)

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.k + self.offset


def test_a_compiled_bound_method_guards_what_it_reads_from_its_object() -> None:
    """``cu.compile(obj.method)`` used to run the method unconverted, so ``self.k`` was read
    once, at capture, and never guarded: a stale value after ``obj.k = 5``."""
    obj = _Scaler()
    f = cu.compile(obj.apply, target="reference", fallback="error")
    x = torch.ones(3)
    close(f(x), x * 2.0)
    obj.k = 5.0
    close(f(x), x * 5.0)
    assert f.stats.compiles == 2 and "self.k" in f.stats.recompile_reasons[-1]
    obj.offset.add_(1.0)  # a tensor attribute: read on every call
    close(f(x), x * 5.0 + 1.0)


def _fills_use_cache(forward):
    """What transformers' decorators do: take ``*args, **kwargs`` and set a keyword."""
    import functools

    @functools.wraps(forward)
    def wrapper(self, *args, **kwargs):
        if kwargs.get("use_cache") is None:
            kwargs["use_cache"] = self.default_use_cache
        return forward(self, *args, **kwargs)

    return wrapper


class _Decorated(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.default_use_cache = True

    @_fills_use_cache
    def forward(self, x, mask=None, use_cache=None, scale=2.0):
        y = self.lin(x) * scale
        return y + 1 if use_cache else y


@pytest.mark.parametrize("target", TARGETS)
@torch.no_grad()
def test_a_forward_wrapped_in_args_kwargs_decorators(target: str) -> None:
    """The call is traced as made: filling the defaults in as positional arguments made the
    decorator's ``kwargs["use_cache"] = ...`` "got multiple values for argument 'use_cache'"
    (BertModel, GPT2Model)."""
    m = _Decorated().eval()
    f = cu.compile(m, target=target, fallback="error")
    x = torch.randn(3, 4)
    close(f(x), m(x))
    close(f(x, use_cache=False), m(x, use_cache=False))
    assert "argument use_cache (bool False) passed now" in f.stats.recompile_reasons[-1]
    x5 = torch.randn(5, 4)
    close(f(x5), m(x5))  # another batch size, the first call form: no new compile
    assert f.stats.compiles == 2
    m.default_use_cache = False  # read by the decorator, through the guarded attribute
    close(f(x5), m(x5))


def test_changed_defaults_recompile() -> None:
    def g(x, k=2.0):
        return x * k

    f = cu.compile(g, target="reference", fallback="error")
    x = torch.ones(2)
    close(f(x), x * 2.0)
    g.__defaults__ = (5.0,)
    close(f(x), x * 5.0)
    assert "the defaults of" in f.stats.recompile_reasons[-1]
