"""Float16/bfloat16 linears and matrix products on CPU: the fastest of torch's own GEMM
in the half type, oneDNN's on a packed half weight, and a float32 GEMM on widened
operands, measured per shape on this host ([Note: GEMM choice]).

[Note: half-precision GEMMs] Which is fastest depends on the hardware more than for
float32. On a CPU with AVX512-BF16, torch's and oneDNN's bfloat16 GEMMs run on the
bf16 dot-product instructions, twice as fast as float32 (1 thread, CPU time, AMD EPYC:
a 128x768 @ 768x768 linear 0.68 ms with oneDNN's packed bf16 weight, 0.72 torch's
bf16, 1.36 float32). Without them (AVX2 hosts, and float16 on CPUs without
AVX512-FP16), torch's half GEMM falls back to a loop that was 5x slower than float32
for linears (7.4 vs 1.4 ms) and 20-30x for batched products (12x128x64 @ 64x128: 7.3 vs
0.32 ms), and oneDNN refuses the half weight; but a matrix-vector product (decode, one
row) reads half the bytes in the half type and is faster there (1.5 vs 2.7 ms for a
4096x4096 weight). So each shape measures its candidates on its first call:

* ``eager``: ``F.linear`` / ``torch.matmul`` in the half type;
* ``onednn``: ``mkldnn._linear_pointwise`` on the half weight packed once per version
  (where this CPU's oneDNN takes the type);
* ``f32``: the operands widened to float32 (a linear's weight once per version, packed
  for oneDNN), a float32 GEMM, the result rounded to the half type once.

All three accumulate in float32 and round once, as eager's half GEMMs do; they differ
in summation order only. The ``f32`` candidate keeps a float32 copy of each weight
it ran (or was measured) with: up to twice the half model's weight memory.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from cuvil_backend_cpu import gemm_choice

HALF_DTYPES = (torch.float16, torch.bfloat16)

#: (id(weight), form) -> (a weak reference to it, its version when prepared, the prepared weight)
_PREPARED: dict[tuple[int, str], tuple[weakref.ref[torch.Tensor], int, torch.Tensor]] = {}
#: half dtypes this CPU's oneDNN packs linear weights of (decided by trying once)
_ONEDNN_TAKES: dict[torch.dtype, bool] = {}


def _prepared(w: torch.Tensor, form: str, make: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``make(w)``, kept per weight and form until the weight changes (its version moves)
    or is dropped."""
    key = (id(w), form)
    hit = _PREPARED.get(key)
    if hit is not None and hit[0]() is w and hit[1] == w._version:
        return hit[2]
    made = make(w)

    def forget(_: object, key: tuple[int, str] = key) -> None:
        _PREPARED.pop(key, None)

    _PREPARED[key] = (weakref.ref(w, forget), w._version, made)
    return made


def _onednn_takes(dtype: torch.dtype) -> bool:
    if dtype not in _ONEDNN_TAKES:
        try:
            torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=dtype), 16)
            _ONEDNN_TAKES[dtype] = True
        except RuntimeError:  # "bf16 path needs the cpu support avx_ne_convert or avx512_bf16"
            _ONEDNN_TAKES[dtype] = False
    return _ONEDNN_TAKES[dtype]


def applies(*tensors: torch.Tensor | None) -> bool:
    """Every given tensor is a CPU tensor of the same half dtype."""
    given = [t for t in tensors if t is not None]
    dtype = given[0].dtype
    return dtype in HALF_DTYPES and all(t.dtype == dtype and t.device.type == "cpu" for t in given)


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, onednn: bool) -> torch.Tensor:
    """``F.linear`` of half tensors by the fastest candidate for this shape (see the module).
    A shape's later calls look its answer up (:func:`gemm_choice.known`) and call it: no
    candidate is built per call."""
    rows = x.numel() // max(x.shape[-1], 1)
    if rows == 0 or w.numel() == 0:
        return torch.nn.functional.linear(x, w, b)
    fast, choice = gemm_choice.known(rows, w.shape[1], w.shape[0], b is not None, (x.dtype, onednn))
    if choice is None:
        choice = _choose_linear(x, w, b, rows, onednn, fast)
    if choice == "onednn":
        packed = _prepared(w, "half", lambda t: torch.ops.mkldnn._reorder_linear_weight(t, rows))
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, b, "none", [], "")
    if choice == "f32":
        return _widened_linear(x, w, b, rows, onednn)
    return torch.nn.functional.linear(x, w, b)


def _widened_linear(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, rows: int, onednn: bool
) -> torch.Tensor:
    """The ``f32`` candidate: widened operands, a float32 GEMM (oneDNN's on a packed weight
    where ``onednn``), the result rounded to the half type once."""
    wide_b = b.float() if b is not None else None
    if onednn:
        packed = _prepared(w, "f32", lambda t: torch.ops.mkldnn._reorder_linear_weight(t.float(), rows))
        out = torch.ops.mkldnn._linear_pointwise(x.contiguous().float(), packed, wide_b, "none", [], "")
    else:
        out = torch.nn.functional.linear(x.float(), _prepared(w, "f32-plain", lambda t: t.float()), wide_b)
    return out.to(x.dtype)


def _choose_linear(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, rows: int, onednn: bool, fast: tuple[Any, ...]
) -> str:
    """Measure (or look up) this shape's candidates once ([Note: GEMM choice])."""
    xc = x.contiguous()
    run: dict[str, Callable[[], torch.Tensor]] = {
        "eager": lambda: torch.nn.functional.linear(x, w, b),
        "f32": lambda: _widened_linear(xc, w, b, rows, onednn),
    }
    if onednn and _onednn_takes(x.dtype):

        def packed_half() -> torch.Tensor:
            packed = _prepared(w, "half", lambda t: torch.ops.mkldnn._reorder_linear_weight(t, rows))
            return torch.ops.mkldnn._linear_pointwise(xc, packed, b, "none", [], "")

        run["onednn"] = packed_half
    # the two call paths offer different candidates: their answers are kept apart
    shape = gemm_choice.key(
        rows, w.shape[1], w.shape[0], b is not None, dtype=x.dtype, epilogue=None if onednn else "plain"
    )
    choice = gemm_choice.choose(shape, run, fast)
    if choice != "f32":  # measured and lost: no float32 copy of the weight stays for it
        for form in ("f32", "f32-plain"):
            _PREPARED.pop((id(w), form), None)
    return choice


#: (ids of a group's weights, then biases) -> (weak references to them, their versions when
#: packed, the weights packed together, the biases concatenated)
_GROUPS: dict[
    tuple[int, ...],
    tuple[tuple[weakref.ref[torch.Tensor], ...], tuple[int, ...], torch.Tensor, torch.Tensor | None],
] = {}


def _group_weight(
    ws: list[torch.Tensor], bs: list[torch.Tensor], rows: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The group's weights concatenated and packed for oneDNN (and its biases concatenated),
    kept until one of them changes (its version moves) or is dropped."""
    parts = (*ws, *bs)
    key = tuple(id(t) for t in parts)
    versions = tuple(t._version for t in parts)
    hit = _GROUPS.get(key)
    if hit is not None and hit[1] == versions and all(r() is t for r, t in zip(hit[0], parts)):
        return hit[2], hit[3]
    packed = torch.ops.mkldnn._reorder_linear_weight(torch.cat(ws), rows)
    bias = torch.cat(bs) if bs else None

    def forget(_: object, key: tuple[int, ...] = key) -> None:
        _GROUPS.pop(key, None)

    _GROUPS[key] = (tuple(weakref.ref(t, forget) for t in parts), versions, packed, bias)
    return packed, bias


def group_into(
    outs: tuple[torch.Tensor, ...],
    x: torch.Tensor,
    members: list[tuple[torch.Tensor, ...]],
    has_bias: bool,
    linear: Callable[..., torch.Tensor],
    onednn: bool,
) -> None:
    """Half linears of one input ``x`` (``members``: each ``(w,)`` or ``(w, b)``) into
    ``outs``: one oneDNN GEMM on their weights packed together, its result split into
    ``outs``, or each member through ``linear`` (its own choice), whichever measured faster
    for the shape.

    [Note: grouped GEMMs] An encoder layer's query, key and value projections (and a gated
    MLP's gate and up) read one input. Three bfloat16 calls of 128 x 256 @ 256 x 256 took
    245 us on a Xeon with AMX, one 128 x 256 @ 256 x 768 call plus the three copies of its
    column blocks 126 (2 threads; float32 gains 3-5%, so float32 groups stay decode-only:
    ``shared_input_linears._few_rows``). The packed group weight replaces the members'
    packed ones (the members keep theirs only where they win), so weight memory is as
    before; the copies into each member's buffer are the price, which the measurement
    weighs. Results equal the members' up to the GEMM's summation order (float32
    accumulation, one rounding)."""
    ws = [m[0] for m in members]
    bs = [m[-1] for m in members] if has_bias else []
    k = x.shape[-1]
    rows = x.numel() // max(k, 1)

    def each() -> None:
        for out, m in zip(outs, members):
            out.copy_(linear(x, *m, has_bias=has_bias))

    if rows == 0 or not onednn or not _onednn_takes(x.dtype) or any(w.numel() == 0 for w in ws):
        each()
        return
    x2 = x.reshape(rows, k).contiguous()

    def grouped() -> None:
        packed, bias = _group_weight(ws, bs, rows)
        y = torch.ops.mkldnn._linear_pointwise(x2, packed, bias, "none", [], "")
        start = 0
        for out, w in zip(outs, ws):
            n = w.shape[0]
            out.copy_(y[:, start : start + n].unflatten(0, out.shape[:-1]))
            start += n

    n_total = sum(w.shape[0] for w in ws)
    fast, choice = gemm_choice.known(rows, k, n_total, has_bias, ("group", len(ws), x.dtype))
    if choice is None:
        each()  # the members' own choices first, outside the choice's lock
        shape = gemm_choice.key(rows, k, n_total, has_bias, dtype=x.dtype, epilogue=f"group{len(ws)}")
        choice = gemm_choice.choose(shape, {"members": each, "grouped": grouped}, fast)
        if choice != "grouped":  # measured and lost: the packed group weight goes
            _GROUPS.pop(tuple(id(t) for t in (*ws, *bs)), None)
        else:  # and where it won, what the members prepared for themselves
            for w in ws:
                for form in ("half", "f32", "f32-plain"):
                    _PREPARED.pop((id(w), form), None)
    (grouped if choice == "grouped" else each)()


def matmul_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``torch.matmul(a, b, out=out)`` of half tensors (both at least 2-d): in the half
    type or widened to float32, the faster for this shape (see the module)."""
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    batch = max(a.numel() // max(m * k, 1), b.numel() // max(k * n, 1))
    if 0 in (m, k, n, batch):
        torch.matmul(a, b, out=out)
        return
    run: dict[str, Callable[[], Any]] = {
        "eager": lambda: torch.matmul(a, b, out=out),
        "f32": lambda: out.copy_(torch.matmul(a.float(), b.float())),  # the copy rounds once
    }
    shape = gemm_choice.key(batch * m, k, n, False, dtype=a.dtype, batch=batch)
    run[gemm_choice.choose(shape, run)]()


__all__ = ["HALF_DTYPES", "applies", "group_into", "linear", "matmul_into"]
