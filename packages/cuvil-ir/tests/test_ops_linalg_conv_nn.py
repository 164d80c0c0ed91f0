"""Matrix products, convolution, pooling, embedding, pad, interpolate and attention against torch.

One torch call per case, checked by :func:`cuvil_ir.testing.check_case` (types, values
and graph against torch); ``test_ops.py`` checks that every declared op has a case.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cuvil_ir.graph_ir.ops.paged import paged_attention
from cuvil_ir.graph_ir.ops.quant import weight_only_linear
from cuvil_ir.testing import CaseTable, In, OpCase, Sz, check_case, spec

T = torch.Tensor
X, Y, Z = In(0), In(1), In(2)
S = spec  # alias for readability in the table
CASES = CaseTable()
case = CASES.add

# -- matrix products ----------------------------------------------------------------------------
case("matmul-vv", torch.matmul, (X, Y), [S(4), S(4)], ops={"matmul"})
case("matmul-mv", torch.matmul, (X, Y), [S(3, 4), S(4)], ops={"matmul"})
case("matmul-vm-batched", T.matmul, (X, Y), [S(4), S(2, 4, 3)], ops={"matmul"})
case("matmul-batched-2d", T.__matmul__, (X, Y), [S(2, 3, 4), S(4, 5, static=True)], ops={"matmul"})
case("matmul-broadcast", torch.matmul, (X, Y), [S(2, 1, 3, 4), S(5, 4, 2)], ops={"matmul"})
case("rmatmul", T.__rmatmul__, (X, Y), [S(4, 2), S(3, 4)], ops={"matmul"})
case("mm", torch.mm, (X, Y), [S(3, 4), S(4, 2)], ops={"matmul"})
case("bmm", T.bmm, (X, Y), [S(2, 3, 4), S(2, 4, 5)], ops={"matmul"})
case("mv", torch.mv, (X, Y), [S(3, 4), S(4)], ops={"matmul"})
case("dot", T.dot, (X, Y), [S(5, dtype=torch.float64), S(5, dtype=torch.float64)], ops={"matmul"})
case("addmm", torch.addmm, (X, Y, Z), [S(5), S(3, 4), S(4, 5)], ops={"matmul", "add"})
case(
    "addmm-scaled",
    T.addmm,
    (X, Y, Z),
    [S(3, 1), S(3, 4), S(4, 2)],
    beta=0.5,
    alpha=2.0,
    ops={"matmul", "mul", "add"},
)
case("baddbmm", torch.baddbmm, (X, Y, Z), [S(2, 3, 5), S(2, 3, 4), S(2, 4, 5)], beta=0.0, ops={"matmul"})
case("linear", F.linear, (X, Y, Z), [S(2, 3, 4), S(5, 4, static=True), S(5, static=True)], ops={"linear"})
case("linear-no-bias", F.linear, (X, Y), [S(3, 4), S(2, 4, static=True)], ops={"linear"})
case("linear-1d-weight", F.linear, (X, Y), [S(2, 4), S(4, static=True)], ops={"linear"})

# weight-only low-precision linears (cuvil_ir/graph_ir/ops/quant.py): weights and their scales
# are parameters (static sizes); the int4 weight holds two values a byte
_WOL = {"weight_only_linear"}
U8 = S(5, 32, dtype=torch.uint8, static=True, low=0, high=256)
case(
    "wol-bf16",
    weight_only_linear,
    (X, Y),
    [S(2, 3, 8), S(5, 8, dtype=torch.bfloat16, static=True)],
    fmt="bf16",
    ops=_WOL,
)
case(
    "wol-int8-bias",
    weight_only_linear,
    (X, Y, Z, None, In(3)),
    [
        S(3, 8),
        S(5, 8, dtype=torch.int8, static=True, low=-128, high=128),
        S(5, static=True),
        S(5, static=True),
    ],
    fmt="int8",
    ops=_WOL,
)
case(
    "wol-int4",
    weight_only_linear,
    (X, Y, Z, In(3)),
    [S(2, 64), U8, S(5, 2, static=True), S(5, 2, static=True)],
    fmt="int4",
    group_size=32,
    ops=_WOL,
)

# paged attention (cuvil_ir/graph_ir/ops/paged.py): every size a symbol. Random int32 operands
# are in range (block tables index the cache) though not a real batch (query_start_loc all 0);
# the kernels' tests (each backend's test_paged_attention.py) run real batches.
I32 = torch.int32
case(
    "paged_attention-gqa",
    paged_attention,
    (X, Y, Z, In(3), In(4), In(5)),
    [
        S(3, 4, 8),
        S(6, 16, 2, 8),
        S(6, 16, 2, 8),
        S(2, 3, dtype=I32, low=0, high=6),
        S(2, dtype=I32, low=1, high=40),
        S(3, dtype=I32, low=0, high=1),
    ],
    scale=0.3,
    ops={"paged_attention"},
)

# -- convolution and pooling --------------------------------------------------------------------
case(
    "conv2d",
    F.conv2d,
    (X, Y, Z),
    [S(2, 3, 9, 10), S(4, 3, 3, 3, static=True), S(4, static=True)],
    stride=2,
    padding=1,
    ops={"conv"},
)
case(
    "conv2d-same-dilated",
    F.conv2d,
    (X, Y),
    [S(1, 2, 7, 6), S(3, 2, 3, 2, static=True)],
    padding="same",
    dilation=2,
    ops={"conv"},
)
case(
    "conv2d-groups-unbatched",
    F.conv2d,
    (X, Y),
    [S(4, 8, 8), S(6, 2, 3, 3, static=True)],
    groups=2,
    stride=(1, 2),
    ops={"conv"},
)
case(
    "conv2d-valid",
    torch.conv2d,
    (X, Y),
    [S(1, 1, 5, 5), S(2, 1, 2, 2, static=True)],
    padding="valid",
    ops={"conv"},
)
case(
    "conv1d",
    F.conv1d,
    (X, Y, Z),
    [S(2, 3, 11), S(4, 3, 5, static=True), S(4, static=True)],
    stride=3,
    padding=2,
    ops={"conv"},
)
case("conv3d", F.conv3d, (X, Y), [S(1, 2, 4, 5, 6), S(2, 2, 2, 3, 2, static=True)], ops={"conv"})
case(
    "conv_transpose2d",
    F.conv_transpose2d,
    (X, Y, Z),
    [S(1, 4, 5, 6), S(4, 3, 3, 3, static=True), S(3, static=True)],
    stride=2,
    padding=1,
    output_padding=1,
    ops={"conv_transpose"},
)
case(
    "conv_transpose1d-groups",
    F.conv_transpose1d,
    (X, Y),
    [S(2, 4, 7), S(4, 1, 3, static=True)],
    groups=2,
    dilation=2,
    ops={"conv_transpose"},
)
case("max_pool2d", F.max_pool2d, (X, 3, 2, 1), [S(2, 3, 9, 10)], ops={"max_pool"})
case(
    "max_pool2d-ceil-dilated",
    F.max_pool2d,
    (X, (2, 3)),
    [S(1, 2, 8, 11)],
    stride=2,
    dilation=(2, 1),
    ceil_mode=True,
    ops={"max_pool"},
)
case("max_pool2d-ceil-edge", F.max_pool2d, (X, 2, 2), [S(1, 1, 5, 7)], ceil_mode=True, ops={"max_pool"})
case("max_pool1d", F.max_pool1d, (X, 2), [S(2, 3, 7)], ops={"max_pool"})
case("max_pool2d-unbatched", F.max_pool2d, (X, 2), [S(3, 6, 4)], ops={"max_pool"})
case(
    "avg_pool2d",
    F.avg_pool2d,
    (X, 3, 2, 1),
    [S(2, 3, 9, 10)],
    ceil_mode=True,
    count_include_pad=False,
    ops={"avg_pool"},
)
case("avg_pool2d-divisor", F.avg_pool2d, (X, 2), [S(1, 2, 4, 6)], divisor_override=3, ops={"avg_pool"})
case("avg_pool1d", F.avg_pool1d, (X, 3), [S(2, 2, 10)], stride=2, ops={"avg_pool"})
case(
    "adaptive_avg_pool2d", F.adaptive_avg_pool2d, (X, (3, None)), [S(2, 3, 9, 10)], ops={"adaptive_avg_pool"}
)
case("adaptive_avg_pool2d-1", F.adaptive_avg_pool2d, (X, 1), [S(1, 4, 5, 5)], ops={"adaptive_avg_pool"})
case("adaptive_avg_pool1d", F.adaptive_avg_pool1d, (X, 2), [S(3, 7)], ops={"adaptive_avg_pool"})
case("adaptive_max_pool2d", F.adaptive_max_pool2d, (X, 2), [S(2, 3, 5, 4)], ops={"adaptive_max_pool"})
case("adaptive_max_pool1d", F.adaptive_max_pool1d, (X, 3), [S(1, 2, 9)], ops={"adaptive_max_pool"})

# -- embedding, pad, interpolate, attention ------------------------------------------------------------
case(
    "embedding",
    F.embedding,
    (X, Y),
    [S(2, 3, dtype=torch.int64, low=0, high=10), S(10, 4, static=True)],
    ops={"embedding"},
)
case(
    "embedding-padding-idx",
    F.embedding,
    (X, Y),
    [S(5, dtype=torch.int32, low=0, high=6), S(6, 3)],
    padding_idx=0,
    ops={"embedding"},
)
case("pad", F.pad, (X, (1, 2)), [S(2, 3)], ops={"pad"})
case("pad-value-2d", F.pad, (X, (1, 1, 2, 0)), [S(2, 3, 4)], value=1.5, ops={"pad"})
# torch's fake kernel cannot crop symbolic sizes; a static input checks the rule
case("pad-crop", F.pad, (X, (-1, 0, 0, -2)), [S(3, 5, 4, static=True)], ops={"pad"})
case("pad-reflect", F.pad, (X, (2, 1)), [S(1, 2, 6)], mode="reflect", ops={"pad"})
case("pad-replicate-2d", F.pad, (X, (1, 1, 1, 1)), [S(1, 2, 3, 4)], mode="replicate", ops={"pad"})
case("interpolate-nearest", F.interpolate, (X,), [S(1, 2, 3, 4)], scale_factor=2.0, ops={"interpolate"})
case(
    "interpolate-bilinear-size",
    F.interpolate,
    (X,),
    [S(2, 3, 4, 5)],
    size=(5, 7),
    mode="bilinear",
    align_corners=True,
    ops={"interpolate"},
)
case(
    "interpolate-bilinear-scale",
    F.interpolate,
    (X,),
    [S(1, 2, 5, 6)],
    scale_factor=1.5,
    mode="bilinear",
    ops={"interpolate"},
)
case("interpolate-nearest-1d", F.interpolate, (X,), [S(2, 3, 5)], scale_factor=0.5, ops={"interpolate"})
# torch's fake kernels need concrete sizes for these two; static inputs check the rule
case(
    "interpolate-computed-size",
    F.interpolate,
    (X, Sz(lambda s: (s[0][2] * 2, s[0][3] + 1))),
    [S(1, 1, 3, 4, static=True)],
    ops={"interpolate"},
)
case(
    "upsample-recompute",
    F.interpolate,
    (X,),
    [S(1, 2, 7, 5, static=True)],
    scale_factor=(1.7, 0.6),
    mode="nearest",
    recompute_scale_factor=True,
    ops={"interpolate"},
)
case(
    "sdpa",
    F.scaled_dot_product_attention,
    (X, Y, Z),
    [S(2, 3, 4, 8), S(2, 3, 5, 8), S(2, 3, 5, 6)],
    ops={"sdpa"},
)
case(
    "sdpa-causal-scale",
    F.scaled_dot_product_attention,
    (X, X, X),
    [S(1, 2, 4, 8)],
    is_causal=True,
    scale=0.3,
    ops={"sdpa"},
)
case(
    "sdpa-bool-mask",
    F.scaled_dot_product_attention,
    (X, Y, Y, Z),
    [S(2, 2, 3, 4), S(2, 2, 5, 4), S(1, 1, 3, 5, dtype=torch.bool)],
    ops={"sdpa"},
)
case(
    "sdpa-float-mask",
    F.scaled_dot_product_attention,
    (X, X, X),
    [S(1, 4, 4), S(4, 4)],
    attn_mask=Y,
    ops={"sdpa"},
)
case(
    "sdpa-gqa",
    F.scaled_dot_product_attention,
    (X, Y, Y),
    [S(1, 4, 3, 8), S(1, 2, 3, 8)],
    enable_gqa=True,
    ops={"sdpa"},
)
case(
    # batch dims broadcast between q, k and v (of three ranks), as torch's do
    "sdpa-broadcast-batch",
    F.scaled_dot_product_attention,
    (X, Y, Z),
    [S(1, 3, 4, 8), S(2, 1, 5, 8), S(5, 6)],
    ops={"sdpa"},
)
case(
    "sdpa-gqa-kv-heads-differ",
    F.scaled_dot_product_attention,
    (X, Y, Z),
    [S(1, 6, 3, 8), S(2, 2, 5, 8), S(3, 5, 4)],
    enable_gqa=True,
    ops={"sdpa"},
)


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
def test_op(c: OpCase) -> None:
    check_case(c)
