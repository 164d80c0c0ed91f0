"""Extern calls that write into a planned buffer (``out=`` variants of torch ops).

An extern listed here gets its result buffer from the memory plan (an arena
slice, or a fresh output), so a matmul in a loop of calls never allocates and
never page-faults a new result. Each function takes ``(out, *inputs, **attrs)``
exactly as the op's reference takes ``(*inputs, **attrs)``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from cuvil_backend_cpu import epilogues, gemm_choice, half_gemm
from cuvil_backend_cpu.quant_linear import F32_GEMV_ROWS


def linear_into(
    out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, *bias: torch.Tensor, has_bias: bool
) -> None:
    if half_gemm.applies(x, w, *bias):  # without oneDNN: [Note: half-precision GEMMs]
        out.copy_(half_gemm.linear(x, w, bias[0] if has_bias else None, onednn=False))
        return
    x2 = x.reshape(-1, x.shape[-1])
    o2 = out.view(-1, out.shape[-1])
    if has_bias:
        torch.addmm(bias[0], x2, w.t(), out=o2)
    else:
        torch.mm(x2, w.t(), out=o2)


def matmul_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    if a.dim() >= 2 and b.dim() >= 2 and half_gemm.applies(a, b):
        half_gemm.matmul_into(out, a, b)  # in the half type or widened: [Note: half-precision GEMMs]
    elif a.dim() >= 2 and b.dim() >= 2:
        torch.matmul(a, b, out=out)
    else:  # torch's matrix-vector forms want an out of another shape (and would resize ours)
        out.copy_(torch.matmul(a, b))


def matmul_into_with_ours(packed: Callable[..., torch.Tensor | None]) -> Callable[..., None]:
    """:func:`matmul_into` with ``packed`` (``packed_gemm.f32_matmul``: ``a @ w`` for a float32
    parameter ``w``) a candidate beside torch's, chosen per shape ([Note: GEMM choice])."""

    def run(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
        if (
            b.dim() == 2
            and a.dim() >= 2
            and isinstance(b, torch.nn.Parameter)
            and not half_gemm.applies(a, b)
        ):
            rows = a.numel() // max(a.shape[-1], 1)
            k, n = b.shape
            fast, choice = gemm_choice.known(rows, k, n, False, "matmul")
            if choice is None:
                run_: dict[str, Callable[[], Any]] = {"mkl": lambda: torch.matmul(a, b, out=out)}
                if packed(a, b, out) is not None:  # (the first call packs the weight)
                    run_["packed"] = lambda: packed(a, b, out)
                choice = gemm_choice.choose(gemm_choice.key(rows, k, n, False, epilogue="matmul"), run_, fast)
            if choice == "packed" and packed(a, b, out) is not None:
                return
        matmul_into(out, a, b)

    return run


OUT_VARIANTS: dict[str, Callable[..., Any]] = {"linear": linear_into, "matmul": matmul_into}
#: (with oneDNN, linear runs as FAST_EXTERNS["linear"] instead, which returns a new tensor)


# -- channels-last convolutions --------------------------------------------------------
#: id(weight) -> (a weak reference to it, its version counter when converted, the copy)
_PACKED: dict[int, tuple[weakref.ref[torch.Tensor], int, torch.Tensor]] = {}


def channels_last_weight(w: torch.Tensor) -> torch.Tensor:
    """``w`` in channels-last layout, converted once per weight and reused until the
    weight changes (its version counter moves) or is dropped: converting the
    weights of a network on every call would cost more than the layout gains."""
    if w.dim() != 4 or w.is_contiguous(memory_format=torch.channels_last):
        return w
    key = id(w)
    hit = _PACKED.get(key)
    if hit is not None and hit[0]() is w and hit[1] == w._version:
        return hit[2]
    packed = w.contiguous(memory_format=torch.channels_last)

    # (tensors compare elementwise, so they cannot key a WeakKeyDictionary)
    def forget(_: object, key: int = key) -> None:
        _PACKED.pop(key, None)

    _PACKED[key] = (weakref.ref(w, forget), w._version, packed)
    return packed


def _conv_channels_last(reference: Callable[..., Any]) -> Callable[..., Any]:
    def conv(x: torch.Tensor, w: torch.Tensor, *rest: Any, **attrs: Any) -> Any:
        if _ONEDNN and PACKED_CONVS and w.dim() == 4 and not isinstance(attrs["padding"], str):
            # a 2-d convolution: oneDNN with its weight prepacked once per version
            # (conv_epilogue runs the reference for what oneDNN does not take)
            return conv_epilogue(
                x,
                w,
                *rest,
                **attrs,
                bn=False,
                eps=0.0,
                has_bn_weight=False,
                has_bn_bias=False,
                has_other=False,
                act="none",
            )
        return reference(x, channels_last_weight(w), *rest, **attrs)

    return conv


#: 2-d float32 convolutions run with a weight prepacked for oneDNN (measured faster here:
#: docs/cpu-backend.md, "Fused epilogues and BatchNorm folding")
PACKED_CONVS = True

#: ops whose extern call wants its weight prepacked channels-last (the input already is)
_LAYOUT_WRAPPERS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "conv": _conv_channels_last
}


# -- oneDNN linear ------------------------------------------------------------------------
#: below this many multiply-adds a fused oneDNN epilogue is not tried (primitive setup)
ONEDNN_MIN_MACS = 1 << 20
_LINEAR_PACKED: dict[int, tuple[weakref.ref[torch.Tensor], int, torch.Tensor]] = {}


def _onednn_available() -> bool:
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _packed_linear_weight(w: torch.Tensor, rows: int) -> torch.Tensor:
    """``w`` reordered for oneDNN once per weight and version (as the conv weights are)."""
    key = id(w)
    hit = _LINEAR_PACKED.get(key)
    if hit is not None and hit[0]() is w and hit[1] == w._version:
        return hit[2]
    packed = torch.ops.mkldnn._reorder_linear_weight(w, rows)

    def forget(_: object, key: int = key) -> None:
        _LINEAR_PACKED.pop(key, None)

    _LINEAR_PACKED[key] = (weakref.ref(w, forget), w._version, packed)
    return packed


def _release_losers(w: torch.Tensor, choice: str, packed: Any) -> None:
    """After the GEMM choice measured (or looked up) a shape, drop the copies of ``w`` that
    the candidates it did not pick packed: a float32 model otherwise kept oneDNN's and our
    packing of every weight whose shape was measured, beside the weight itself.
    A weight whose other shapes pick one of them packs it again there, once (the choice of a
    shape is made once)."""
    if choice != "onednn":
        hit = _LINEAR_PACKED.get(id(w))
        if hit is not None and hit[0]() is w:
            _LINEAR_PACKED.pop(id(w), None)
    release = getattr(packed, "release", None)
    if choice != "packed" and release is not None:
        release(w)


def linear(x: torch.Tensor, w: torch.Tensor, *bias: torch.Tensor, has_bias: bool) -> torch.Tensor:
    """``F.linear`` on float32 through the faster of oneDNN (packed weight) and MKL
    (torch's default) for this shape on this host, measured at its first call
    ([Note: GEMM choice] in :mod:`cuvil_backend_cpu.gemm_choice`); on float16/bfloat16
    through :func:`cuvil_backend_cpu.half_gemm.linear`."""
    return _linear(x, w, bias[0] if has_bias else None, has_bias, None)


def linear_with_ours(
    gemv: Callable[..., torch.Tensor | None], packed: Callable[..., torch.Tensor | None] | None = None
) -> Callable[..., torch.Tensor]:
    """:func:`linear` with our own GEMMs among the candidates: ``gemv``
    (``quant_linear.f32_gemv``: our GEMV, for few rows) and ``packed`` (``packed_gemm.f32_linear``:
    our GEMM on a prepacked weight, any rows); each returns ``None`` where it does not apply."""

    def run(x: torch.Tensor, w: torch.Tensor, *bias: torch.Tensor, has_bias: bool) -> torch.Tensor:
        return _linear(x, w, bias[0] if has_bias else None, has_bias, gemv, packed)

    return run


def _linear(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    has_bias: bool,
    gemv: Callable[..., torch.Tensor | None] | None,
    packed: Callable[..., torch.Tensor | None] | None = None,
) -> torch.Tensor:
    if half_gemm.applies(x, w, b):  # [Note: half-precision GEMMs]
        return half_gemm.linear(x, w, b, _ONEDNN)
    rows = x.numel() // max(x.shape[-1], 1)
    if not (_ONEDNN and x.dtype == torch.float32 and w.dtype == torch.float32 and rows > 0 and w.numel() > 0):
        return torch.nn.functional.linear(x, w, b)
    offer_gemv = gemv is not None and rows <= F32_GEMV_ROWS and w.is_contiguous()
    offer_packed = packed is not None and w.is_contiguous()
    offered = 2 + int(offer_gemv) + 2 * int(offer_packed)  # (which were offered, not only how many)
    fast, choice = gemm_choice.known(rows, w.shape[1], w.shape[0], has_bias, offered)
    if choice is None:  # this shape's first call: measured (or looked up) once
        xc = x.contiguous()
        run: dict[str, Callable[[], Any]] = {
            "onednn": lambda: _onednn_linear(xc, w, b, rows),
            "mkl": lambda: torch.nn.functional.linear(x, w, b),
        }
        if offer_gemv:
            run["gemv"] = lambda: gemv(xc, w, b)  # type: ignore[misc]
        if offer_packed and packed(xc, w, b) is not None:  # (the first call packs the weight)
            run["packed"] = lambda: packed(xc, w, b)  # type: ignore[misc]
        choice = gemm_choice.choose(gemm_choice.key(rows, w.shape[1], w.shape[0], has_bias), run, fast)
        _release_losers(w, choice, packed)
    if choice == "gemv" and gemv is not None:
        out = gemv(x, w, b)
        if out is not None:
            return out
    if choice == "packed" and packed is not None:
        out = packed(x, w, b)
        if out is not None:
            return out
    if choice == "onednn":
        return _onednn_linear(x.contiguous(), w, b, rows)
    return torch.nn.functional.linear(x, w, b)


def _onednn_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, rows: int) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, _packed_linear_weight(w, rows), b, "none", [], "")


_ONEDNN = _onednn_available()


#: Graph IR activation -> (oneDNN unary post-op attr, its algorithm)
_ACTIVATIONS = {
    "relu": ("relu", ""),
    "gelu": ("gelu", "none"),
    "gelu_tanh": ("gelu", "tanh"),
    "silu": ("swish", ""),
}


# -- fused epilogues and prepacked convolutions (cuvil_backend_cpu.epilogues' ops) ---------------


def linear_epilogue(
    x: torch.Tensor, w: torch.Tensor, *rest: torch.Tensor, has_bias: bool, has_other: bool, act: str
) -> Any:
    """One oneDNN call with the activation (or the residual add) as a post-op, for float32
    products large enough for oneDNN (:func:`cuvil_backend_cpu.externs.linear`'s rule);
    else the eager composition."""
    return _linear_epilogue(x, w, rest, has_bias, has_other, act, None)


def linear_epilogue_with_ours(packed: Callable[..., torch.Tensor | None]) -> Callable[..., Any]:
    """:func:`linear_epilogue` with ``packed`` (``packed_gemm.f32_linear``: our GEMM with the
    bias, residual and activation in its store) a second candidate, chosen against oneDNN's
    post-ops per shape and epilogue as plain linears are ([Note: GEMM choice])."""

    def run(
        x: torch.Tensor, w: torch.Tensor, *rest: torch.Tensor, has_bias: bool, has_other: bool, act: str
    ) -> Any:
        return _linear_epilogue(x, w, rest, has_bias, has_other, act, packed)

    return run


def _linear_epilogue(
    x: torch.Tensor,
    w: torch.Tensor,
    rest: tuple[torch.Tensor, ...],
    has_bias: bool,
    has_other: bool,
    act: str,
    packed: Callable[..., torch.Tensor | None] | None,
) -> Any:
    rows = x.numel() // max(x.shape[-1], 1)
    b = rest[0] if has_bias else None
    if not (
        _ONEDNN
        and x.dtype == torch.float32
        and w.dtype == torch.float32
        and x.device.type == "cpu"
        and rows * w.shape[0] * w.shape[1] >= ONEDNN_MIN_MACS
        and not (has_other and (act != "none" or rest[-1].shape != (*x.shape[:-1], w.shape[0])))
    ):
        return epilogues.LinearEpilogue.reference(
            x, w, *rest, has_bias=has_bias, has_other=has_other, act=act
        )
    x = x.contiguous()
    other = rest[-1].contiguous() if has_other else None
    if packed is not None and w.is_contiguous():
        fast, choice = gemm_choice.known(rows, w.shape[1], w.shape[0], has_bias, (act, has_other))
        if choice is None:  # this shape and epilogue's first call: measured (or looked up) once
            run: dict[str, Callable[[], Any]] = {
                "onednn": lambda: _onednn_epilogue(x, w, b, other, act, rows)
            }
            if packed(x, w, b, other, act) is not None:  # (the first call packs the weight)
                run["packed"] = lambda: packed(x, w, b, other, act)
            epilogue = f"{act}{'+r' if has_other else ''}"
            shape_key = gemm_choice.key(rows, w.shape[1], w.shape[0], has_bias, epilogue=epilogue)
            choice = gemm_choice.choose(shape_key, run, fast)
            _release_losers(w, choice, packed)
        if choice == "packed":
            out = packed(x, w, b, other, act)
            if out is not None:
                return out
    return _onednn_epilogue(x, w, b, other, act, rows)


def _onednn_epilogue(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, other: torch.Tensor | None, act: str, rows: int
) -> torch.Tensor:
    wp = _packed_linear_weight(w, rows)
    if other is not None:
        return torch.ops.mkldnn._linear_pointwise.binary(x, other, wp, b, "add")
    attr, algorithm = _ACTIVATIONS.get(act, ("none", ""))
    return torch.ops.mkldnn._linear_pointwise(x, wp, b, attr, [], algorithm)


#: id(conv weight) -> (weak references to the weight, its bias and the batch norm's
#: mean, var, weight, bias (None where absent), their versions, the convolution's
#: hyper-parameters, the prepacked weight, the folded bias)
_FOLDED: dict[
    int, tuple[tuple[Any, ...], tuple[int, ...], tuple[Any, ...], torch.Tensor, torch.Tensor | None]
] = {}


def packed_conv(
    w: torch.Tensor,
    b: torch.Tensor | None,
    bn: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None, float] | None,
    hyper: tuple[list[int], list[int], list[int], int],
    input_size: list[int],
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The convolution's weight, with the batch norm folded in and prepacked in oneDNN's
    blocked layout for this convolution (``_reorder_convolution_weight``), and its bias,
    computed once per weight/statistics and version (see the module doc). Packing once
    saves the weight reorder every ``F.conv2d`` call does (a third of a 512-channel 3x3
    convolution's time at batch 1). The layout is chosen for the input size of the call
    that packs; other sizes give the same results (oneDNN reorders where it must)."""
    params: tuple[torch.Tensor | None, ...] = (w, b, *(bn[:4] if bn is not None else ()))
    versions = tuple(-1 if t is None else t._version for t in params)
    key = id(w)
    hit = _FOLDED.get(key)
    if (
        hit is not None
        and len(hit[0]) == len(params)
        and all((r is None and t is None) or (r is not None and r() is t) for r, t in zip(hit[0], params))
        and hit[1] == versions
        and hit[2] == (*hyper, bn is not None and bn[4])
    ):
        return hit[3], hit[4]
    if bn is None:
        wf, bf = w, b
    else:
        mean, var, g, beta, eps = bn
        scale = torch.rsqrt(var.double() + eps)
        if g is not None:
            scale = scale * g.double()
        # the per-channel factors in float64, the weight's product in its own dtype: a
        # float64 copy of every weight made the first call of a ResNet-18 fold 48 MB as
        # 190 MB of fresh float64 memory (6x slower here); the product differs from the
        # float64 one by at most one rounding of the factor (1 ulp)
        wf = w * scale.to(w.dtype).view(-1, 1, 1, 1)
        shift = -mean.double() * scale
        if b is not None:
            shift = shift + b.double() * scale
        if beta is not None:
            shift = shift + beta.double()
        bf = shift.to(w.dtype)
    padding, stride, dilation, groups = hyper
    wp = torch.ops.mkldnn._reorder_convolution_weight(
        wf.contiguous(), padding, stride, dilation, groups, input_size
    )

    def forget(_: object, key: int = key) -> None:
        _FOLDED.pop(key, None)

    refs = tuple(None if t is None else weakref.ref(t, forget) for t in params)
    _FOLDED[key] = (refs, versions, (*hyper, bn is not None and bn[4]), wp, bf)
    return wp, bf


#: half dtypes this CPU's oneDNN packs convolution weights of (decided by trying once)
_CONV_TAKES: dict[torch.dtype, bool] = {}


def _onednn_conv_takes(dtype: torch.dtype) -> bool:
    """Whether oneDNN convolves ``dtype`` here (bfloat16 with AVX512-BF16 or AMX: the packed
    weight saves eager's per-call reorder of it, as for float32)."""
    if dtype not in half_gemm.HALF_DTYPES:
        return False
    if dtype not in _CONV_TAKES:
        try:
            w = torch.zeros(16, 16, 3, 3, dtype=dtype)
            torch.ops.mkldnn._reorder_convolution_weight(w, [1, 1], [1, 1], [1, 1], 1, [1, 16, 8, 8])
            _CONV_TAKES[dtype] = half_gemm._onednn_takes(dtype)
        except RuntimeError:
            _CONV_TAKES[dtype] = False
    return _CONV_TAKES[dtype]


def _conv_shape(
    x: torch.Tensor, w: torch.Tensor, stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int]
) -> tuple[int, ...]:
    spatial = (
        (n + 2 * p - d * (k - 1) - 1) // s + 1
        for n, k, s, p, d in zip(x.shape[2:], w.shape[2:], stride, padding, dilation)
    )
    return (x.shape[0], w.shape[0], *spatial)


def conv_epilogue(
    x: torch.Tensor,
    w: torch.Tensor,
    *rest: torch.Tensor,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int,
    has_bias: bool,
    bn: bool,
    eps: float,
    has_bn_weight: bool,
    has_bn_bias: bool,
    has_other: bool,
    act: str,
) -> Any:
    """One oneDNN convolution (``_convolution_pointwise``) on channels-last tensors, its
    weight prepacked and its bias, with the batch norm folded in (:func:`packed_conv`), ReLU and the residual
    add as post-ops; the eager composition for anything but float32 4-d CPU tensors
    (the weight's version is checked on every call: an in-place update repacks)."""
    kw: dict[str, Any] = dict(
        stride=stride,
        padding=padding,
        dilation=dilation,
        groups=groups,
        has_bias=has_bias,
        bn=bn,
        eps=eps,
        has_bn_weight=has_bn_weight,
        has_bn_bias=has_bn_bias,
        has_other=has_other,
        act=act,
    )
    tensors = (x, w, *rest)
    # float32; or a half type this CPU's oneDNN convolves, for a plain convolution (a half
    # epilogue would skip the rounding eager does between the convolution and it)
    plain = not (bn or has_other or act != "none")
    dtype = x.dtype if x.dtype == torch.float32 or (plain and _onednn_conv_takes(x.dtype)) else None
    if not (
        _ONEDNN
        and dtype is not None
        and x.dim() == 4
        and x.numel() > 0  # (an empty batch: nothing to pack the weight for)
        and all(t.dtype == dtype and t.device.type == "cpu" for t in tensors)
    ):
        return epilogues.ConvEpilogue.reference(x, w, *rest, **kw)
    if has_other and rest[-1].shape != _conv_shape(x, w, stride, padding, dilation):
        return epilogues.ConvEpilogue.reference(x, w, *rest, **kw)  # a residual that broadcasts
    k = int(has_bias)
    b = rest[0] if has_bias else None
    stats = None
    if bn:
        g = rest[k + 2] if has_bn_weight else None
        beta = rest[k + 2 + int(has_bn_weight)] if has_bn_bias else None
        stats = (rest[k], rest[k + 1], g, beta, eps)
    pad, st, dil = list(padding), list(stride), list(dilation)
    wp, bf = packed_conv(w, b, stats, (pad, st, dil, groups), list(x.shape))
    cl = torch.channels_last
    x = x.contiguous(memory_format=cl)
    unary = "relu" if act == "relu" else "none"
    if has_other:
        other = rest[-1].contiguous(memory_format=cl)
        return torch.ops.mkldnn._convolution_pointwise.binary(
            x, other, wp, bf, pad, st, dil, groups, "add", None, unary if act == "relu" else None, [], ""
        )
    return torch.ops.mkldnn._convolution_pointwise(x, wp, bf, pad, st, dil, groups, unary, [], "")


#: the ops of cuvil_backend_cpu.epilogues -> their implementation
EPILOGUES: dict[str, Callable[..., Any]] = {
    "cpu_linear_epilogue": linear_epilogue,
    "cpu_conv_epilogue": conv_epilogue,
}

#: ops run by a faster implementation than their eager reference (same results within
#: float reassociation)
FAST_EXTERNS: dict[str, Callable[..., Any]] = {"linear": linear} if _ONEDNN else {}
#: the fused ops of :mod:`cuvil_backend_cpu.epilogues` (each falls back to its eager
#: composition where oneDNN cannot run it)
FAST_EXTERNS.update(EPILOGUES)


def implementation(op: str, reference: Callable[..., Any], channels_last: bool) -> Callable[..., Any]:
    """What an extern call of ``op`` runs: a faster implementation where there is one
    (oneDNN linears), wrapped for channels-last operands where the op wants it
    (prepacked convolution weights), else the op's eager reference."""
    fn = FAST_EXTERNS.get(op, reference)
    if channels_last and op in _LAYOUT_WRAPPERS:
        fn = _LAYOUT_WRAPPERS[op](fn)
    return fn
