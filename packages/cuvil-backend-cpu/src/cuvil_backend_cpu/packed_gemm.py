"""Float32 linears by our own GEMM on a prepacked weight (``packed_gemm.c``): the ``packed``
candidate of the GEMM choice ([Note: GEMM choice] in :mod:`cuvil_backend_cpu.gemm_choice`).

The weight is packed once per weight and version into panels of ``2 x lanes`` output columns,
k-major, so a register tile of rows of x by one panel reads the panel as a stream and keeps its
accumulators in registers over the whole of K (``packed_gemm.c``'s comment says how). Built by
the target's kernel cache like every kernel (same compiler, flags, ``CUVIL_CPU_ISA``). Measured
against MKL and oneDNN per shape on the host, it runs where it wins: on the AVX2 development
host it did at every transformer-sized shape measured (docs/cpu-backend.md, "GEMMs").

Memory: a packed weight is a second copy of the weight (rounded up to whole panels), kept while
the weight lives and is not written; only shapes whose choice is ``packed`` are packed.
"""

from __future__ import annotations

import ctypes
import struct
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

from cuvil_backend_cpu.c_prelude import build_facts, kernel_source
from cuvil_backend_cpu.emulation import EmulatedLibrary
from cuvil_backend_cpu.kernel_cache import KernelCache, per_cache

#: the epilogue's activations (``cpu_linear_epilogue``'s ``act``) and the kernel's codes for them
ACTIVATIONS = {"none": 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4}


class PackedGemmKernel:
    """The compiled ``packed_gemm.c``, loaded from ``cache``."""

    def __init__(self, cache: KernelCache, lanes: int | None = None) -> None:
        """``lanes`` forces the vector width (tests: every tiling's logic on any host)."""
        source = kernel_source("packed_gemm.c", lanes)
        lib = cache.load(cache.build(source, name="packed_gemm"), source, name="packed_gemm")
        #: an emulated kernel (:mod:`cuvil_backend_cpu.emulation`) takes tensors, not addresses
        self._tensors = isinstance(lib, EmulatedLibrary)
        self._pack = lib.cuvil_pg_pack
        self._pack.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
        self._pack.restype = None
        self._pack_kn = lib.cuvil_pg_pack_kn
        self._pack_kn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
        self._pack_kn.restype = None
        self._linear = lib.cuvil_pg_linear
        self._linear.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_char_p]
        self._linear.restype = ctypes.c_int
        #: the build's vector width (floats), rows of x per register tile, columns per panel
        self.lanes, self.tile_rows, self.panel_cols = build_facts(lib, "cuvil_pg_info", 3)
        self._packed: dict[tuple[int, bool], tuple[weakref.ref[torch.Tensor], int, int, torch.Tensor]] = {}
        self._lock = threading.Lock()

    def _ptr(self, t: torch.Tensor | None) -> Any:
        if self._tensors:
            return t
        return None if t is None else t.data_ptr()

    def pack(self, w: torch.Tensor, kn: bool = False) -> torch.Tensor:
        """``w`` (contiguous float32 ``[N, K]``, or ``[K, N]`` with ``kn``) in panels: a new
        tensor of whole panels."""
        n, k = (w.shape[1], w.shape[0]) if kn else w.shape
        panels = -(-n // self.panel_cols)
        out = torch.empty(panels * self.panel_cols * k, dtype=torch.float32)
        (self._pack_kn if kn else self._pack)(self._ptr(w), n, k, self._ptr(out))
        return out

    def packed(self, w: torch.Tensor, kn: bool = False) -> torch.Tensor:
        """``w`` packed, once per weight, storage and version (a weight written in place, or
        given new storage, is packed again; a weight that dies drops its packing)."""
        key = (id(w), kn)
        hit = self._packed.get(key)
        if hit is not None and hit[0]() is w and hit[1] == w._version and hit[2] == w.data_ptr():
            return hit[3]
        p = self.pack(w, kn)
        with self._lock:
            cache = self._packed

            def forget(_: object, key: tuple[int, bool] = key) -> None:
                cache.pop(key, None)

            cache[key] = (weakref.ref(w, forget), w._version, w.data_ptr(), p)
        return p

    def release(self, w: torch.Tensor) -> None:
        """Drop ``w``'s packings (the GEMM choice picked another GEMM for it: no copy of the
        weight is kept for nothing; a later call that needs one packs it again)."""
        with self._lock:
            for kn in (False, True):
                hit = self._packed.get((id(w), kn))
                if hit is not None and hit[0]() is w:
                    del self._packed[(id(w), kn)]

    def linear_into(
        self,
        out: torch.Tensor,
        x: torch.Tensor,
        packed: torch.Tensor,
        n: int,
        bias: torch.Tensor | None,
        other: torch.Tensor | None = None,
        act: str = "none",
    ) -> None:
        """``out[M, n] = act(x[M, K] @ W^T (+ bias) (+ other))`` for ``W`` packed by :meth:`pack`:
        ``x`` float32 with unit stride along K (any row stride), ``out`` and ``other`` float32
        ``[M, n]`` with unit stride along N; ``act`` one of :data:`ACTIVATIONS`."""
        m, k = x.shape
        ldx = x.stride(0) if m > 1 else k  # (one row: its stride is never read)
        ldy = out.stride(0) if m > 1 else n
        ldo = 0 if other is None else (other.stride(0) if m > 1 else n)
        params = struct.pack(
            "9q", m, n, k, ldx, ldy, torch.get_num_threads(), int(bias is not None), ACTIVATIONS[act], ldo
        )
        rc = self._linear(
            self._ptr(x), self._ptr(packed), self._ptr(bias), self._ptr(other), self._ptr(out), params
        )
        if rc:
            raise ValueError(f"packed_gemm: the kernel refused {m}x{k} @ {n}x{k}")


def kernel(cache: KernelCache) -> PackedGemmKernel:
    """The kernel built and loaded from ``cache``, once per cache."""
    return per_cache(PackedGemmKernel, cache)


def applies(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> bool:
    """Whether :func:`linear` takes these operands: float32 CPU tensors, ``w`` 2-d and
    contiguous, ``b`` contiguous, at least one row and one output."""
    return (
        x.dtype == w.dtype == torch.float32
        and x.device.type == "cpu"
        and w.device.type == "cpu"
        and w.dim() == 2
        and w.is_contiguous()
        and w.shape[0] > 0
        and x.shape[-1] == w.shape[1]
        and x.numel() > 0
        and (b is None or (b.dtype == torch.float32 and b.is_contiguous() and b.shape == (w.shape[0],)))
    )


def linear(
    pg: PackedGemmKernel,
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    other: torch.Tensor | None = None,
    act: str = "none",
) -> torch.Tensor:
    """``act(F.linear(x, w, b) (+ other))`` by the packed GEMM, for operands :func:`applies`
    takes (``other``: float32 of the result's shape)."""
    out = _product(pg, x, pg.packed(w), w.shape[0], b, other, act)
    assert out is not None  # (no out given: one is made)
    return out


def _product(
    pg: PackedGemmKernel,
    x: torch.Tensor,
    packed: torch.Tensor,
    n: int,
    b: torch.Tensor | None = None,
    other: torch.Tensor | None = None,
    act: str = "none",
    out: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """``x [..., K]`` times a packed weight of ``n`` outputs, the epilogue in the store, into
    ``out`` (``None`` when it is not contiguous float32 of the result's shape) or a new tensor."""
    k = x.shape[-1]
    rows = x.numel() // max(k, 1)
    shape = (*x.shape[:-1], n)
    if out is None:
        out = torch.empty(shape, dtype=torch.float32)
    elif out.shape != shape or out.dtype != torch.float32 or not out.is_contiguous():
        return None
    x2 = x.reshape(rows, k)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    o2 = None
    if other is not None:
        o2 = other.reshape(rows, n)
        if o2.stride(1) != 1:
            o2 = o2.contiguous()
    pg.linear_into(out.view(rows, n), x2, packed, n, b, o2, act)
    return out


def f32_matmul(cache: KernelCache) -> Callable[..., torch.Tensor | None]:
    """``a @ w`` by the packed GEMM for a float32 parameter ``w`` (2-d, contiguous ``[K, N]``:
    GPT-2's ``Conv1D``), packed once per version; ``None`` where it does not apply (a right
    operand that is not a parameter would be packed at every call). The ``packed`` candidate
    of the cpu target's matmul out-variant."""

    def run(a: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor | None:
        """``a @ w`` (into ``out``, contiguous float32 of the result's shape, where given)."""
        if not (
            isinstance(w, torch.nn.Parameter)
            and w.dim() == 2
            and a.dim() >= 2
            and a.dtype == w.dtype == torch.float32
            and a.device.type == w.device.type == "cpu"
            and w.is_contiguous()
            and a.shape[-1] == w.shape[0]
            and a.numel() > 0
            and w.shape[1] > 0
        ):
            return None
        pg = kernel(cache)
        return _product(pg, a, pg.packed(w, kn=True), w.shape[1], out=out)

    return run


class F32Linear:
    """A float32 linear by the packed GEMM (``act(F.linear(x, w, b) (+ other))``), or ``None``
    where it does not apply (:func:`applies`, an ``other`` not of the result's shape): the
    ``packed`` candidate of the cpu target's GEMM choice, for plain linears and fused epilogues.
    The kernel is built at the first call (a target that never runs a float32 linear builds
    nothing). :meth:`release` drops a weight's packing when another GEMM won its shape."""

    def __init__(self, cache: KernelCache) -> None:
        self.cache = cache

    def __call__(
        self,
        x: torch.Tensor,
        w: torch.Tensor,
        b: torch.Tensor | None,
        other: torch.Tensor | None = None,
        act: str = "none",
    ) -> torch.Tensor | None:
        if not applies(x, w, b) or act not in ACTIVATIONS:
            return None
        if other is not None and (other.dtype != torch.float32 or other.shape != (*x.shape[:-1], w.shape[0])):
            return None
        return linear(kernel(self.cache), x, w, b, other, act)

    def release(self, w: torch.Tensor) -> None:
        kernel(self.cache).release(w)


def f32_linear(cache: KernelCache) -> F32Linear:
    """The packed GEMM as a float32 linear (:class:`F32Linear`)."""
    return F32Linear(cache)


__all__ = [
    "ACTIVATIONS",
    "F32Linear",
    "PackedGemmKernel",
    "applies",
    "f32_linear",
    "f32_matmul",
    "kernel",
    "linear",
]
