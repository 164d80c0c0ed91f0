"""Results alias as eager's do (issue 26 item 6): ``return x`` is ``x`` itself, a view of
an input is a view of the caller's tensor with eager's sizes, strides and offset, one
value returned twice is one object, and results that are views of each other (or of
one fresh tensor) share its storage, so an in-place change through a result reaches
what it reaches in eager. Compared with eager on every case, on the reference and cpu
targets, for a contiguous and a transposed input; and through cu.save / cu.load.
See [Note: output aliasing] in cuvil_ir/graph_ir/aliases.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import cuvil as cu

TARGETS = ["reference", "cpu"]


def _ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def relations(x: torch.Tensor, outs: tuple[torch.Tensor, ...]) -> list[Any]:
    """What aliasing a caller can observe: identity and shared storage with the input and
    between results, and the layout of every result that shares storage (with another
    result: only for a contiguous input, since a computed result is row-major where eager
    may keep a transposed input's layout, which is no aliasing question)."""
    rel: list[Any] = []
    for k, o in enumerate(outs):
        shared = _ptr(o) == _ptr(x) or (
            x.is_contiguous() and any(_ptr(o) == _ptr(p) for j, p in enumerate(outs) if j != k)
        )
        layout = (o.stride(), o.storage_offset()) if shared else None
        rel.append((k, o is x, _ptr(o) == _ptr(x), tuple(o.shape), layout))
        rel.extend((k, j, o is p, _ptr(o) == _ptr(p)) for j, p in enumerate(outs) if j < k)
    return rel


def as_tuple(r: Any) -> tuple[torch.Tensor, ...]:
    return r if isinstance(r, tuple) else (r,)


def check_like_eager(fn: Any, compiled: Any, make: Any) -> None:
    xe, xc = make(), make()
    eager, got = as_tuple(fn(xe)), as_tuple(compiled(xc))
    assert relations(xc, got) == relations(xe, eager)
    for a, b in zip(got, eager):
        torch.testing.assert_close(a, b)
    # an in-place change through each result (not through an expanded one: torch refuses)
    for k, (a, b) in enumerate(zip(got, eager)):
        if 0 not in b.stride():
            b.add_(10.0 * (k + 1))
            a.add_(10.0 * (k + 1))
    torch.testing.assert_close(xc, xe)
    for a, b in zip(got, eager):
        torch.testing.assert_close(a, b)


def _identity(x):
    return x


def _select(x):
    return x[0]


def _transpose(x):
    return x.t()


def _slice(x):
    return x[:, 1:]


def _views(x):
    return (
        x,
        x[1],
        x.t(),
        x[:, 1:],
        x[::2],
        x.reshape(-1),
        x.unsqueeze(0).expand(2, -1, -1),
        x.permute(1, 0)[0],
    )


def _squeeze(x):
    return x[None, :, None].squeeze(0), x.narrow(1, 1, 2).unsqueeze(-1)


def _twice(x):
    y = x + 1
    return y, y


def _view_of_output(x):
    y = x * 2
    return y, y[0], y.t()


def _views_of_one_fresh_tensor(x):
    y = x - 1
    return y[0], y[1:]


def _same_view_twice(x):
    v = x[0]
    return v, v


def _input_twice(x):
    return x, x


def _clones(x):
    y = x + 1
    return x.clone(), x.clone()[0], y.clone(), y, x


def _chunks(x):
    return x.chunk(2, 1)


CASES = [
    _identity,
    _select,
    _transpose,
    _slice,
    _views,
    _squeeze,
    _twice,
    _view_of_output,
    _views_of_one_fresh_tensor,
    _same_view_twice,
    _input_twice,
    _clones,
    _chunks,
]

INPUTS = {
    "contiguous": lambda: torch.arange(12.0).reshape(3, 4),
    "transposed": lambda: torch.arange(12.0).reshape(4, 3).t(),
}


@pytest.mark.parametrize("layout", list(INPUTS))
@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("target", TARGETS)
def test_results_alias_as_in_eager(target: str, fn: Any, layout: str) -> None:
    compiled = cu.compile(fn, target=target, fallback="error")
    check_like_eager(fn, compiled, INPUTS[layout])
    check_like_eager(fn, compiled, INPUTS[layout])  # the cache hit (fast path) too


@pytest.mark.parametrize("target", TARGETS)
def test_return_x_is_the_argument_itself(target: str) -> None:
    compiled = cu.compile(_identity, target=target, fallback="error")
    x = torch.randn(5)
    assert compiled(x) is x
    assert compiled(x) is x  # the hit


@pytest.mark.parametrize("target", TARGETS)
def test_a_clone_is_a_new_tensor(target: str) -> None:
    """``x.clone()`` is the value of ``x`` in Graph IR: it must still come back new."""
    compiled = cu.compile(lambda x: x.clone(), target=target, fallback="error")
    x = torch.ones(3)
    out = compiled(x)
    assert _ptr(out) != _ptr(x)
    out.add_(1)
    assert torch.equal(x, torch.ones(3))


def test_contiguous_of_a_transposed_input_is_a_copy() -> None:
    """eager copies here: a view of the caller's tensor would be wrong."""
    compiled = cu.compile(lambda x: x.t().contiguous()[0], target="cpu", fallback="error")
    x = torch.arange(6.0).reshape(2, 3)
    out = compiled(x)
    assert _ptr(out) != _ptr(x) and out.is_contiguous()
    torch.testing.assert_close(out, x.t().contiguous()[0])


def test_cpu_computes_no_copy_for_an_alias() -> None:
    """The program computes only the outputs that are not aliases: ``return x, x.t()``
    launches no kernel."""
    compiled = cu.compile(lambda x: (x, x.t()), target="cpu", fallback="error")
    compiled(torch.randn(2, 3))
    program = compiled.artifacts[-1].executable.program
    assert program.outputs == () and not list(program.kernels())


def test_saved_and_loaded_artifacts_alias_as_in_eager(tmp_path: Path) -> None:
    loaded = cu.load(cu.save(cu.compile(_views, target="cpu"), tmp_path / "views.cuvil", torch.randn(3, 4)))
    check_like_eager(_views, loaded, INPUTS["contiguous"])
    loaded2 = cu.load(
        cu.save(cu.compile(_view_of_output, target="cpu"), tmp_path / "y.cuvil", torch.randn(3, 4))
    )
    check_like_eager(_view_of_output, loaded2, INPUTS["contiguous"])
    loaded3 = cu.load(cu.save(cu.compile(_clones, target="cpu"), tmp_path / "c.cuvil", torch.randn(3, 4)))
    check_like_eager(_clones, loaded3, INPUTS["contiguous"])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    ("fn", "x_shape"),
    [
        (lambda x, y: x.expand_as(y), lambda n: (n, 1)),
        (lambda x, y: x.view_as(y), lambda n: (n * 4,)),
        (lambda x, y: x.reshape_as(y), lambda n: (n * 4,)),
    ],
    ids=["expand_as", "view_as", "reshape_as"],
)
def test_a_view_sized_by_another_argument(target: str, fn: Any, x_shape: Any) -> None:
    # the view's sizes are y's, which no computed step reads: the wrapper binds them from
    # y's shape (found by the OpInfo sweep: "size expression y_0 did not evaluate")
    cf = cu.compile(fn, target=target, fallback="error")
    for n in (3, 5):
        x, y = torch.randn(*x_shape(n)), torch.randn(n, 4)
        got, want = cf(x, y), fn(x, y)
        assert got.shape == want.shape and got.stride() == want.stride()
        assert got.data_ptr() == x.data_ptr()
        torch.testing.assert_close(got, want)
