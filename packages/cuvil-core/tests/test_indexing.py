"""Advanced indexing with Python lists (defect 5): ``x[[1, 2]]`` is ``x[torch.tensor([1, 2])]``,
not ``x[1, 2]``, on every installed target, with a second call at other sizes."""

from __future__ import annotations

import pytest
import torch

import cuvil as cu
from cuvil_ir.graph_ir.parser import parse_graph

TARGETS = sorted(b.name for b in cu.backends() if b.available)


def same(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def list_index(x):
    return x[[1, 2]]


def negative_list(x):
    return x[[-1, 0, -1]]


def tuple_of_lists(x):
    return x[[1, 2], [0, 3]]


def explicit_tuple_of_lists(x):
    return x[([0, 1], [2, 3])]


def list_after_slice(x):
    return x[:, [0, 2]]


def int_and_list(x):
    return x[1, [0, 2]] * 2


def list_after_ellipsis(x):
    return x[..., [0, 2]] + 1


def list_slice_list(x):
    return x[[0, 1], 1:, [2, 3]]


def chained_lists(x):
    return x[[0, 2]][:, [1]]


def mixed_int_bool_list(x):
    return x[[1, True]]  # not all bools: True is the index 1


def empty_list(x):
    return x[[]]


def bool_list(x):
    return x[[True, False, True, False, True]]


def bool_list_dim1(x):
    return x[:, [False, True, True, False, True]]


def bool_list_and_ints(x):
    return x[[True, False, False, True, True], [0, 1, 2]]


def all_false(x):
    return x[[False] * 5]


def setitem_list(x):
    y = x.clone()
    y[[1, 2]] = 0.0
    return y


def setitem_list_tensor_value(x):
    y = x.clone()
    y[:, [0, 3]] = x[:, [1, 2]] * 2
    return y


def setitem_bool_list(x):
    y = x.clone()
    y[[True, False, False, False, True]] = 1.5
    return y


PROGRAMS = [
    list_index,
    negative_list,
    tuple_of_lists,
    explicit_tuple_of_lists,
    list_after_slice,
    int_and_list,
    list_after_ellipsis,
    list_slice_list,
    chained_lists,
    mixed_int_bool_list,
    empty_list,
    bool_list,
    bool_list_dim1,
    bool_list_and_ints,
    all_false,
    setitem_list,
    setitem_list_tensor_value,
    setitem_bool_list,
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_list_index_matches_eager(fn, target):
    f = cu.compile(fn, target=target, fallback="error")
    for shape in ((5, 5, 5), (5, 5, 7)):  # the second call: other sizes, same artifact
        x = torch.randn(*shape)
        same(f(x), fn(x))
    assert f.stats.compiles == 1


def test_issue_example_shape():
    f = cu.compile(list_index, target="reference", fallback="error")
    assert f(torch.randn(5, 5, 5)).shape == (2, 5, 5)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.float64])
def test_list_index_dtypes(dtype):
    x = (torch.arange(60).reshape(3, 4, 5) % 3).to(dtype)
    for target in TARGETS:
        same(cu.compile(list_after_slice, target=target, fallback="error")(x), list_after_slice(x))


def test_list_key_round_trips_through_the_text():
    f = cu.compile(list_slice_list, target="reference", fallback="error")
    f(torch.randn(5, 5, 5))
    g = f.graphs[0]
    assert "__list__ = [0, 1]" in g.text
    assert parse_graph(g.text).text == g.text


def test_bool_list_length_is_checked_like_eager():
    f = cu.compile(bool_list, target="reference", fallback="error")
    x = torch.randn(5, 2)
    same(f(x), bool_list(x))
    with pytest.raises(IndexError):
        bool_list(torch.randn(4, 2))
    # another length: the guard on the dim fails, the recompile names the mismatch
    with pytest.raises(cu.CompileError, match="boolean index list of length 5 indexes a dim of size"):
        f(torch.randn(4, 2))
