"""Lower an emitted module with upstream passes and run it with the MLIR ExecutionEngine.

The entry function carries ``llvm.emit_c_interface``; tensors travel as ranked memref
descriptors built with ctypes over torch storage (inputs) or over the buffers the
JIT-compiled code allocated (results: sizes and strides come back in the descriptors,
which is how dynamic result shapes are read). Result buffers are copied into torch
tensors and not freed (the oracle runs small programs).
"""

from __future__ import annotations

import ctypes
from functools import cache
from typing import Any

import torch

from cuvil_ir.graph_ir.nodes import Graph
from cuvil_ir.graph_ir.types import ScalarKind, ScalarType, TensorType, Type
from cuvil_ir.mlir.base import MlirError
from cuvil_ir.mlir.bindings import load
from cuvil_ir.mlir.emit import to_mlir

PIPELINE = (
    "builtin.module("
    "one-shot-bufferize{allow-return-allocs-from-loops bufferize-function-boundaries "
    "function-boundary-type-conversion=identity-layout-map},"
    "convert-linalg-to-loops,"
    "convert-scf-to-cf,"
    "expand-strided-metadata,"
    "lower-affine,"
    "finalize-memref-to-llvm,"
    "convert-math-to-llvm,"
    "convert-math-to-libm,"
    "convert-arith-to-llvm,"
    "convert-index-to-llvm,"
    "convert-func-to-llvm,"
    "convert-cf-to-llvm,"
    "reconcile-unrealized-casts)"
)

_SCALAR_CT: dict[ScalarKind, Any] = {
    ScalarKind.int: ctypes.c_int64,
    ScalarKind.float: ctypes.c_double,
    ScalarKind.bool: ctypes.c_bool,
}


@cache
def _descriptor(rank: int) -> type[ctypes.Structure]:
    fields: list[tuple[str, Any]] = [
        ("allocated", ctypes.c_void_p),
        ("aligned", ctypes.c_void_p),
        ("offset", ctypes.c_int64),
    ]
    if rank:
        fields += [("sizes", ctypes.c_int64 * rank), ("strides", ctypes.c_int64 * rank)]
    return type(f"MemRef{rank}D", (ctypes.Structure,), {"_fields_": fields})


def _ctype(t: Type) -> Any:
    if isinstance(t, ScalarType):
        return _SCALAR_CT[t.kind]
    return _descriptor(t.rank)


def _to_descriptor(x: torch.Tensor) -> ctypes.Structure:
    d = _descriptor(x.dim())()
    d.allocated = d.aligned = x.data_ptr()
    d.offset = 0
    for i in range(x.dim()):
        d.sizes[i] = x.shape[i]
        d.strides[i] = x.stride(i)
    return d


def _from_descriptor(d: Any, t: TensorType) -> torch.Tensor:
    dtype = t.dtype.torch
    size = [d.sizes[i] for i in range(t.rank)] if t.rank else []
    stride = [d.strides[i] for i in range(t.rank)] if t.rank else []
    if any(s == 0 for s in size):
        return torch.empty(size, dtype=dtype)
    elt = torch.empty((), dtype=dtype).element_size()
    span = 1 + sum((s - 1) * st for s, st in zip(size, stride))
    raw = (ctypes.c_char * (span * elt)).from_address(d.aligned + d.offset * elt)
    flat = torch.frombuffer(bytearray(raw), dtype=dtype)
    return torch.as_strided(flat, size, stride).clone()


class _Unranked(ctypes.Structure):
    _fields_ = [("rank", ctypes.c_int64), ("descriptor", ctypes.c_void_p)]


def _strided_bytes(u: _Unranked, elem_size: int) -> torch.Tensor:
    rank = u.rank
    d = ctypes.cast(u.descriptor, ctypes.POINTER(_descriptor(rank))).contents
    size = [d.sizes[i] for i in range(rank)] if rank else []
    stride = [d.strides[i] for i in range(rank)] if rank else []
    span = d.offset + 1 + sum((s - 1) * st for s, st in zip(size, stride))
    raw = (ctypes.c_char * (span * elem_size)).from_address(d.aligned)
    flat = torch.frombuffer(raw, dtype=torch.uint8)
    return torch.as_strided(
        flat, [*size, elem_size], [st * elem_size for st in stride] + [1], d.offset * elem_size
    )


def _memref_copy(elem_size: int, src: Any, dst: Any) -> None:
    """``memrefCopy`` of MLIR's C runner utils (bufferization emits calls to it)."""
    if elem_size == 0:
        return
    s = _strided_bytes(src.contents, elem_size)
    if s.numel() == 0:
        return
    _strided_bytes(dst.contents, elem_size).copy_(s)


_MEMREF_COPY = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.POINTER(_Unranked), ctypes.POINTER(_Unranked))(
    _memref_copy
)


class Compiled:
    """A lowered module and its ExecutionEngine (kept alive together)."""

    def __init__(self, graph: Graph) -> None:
        result = to_mlir(graph)
        if not result.lowerable:
            raise MlirError(
                f"{graph.name}: not lowerable; these ops are external calls: {', '.join(result.externs)}"
            )
        b = load()
        self.graph = graph
        self.context = b.ir.Context()
        with self.context:
            module = b.ir.Module.parse(result.text)
            try:
                b.passmanager.PassManager.parse(PIPELINE).run(module.operation)
            except Exception as exc:
                raise MlirError(f"{graph.name}: lowering failed: {exc}") from exc
            self.module = module
            self.engine = b.execution_engine.ExecutionEngine(module, opt_level=2)
            self.engine.raw_register_runtime("memrefCopy", ctypes.cast(_MEMREF_COPY, ctypes.c_void_p))
        self.name = result.text.split("func.func @", 1)[1].split("(", 1)[0]

    def __call__(self, *inputs: Any) -> tuple[Any, ...]:
        g = self.graph
        if len(inputs) != len(g.inputs):
            raise TypeError(f"{g.name} takes {len(g.inputs)} inputs, got {len(inputs)}")
        keep: list[Any] = []
        args: list[Any] = []
        for v, x in zip(g.inputs, inputs):
            if isinstance(v.type, TensorType):
                t = torch.as_tensor(x).to(v.type.dtype.torch).contiguous()
                keep.append(t)
                args.append(ctypes.pointer(ctypes.pointer(_to_descriptor(t))))
            else:
                args.append(ctypes.pointer(_SCALAR_CT[v.type.kind](x)))
        outs = [v.type for v in g.outputs]
        packed: Any = None
        if len(outs) == 1 and isinstance(outs[0], ScalarType):
            packed = _SCALAR_CT[outs[0].kind]()
            self.engine.invoke(self.name, *args, ctypes.pointer(packed))
            return (packed.value,)
        if len(outs) == 1:
            packed = _ctype(outs[0])()
            self.engine.invoke(self.name, ctypes.pointer(ctypes.pointer(packed)), *args)
            return (self._out(packed, outs[0]),)
        if outs:
            fields = [(f"r{i}", _ctype(t)) for i, t in enumerate(outs)]
            packed = type("Results", (ctypes.Structure,), {"_fields_": fields})()
            self.engine.invoke(self.name, ctypes.pointer(ctypes.pointer(packed)), *args)
        else:
            self.engine.invoke(self.name, *args)
        del keep
        return tuple(self._out(getattr(packed, f"r{i}"), t) for i, t in enumerate(outs))

    @staticmethod
    def _out(value: Any, t: Type) -> Any:
        if isinstance(t, TensorType):
            return _from_descriptor(value, t)
        return value.value if hasattr(value, "value") else value


def compile_mlir(graph: Graph) -> Compiled:
    """Emit, lower and JIT-compile ``graph``; raises :class:`MlirError` when it has external calls."""
    return Compiled(graph)


def run_mlir(graph: Graph, *inputs: Any) -> tuple[Any, ...]:
    """Run ``graph`` through MLIR's ExecutionEngine (a numeric oracle independent of Cuvil's backends)."""
    return Compiled(graph)(*inputs)
