"""Linears that read the same input, as one call: a Graph IR rewrite before lowering.

A decoder layer multiplies one normalized hidden state by three weights (query, key and
value projections) and, later, another by two (gate and up projections). As five extern
calls, a decode step pays five calls' dispatch and five parallel regions, and the key and
value projections (a quarter of the query's rows with grouped-query attention) are too
small to keep two threads busy. :func:`rewrite` makes each such set one
``cpu_linear_group`` node with one result per weight. At run time (:func:`out_variant`)
few rows of activations run ``quant_linear.c``'s grouped GEMV: one parallel loop over the
row blocks of every weight, so threads split the group's rows as they would one weight's.
More rows (prefill) run each member as it ran before, a GEMM each.

Grouped: top-level ``weight_only_linear`` nodes of one format, group size and bias-ness,
and float32 ``linear`` nodes (2-d weights) of one bias-ness whose input has decode-like rows
(:func:`_few_rows`: one size symbol, the batch, at most), that read the same value, at
most :data:`MAX_MEMBERS` at a time, whose other operands are all defined before the first
of them (the group takes its place). No weight is copied or concatenated: the kernel takes
each weight's address. Results equal the separate calls' (the GEMV computes each output
element exactly as one weight's call does). A float32 linear of one position per sequence
(:func:`_one_position`: a decode step's ``[batch, 1, hidden]``) that shares its input with none
is a group of one: written into its buffer by the GEMV, a step of a native run like the groups
around it ([Note: native runs] in cuvil_runtime/native_runs.py),
where as a GEMM-choice extern returning a new tensor it split a decode step's run at every
output and down projection and at the LM head.

:func:`fuse_silu_gate` then folds a gated MLP's ``silu(gate) * up`` into its two-weight group
(``epilogue="silu_mul"``, one result): the grouped GEMV applies it before it returns, so a
decode step's MLP is one call (docs/cpu-backend.md, "Linears of one input").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import sympy
import torch

from cuvil_backend_cpu import half_gemm, quant_linear
from cuvil_backend_cpu.epilogues import context, is_f32, same_type
from cuvil_backend_cpu.externs import _ONEDNN
from cuvil_backend_cpu.kernel_cache import KernelCache
from cuvil_backend_cpu.quant_linear import QuantLinearKernel
from cuvil_backend_cpu.step_runner import address
from cuvil_ir import REGISTRY
from cuvil_ir.graph_ir.nodes import Graph, Node
from cuvil_ir.graph_ir.ops import quant
from cuvil_ir.graph_ir.ops._rules import LIBRARY_KERNEL, ShapeError
from cuvil_ir.graph_ir.registry import Op
from cuvil_ir.graph_ir.types import DType, TensorType, Type
from cuvil_ir.symbolic import ShapeContext
from cuvil_runtime.target import NativeArg, NativeExtern, NativeOperand

#: the most weights one group holds (quant_linear.c's QL_GROUP_MAX)
MAX_MEMBERS = 8
#: rows of activations up to which a float32 group runs the grouped GEMV (decode steps and
#: small batches, where the GEMV streams each weight once; more rows: each member's GEMM choice)
F32_GROUP_ROWS = 4

_INTERNAL = (
    "an op of the cpu target's own graph rewrite (cuvil_backend_cpu.shared_input_linears), made "
    "after capture and never in a captured or exported graph"
)


#: formats whose members are plain linears (``linear``'s weight and bias): float32, and
#: float16/bfloat16 weights of activations of their own type
PLAIN = ("f32", "half")


def _operands(fmt: str, has_bias: bool) -> int:
    """Operands per member after ``x``: the weight, the format's parameters, the bias."""
    params = 0 if fmt in PLAIN else len(quant._PARAMS[fmt])
    return 1 + params + int(has_bias)


def _members(rest: tuple[Any, ...], count: int, fmt: str, has_bias: bool) -> list[tuple[Any, ...]]:
    per = _operands(fmt, has_bias)
    if len(rest) != count * per:
        raise ValueError(f"cpu_linear_group: {count} {fmt} weights take {count * per} operands after x")
    return [tuple(rest[i * per : (i + 1) * per]) for i in range(count)]


class LinearGroup(Op):
    """``count`` linears of one input: inputs ``x``, then per weight ``w`` (float32 for
    ``fmt = "f32"``, float16/bfloat16 of ``x``'s type for ``fmt = "half"``, else a ``weight_only_linear`` weight and its format's parameters) and,
    with ``has_bias``, its bias; one result per weight. ``epilogue = "silu_mul"`` (two
    weights of one output size): the one result ``silu(y_0) * y_1`` instead, a gated MLP's
    gate and up projections (:func:`fuse_silu_gate`)."""

    name = "cpu_linear_group"
    traits = frozenset({"extern_kernel", "pure"})
    extern_reasons = {"tensor_ir": LIBRARY_KERNEL, "mlir": _INTERNAL, "onnx": _INTERNAL}
    num_outputs = None

    @staticmethod
    def infer(
        ctx: ShapeContext,
        x: Type,
        *rest: Type,
        count: int,
        fmt: str,
        group_size: int,
        has_bias: bool,
        epilogue: str = "",
    ) -> tuple[Type, ...]:
        out = []
        for member in _members(rest, count, fmt, has_bias):
            if fmt in PLAIN:
                out.append(REGISTRY.get("linear").infer(ctx, x, *member, has_bias=has_bias))
            else:
                op = REGISTRY.get(quant.WeightOnlyLinear.name)
                out.append(op.infer(ctx, x, *member, fmt=fmt, group_size=group_size, has_bias=has_bias))
        if epilogue:
            a, b = out
            if (
                epilogue not in EPILOGUES
                or count != 2
                or not isinstance(a, TensorType)
                or not isinstance(b, TensorType)
                or (a.dtype, a.rank) != (b.dtype, b.rank)
                or any(ctx.prove(sympy.Eq(p, q)) is False for p, q in zip(a.shape, b.shape))
            ):
                raise ShapeError(f"cpu_linear_group: epilogue {epilogue!r} takes two results of one type")
            return (a,)
        return tuple(out)

    @staticmethod
    def reference(
        x: Any, *rest: Any, count: int, fmt: str, group_size: int, has_bias: bool, epilogue: str = ""
    ) -> Any:
        out = []
        for member in _members(rest, count, fmt, has_bias):
            if fmt in PLAIN:
                out.append(torch.nn.functional.linear(x, member[0], member[-1] if has_bias else None))
            else:
                out.append(quant.reference(x, *member, fmt=fmt, group_size=group_size, has_bias=has_bias))
        if epilogue:
            return (EPILOGUES[epilogue](out[0], out[1]),)
        return tuple(out)


def _silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(gate) * up


#: a group's epilogues: name -> the eager function of its two results
EPILOGUES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {"silu_mul": _silu_mul}


def _kind(n: Node, pinned: dict[Any, int]) -> tuple[Any, ...] | None:
    """What must match for ``n`` to share a group (``None``: ``n`` is no candidate)."""
    if n.op == quant.WeightOnlyLinear.name and is_f32(n.inputs[0]) and is_f32(n.output):
        return (str(n.attr("fmt")), int(n.attr("group_size") or 0), bool(n.attr("has_bias")))  # type: ignore[arg-type]
    if n.op != "linear" or len(n.inputs) < 2:
        return None
    w, x = n.inputs[1].type, n.inputs[0].type
    if not (isinstance(w, TensorType) and w.rank == 2 and isinstance(x, TensorType)):
        return None
    if all(is_f32(v) for v in n.inputs) and is_f32(n.output) and _few_rows(x, pinned):
        return ("f32", 0, bool(n.attr("has_bias")))
    if x.dtype in (DType.bf16, DType.f16) and all(_same_half(v, x) for v in (*n.inputs, n.output)):
        # any rows: the group's GEMM (one oneDNN call on the weights packed together) or
        # its members, whichever measured faster ([Note: grouped GEMMs])
        return ("half", 0, bool(n.attr("has_bias")), x.dtype)
    return None


def _same_half(v: Any, x: TensorType) -> bool:
    t = v.type
    return isinstance(t, TensorType) and t.dtype == x.dtype and t.device == "cpu"


def _pinned(graph: Graph) -> dict[Any, int]:
    """The size symbols the graph's assumptions pin to a number (``Eq(input_ids_1, 1)``: a decode step)."""
    out: dict[Any, int] = {}
    for a in graph.assumptions:
        if isinstance(a, sympy.Eq):
            lhs, rhs = a.lhs, a.rhs
            if isinstance(lhs, sympy.Integer):
                lhs, rhs = rhs, lhs
            if isinstance(lhs, sympy.Symbol) and isinstance(rhs, sympy.Integer):
                out[lhs] = int(rhs)
    return out


def _few_rows(x: TensorType, pinned: dict[Any, int]) -> bool:
    """Whether ``x`` looks like a decode step's activations: at most one size symbol among its
    rows (a batch) and at most :data:`F32_GROUP_ROWS` rows otherwise. A float32 group of more
    rows runs its members one at a time and copies each result into the group's buffer, which
    an encoder's (batch, sequence) rows would pay at every call for nothing."""
    lead = [pinned.get(d, d) for d in x.shape[:-1]]
    symbols = [d for d in lead if not isinstance(d, int) and not getattr(d, "is_Integer", False)]
    fixed = 1
    for d in lead:
        if d not in symbols:
            fixed *= int(d)
    return len(symbols) <= 1 and fixed <= F32_GROUP_ROWS


def _one_position(x: Any, pinned: dict[Any, int]) -> bool:
    """Whether ``x`` is one position per sequence, a decode step's ``[batch, 1, hidden]``: its
    rows a batch and a size of 1 (a literal, or a symbol the assumptions pin to 1). A lone
    float32 linear of such rows is a group of one; a ``[batch, features]`` MLP's keeps its GEMM
    choice, whose result a group would copy into its buffer at every batch above
    :data:`F32_GROUP_ROWS`."""
    t = x.type
    if not isinstance(t, TensorType):
        return False
    lead = [pinned.get(d, d) for d in t.shape[:-1]]
    return len(lead) >= 2 and any(d == 1 for d in lead[1:])


def rewrite(graph: Graph) -> Graph:
    """``graph`` with each set of linears of one input (see the module doc) as one
    ``cpu_linear_group`` at the first one's place; the graph itself when there is none.
    Deterministic: groups follow the nodes' order."""
    nodes = list(graph.nodes)
    defined = {v.name: -1 for v in graph.inputs}
    for i, n in enumerate(nodes):
        for v in n.outputs:
            defined[v.name] = i
    groups: dict[tuple[Any, ...], list[int]] = {}
    pinned = _pinned(graph)
    for i, n in enumerate(nodes):
        kind = _kind(n, pinned)
        if kind is not None:
            groups.setdefault((n.inputs[0].name, *kind), []).append(i)
    replaced: dict[int, Node] = {}
    removed: set[int] = set()
    for (_, fmt, group_size, has_bias, *_), members in groups.items():
        for start in range(0, len(members), MAX_MEMBERS):
            chunk = members[start : start + MAX_MEMBERS]
            first = chunk[0]
            # every operand must exist where the group stands
            chunk = [i for i in chunk if all(defined.get(v.name, first) < first for v in nodes[i].inputs[1:])]
            if len(chunk) < (1 if fmt == "f32" and _one_position(nodes[chunk[0]].inputs[0], pinned) else 2):
                continue
            x = nodes[first].inputs[0]
            operands = [x, *(v for i in chunk for v in nodes[i].inputs[1:])]
            outputs = tuple(nodes[i].outputs[0] for i in chunk)
            attrs = (("count", len(chunk)), ("fmt", fmt), ("group_size", group_size), ("has_bias", has_bias))
            replaced[first] = Node(LinearGroup.name, tuple(operands), outputs, attrs, loc=nodes[first].loc)
            removed.update(chunk[1:])
    if not replaced:
        return graph
    kept = tuple(replaced.get(i, n) for i, n in enumerate(nodes) if i not in removed)
    return graph.replace(nodes=kept)


def out_variant(
    cache: KernelCache | None, linear: Callable[..., torch.Tensor], wol: Callable[..., None]
) -> Callable[..., None]:
    """What a ``cpu_linear_group`` call runs: ``(out_1, ..., out_count, x, *operands, **attrs)``
    writing each ``out_i``. ``linear``: a float32 linear extern (``(x, w, *bias, has_bias)``),
    ``wol``: the ``weight_only_linear`` out-variant, for the members one at a time (more rows
    than the GEMV takes, or no kernel)."""
    ql = quant_linear.kernel(cache) if cache is not None else None

    def run(*args: Any, count: int, fmt: str, group_size: int, has_bias: bool, epilogue: str = "") -> None:
        n_out = 1 if epilogue else count
        outs, x, rest = args[:n_out], args[n_out], args[n_out + 1 :]
        members = _members(rest, count, fmt, has_bias)
        k = x.shape[-1]
        rows = x.numel() // max(k, 1)
        limit = F32_GROUP_ROWS if fmt == "f32" else (ql.gemv_max_rows if ql is not None else 0)
        if (
            ql is not None
            and fmt != "half"
            and 0 < rows <= limit
            and ql.group_into(outs, x.reshape(rows, k), members, fmt, group_size, epilogue)
        ):
            return
        if epilogue:  # (each member into a buffer of its own, then the epilogue into the result)
            outs = tuple(torch.empty_like(outs[0]) for _ in members)
        if fmt == "half":  # one GEMM or the members: [Note: grouped GEMMs]
            half_gemm.group_into(outs, x, members, has_bias, linear, _ONEDNN)
        else:
            _each(outs, x, members, fmt, group_size, has_bias, linear, wol)
        if epilogue:
            args[0].copy_(EPILOGUES[epilogue](outs[0], outs[1]))

    return run


def _each(
    outs: tuple[torch.Tensor, ...],
    x: torch.Tensor,
    members: list[tuple[Any, ...]],
    fmt: str,
    group_size: int,
    has_bias: bool,
    linear: Callable[..., torch.Tensor],
    wol: Callable[..., None],
) -> None:
    """The members one at a time, each into its buffer."""
    for out, member in zip(outs, members):
        if fmt == "f32":
            out.copy_(linear(x, *member, has_bias=has_bias))
        else:
            wol(out, x, *member, fmt=fmt, group_size=group_size, has_bias=has_bias)


def native(ql: QuantLinearKernel) -> NativeExtern | None:
    """The grouped GEMV as a step of a native run ([Note: native runs] in
    cuvil_runtime.native_runs): what :func:`out_variant` runs for float32 activations of few
    rows (``QuantLinearKernel.group_into``'s call, the same arguments); other bindings run
    :func:`out_variant`."""
    if ql._group is None:
        return None

    def prepare(ops: Sequence[NativeOperand], attrs: Mapping[str, Any]) -> list[NativeArg] | None:
        count, fmt, has_bias = attrs["count"], attrs["fmt"], attrs["has_bias"]
        epilogue = attrs.get("epilogue", "")
        n_out = 1 if epilogue else count
        outs, x = ops[:n_out], ops[n_out]
        rows = quant_linear.rows_of(x)
        per = _operands(fmt, has_bias)
        if rows is None or len(ops) != n_out + 1 + count * per or not 1 <= count <= MAX_MEMBERS:
            return None
        (m, ldx), k = rows, x.shape[-1]
        limit = F32_GROUP_ROWS if fmt == "f32" else ql.gemv_max_rows
        if not 0 < m <= limit or k == 0 or x.dtype != torch.float32:
            return None
        if epilogue and (epilogue not in quant_linear._EPILOGUES or count != 2):
            return None
        if not all(o.dtype == torch.float32 and o.is_contiguous() for o in outs):
            return None
        n_params = 0 if fmt == "f32" else len(quant._PARAMS[fmt])
        addr: list[NativeArg] = []
        for i in range(count):
            first = n_out + 1 + i * per
            member = ops[first : first + per]
            if not all(t.is_contiguous() for t in member):
                return None
            if fmt == "f32" and member[0].dtype != torch.float32:
                return None
            if has_bias and member[-1].dtype != torch.float32:
                return None
            n = member[0].shape[0]
            scales = ("ptr", first + 1) if n_params > 0 else ("int", 0)
            zeros = ("ptr", first + 2) if n_params > 1 else ("int", 0)
            bias = ("ptr", first + per - 1) if has_bias else ("int", 0)
            out = ("ptr", i) if i < n_out else ("int", 0)  # (the epilogue's second: the kernel's own)
            addr += [("ptr", first), scales, zeros, bias, out, ("int", n), ("int", n)]
        code = quant_linear._EPILOGUES.get(epilogue, 0)
        params = (*(("int", v) for v in (m, 0, k, ldx, 0, attrs["group_size"])), ("threads",), ("int", code))
        return [
            ("int", quant_linear._FORMATS[fmt]),
            ("ptr", n_out),
            ("int", count),
            ("block", tuple(addr)),
            ("block", params),
        ]

    def error(rc: int, attrs: Mapping[str, Any]) -> Exception:
        if rc == 2:
            return MemoryError(
                f"quant_linear: a group of {attrs['count']} {attrs['fmt']} weights: out of memory"
            )
        return ValueError(
            f"quant_linear: the kernel refused a group of {attrs['count']} {attrs['fmt']} weights"
        )

    return NativeExtern(address(ql._group), prepare, error)


__all__ = [
    "EPILOGUES",
    "F32_GROUP_ROWS",
    "MAX_MEMBERS",
    "LinearGroup",
    "fuse_silu_gate",
    "native",
    "out_variant",
    "rewrite",
]


def fuse_silu_gate(graph: Graph) -> Graph:
    """``graph`` with each two-member ``cpu_linear_group`` whose results only feed
    ``silu(y_0) * y_1`` (either operand order of the ``mul``) as one group with
    ``epilogue="silu_mul"`` and that product as its result: a gated MLP's gate and up
    projections, the activation and the product in the same kernel call (the grouped GEMV
    applies it to its results in registers' width; more rows apply it after the members).
    Only top-level nodes; the graph itself when there is none."""
    nodes = list(graph.nodes)
    uses = graph.use_counts()
    producer = {v.name: i for i, n in enumerate(nodes) for v in n.outputs}
    ctx = context(graph)
    fused: dict[int, Node] = {}
    removed: set[int] = set()
    for i, n in enumerate(nodes):
        if n.op != "mul" or n.attrs or len(n.inputs) != 2:
            continue
        for act, other in ((n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])):
            s = producer.get(act.name)
            if s is None or nodes[s].op != "silu" or uses[act.name] != 1:
                continue
            g = producer.get(nodes[s].inputs[0].name)
            if g is None or g in fused or g in removed:
                continue
            group = nodes[g]
            if group.op != LinearGroup.name or group.attr("count") != 2 or group.attr("epilogue"):
                continue
            if group.attr("fmt") == "half":  # no grouped GEMV: the product stays a fused kernel
                continue
            gate_out = nodes[s].inputs[0].name
            outs = [v.name for v in group.outputs]
            if sorted(outs) != sorted((gate_out, other.name)) or gate_out == other.name:
                continue
            if not (
                uses[outs[0]] == 1
                and uses[outs[1]] == 1
                and same_type(ctx, group.outputs[0].type, group.outputs[1].type)
                and same_type(ctx, n.output.type, group.outputs[0].type)
            ):
                continue
            inputs = group.inputs
            if outs[1] == gate_out:  # (up, gate): the gate's operands first
                per = (len(inputs) - 1) // 2
                inputs = (inputs[0], *inputs[1 + per :], *inputs[1 : 1 + per])
            fused[g] = group.replace(
                inputs=inputs, outputs=(n.output,), attrs=(*group.attrs, ("epilogue", "silu_mul"))
            )
            removed.update((s, i))
            break
    if not fused:
        return graph
    kept = tuple(fused.get(i, n) for i, n in enumerate(nodes) if i not in removed)
    return graph.replace(nodes=kept)
