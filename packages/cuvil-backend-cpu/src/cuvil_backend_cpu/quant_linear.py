"""``weight_only_linear`` (bf16, int8 and int4 weights) as the ``cpu`` target's own kernel.

``quant_linear.c`` is written once (not generated) and built by the target's kernel cache like
any generated kernel (same compiler, flags and ISA: ``CUVIL_CPU_ISA`` picks the AVX-512, AVX2 or
portable code). Few rows of activations (decode: :attr:`QuantLinearKernel.gemv_max_rows`) run its GEMV, which
streams the packed weight once, dequantizing in registers; more rows (prefill) dequantize the
weight to float32 in panels of at most :data:`PANEL_BYTES` and multiply each with torch's GEMM,
where a library GEMM's cache blocking is worth more than the bytes saved.

:func:`out_variant` is what a ``weight_only_linear`` extern call runs on the ``cpu`` target: it
writes into the buffer the memory plan gives it. Activations that are not float32 CPU tensors
run the op's reference (dequantize, then ``F.linear``).
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from cuvil_backend_cpu.c_prelude import build_facts, kernel_source
from cuvil_backend_cpu.emulation import EmulatedLibrary
from cuvil_backend_cpu.kernel_cache import KernelCache, per_cache
from cuvil_backend_cpu.step_runner import address
from cuvil_backend_cpu.toolchain import ToolchainError
from cuvil_ir.graph_ir.ops import quant
from cuvil_runtime.target import NativeArg, NativeExtern, NativeOperand

#: the kernel's source, the vector prelude in place (:mod:`cuvil_backend_cpu.c_prelude`)
SOURCE = kernel_source("quant_linear.c")

#: the Graph IR op this module runs
OP = quant.WeightOnlyLinear.name

#: the C kernel's format codes ("f32": plain float32 weights, :func:`f32_gemv`)
_FORMATS = {"bf16": 0, "int8": 1, "int4": 2, "f32": 3, "int4-a8": 4}

#: rows of activations, per row of the kernel's register tile, up to which the GEMV kernel runs
#: (128 rows with AVX-512's tiles of 4, 64 with AVX2's of 2); more rows dequantize the weight and
#: call a GEMM. Measured on one thread (docs/quantization.md, "More rows"): the tiled GEMV was
#: ahead of dequantize + GEMM up to 128 rows and even at 256 with AVX-512, even at 64 with AVX2.
GEMV_ROWS_PER_TILE_ROW = 32
#: float32 bytes of weight dequantized at a time on the GEMM path (bounds its extra memory)
PANEL_BYTES = 16 << 20

#: what a grouped call may do with its two results (``cuvil_ql_linear_group``'s epilogue codes)
_EPILOGUES = {"silu_mul": 1}

#: the kernels' parameter block (eight int64s), packed
_PACK8 = struct.Struct("8q").pack
_threads = torch.get_num_threads


class QuantLinearKernel:
    """The compiled kernels of ``quant_linear.c``, loaded from ``cache``."""

    def __init__(self, cache: KernelCache, lanes: int | None = None) -> None:
        """``lanes`` forces the vector width (tests: the AVX-512 tiling on any host)."""
        source = kernel_source("quant_linear.c", lanes)
        lib = cache.load(cache.build(source, name="quant_linear"), source, name="quant_linear")
        self._linear = lib.cuvil_ql_linear
        self._linear.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 6 + [ctypes.c_char_p]
        self._linear.restype = ctypes.c_int
        self._group = None if isinstance(lib, EmulatedLibrary) else lib.cuvil_ql_linear_group
        if self._group is not None:  # (addresses in an array: not for an emulated process)
            self._group.argtypes = [
                ctypes.c_int,
                ctypes.c_void_p,
                ctypes.c_int64,
                ctypes.c_char_p,
                ctypes.c_char_p,
            ]
            self._group.restype = ctypes.c_int
        self._dequant = lib.cuvil_ql_dequant
        self._dequant.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 4 + [ctypes.c_char_p]
        self._dequant.restype = ctypes.c_int
        self._round = lib.cuvil_ql_round_x
        self._round.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p]
        self._round.restype = ctypes.c_int
        #: an emulated kernel (:mod:`cuvil_backend_cpu.emulation`) takes tensors, not addresses
        self._tensors = isinstance(lib, EmulatedLibrary)
        #: the build's vector width (floats), rows of x and of W per register tile
        self.lanes, self.tile_rows, self.tile_cols = build_facts(lib, "cuvil_ql_info", 3)
        #: rows of activations up to which :meth:`linear_into` runs the GEMV
        self.gemv_max_rows = GEMV_ROWS_PER_TILE_ROW * self.tile_rows

    def _pointers(self, *tensors: torch.Tensor | None) -> tuple[Any, ...]:
        """The kernel's pointer arguments: addresses, or the tensors themselves when emulated."""
        if self._tensors:
            return tensors
        return tuple(None if t is None else t.data_ptr() for t in tensors)

    def gemv(
        self,
        out: torch.Tensor,
        x: torch.Tensor,
        weight: torch.Tensor,
        scales: torch.Tensor | None,
        zeros: torch.Tensor | None,
        bias: torch.Tensor | None,
        *,
        fmt: str,
        group_size: int,
    ) -> None:
        """``out[M, N] = x[M, K] @ W^T (+ bias)`` by the kernel: ``x`` float32 with unit stride
        along K (any row stride), ``out`` float32 with unit stride along N, the weight and its
        parameters contiguous (the caller's checks)."""
        m, k = x.shape
        n = out.shape[1]
        params = _PACK8(m, n, k, x.stride(0), out.stride(0), group_size, _threads(), bias is not None)
        if self._tensors:
            rc = self._linear(_FORMATS[fmt], x, weight, scales, zeros, bias, out, params)
        else:  # (one call per decode linear: no generic helper in the way)
            rc = self._linear(
                _FORMATS[fmt],
                x.data_ptr(),
                weight.data_ptr(),
                None if scales is None else scales.data_ptr(),
                None if zeros is None else zeros.data_ptr(),
                None if bias is None else bias.data_ptr(),
                out.data_ptr(),
                params,
            )
        if rc == 2:
            raise MemoryError(f"quant_linear: {fmt} {m}x{k} @ {n}x{k}: out of memory")
        if rc:
            raise ValueError(f"quant_linear: the kernel refused {fmt} {n}x{k} (group {group_size})")

    def group_into(
        self,
        outs: Sequence[torch.Tensor],
        x: torch.Tensor,
        members: Sequence[Sequence[torch.Tensor]],
        fmt: str,
        group_size: int,
        epilogue: str = "",
    ) -> bool:
        """``outs[i] = x @ W_i^T (+ bias_i)`` for the weights of ``members`` (each ``(weight,
        *params[, bias])`` as ``weight_only_linear`` takes them; ``fmt = "f32"``: a float32
        weight) by one grouped GEMV call over 2-d float32 ``x``; with ``epilogue="silu_mul"``
        (two members, ``outs`` one tensor) ``outs[0] = silu(x @ W_0^T) * (x @ W_1^T)``. False
        (nothing written) where the grouped kernel does not apply: an emulated build, or
        operands it cannot take."""
        if self._group is None or not 1 <= len(members) <= 8 or x.dtype != torch.float32:
            return False
        if epilogue:
            if epilogue not in _EPILOGUES or len(members) != 2 or len(outs) != 1:
                return False
            outs = (outs[0], None)
        if x.stride(1) != 1 and x.shape[1] > 1:
            x = x.contiguous()
        n_params = 0 if fmt == "f32" else len(quant._PARAMS[fmt])
        addr: list[int] = []
        keep = []  # (contiguous copies live until the call returns)
        for out, member in zip(outs, members):
            if out is not None and (out.dtype != torch.float32 or not out.is_contiguous()):
                return False
            weight = _dense(member[0])
            params = [_dense(t) for t in member[1 : 1 + n_params]]
            bias = _dense(member[1 + n_params]) if len(member) > 1 + n_params else None
            if fmt == "f32" and weight.dtype != torch.float32:
                return False
            if bias is not None and bias.dtype != torch.float32:
                return False
            scales, zeros = (params + [None, None])[:2]
            keep.append((weight, params, bias))
            n = weight.shape[0]
            addr += [_ptr(weight), _ptr(scales), _ptr(zeros), _ptr(bias), _ptr(out), n, n]
        m, k = x.shape
        params_bytes = _PACK8(m, 0, k, x.stride(0), 0, group_size, _threads(), _EPILOGUES.get(epilogue, 0))
        rc = self._group(
            _FORMATS[fmt], x.data_ptr(), len(members), struct.pack(f"{len(addr)}q", *addr), params_bytes
        )
        if rc == 2:
            raise MemoryError(f"quant_linear: a group of {len(members)} {fmt} weights: out of memory")
        if rc:
            raise ValueError(
                f"quant_linear: the kernel refused a group of {len(members)} {fmt} weights ({k} in)"
            )
        return True

    def dequantize(
        self,
        weight: torch.Tensor,
        scales: torch.Tensor | None,
        zeros: torch.Tensor | None,
        *,
        fmt: str,
        group_size: int,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The weight (rows of it: a contiguous slice) as float32 ``[N, K]``."""
        n, k = weight.shape[0], quant.in_features(weight, fmt)
        out = torch.empty((n, k), dtype=torch.float32) if out is None else out
        params = struct.pack("8q", 0, n, k, 0, 0, group_size, torch.get_num_threads(), 0)
        rc = self._dequant(_FORMATS[fmt], *self._pointers(weight, scales, zeros, out), params)
        if rc:
            raise ValueError(f"quant_linear: the kernel refused to dequantize {fmt} {n}x{k}")
        return out

    def round_activations(self, x: torch.Tensor) -> torch.Tensor:
        """2-d float32 ``x`` (unit stride along K, a multiple of 32) rounded as ``"int4-a8"``
        rounds it (:func:`cuvil_ir.graph_ir.ops.quant.round_activations`, by the kernel's own
        code), as a new float32 tensor."""
        m, k = x.shape
        out = torch.empty((m, k), dtype=torch.float32)
        params = struct.pack("8q", m, 0, k, x.stride(0), k, 0, 1, 0)
        if self._round(*self._pointers(x, out), params):
            raise ValueError(f"quant_linear: int4-a8 activations of {k} values a row (not a multiple of 32)")
        return out

    def linear_into(
        self,
        out: torch.Tensor,
        x: torch.Tensor,
        weight: torch.Tensor,
        scales: torch.Tensor | None,
        zeros: torch.Tensor | None,
        bias: torch.Tensor | None,
        *,
        fmt: str,
        group_size: int,
    ) -> None:
        """``out = x @ dequantize(W)^T (+ bias)`` for float32 2-d ``x`` and ``out`` (``out``
        with unit stride along N): the GEMV for few rows, else dequantized panels and torch's
        GEMM."""
        if x.stride(1) != 1 and x.shape[1] > 1:
            x = x.contiguous()
        weight, scales, zeros, bias = _dense(weight), _dense(scales), _dense(zeros), _dense(bias)
        if x.shape[0] <= self.gemv_max_rows:
            self.gemv(out, x, weight, scales, zeros, bias, fmt=fmt, group_size=group_size)
            return
        n, k = weight.shape[0], x.shape[1]
        if fmt == "int4-a8":  # the GEMM multiplies what the GEMV's integers stand for
            x = self.round_activations(x)
        rows = max(self.tile_cols, PANEL_BYTES // max(4 * k, 1))
        buf = torch.empty((min(rows, n), k), dtype=torch.float32)
        for n0 in range(0, n, rows):
            n1 = min(n, n0 + rows)
            panel = self.dequantize(
                weight[n0:n1],
                None if scales is None else scales[n0:n1],
                None if zeros is None else zeros[n0:n1],
                fmt=fmt,
                group_size=group_size,
                out=buf[: n1 - n0],
            )
            dest = out[:, n0:n1]
            if bias is None:
                torch.mm(x, panel.t(), out=dest)
            else:
                torch.addmm(bias[n0:n1], x, panel.t(), out=dest)


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def _dense(t: torch.Tensor | None) -> Any:
    return t if t is None or t.is_contiguous() else t.contiguous()


#: rows of activations up to which a float32 linear may run the GEMV (:func:`f32_gemv`): decode
#: steps and small batches; more rows are GEMMs, where oneDNN's and MKL's blocking win
F32_GEMV_ROWS = 16


def f32_gemv(cache: KernelCache) -> Callable[..., torch.Tensor | None]:
    """A float32 linear by this GEMV (``F.linear(x, w, b)`` for ``x`` of at most
    :data:`F32_GEMV_ROWS` rows, ``w`` contiguous float32 ``[N, K]``), or ``None`` where it
    does not apply: the ``gemv`` candidate of the cpu target's GEMM choice
    ([Note: GEMM choice] in :mod:`cuvil_backend_cpu.gemm_choice`), measured against oneDNN
    and MKL per shape. The GEMV streams each row of ``w`` once; at decode, where every
    weight is read once per token, it measured ahead of torch's ``mv``-shaped GEMM on
    the bytes it streams (docs/quantization.md)."""
    ql = kernel(cache)

    def run(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor | None:
        k = x.shape[-1]
        rows = x.numel() // max(k, 1)
        if not (
            0 < rows <= F32_GEMV_ROWS
            and k > 0
            and x.dtype == w.dtype == torch.float32
            and w.dim() == 2
            and w.is_contiguous()
            and (b is None or (b.dtype == torch.float32 and b.is_contiguous()))
        ):
            return None
        x2 = x.reshape(rows, k)
        if x2.stride(1) != 1:
            x2 = x2.contiguous()
        out = torch.empty((*x.shape[:-1], w.shape[0]), dtype=torch.float32)
        if out.numel():
            ql.gemv(out.view(rows, w.shape[0]), x2, w, None, None, b, fmt="f32", group_size=0)
        return out

    return run


def rows_of(x: NativeOperand) -> tuple[int, int] | None:
    """``(rows, row stride)`` of a native operand read as the 2-d ``x.reshape(-1, K)`` the
    out-variant makes, where that is a view with unit stride along ``K``; else ``None``."""
    if not x.shape:
        return None
    k = x.shape[-1]
    if k > 1 and x.strides[-1] != 1:
        return None
    lead = [(d, s) for d, s in zip(x.shape[:-1], x.strides[:-1]) if d != 1]
    for (_, s0), (d1, s1) in zip(lead, lead[1:]):
        if s0 != s1 * d1:
            return None
    m = 1
    for d in x.shape[:-1]:
        m *= d
    return m, (lead[-1][1] if lead else k)


def native(ql: QuantLinearKernel) -> NativeExtern | None:
    """The GEMV as a step of a native run ([Note: native runs] in cuvil_runtime.native_runs):
    what :func:`out_variant` runs for float32 activations of at most
    :attr:`QuantLinearKernel.gemv_max_rows` rows, called with the same arguments; other
    bindings (prefill's rows, layouts it would copy) run :func:`out_variant`."""
    if ql._tensors:
        return None

    def prepare(ops: Sequence[NativeOperand], attrs: Mapping[str, Any]) -> list[NativeArg] | None:
        fmt, has_bias = attrs["fmt"], attrs["has_bias"]
        out, x, weight, *rest = ops
        rows = rows_of(x)
        if fmt not in _FORMATS or rows is None or x.dtype != torch.float32 or not out.is_contiguous():
            return None
        (m, ldx), k, n = rows, x.shape[-1], out.shape[-1]
        if not 0 < m <= ql.gemv_max_rows or k == 0 or n == 0:
            return None
        if not all(t.is_contiguous() for t in (weight, *rest)):
            return None
        n_params = len(rest) - int(has_bias)
        scales = ("ptr", 3) if n_params > 0 else ("int", 0)
        zeros = ("ptr", 4) if n_params > 1 else ("int", 0)
        bias = ("ptr", 3 + n_params) if has_bias else ("int", 0)
        block = (m, n, k, ldx, n, attrs["group_size"])
        params = (*(("int", v) for v in block), ("threads",), ("int", int(has_bias)))
        return [
            ("int", _FORMATS[fmt]),
            ("ptr", 1),
            ("ptr", 2),
            scales,
            zeros,
            bias,
            ("ptr", 0),
            ("block", params),
        ]

    def error(rc: int, attrs: Mapping[str, Any]) -> Exception:
        fmt = attrs["fmt"]
        if rc == 2:
            return MemoryError(f"quant_linear: {fmt}: out of memory")
        return ValueError(f"quant_linear: the kernel refused {fmt} (group {attrs['group_size']})")

    return NativeExtern(address(ql._linear), prepare, error)


def kernel(cache: KernelCache) -> QuantLinearKernel:
    """The kernels built and loaded from ``cache``, once per cache."""
    return per_cache(QuantLinearKernel, cache)


def out_variant(cache: KernelCache | None) -> Callable[..., None]:
    """What a ``weight_only_linear`` extern call runs: ``(out, x, weight, *params[, bias],
    **attrs)`` writing ``out``. ``cache=None`` (a loaded artifact) builds the kernel with this
    host's compiler if it has one, else runs the reference and copies."""
    ql: QuantLinearKernel | None = None
    if cache is None:
        try:
            cache = KernelCache()
        except ToolchainError:
            cache = None
    if cache is not None:
        ql = kernel(cache)
    reference = quant.reference

    def run(
        out: torch.Tensor,
        x: torch.Tensor,
        weight: torch.Tensor,
        *rest: torch.Tensor,
        fmt: str,
        group_size: int,
        has_bias: bool,
    ) -> None:
        if ql is None or x.dtype != torch.float32 or not x.is_cpu or not out.is_contiguous():
            out.copy_(reference(x, weight, *rest, fmt=fmt, group_size=group_size, has_bias=has_bias))
            return
        params = rest[: len(rest) - int(has_bias)]
        scales = params[0] if params else None
        zeros = params[1] if len(params) > 1 else None
        bias = rest[-1] if has_bias else None
        k = x.shape[-1]
        x2 = x.reshape(-1, k) if x.dim() != 2 else x
        o2 = out.view(-1, out.shape[-1]) if out.dim() != 2 else out
        if x2.shape[0] == 0 or o2.shape[1] == 0:
            return
        if k == 0:
            o2.copy_(bias.expand_as(o2) if bias is not None else torch.zeros_like(o2))
            return
        ql.linear_into(o2, x2, weight, scales, zeros, bias, fmt=fmt, group_size=group_size)

    return run


__all__ = [
    "F32_GEMV_ROWS",
    "GEMV_ROWS_PER_TILE_ROW",
    "OP",
    "PANEL_BYTES",
    "QuantLinearKernel",
    "f32_gemv",
    "kernel",
    "native",
    "out_variant",
    "rows_of",
]
