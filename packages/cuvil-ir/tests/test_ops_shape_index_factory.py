"""Shape ops, indexing, joining, splitting and factories against torch.

One torch call per case, checked by :func:`cuvil_ir.testing.check_case` (types, values
and graph against torch); ``test_ops.py`` checks that every declared op has a case.
"""

from __future__ import annotations

import pytest
import torch

from cuvil_ir.testing import CaseTable, In, OpCase, Sz, check_case, spec

T = torch.Tensor
X, Y = In(0), In(1)
S = spec  # alias for readability in the table
CASES = CaseTable()
case = CASES.add

# -- shape ops -------------------------------------------------------------------------------------
case("view-minus-one", T.view, (X, Sz(lambda s: s[0][0]), -1), [S(2, 3, 4)], ops={"reshape"})
case("view-flat", T.view, (X, -1), [S(3, 1, 2)], ops={"reshape"})
case("reshape-divisible", torch.reshape, (X, (-1, 4)), [S(3, 8)], ops={"reshape"})
case("reshape-3", T.reshape, (X, 3, -1), [S(6, 2, 5)], ops={"reshape"})
case(
    "reshape-symbolic",
    T.reshape,
    (X, Sz(lambda s: (s[0][0] * s[0][1], s[0][2]))),
    [S(2, 3, 4)],
    ops={"reshape"},
)
case("view_as", T.view_as, (X, Y), [S(2, 6), S(3, 4)], ops={"reshape"})
case("flatten", torch.flatten, (X, 1), [S(2, 3, 4)], ops={"reshape"})
case("flatten-all", T.flatten, (X,), [S(2, 1, 3)], ops={"reshape"})
case("flatten-one-dim", T.flatten, (X, 1, 1), [S(2, 3)], ops=set())
case("ravel", T.ravel, (X,), [S(3, 2)], ops={"reshape"})
case("unflatten", T.unflatten, (X, 1, (2, -1)), [S(3, 8)], ops={"reshape"})
case("unflatten-static", torch.unflatten, (X, -1, (3, 2)), [S(2, 6)], ops={"reshape"})
case("permute", T.permute, (X, 2, 0, 1), [S(2, 3, 4)], ops={"permute"})
case("permute-tuple", torch.permute, (X, (1, 0)), [S(3, 1)], ops={"permute"})
case("permute-identity", T.permute, (X, 0, 1), [S(2, 3)], ops=set())
case("transpose", T.transpose, (X, 0, -1), [S(2, 3, 4)], ops={"permute"})
case("swapaxes", torch.swapaxes, (X, 1, 2), [S(2, 1, 3)], ops={"permute"})
case("t", T.t, (X,), [S(3, 4)], ops={"permute"})
case("t-1d", torch.t, (X,), [S(3)], ops=set())
case("T", T.T.__get__, (X,), [S(3, 2)], ops={"permute"})
case("mT", T.mT.__get__, (X,), [S(2, 3, 4)], ops={"permute"})
case("movedim", torch.movedim, (X, 0, -1), [S(2, 3, 4)], ops={"permute"})
case("movedim-multi", T.movedim, (X, (0, 1), (2, 0)), [S(2, 3, 4)], ops={"permute"})
case("unsqueeze", torch.unsqueeze, (X, -1), [S(2, 3)], ops={"unsqueeze"})
case("unsqueeze-0", T.unsqueeze, (X, 0), [S(4)], ops={"unsqueeze"})
case("squeeze-all", T.squeeze, (X,), [S(1, 3, 1, 2)], ops={"squeeze"})
case("squeeze-dim", torch.squeeze, (X, 1), [S(3, 1)], ops={"squeeze"})
case("squeeze-noop", T.squeeze, (X, 0), [S(3, 2)], ops=set())
case("squeeze-dims", T.squeeze, (X, (0, 2)), [S(1, 4, 1)], ops={"squeeze"})
case("expand", T.expand, (X, 3, -1, 4), [S(2, 1)], ops={"expand"})
case("expand-symbolic", T.expand, (X, Sz(lambda s: (s[1][0], s[0][1]))), [S(1, 3), S(5)], ops={"expand"})
case("expand_as", T.expand_as, (X, Y), [S(3, 1), S(2, 3, 4)], ops={"expand"})
case("broadcast_to", torch.broadcast_to, (X, (2, 3)), [S(3)], ops={"expand"})
case("repeat", T.repeat, (X, 2, 1, 3), [S(2, 3)], ops={"repeat"})
case("repeat-tuple", T.repeat, (X, (2, 2)), [S(1, 3)], ops={"repeat"})
case("flip", torch.flip, (X, (0, -1)), [S(2, 3, 4)], ops={"flip"})
case("flip-method", T.flip, (X, 1), [S(3, 2)], ops={"flip"})
case("contiguous", T.contiguous, (X,), [S(2, 3)], ops=set())
case("detach", T.detach, (X,), [S(3)], ops=set())
case("tril", torch.tril, (X,), [S(3, 4)], ops={"tril"})
case("tril-batched", T.tril, (X, -1), [S(2, 4, 4)], ops={"tril"})
case("triu", torch.triu, (X, 1), [S(4, 3)], ops={"triu"})
case("triu-method", T.triu, (X,), [S(2, 3, 3, dtype=torch.int64)], ops={"triu"})

# -- indexing, joining, splitting ----------------------------------------------------------------
case("getitem-int", T.__getitem__, (X, 0), [S(3, 4)], ops={"select"})
case("getitem-neg-int", T.__getitem__, (X, (slice(None), -1)), [S(3, 4)], ops={"select"})
case("getitem-slices", T.__getitem__, (X, (slice(None), slice(1, -1))), [S(3, 5)], ops={"slice"})
case(
    "getitem-ellipsis-none-step",
    T.__getitem__,
    (X, (Ellipsis, None, slice(None, None, 2))),
    [S(2, 3, 5)],
    ops={"unsqueeze", "slice"},
)
case(
    "getitem-mixed",
    T.__getitem__,
    (X, (slice(1, None), None, 0)),
    [S(4, 3, 2)],
    ops={"slice", "unsqueeze", "select"},
)
case(
    "getitem-symbolic-stop",
    T.__getitem__,
    (X, (slice(None), slice(None, Sz(lambda s: s[1][0])))),
    [S(2, 6), S(4)],
    ops={"slice"},
)
case(
    "getitem-symbolic-neg-start",
    T.__getitem__,
    (X, (Ellipsis, slice(Sz(lambda s: -s[1][0]), None))),
    [S(2, 6), S(2)],
    ops={"slice"},
)
case("getitem-clamped", T.__getitem__, (X, slice(-10, 10)), [S(3, 2)], ops={"slice"})
case("getitem-empty-slice", T.__getitem__, (X, slice(3, 1)), [S(4)], ops={"slice"})
case("getitem-full", T.__getitem__, (X, (slice(None), Ellipsis)), [S(2, 3)], ops=set())
case("select", torch.select, (X, 1, -1), [S(2, 3)], ops={"select"})
case("select-method", T.select, (X, 0, 2), [S(4, 2, 2)], ops={"select"})
case("narrow", T.narrow, (X, 1, 1, 2), [S(2, 5)], ops={"slice"})
case("narrow-neg", torch.narrow, (X, 0, -2, 2), [S(4, 3)], ops={"slice"})
case("unbind", T.unbind, (X, 1), [S(2, 3)], ops={"select"})
case("unbind-0", torch.unbind, (X,), [S(2, 2, 1)], ops={"select"})
case("cat", torch.cat, ([X, Y], 1), [S(2, 3), S(2, 4)], ops={"cat"})
case("cat-promote", torch.cat, ((X, Y, X),), [S(1, 2, dtype=torch.float16), S(3, 2)], ops={"cat"})
case("concat", torch.concat, ([X, Y],), [S(2, 3), S(1, 3)], dim=-2, ops={"cat"})
case("stack", torch.stack, ([X, Y],), [S(2, 3), S(2, 3)], ops={"unsqueeze", "cat"})
case("stack-last", torch.stack, ((X, X, Y), -1), [S(3), S(3)], ops={"unsqueeze", "cat"})
case("split", torch.split, (X, 2), [S(5, 3)], ops={"split"})
case("split-method-dim", T.split, (X, 4, 1), [S(2, 8)], ops={"split"})
case("split-sizes", T.split, (X, [1, 3], -1), [S(2, 4)], ops={"split"})
case("split_with_sizes", torch.split_with_sizes, (X, (2, 1)), [S(3, 2)], ops={"split"})
case("chunk", T.chunk, (X, 3, 1), [S(2, 7)], ops={"split"})
case("chunk-fewer", torch.chunk, (X, 4), [S(6, 2)], ops={"split"})
case("chunk-even", T.chunk, (X, 2, -1), [S(3, 8)], ops={"split"})

# -- factories -----------------------------------------------------------------------------------
case("arange", torch.arange, (Sz(lambda s: s[0][0]),), [S(5)], ops={"arange"})
case("arange-step", torch.arange, (1, Sz(lambda s: s[0][1]), 2), [S(2, 9)], ops={"arange"})
case("arange-float", torch.arange, (0.0, 2.5, 0.5), [], ops={"arange"})
case("arange-dtype", torch.arange, (5,), [], dtype=torch.float32, ops={"arange"})
case("arange-negative-step", torch.arange, (Sz(lambda s: s[0][0]), 0, -2), [S(7)], ops={"arange"})
case("zeros", torch.zeros, (Sz(lambda s: s[0][0]), 3), [S(4)], ops={"full"})
case("zeros-tuple", torch.zeros, (Sz(lambda s: tuple(s[0])),), [S(2, 3)], dtype=torch.int32, ops={"full"})
case("ones", torch.ones, (2, 3), [], ops={"full"})
case("ones-size-kw", torch.ones, (), [], size=(3,), dtype=torch.float64, ops={"full"})
case("full", torch.full, ((Sz(lambda s: s[0][0]), 2), 1.5), [S(3)], ops={"full"})
case("full-bool", torch.full, ((2,), True), [], ops={"full"})
case("full-int", torch.full, ((1, 3), 7), [], ops={"full"})
case("empty", torch.empty, (2, Sz(lambda s: s[0][0])), [S(3)], check="shape", ops={"full"})
case("zeros_like", torch.zeros_like, (X,), [S(2, 3)], ops={"full"})
case(
    "ones_like-dtype", torch.ones_like, (X,), [S(3, 1, dtype=torch.int64)], dtype=torch.float64, ops={"full"}
)
case("full_like", torch.full_like, (X, 7), [S(2, 2)], ops={"full"})
case("full_like-int-float", torch.full_like, (X, 2.5), [S(3, dtype=torch.int32)], ops={"full"})
case("empty_like", torch.empty_like, (X,), [S(2, 3)], check="shape", ops={"full"})
case("new_zeros", T.new_zeros, (X, (Sz(lambda s: s[0][1]), 2)), [S(2, 3, dtype=torch.float16)], ops={"full"})
case("new_ones", T.new_ones, (X, 2, 3), [S(1, dtype=torch.int64)], ops={"full"})
case("new_full", T.new_full, (X, (2, 3), 3.0), [S(4)], ops={"full"})
case("new_empty", T.new_empty, (X, (3,)), [S(2)], check="shape", ops={"full"})


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
def test_op(c: OpCase) -> None:
    check_case(c)
