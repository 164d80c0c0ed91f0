"""What a backend wants from lowering, as data: :class:`FusionPolicy`.

Each target's ``fusion_policy(options)`` returns one; :func:`cuvil_ir.tensor_ir.lower.lower`
reads it (recompute or realize, dtypes kernels hold, ops kept as externs, reductions
its scheduler cannot keep in a kernel, native lowerings) instead of checking target names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import sympy

from cuvil_ir.graph_ir.types import DType
from cuvil_ir.tensor_ir import expr as E

#: ``(reduce, its free indices, the kernel's outer indices) -> realize it?``
RealizeReduction = Callable[[E.Reduce, frozenset[sympy.Symbol], frozenset[sympy.Symbol]], bool]


@dataclass(frozen=True)
class FusionPolicy:
    """What a backend wants from lowering (data, not target-name checks)."""

    #: a value used more than once is recomputed in each consumer when its cost
    #: (see :func:`cuvil_ir.tensor_ir.expr.cost`) is at most this, else realized
    recompute_budget: int = 4
    #: realize an expression that grew past this many nodes
    max_expr_nodes: int = 256
    #: a subexpression at least this costly that varies with fewer indices than its
    #: kernel (batch norm's per-channel ``rsqrt``) is computed once into a small buffer
    low_rank_cost: int = 4
    #: element types kernels can hold; an op touching another dtype runs as an extern
    dtypes: frozenset[DType] = frozenset(
        {DType.f32, DType.f64, DType.i64, DType.i32, DType.i16, DType.i8, DType.u8, DType.bool}
    )
    #: ops never lowered into kernels (run by their reference as externs)
    extern_ops: frozenset[str] = frozenset()
    #: extern ops the backend can run into a preallocated (arena) buffer, ``out=`` style
    out_variants: frozenset[str] = frozenset()
    #: extern ops that run fastest on channels-last NCHW tensors: their first operand is
    #: passed channels-last and their 4-d results are kept so (see docs/tensor-and-loop-ir.md)
    channels_last_ops: frozenset[str] = frozenset()
    #: which reductions inside a kernel body become buffers of their own, as the
    #: backend's scheduler needs: ``realize_reduction(reduce, its free indices, the
    #: kernel's non-unit outer indices up to the deepest one any reduction uses)``.
    #: ``None``: every reduction stays in its kernel (the backend's code computes a
    #: nested reduction where it is used)
    realize_reduction: RealizeReduction | None = None
    #: the key of the native lowerings of composite ops this target takes: a node's
    #: ``lower_<native>`` attribute, an expression in the target's kernel language (see
    #: [Note: native calls] in :mod:`cuvil_ir.tensor_ir.expr`); ``None``: none
    native: str | None = None
