"""Reduction, softmax and normalization ops against torch.

One torch call per case, checked by :func:`cuvil_ir.testing.check_case` (types, values
and graph against torch); ``test_ops.py`` checks that every declared op has a case.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cuvil_ir.testing import CaseTable, In, OpCase, Sz, check_case, spec

T = torch.Tensor
X, Y, Z, W = In(0), In(1), In(2), In(3)
S = spec  # alias for readability in the table
CASES = CaseTable()
case = CASES.add

# -- reductions ---------------------------------------------------------------------------------
case("sum", torch.sum, (X, 1), [S(2, 3, 4)], ops={"sum"})
case("sum-all-int", T.sum, (X,), [S(3, 4, dtype=torch.int32)], ops={"sum"})
case("sum-dims-dtype", torch.sum, (X, (0, -1), True), [S(2, 1, 3)], dtype=torch.float64, ops={"sum"})
case("mean", T.mean, (X, -1), [S(3, 5)], keepdim=True, ops={"mean"})
case("mean-all", torch.mean, (X,), [S(2, 3, 2)], ops={"mean"})
case("mean-int-dtype", torch.mean, (X, [0]), [S(4, 2, dtype=torch.int64)], dtype=torch.float32, ops={"mean"})
case("prod", torch.prod, (X, 1), [S(2, 3, dtype=torch.int32, low=1, high=4)], ops={"prod"})
case("prod-all", T.prod, (X,), [S(2, 3)], ops={"prod"})
case("prod-keepdim", torch.prod, (X, -1, True), [S(3, 2)], ops={"prod"})
case("amax", torch.amax, (X, (1, 2)), [S(2, 3, 4)], ops={"amax"})
case("amax-all", T.amax, (X,), [S(3, 1)], ops={"amax"})
case("amin", T.amin, (X, 0, True), [S(4, 3)], ops={"amin"})
case("amin-int", torch.amin, (X, -1), [S(2, 5, dtype=torch.int64)], ops={"amin"})
case("all", torch.all, (X, 1), [S(3, 4, dtype=torch.bool)], ops={"all"})
case("all-u8", T.all, (X,), [S(2, 3, dtype=torch.uint8, low=0, high=3)], ops={"all"})
case("any", T.any, (X, -1, True), [S(2, 3)], ops={"any"})
case("any-all", torch.any, (X,), [S(4, dtype=torch.bool)], ops={"any"})
case("logsumexp", torch.logsumexp, (X, 1), [S(2, 5)], ops={"logsumexp"})
case("logsumexp-keep", T.logsumexp, (X, (0, 1), True), [S(3, 2, 2)], ops={"logsumexp"})
case("var", torch.var, (X, 1), [S(3, 5)], ops={"var"})
case("var-unbiased-false", T.var, (X, 0, False, True), [S(4, 3)], ops={"var"})
case("var-correction", torch.var, (X,), [S(2, 6)], dim=(0, 1), correction=0, keepdim=True, ops={"var"})
case("var-all-bool-arg", T.var, (X, False), [S(3, 3)], ops={"var"})
case("std", torch.std, (X, (0, 2)), [S(2, 3, 4)], ops={"std"})
case(
    "std-all",
    T.std,
    (X,),
    [
        S(
            5,
        )
    ],
    ops={"std"},
)
case("var_mean", torch.var_mean, (X, 1), [S(3, 4)], ops={"var", "mean"})
case("std_mean", torch.std_mean, (X,), [S(4, 3)], dim=0, correction=2, ops={"std", "mean"})
case("max-all", torch.max, (X,), [S(3, 4)], ops={"amax"})
case("max-dim", torch.max, (X, 1), [S(3, 4)], ops={"max"})
case("max-keepdim", T.max, (X,), [S(2, 3, 2)], dim=0, keepdim=True, ops={"max"})
case("max-pairwise", torch.max, (X, Y), [S(2, 3), S(1, 3)], ops={"maximum"})
case("min-dim", T.min, (X, -1), [S(4, 5, dtype=torch.int64)], ops={"min"})
case("min-keepdim", torch.min, (X, 0, True), [S(3, 1)], ops={"min"})
case("min-all", T.min, (X,), [S(2, 2)], ops={"amin"})
case("argmax", torch.argmax, (X,), [S(3, 4)], ops={"argmax"})
case("argmax-dim", T.argmax, (X, 1, True), [S(2, 5)], ops={"argmax"})
case("argmin", torch.argmin, (X, -1), [S(3, 2, 4)], ops={"argmin"})
case("argmin-keep-all", T.argmin, (X,), [S(2, 3)], keepdim=True, ops={"argmin"})
case("cumsum", torch.cumsum, (X, 1), [S(2, 4)], ops={"cumsum"})
case("cumsum-int", T.cumsum, (X, -1), [S(3, dtype=torch.int32)], ops={"cumsum"})
case("cumsum-dtype", torch.cumsum, (X, 0), [S(3, 2)], dtype=torch.float64, ops={"cumsum"})
case("cumprod", torch.cumprod, (X, 0), [S(4, 2)], ops={"cumprod"})
case("cumprod-bool", T.cumprod, (X, 1), [S(2, 3, dtype=torch.bool)], ops={"cumprod"})

# -- softmax and norms -----------------------------------------------------------------------------
case("softmax", F.softmax, (X,), [S(2, 5)], dim=-1, ops={"softmax"})
case(
    "softmax-dtype",
    torch.softmax,
    (X, 1),
    [S(3, 4, 2, dtype=torch.float16)],
    dtype=torch.float32,
    ops={"softmax"},
)
case("softmax-method", T.softmax, (X, 0), [S(4, 1)], ops={"softmax"})
case("log_softmax", F.log_softmax, (X, 1), [S(2, 6)], ops={"log_softmax"})
case("log_softmax-method", T.log_softmax, (X, -1), [S(3, 2, 4, dtype=torch.float64)], ops={"log_softmax"})
case(
    "layer_norm",
    F.layer_norm,
    (X, (4,), Y, Z),
    [S(2, 3, 4), S(4, static=True), S(4, static=True)],
    ops={"layer_norm"},
)
case(
    "layer_norm-2d-no-affine",
    F.layer_norm,
    (X, Sz(lambda s: s[0][1:])),
    [S(2, 3, 4)],
    eps=1e-3,
    ops={"layer_norm"},
)
case(
    "layer_norm-bias-only", F.layer_norm, (X, [5], None, Y), [S(3, 5), S(5, static=True)], ops={"layer_norm"}
)
case("rms_norm", F.rms_norm, (X, (4,), Y), [S(2, 3, 4), S(4, static=True)], ops={"rms_norm"})
case("rms_norm-eps", F.rms_norm, (X, [3, 2]), [S(2, 3, 2)], eps=1e-4, ops={"rms_norm"})
case(
    "batch_norm",
    F.batch_norm,
    (X, Y, Z, W),
    [S(2, 3, 4, 5), S(3, static=True), S(3, static=True, low=1), S(3, static=True)],
    ops={"batch_norm"},
)
case(
    "batch_norm-affine",
    F.batch_norm,
    (X, Y, Z, W, In(4)),
    [S(4, 3), S(3, static=True), S(3, static=True), S(3, static=True), S(3, static=True)],
    eps=1e-3,
    ops={"batch_norm"},
)
case("group_norm", F.group_norm, (X, 2), [S(2, 4, 3, 3)], ops={"group_norm"})
case(
    "group_norm-affine",
    F.group_norm,
    (X, 3, Y, Z),
    [S(1, 6, 5), S(6, static=True), S(6, static=True)],
    ops={"group_norm"},
)


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
def test_op(c: OpCase) -> None:
    check_case(c)
