"""The ``cpu`` target's step runner: ``step_runner.c``, which runs a native run of a program's
steps in one call ([Note: native runs] in :mod:`cuvil_runtime.native_runs`).

Written once (not generated) and built by the target's kernel cache like the hand-written
kernels; a kernel cache whose kernels run emulated (another ISA under an emulator) has none:
its kernels take tensors, not addresses, and run from Python.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from cuvil_backend_cpu.emulation import EmulatedLibrary
from cuvil_backend_cpu.kernel_cache import KernelCache, per_cache
from cuvil_ir.graph_ir.nodes import KV, Ref
from cuvil_runtime.native_runs import MAX_ARGS
from cuvil_runtime.target import NativeArg, NativeExtern, NativeOperand

#: the runner's source (no vector prelude: it only calls functions)
SOURCE = (Path(__file__).parent / "step_runner.c").read_text()


class StepRunner:
    """``step_runner.c`` built and loaded from ``cache``; ``fn(head_address) -> 0 | 1 + failed step``."""

    def __init__(self, cache: KernelCache) -> None:
        lib = cache.load(cache.build(SOURCE, name="step_runner"), SOURCE, name="step_runner")
        self.fn: Callable[[int], int] | None = None
        self.index_copy: int | None = None
        if not isinstance(lib, EmulatedLibrary):
            limit = lib.cuvil_run_steps_max_args
            limit.restype = ctypes.c_int64
            if limit() != MAX_ARGS:  # (the planner's limit and the runner's switch must agree)
                raise RuntimeError(f"step_runner.c takes {limit()} arguments a step, the planner {MAX_ARGS}")
            fn = lib.cuvil_run_steps
            fn.argtypes = [ctypes.c_void_p]
            fn.restype = ctypes.c_int64
            self.fn = fn
            self.index_copy = address(lib.cuvil_index_copy)


def runner(cache: KernelCache) -> Callable[[int], int] | None:
    """The step runner of ``cache`` (built once per cache), or ``None`` under emulation."""
    return per_cache(StepRunner, cache).fn


#: what an in-place ``extern`` step runs natively: torch's method by name
INDEX_COPY = "torch.Tensor.index_copy_"
#: the C function's rank limit (``CUVIL_INDEX_COPY_RANK``)
INDEX_COPY_RANK = 8


def in_place_native(cache: KernelCache) -> NativeExtern | None:
    """The C form of an opaque ``extern`` call that overwrites its first operand in place
    (``in_place = true``: [Note: updates in place]), for native runs: ``index_copy_`` along one
    dim with an int64 index and a source of the destination's dtype (a decoder's static-cache
    writes, two a layer a decode step). Its result is its first operand, so the run writes the
    caller's tensor; the wrapper takes the run only for a call that may write it. Other calls
    (another method, dtypes or shapes torch would refuse or convert) run torch's."""
    runner = per_cache(StepRunner, cache)
    if runner.index_copy is None:
        return None

    def prepare(ops: Sequence[NativeOperand], attrs: Mapping[str, Any]) -> list[NativeArg] | None:
        args = attrs.get("args")
        if (
            attrs.get("target") != INDEX_COPY
            or not attrs.get("in_place")
            or attrs.get("mutates") != 0
            or attrs.get("autocast")
            or attrs.get("kwargs") not in (None, KV(()))
            or not (isinstance(args, tuple) and len(args) == 4)
            or args[0] != Ref(0)
            or args[2] != Ref(1)
            or args[3] != Ref(2)
            or type(args[1]) is not int
            or len(ops) != 4
        ):
            return None
        out, dst, index, src = ops
        rank = len(dst.shape)
        dim = args[1] + rank if args[1] < 0 else args[1]
        if (
            not 0 < rank <= INDEX_COPY_RANK
            or not 0 <= dim < rank
            or out.shape != dst.shape
            or not out.is_contiguous()
            or not dst.is_contiguous()
            or dst.dtype != src.dtype
            or index.dtype != torch.int64
            or len(index.shape) > 1
            or len(src.shape) != rank
        ):
            return None
        n = index.shape[0] if index.shape else 1
        if src.shape[dim] != n or any(src.shape[d] != dst.shape[d] for d in range(rank) if d != dim):
            return None
        block = (rank, dim, dst.dtype.itemsize, n, *dst.shape, *dst.strides, *src.strides)
        return [("ptr", 1), ("ptr", 2), ("ptr", 3), ("block", tuple(("int", v) for v in block))]

    def error(rc: int, attrs: Mapping[str, Any]) -> Exception:
        if rc == 3:
            return IndexError(f"index_copy_(): an index is out of bounds for dimension {attrs['args'][1]}")
        return RuntimeError(f"index_copy_: the native step refused its operands ({rc})")

    return NativeExtern(runner.index_copy, prepare, error)


def address(fn: Any) -> int:
    """The address of a loaded C function (a ``ctypes`` function of a ``CDLL``)."""
    value = ctypes.cast(fn, ctypes.c_void_p).value
    assert value is not None
    return value


__all__ = ["INDEX_COPY", "SOURCE", "StepRunner", "address", "in_place_native", "runner"]
