"""Value types of Graph IR: tensors with symbolic shapes, and scalars.

Text forms (printed by the printer, read by the parser):
    Tensor[f32, (x_0, 16), cpu]
    Scalar[int]   Scalar[float]   Scalar[bool]
"""

from __future__ import annotations

import builtins
import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

from cuvil_ir.symbolic import Dim, Shape, as_dim, dim_str

if TYPE_CHECKING:
    import torch as _torch  # DType.torch shadows the module name inside the class


class DType(enum.Enum):
    """Element types; the value is the printed name."""

    bool = "bool"
    u8 = "u8"
    i8 = "i8"
    i16 = "i16"
    i32 = "i32"
    i64 = "i64"
    f16 = "f16"
    bf16 = "bf16"
    f32 = "f32"
    f64 = "f64"
    c64 = "c64"
    c128 = "c128"

    @property
    def torch(self) -> _torch.dtype:
        import torch

        dtype: _torch.dtype = getattr(torch, _TORCH_NAMES[self])
        return dtype

    @staticmethod
    def from_torch(dtype: _torch.dtype) -> DType:
        name = str(dtype).removeprefix("torch.")
        for k, v in _TORCH_NAMES.items():
            if v == name:
                return k
        raise TypeError(f"dtype {dtype} is not supported by Cuvil")

    @property
    def is_floating(self) -> builtins.bool:
        return self in (DType.f16, DType.bf16, DType.f32, DType.f64)

    @property
    def is_complex(self) -> builtins.bool:
        return self in (DType.c64, DType.c128)

    @property
    def is_integer(self) -> builtins.bool:
        return self in (DType.u8, DType.i8, DType.i16, DType.i32, DType.i64)


_TORCH_NAMES = {
    DType.bool: "bool",
    DType.u8: "uint8",
    DType.i8: "int8",
    DType.i16: "int16",
    DType.i32: "int32",
    DType.i64: "int64",
    DType.f16: "float16",
    DType.bf16: "bfloat16",
    DType.f32: "float32",
    DType.f64: "float64",
    DType.c64: "complex64",
    DType.c128: "complex128",
}


class ScalarKind(enum.Enum):
    """Python-number kinds; they take part in type promotion as weak types."""

    bool = "bool"
    int = "int"
    float = "float"

    @staticmethod
    def of(value: object) -> ScalarKind:
        if isinstance(value, bool):
            return ScalarKind.bool
        if isinstance(value, int):
            return ScalarKind.int
        if isinstance(value, float):
            return ScalarKind.float
        import sympy

        if isinstance(value, sympy.Basic):
            if value.is_Relational or isinstance(
                value, (sympy.logic.boolalg.BooleanFunction, sympy.logic.boolalg.BooleanAtom)
            ):
                return ScalarKind.bool
            return ScalarKind.int if value.is_integer else ScalarKind.float
        raise TypeError(f"not a scalar: {value!r}")


@dataclass(frozen=True, slots=True)
class TensorType:
    dtype: DType
    shape: Shape
    device: str = "cpu"

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(as_dim(d) for d in self.shape))

    @property
    def rank(self) -> int:
        return len(self.shape)

    def replace(self, **changes: object) -> TensorType:
        if all(getattr(self, k) == v for k, v in changes.items()):
            return self
        fields = {"dtype": self.dtype, "shape": self.shape, "device": self.device}
        fields.update(changes)
        return TensorType(**fields)  # type: ignore[arg-type]

    def __str__(self) -> str:
        dims = ", ".join(dim_str(d) for d in self.shape)
        if len(self.shape) == 1:
            dims += ","
        return f"Tensor[{self.dtype.value}, ({dims}), {self.device}]"


@dataclass(frozen=True, slots=True)
class ScalarType:
    kind: ScalarKind

    def __str__(self) -> str:
        return f"Scalar[{self.kind.value}]"


Type = Union[TensorType, ScalarType]

#: the element type a scalar takes where it must have one (a kernel argument, an MLIR
#: value, a 0-d ONNX tensor): Python's bool, int and float are bool, int64 and float64
SCALAR_DTYPES: dict[ScalarKind, DType] = {
    ScalarKind.bool: DType.bool,
    ScalarKind.int: DType.i64,
    ScalarKind.float: DType.f64,
}

#: the Python values a scalar of each kind accepts (an int is a valid float)
SCALAR_PYTHON_TYPES: dict[ScalarKind, tuple[type, ...]] = {
    ScalarKind.bool: (builtins.bool,),
    ScalarKind.int: (builtins.int,),
    ScalarKind.float: (builtins.float, builtins.int),
}


def element_dtype(t: Type) -> DType:
    """A tensor's dtype, or the element type of a scalar (:data:`SCALAR_DTYPES`)."""
    return t.dtype if isinstance(t, TensorType) else SCALAR_DTYPES[t.kind]


def promote_types(*types: Type) -> DType:
    """torch's type promotion (``torch.result_type``) over tensors, 0-d tensors and weak
    Python scalars: the dtype an elementwise op on these operands computes and returns.

    The one promotion function of Cuvil (shape rules, lowering, MLIR, ONNX): it asks torch
    itself, on storage-less ``meta`` tensors, so it cannot drift from eager.
    """
    import torch

    def probe(t: Type) -> _torch.Tensor | builtins.bool | builtins.int | builtins.float:
        if isinstance(t, ScalarType):
            return {ScalarKind.bool: True, ScalarKind.int: 1, ScalarKind.float: 1.0}[t.kind]
        return torch.empty((1,) * min(t.rank, 1), dtype=t.dtype.torch, device="meta")

    probes = [probe(t) for t in types]
    if not any(isinstance(p, torch.Tensor) for p in probes):
        raise ValueError("type promotion needs at least one tensor operand")
    ranked = any(isinstance(t, TensorType) and t.rank > 0 for t in types)
    acc = probes[0]
    dtype = acc.dtype if isinstance(acc, torch.Tensor) else None
    for p in probes[1:]:
        dtype = torch.result_type(acc, p)
        acc = torch.empty((1,) if ranked else (), dtype=dtype, device="meta")
    assert dtype is not None
    return DType.from_torch(dtype)


def tensor(dtype: DType, shape: tuple[Dim, ...] | list[Dim], device: str = "cpu") -> TensorType:
    return TensorType(dtype, tuple(shape), device)


def stored_float(value: float, dtype: DType) -> float:
    """``value`` as a ``dtype`` tensor holds it, as a Python float: a float16/bfloat16
    value goes through float32 first, as ``c10::Half``/``BFloat16`` are built from a
    float (torch's own conversion: to nearest, ties to even, overflow to inf); a
    float32 value is rounded to float32; float64 and NaN are unchanged."""
    if dtype not in (DType.f16, DType.bf16, DType.f32) or value != value:
        return value
    import torch

    wide = torch.tensor(value, dtype=torch.float64).to(torch.float32)
    return float(wide.to(dtype.torch).item()) if dtype != DType.f32 else float(wide.item())
