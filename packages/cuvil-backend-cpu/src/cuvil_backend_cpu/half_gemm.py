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


__all__ = ["HALF_DTYPES", "applies", "linear", "matmul_into"]
