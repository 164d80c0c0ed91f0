"""The function programs of the corpus: elementwise math, reductions, linear algebra,
convolution, views, attention, and plain Python code around tensors.

Registered in file order by :func:`~cuvil.testing.corpus.registry.program`; see
:mod:`cuvil.testing.corpus` for the rules programs follow.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from cuvil.testing.corpus.registry import _rand, _randint, _randn, program

# These programs stand for user code: Cuvil converts them from source (control flow
# hooks, source locations) even though they live inside an installed package.
__cuvil_convert__ = True


# --------------------------------------------------------------------------------------
# Elementwise math, comparisons, broadcasting, type promotion
# --------------------------------------------------------------------------------------


@program(lambda g, b: (_randn(g, b, 8), _randn(g, 8)), sizes=[2, 5])
def ew_arith(x, y):
    a = x * y + x / (y.abs() + 1.0) - 0.5 * x**2
    return a - y + 3 * x - 1 / (x.abs() + 2) + (-x)


@program(lambda g, b, s: (_randn(g, b, 1, 6), _randn(g, 1, s, 6), _randn(g, s, 1)), sizes=[(2, 4), (3, 7)])
def ew_broadcast_3d(x, y, z):
    return torch.maximum(x - y, z) * torch.minimum(x, y) + (x * y) / (z.abs() + 1)


@program(lambda g, n: (_randint(g, -5, 20, n, 4), _randn(g, n, 4)), sizes=[3, 6])
def int_float_promotion(ids, x):
    a = ids + 0.5  # int tensor + float scalar -> default float
    b = ids * 2  # stays int64
    c = ids / 2  # true division -> float
    d = ids // 3  # floor division on ints
    e = ids % 4
    f = ids + x  # int tensor + float tensor -> float
    g = (ids > 3) + 1  # bool + int -> int64
    return a, b, c, d, e, f, g


@program(lambda g, b: (_randn(g, b, 5), _rand(g, b, 5)), sizes=[3, 7])
def bool_mask_ops(x, y):
    mask = x > 0
    both = mask & (y < 0.5)
    either = mask | (y > 0.9)
    inv = ~mask
    kept = x * mask  # float * bool
    filled = x.masked_fill(inv, -1.0)
    return both, either ^ both, kept + mask.float(), filled, torch.logical_or(mask, both), inv.sum(-1)


@program(lambda g, b: (_randn(g, b, 6), _randn(g, b, 6)), sizes=[2, 4])
def comparisons(x, y):
    return (x == y, x != y, x >= y, x <= 0.25, x < y, torch.eq(x, x), torch.gt(x, 0), torch.maximum(x, y))


@program(lambda g, b: (_randn(g, b, 7), _randn(g, b, 7)), sizes=[3, 5])
def where_select(x, y):
    a = torch.where(x > 0, x, y * 2)
    b = torch.where(y > x, 0.0, x)  # scalar branch
    c = torch.where(x < -0.5, -1.0, 1.0 + x)
    return a + b * c


@program(lambda g, b: (_randn(g, b, 6) * 2, _randn(g, 6)), sizes=[2, 6])
def clamp_ops(x, lo):
    a = x.clamp(-0.5, 0.5)
    b = torch.clamp(x, min=0.0)
    c = x.clamp(max=1.0)
    d = x.clamp_min(-0.25) + x.clamp_max(0.25)
    e = torch.clamp(x, min=lo, max=lo + 1.0)  # tensor bounds, broadcast
    return a + b + c + d + e


@program(lambda g, b: (_randn(g, b, 8), _randint(g, 0, 9, b, 8)), sizes=[2, 5])
def casts(x, ids):
    h = x.to(torch.float16)
    back = h.float()  # round trip through half
    i32 = ids.int()
    as_float = ids.float()
    asd = x.to(dtype=torch.float64).sum(-1)
    flags = x.bool()
    t = ids.type_as(x)
    return back, i32 * 2, as_float / 3, asd, flags, t + x.long(), h * 2


@program(lambda g, b: (_randn(g, b, 9),), sizes=[2, 5])
def unary_math(x):
    a = torch.exp(x) + torch.log(x.abs() + 1) + torch.sqrt(x.abs()) + torch.rsqrt(x.abs() + 1)
    b = torch.erf(x) + x.tanh() + x.sigmoid() + x.abs() + x.neg() + (x.abs() + 0.5).reciprocal()
    c = torch.sin(x) * torch.cos(x) + x.pow(3) + torch.pow(2.0, x) + x.exp2() + torch.log1p(x.abs())
    return a, b, c, x.sign(), torch.floor(x * 3), x.round(), x.trunc()


@program(lambda g, b: (_randn(g, b, 10) * 3,), sizes=[2, 5])
def activations(x):
    return (
        F.relu(x),
        F.gelu(x),
        F.gelu(x, approximate="tanh"),
        F.silu(x),
        torch.tanh(x),
        torch.sigmoid(x),
        F.leaky_relu(x, 0.1),
        F.elu(x),
        F.softplus(x),
        F.hardtanh(x, -1.0, 1.0),
        F.mish(x),
        F.hardswish(x),
        F.relu6(x),
    )


# --------------------------------------------------------------------------------------
# Reductions, normalization
# --------------------------------------------------------------------------------------


@program(lambda g, b, s: (_randn(g, b, s, 6),), sizes=[(2, 4), (3, 9)])
def reductions_sum_mean(x):
    return (
        x.sum(-1),
        x.sum(dim=1, keepdim=True),
        x.mean(dim=(1, 2)),
        torch.sum(x),
        x.mean(0, keepdim=True),
        torch.mean(x, dim=-2),
        x.prod(-1),
    )


@program(lambda g, b, s: (_randn(g, b, s),), sizes=[(3, 4), (5, 11)])
def reductions_minmax(x):
    return (
        x.amax(-1),
        x.amin(dim=0, keepdim=True),
        torch.amax(x, dim=(0, 1)),
        x.max(),
        x.min(),
        x.max(dim=-1).values,
        x.argmax(-1),
        x.argmin(dim=0),
    )


@program(lambda g, b, s: (_randn(g, b, s),), sizes=[(3, 5), (6, 8)])
def var_std(x):
    return (
        x.var(-1),
        x.var(dim=0, unbiased=False),
        x.std(-1, keepdim=True),
        torch.std(x, dim=1, correction=0),
        x.var(dim=-1, correction=2),
        torch.var_mean(x, dim=-1),
    )


@program(lambda g, b, s: (_randn(g, b, s, 8),), sizes=[(2, 5), (3, 7)])
def softmax_family(x):
    return (
        torch.softmax(x, dim=-1),
        F.log_softmax(x, dim=1),
        x.softmax(0),
        F.softmax(x.half(), dim=-1, dtype=torch.float32),
        torch.logsumexp(x, dim=-1),
    )


@program(lambda g, b, s: (_randn(g, b, s, 12), _randn(g, 12), _randn(g, 12)), sizes=[(2, 3), (4, 8)])
def layer_norm_fn(x, w, b):
    a = F.layer_norm(x, (12,), w, b, eps=1e-5)
    c = F.layer_norm(x, x.shape[-1:])  # no affine, normalized shape from the input
    d = F.layer_norm(x, (x.shape[-2], x.shape[-1]), eps=1e-6)
    return a, c, d


@program(lambda g, b: (_randn(g, b, 16), _randn(g, 16)), sizes=[3, 7])
def rms_norm_manual(x, w, eps: float = 1e-6):
    var = x.pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(var + eps) * w


@program(
    lambda g, b, c: (
        _randn(g, b, c, 5, 6),
        _randn(g, c),
        _randn(g, c),
        _rand(g, c) + 0.5,
        _randn(g, c),
        _randn(g, c),
    ),
    sizes=[(2, 4), (3, 4)],
)
def batch_norm_inference(x, mean, bias, var, weight, shift):
    y = F.batch_norm(x, mean, var, weight, bias, training=False, momentum=0.1, eps=1e-5)
    z = F.batch_norm(x, mean, var, training=False)
    return y + shift[:, None, None], z


# --------------------------------------------------------------------------------------
# Linear algebra, convolution, pooling
# --------------------------------------------------------------------------------------


@program(lambda g, b, s: (_randn(g, b, s, 8), _randn(g, 8, 5), _randn(g, 8)), sizes=[(2, 3), (3, 6)])
def matmul_variants(x, w, v):
    a = x @ w  # batched x 2-D
    b = torch.matmul(x, v)  # matrix-vector
    c = v @ w  # vector-matrix
    d = x @ x.transpose(-1, -2)  # batched x batched
    e = torch.mm(x[0], w)
    return a, b, c, d, e, v @ v


@program(lambda g, b: (_randn(g, b, 12), _randn(g, 6, 12), _randn(g, 6)), sizes=[3, 8])
def linear_addmm(x, w, b):
    a = F.linear(x, w, b)
    c = torch.addmm(b, x, w.t())
    d = F.linear(x, w)
    e = torch.addmm(b, x, w.t(), beta=0.5, alpha=2.0)
    return a, c, d, e


@program(lambda g, b, s: (_randn(g, b, s, 4), _randn(g, b, 4, 5), _randn(g, b, s, 5)), sizes=[(2, 3), (3, 7)])
def bmm_baddbmm(a, b, c):
    return torch.bmm(a, b), torch.baddbmm(c, a, b), torch.baddbmm(c, a, b, beta=0.0, alpha=0.5)


@program(
    lambda g, b, h: (_randn(g, b, 3, h, h + 1), _randn(g, 8, 3, 3, 3), _randn(g, 8)), sizes=[(1, 6), (2, 9)]
)
def conv2d_basic(x, w, b):
    return F.conv2d(x, w, b, stride=1, padding=1), F.conv2d(x, w)


@program(
    lambda g, b, h: (_randn(g, b, 4, h, h), _randn(g, 6, 2, 3, 3), _randn(g, 4, 1, 3, 3)),
    sizes=[(1, 8), (2, 11)],
)
def conv2d_strided_grouped(x, w, dw):
    a = F.conv2d(x, w, None, stride=2, padding=1, groups=2)
    b = F.conv2d(x, dw, stride=(1, 2), padding=(1, 0), groups=4)  # depthwise
    c = F.conv2d(x, w, padding="same", dilation=2, groups=2)
    return a, b, c


@program(lambda g, b, h: (_randn(g, b, 3, h, h + 2),), sizes=[(1, 6), (2, 9)])
def pooling(x):
    return (
        F.max_pool2d(x, 2),
        F.max_pool2d(x, kernel_size=3, stride=2, padding=1),
        F.avg_pool2d(x, 3, stride=1, padding=1),
        F.avg_pool2d(x, 2, ceil_mode=True, count_include_pad=False),
        F.adaptive_avg_pool2d(x, (1, 1)),
        F.adaptive_avg_pool2d(x, 3),
        F.adaptive_max_pool2d(x, 1),
    )


# --------------------------------------------------------------------------------------
# Embedding, dropout, interpolation
# --------------------------------------------------------------------------------------


@program(lambda g, b, s: (_randint(g, 0, 20, b, s), _randn(g, 20, 8)), sizes=[(2, 5), (3, 9)])
def embedding_lookup(ids, table):
    a = F.embedding(ids, table)
    b = F.embedding(ids, table, padding_idx=0)
    c = table[ids]  # advanced indexing with an integer tensor
    return a + b, c.sum(1)


@program(lambda g, b: (_randn(g, b, 10),), sizes=[3, 6])
def dropout_eval(x):
    a = F.dropout(x, p=0.5, training=False)
    b = torch.dropout(x, 0.2, False)
    c = F.dropout2d(x.view(x.shape[0], 10, 1, 1), 0.3, training=False)
    return a + b, c


@program(lambda g, b, h: (_randn(g, b, 2, h, h + 1),), sizes=[(1, 4), (2, 6)])
def interpolate_nearest(x):
    a = F.interpolate(x, scale_factor=2, mode="nearest")
    b = F.interpolate(x, size=(x.shape[-2] * 2, x.shape[-1] + 3), mode="nearest")
    c = F.interpolate(x, size=(5, 5))
    return a, b, c


@program(lambda g, b, h: (_randn(g, b, 2, h, h + 2),), sizes=[(1, 4), (2, 7)])
def interpolate_bilinear(x):
    a = F.interpolate(x, size=(6, 9), mode="bilinear", align_corners=False)
    b = F.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=True)
    c = F.interpolate(x, scale_factor=1.5, mode="bilinear")
    return a, b, c


# --------------------------------------------------------------------------------------
# Views and data movement
# --------------------------------------------------------------------------------------


@program(lambda g, b, s: (_randn(g, b, s, 6),), sizes=[(2, 3), (4, 5)])
def view_reshape(x):
    a = x.view(x.shape[0], -1)
    b = x.reshape(-1)
    c = x.flatten(1)
    d = torch.flatten(x)
    e = x.reshape(x.shape[0], x.shape[1], 2, 3)
    f = x.view(-1, 6)
    return a * 2, b + 1, c, d, e, f.unflatten(1, (2, 3))


@program(lambda g, b, s: (_randn(g, b, s, 5),), sizes=[(2, 4), (3, 7)])
def permute_transpose(x):
    a = x.permute(0, 2, 1)
    b = x.transpose(-1, -2).contiguous()
    c = torch.transpose(x, 0, 1)
    d = x[0].t()
    e = x.permute(2, 0, 1).reshape(5, -1)
    return a + 1, b * 2, c, d, e, x.mT


@program(lambda g, b, s: (_randn(g, b, s), _randn(g, b, 1, s)), sizes=[(2, 3), (5, 4)])
def unsqueeze_squeeze_expand(x, y):
    a = x.unsqueeze(1)
    b = y.squeeze(1)
    c = x.unsqueeze(-1).expand(-1, -1, 4)
    d = y.expand(x.shape[0], 3, x.shape[1])
    e = x[:, None, :].expand_as(d)
    f = torch.squeeze(a, 1)
    return a * 2, b + x, c.sum(-1), d + e, f, x.unsqueeze(0).repeat(2, 1, 1)


@program(lambda g, b, s: (_randn(g, b, s, 6),), sizes=[(4, 5), (6, 8)])
def slicing(x):
    a = x[:, 1:]
    b = x[..., :-1]
    c = x[:, ::2]
    d = x[-2:]
    e = x[:, -3:-1, 2:]
    f = x[0]
    g = x.select(1, -1)
    h = x[:, None, 0]
    k = x.narrow(1, 1, 3)
    m = x[1:-1, :, 3]
    return a * 1, b * 1, c * 1, d * 1, e * 1, f * 1, g * 1, h * 1, k * 1, m * 1


@program(lambda g, b, s: (_randn(g, b, s), _randn(g, b, 3), _randn(g, b, s)), sizes=[(2, 5), (4, 6)])
def cat_stack(x, y, z):
    a = torch.cat([x, y], dim=1)
    b = torch.stack([x, z], 0)
    c = torch.cat((x, y, x), dim=-1)
    d = torch.stack([x, z], dim=-1)
    e = torch.cat([x.unsqueeze(0), z.unsqueeze(0)])
    return a, b, c, d, e


@program(lambda g, b: (_randn(g, b, 12),), sizes=[2, 5])
def split_chunk(x):
    a, b, c = x.chunk(3, dim=1)
    parts = x.split(5, dim=-1)  # 5, 5, 2
    p, q = torch.split(x, [4, 8], dim=1)
    rows = x.unbind(0)
    return a * b + c, [t.sum(-1) for t in parts], p.sum(1) + q.sum(1), rows[0] + rows[-1]


@program(lambda g, b, s: (_randn(g, b, s),), sizes=[(2, 4), (3, 7)])
def factories(x):
    n = x.shape[1]
    pos = torch.arange(n)
    ramp = torch.arange(0, n, 2, dtype=torch.float32)
    frac = torch.arange(0.0, 1.0, 0.25)
    z = torch.zeros(x.shape)
    o = torch.ones(x.shape[0], n, dtype=torch.float32)
    f = torch.full((2, n), 7.0)
    zl = torch.zeros_like(x)
    ol = torch.ones_like(x, dtype=torch.int64)
    fl = torch.full_like(x, -2.5)
    eye = torch.eye(n)
    return x + pos, ramp, frac, z + o, f, zl + fl, ol, x @ eye


# --------------------------------------------------------------------------------------
# Attention
# --------------------------------------------------------------------------------------


def _qkv(g: torch.Generator, b: int, s: int, heads: int = 2, dim: int = 8) -> tuple[torch.Tensor, ...]:
    return _randn(g, b, heads, s, dim), _randn(g, b, heads, s, dim), _randn(g, b, heads, s, dim)


_QKV_SIZES = [(2, 7), (3, 12)]  # (batch, sequence)


@program(_qkv, sizes=_QKV_SIZES)
def sdpa_basic(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


@program(_qkv, sizes=_QKV_SIZES)
def sdpa_causal(q, k, v):
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    s = q.shape[-2]
    mask = torch.ones(s, s, dtype=torch.bool).tril()
    b = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.5)
    return a, b


@program(lambda g, b, s: (*_qkv(g, b, s), _rand(g, b, 1, 1, s) > 0.3), sizes=_QKV_SIZES)
def sdpa_padding_mask(q, k, v, keep):
    bias = torch.zeros(keep.shape, dtype=q.dtype).masked_fill(~keep, -1e4)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


@program(_qkv, sizes=_QKV_SIZES)
def manual_attention_masked(q, k, v):
    s = q.shape[-2]
    scores = q @ k.transpose(-2, -1) * q.size(-1) ** -0.5
    causal = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
    scores = scores.masked_fill(causal, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


# --------------------------------------------------------------------------------------
# Python-level code: sizes, containers, arguments, loops, helpers, globals, in-place
# --------------------------------------------------------------------------------------


@program(lambda g, b: (_randn(g, b, 3, 4), _randn(g, 12, 5)), sizes=[2, 6])
def size_arithmetic_view(x, w):
    flat = x.view(x.shape[0], -1)
    scale = x.size(-1) ** -0.5
    half = x.shape[1] * x.shape[2] // 2
    return (flat @ w) * scale, flat[:, :half], flat.reshape(x.size(0) * 2, -1)


@program(lambda g, b, s: (_randn(g, b, s, 16), _randn(g, b, s, 16)), sizes=[(2, 4), (3, 6)])
def math_sqrt_scale(q, k):
    d = q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    return scores.softmax(-1), scores * (1.0 / math.sqrt(q.size(-1)))


@program(lambda g, b: (_randn(g, b, 4), _randn(g, b, 4)), sizes=[3, 5])
def tuple_dict_outputs(x, y):
    return {
        "sum": x + y,
        "pair": (x * y, x - y),
        "nested": {"max": torch.maximum(x, y), "list": [x.mean(-1), y.amax(-1)]},
        "scale": 2,
    }


@program(
    lambda g, b: (_randn(g, b, 6),),
    sizes=[2, 4],
    kwargs=[{}, {"scale": 3.0, "dim": 0, "bias": torch.linspace(-1, 1, 6)}],
)
def kwargs_defaults(x, bias=None, scale: float = 2.0, *, dim: int = -1, eps: float = 1e-5):
    y = x * scale
    if bias is not None:
        y = y + bias
    return y / (y.abs().sum(dim, keepdim=True) + eps)


@program(lambda g, b, groups: (_randn(g, b, 12), groups), sizes=[(2, 3), (5, 4)])
def python_int_arg(x, groups: int):
    g = x.reshape(x.shape[0], groups, -1)
    g = g - g.mean(-1, keepdim=True)
    return g.reshape(x.shape) * groups + groups // 2


@program(lambda g, b: (_randn(g, b, 8), _randn(g, 3, 8, 8) * 0.3, _randn(g, 3, 8)), sizes=[2, 5])
def loop_range(x, ws, bs):
    h = x
    for layer in range(3):
        h = torch.tanh(h @ ws[layer] + bs[layer])
    acc = torch.zeros_like(h)
    for k in range(1, 4):
        acc = acc + h * k
    return acc


@program(lambda g, b: (_randn(g, b, 5),), sizes=[3, 7])
def loop_python_list(x):
    acc = x
    for s, shift in [(0.5, 1.0), (1.5, -2.0), (2.0, 0.0)]:
        acc = acc * s + shift
    outs = []
    for p in (1, 2, 3):
        outs.append(x.pow(p).sum(-1))
    return acc, torch.stack(outs, -1)


@program(lambda g, b: ([_randn(g, b, 4) for _ in range(3)],), sizes=[2, 6])
def list_comprehension(xs):
    doubled = [t * 2 for t in xs]
    norms = [t.pow(2).sum(-1, keepdim=True).sqrt() for t in doubled]
    pairs = [a * b for a, b in zip(xs, xs[1:])]
    return torch.cat([d / (n + 1) for d, n in zip(doubled, norms)], -1), sum(pairs), len(xs)


def _cube(x):
    return x * x * x


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * _cube(x))))


def _mlp_step(x, w1, w2):
    return _gelu_tanh(x @ w1) @ w2


@program(lambda g, b: (_randn(g, b, 6), _randn(g, 6, 10), _randn(g, 10, 6)), sizes=[2, 4])
def helper_chain(x, w1, w2):
    return _mlp_step(x, w1, w2) + _gelu_tanh(x)


_SCALE_TABLE = torch.linspace(0.5, 1.5, 8)
_BIAS_TABLE = torch.arange(8, dtype=torch.float32).reshape(1, 8) / 10


def _apply_tables(x):
    return x * _SCALE_TABLE + _BIAS_TABLE


@program(lambda g, b: (_randn(g, b, 8),), sizes=[3, 5])
def global_const_tensor(x):
    return _apply_tables(x) - _SCALE_TABLE.sum(), x @ _SCALE_TABLE


@program(lambda g, b: (_randn(g, b, 6),), sizes=[2, 5])
def inplace_intermediate(x):
    y = x * 2
    y.add_(1)
    y += 1
    y.mul_(0.5)
    y.clamp_(min=-1.0)
    z = torch.relu(x)
    z -= 0.5
    z.sigmoid_()
    return y, z


@program(lambda g, b, s: (_randn(g, b, s),), sizes=[(3, 4), (5, 6)])
def extern_ops(x):
    # ops without a Graph IR declaration today: captured as extern nodes
    return (
        torch.cumsum(x, dim=-1),
        torch.flip(x, dims=[0]),
        torch.roll(x, shifts=1, dims=-1),
        torch.triu(x),
        torch.tril(x, -1),
        x.cumprod(0),
    )


@program(
    lambda g, b, s: (_randn(g, b, s, 6), _randint(g, 0, 6, b, s, 2), _randn(g, 6, 4)), sizes=[(2, 4), (3, 5)]
)
def long_tail(x, idx, w):
    a = torch.einsum("bsd,de->bse", x, w)
    b = torch.gather(x, -1, idx)
    c = torch.index_select(x, -1, torch.tensor([0, 2, 5]))
    vals, inds = torch.topk(x, 2, dim=-1)
    srt = torch.sort(x, dim=-1, descending=True).values
    p = F.pad(x, (1, 2))
    pc = F.pad(x, (0, 0, 1, 0), value=-1.0)
    n = F.normalize(x, dim=-1)
    oh = F.one_hot(idx[..., 0], num_classes=6)
    lerp = torch.lerp(x, x.flip(-1), 0.25)
    acm = torch.addcmul(x, x, x, value=0.5)
    glu = F.glu(x, dim=-1)
    return a, b, c, vals, inds, srt, p, pc, n, oh, lerp, acm, glu, torch.outer(w[:, 0], w[0])


@program(lambda g, b, s: (_randn(g, b, s, 8), _rand(g, b, s) > 0.3), sizes=[(2, 5), (4, 9)])
def masked_mean_pool(x, mask):
    m = mask.unsqueeze(-1).to(x.dtype)
    total = (x * m).sum(1)
    count = m.sum(1).clamp(min=1.0)
    return total / count, x.masked_fill(~mask.unsqueeze(-1), float("-inf")).amax(1)


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


@program(lambda g, b, s: (_randn(g, b, 2, s, 8),), sizes=[(1, 6), (2, 10)])
def rotary_embedding(x, base: float = 10000.0):
    seq, dim = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    t = torch.arange(seq, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return x * emb.cos() + _rotate_half(x) * emb.sin()


@program(lambda g, n, m: (_randn(g, n, 4), _randn(g, m, 4)), sizes=[(3, 4), (5, 6)])
def pairwise_distances(x, y):
    d2 = (x.unsqueeze(1) - y.unsqueeze(0)).pow(2).sum(-1)
    dist = d2.clamp_min(1e-12).sqrt()
    return dist, torch.linalg.vector_norm(x, dim=-1), x.norm(dim=-1, keepdim=True), (-dist).softmax(-1)


@program(lambda g, b: (_randn(g, b, 10), _randint(g, 0, 10, b)), sizes=[3, 6])
def classification_head(logits, labels):
    logp = F.log_softmax(logits, dim=-1)
    picked = logp.gather(1, labels.unsqueeze(1)).squeeze(1)
    pred = logits.argmax(dim=-1)
    correct = (pred == labels).float().mean()
    nll = F.nll_loss(logp, labels)
    ce = F.cross_entropy(logits, labels, reduction="none")
    return -picked.mean(), correct, nll, ce


@program(lambda g, b, s: (_randn(g, b, s, 8), _randn(g, 8)), sizes=[(2, 3), (3, 5)])
def half_precision_roundtrip(x, w):
    xh = x.to(torch.float16)
    wh = w.half()
    y = (xh * wh + 1).to(torch.float32)
    z = x.to(torch.bfloat16).float()
    return y, z, (xh.float() - x).abs().amax()


@program(lambda g, b: (_randn(g, b, 6), _randint(g, 0, 4, b)), sizes=[3, 5])
def integer_ops(x, labels):
    idx = labels * 2 + 1
    shifted = torch.bitwise_and(labels, 1) + (labels << 1) - (labels >> 1)
    counts = torch.zeros(4, dtype=torch.int64).scatter_add(0, labels, torch.ones_like(labels))
    return idx, shifted, counts, x[torch.arange(x.shape[0]), labels], labels.max(), labels.float().mean()


@program(lambda g, b, c: (_randn(g, b, c, 5, 5),), sizes=[(1, 6), (2, 6)])
def group_norm_fn(x):
    w = torch.linspace(0.5, 1.5, x.shape[1])
    return F.group_norm(x, 2, w, torch.zeros(x.shape[1])), F.instance_norm(x), F.local_response_norm(x, 2)


@program(lambda g, b, s: (_randn(g, b, s, 6), _randn(g, b, 6)), sizes=[(2, 4), (3, 6)])
def scalar_tensor_constants(x, y):
    two = torch.tensor(2.0)
    eps = torch.tensor([1e-3])
    shape_t = torch.tensor(x.shape[-1], dtype=torch.float32)
    return x * two + eps, (x.sum(-1) / shape_t), torch.maximum(y, torch.tensor(0.0))
