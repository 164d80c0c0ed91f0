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
from cuvil_ir.graph_ir.types import SCALAR_DTYPES, DType, ScalarKind, ScalarType, TensorType, Type
from cuvil_ir.mlir.bindings import load
from cuvil_ir.mlir.emit import to_mlir
from cuvil_ir.mlir.module import MlirError

#: Software bf16 (see [Note: bf16 in the oracle]): arithmetic on bf16 becomes f32 arithmetic between
#: ``extf``/``truncf``, then those conversions become integer ops (round to nearest even, NaN kept).
BF16_PASSES = (
    "func.func(arith-emulate-unsupported-floats{source-types=bf16 target-type=f32},"
    "arith-expand{include-bf16=true}),"
)

PIPELINE = (
    "builtin.module("
    "one-shot-bufferize{allow-return-allocs-from-loops bufferize-function-boundaries "
    "function-boundary-type-conversion=identity-layout-map},"
    "convert-linalg-to-loops,"
    f"{BF16_PASSES}"
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

# [Note: bf16 in the oracle]
# LLVM lowers ``fptrunc float to bfloat`` to one instruction only on CPUs with AVX512_BF16
# (or AVX-NE-CONVERT); everywhere else it calls the compiler runtime's ``__truncsfbf2``,
# which gcc 12's libgcc lacks, so the ExecutionEngine (which compiles for the host CPU)
# failed with "JIT session error: Symbols not found: [ __truncsfbf2 ]" on an AVX2-only
# host. BF16_PASSES leave no bf16 conversion or arithmetic for LLVM to lower: the oracle
# builds the same code on every host, rounds as torch's c10::BFloat16 does (nearest even,
# NaN -> 0x7FC0) and, unlike VCVTNEPS2BF16, keeps subnormals. They run only on modules
# that mention bf16, so f32 programs lower exactly as before (arith-expand also rewrites
# ``maximumf``/``minimumf`` into compares and selects, which order -0 and +0 differently).

_SCALAR_CT: dict[ScalarKind, Any] = {
    kind: {DType.i64: ctypes.c_int64, DType.f64: ctypes.c_double, DType.bool: ctypes.c_bool}[d]
    for kind, d in SCALAR_DTYPES.items()
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


def pipeline(text: str) -> str:
    """The lowering pipeline for a module's text: :data:`PIPELINE`, without :data:`BF16_PASSES`
    when nothing in it is bf16."""
    return PIPELINE if "bf16" in text else PIPELINE.replace(BF16_PASSES, "")


def _lower(text: str, name: str) -> Any:
    """Parse and lower ``text`` in the current context; the module in the LLVM dialect."""
    b = load()
    module = b.ir.Module.parse(text)
    try:
        b.passmanager.PassManager.parse(pipeline(text)).run(module.operation)
    except Exception as exc:
        raise MlirError(f"{name}: lowering failed: {exc}") from exc
    return module


def lower_to_llvm(graph: Graph) -> str:
    """``graph``'s module lowered to the LLVM dialect, as text: what the ExecutionEngine compiles."""
    result = to_mlir(graph)
    with load().ir.Context():
        return str(_lower(result.text, graph.name))


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
            module = _lower(result.text, graph.name)
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
