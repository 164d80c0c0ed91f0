"""Fused epilogues of GEMMs and convolutions, and eval-mode BatchNorm folded into
convolutions: a Graph IR rewrite the ``cpu`` target runs before lowering.

The rewrite (:func:`rewrite`) replaces a chain that starts at a ``linear`` or a 2-d
``conv`` by one node of an op declared here, which the target runs as one oneDNN call
with post-ops (``linear_epilogue``, ``conv_epilogue`` in :mod:`cuvil_backend_cpu.externs`):

- ``linear -> relu | gelu | silu`` and ``linear -> add(., r)`` (``r`` of the result's
  exact type: oneDNN's binary post-op does not broadcast) become ``cpu_linear_epilogue``;
- ``conv -> batch_norm`` (eval mode: the captured ``batch_norm`` is always eval mode, a
  training-mode call stays an ``extern``), then optionally ``-> add(., r)`` and
  ``-> relu``, becomes ``cpu_conv_epilogue``; so does ``conv -> relu`` and
  ``conv -> add(., r) [-> relu]`` without a batch norm.

Every link of a chain is a value with exactly one user (a value another node or a graph
output also reads is never swallowed), and a rule applies only to float32 CPU tensors (the
implementations still fall back to the eager composition for anything oneDNN does not
take). A fused node sits where the chain's last node was, so a residual computed after the
convolution (ResNet's downsample branch) is defined before it is read.

BatchNorm folding (``externs.packed_conv``): the statistics and affine parameters are
graph inputs (module buffers and parameters are read on every call, never baked in), so
the fold happens at call time, ``w' = w * g / sqrt(var + eps)``, ``b' = (b - mean) * g / sqrt(var + eps) +
beta``, computed in float64 and kept per (convolution weight, statistics) until any of
those tensors is dropped or changes (its version counter moves): an in-place update of a
running statistic between calls is seen on the next call, and an unchanged network
folds once. The rule only fuses a batch norm whose parameters and statistics, and the
convolution's weight and bias, are graph inputs, so the cache hits.

Which rules run is :data:`ENABLED` (measured on this target's host; see
docs/cpu-backend.md, "Fused epilogues and BatchNorm folding").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import sympy
import torch
import torch.nn.functional as F

from cuvil_ir import REGISTRY
from cuvil_ir.graph_ir.nodes import Graph, Node, Value
from cuvil_ir.graph_ir.ops._rules import LIBRARY_KERNEL
from cuvil_ir.graph_ir.registry import Op
from cuvil_ir.graph_ir.types import DType, TensorType, Type
from cuvil_ir.symbolic import ShapeContext, canonical, with_equalities

#: the rules :func:`rewrite` applies (names as in :data:`RULES`)
RULES = (
    "linear_relu",
    "linear_gelu",
    "linear_gelu_tanh",
    "linear_silu",
    "linear_add",
    "conv_bn",
    "conv_relu",
    "conv_add",
)
#: measured on an AVX2 host (AMD EPYC, 2 cores; docs/cpu-backend.md): the convolution rules
#: and linear -> relu are kept; oneDNN's GELU/SiLU post-ops were slower there than a
#: separate pass, and the residual-add post-op did not pay on the transformer workloads,
#: so those rules are off until a host where they pay measures them (they stay tested:
#: tests/test_epilogues.py enables every rule)
ENABLED: frozenset[str] = frozenset({"linear_relu", "conv_bn", "conv_relu", "conv_add"})

_INTERNAL = (
    "an op of the cpu target's own graph rewrite (cuvil_backend_cpu.epilogues), made after "
    "capture and never in a captured or exported graph"
)


def _act(y: torch.Tensor, act: str) -> torch.Tensor:
    if act == "relu":
        return torch.relu(y)
    if act == "gelu":
        return F.gelu(y)
    if act == "gelu_tanh":
        return F.gelu(y, approximate="tanh")
    if act == "silu":
        return F.silu(y)
    return y


# -- the ops ----------------------------------------------------------------------------------


class LinearEpilogue(Op):
    """``act(linear(x, w, b) [+ other])``; inputs ``x, w[, b][, other]``; ``act`` one of
    ``none``, ``relu``, ``gelu``, ``gelu_tanh``, ``silu``."""

    name = "cpu_linear_epilogue"
    traits = frozenset({"extern_kernel", "pure"})
    extern_reasons = {"tensor_ir": LIBRARY_KERNEL, "mlir": _INTERNAL, "onnx": _INTERNAL}

    @staticmethod
    def infer(
        ctx: ShapeContext, x: Type, w: Type, *rest: Type, has_bias: bool, has_other: bool, act: str
    ) -> Type:
        out = REGISTRY.get("linear").infer(ctx, x, w, *rest[: int(has_bias)], has_bias=has_bias)
        assert isinstance(out, TensorType)
        if has_other and not same_type(ctx, rest[-1], out):
            raise ValueError(f"cpu_linear_epilogue: residual of type {rest[-1]}, result {out}")
        return out

    @staticmethod
    def reference(x: Any, w: Any, *rest: Any, has_bias: bool, has_other: bool, act: str) -> Any:
        y = F.linear(x, w, rest[0] if has_bias else None)
        if has_other:
            y = y + rest[-1]
        return _act(y, act)


class ConvEpilogue(Op):
    """``act(batch_norm(conv(x, w, b)) [+ other])`` of a 2-d convolution; inputs ``x, w[, b]``,
    then with ``bn``: ``mean, var[, weight][, bias]``, then ``[other]``; ``act`` is ``none``
    or ``relu``."""

    name = "cpu_conv_epilogue"
    traits = frozenset({"extern_kernel", "pure"})
    extern_reasons = {"tensor_ir": LIBRARY_KERNEL, "mlir": _INTERNAL, "onnx": _INTERNAL}

    @staticmethod
    def infer(
        ctx: ShapeContext,
        x: Type,
        w: Type,
        *rest: Type,
        stride: tuple[int, ...],
        padding: tuple[int, ...],
        dilation: tuple[int, ...],
        groups: int,
        has_bias: bool,
        bn: bool,
        eps: float,
        has_bn_weight: bool,
        has_bn_bias: bool,
        has_other: bool,
        act: str,
    ) -> Type:
        conv = REGISTRY.get("conv")
        out = conv.infer(
            ctx,
            x,
            w,
            *rest[: int(has_bias)],
            stride=stride,
            padding=padding,
            dilation=dilation,
            groups=groups,
            has_bias=has_bias,
        )
        assert isinstance(out, TensorType)
        if has_other and not same_type(ctx, rest[-1], out):
            raise ValueError(f"cpu_conv_epilogue: residual of type {rest[-1]}, result {out}")
        return out

    @staticmethod
    def reference(
        x: Any,
        w: Any,
        *rest: Any,
        stride: Sequence[int],
        padding: Sequence[int],
        dilation: Sequence[int],
        groups: int,
        has_bias: bool,
        bn: bool,
        eps: float,
        has_bn_weight: bool,
        has_bn_bias: bool,
        has_other: bool,
        act: str,
    ) -> Any:
        k = int(has_bias)
        y = F.conv2d(x, w, rest[0] if has_bias else None, stride, padding, dilation, groups)
        if bn:
            mean, var = rest[k], rest[k + 1]
            g = rest[k + 2] if has_bn_weight else None
            beta = rest[k + 2 + int(has_bn_weight)] if has_bn_bias else None
            y = F.batch_norm(y, mean, var, g, beta, training=False, momentum=0.0, eps=eps)
        if has_other:
            y = y + rest[-1]
        return _act(y, act)


# -- the rewrite -------------------------------------------------------------------------------


def is_f32(v: Value) -> bool:
    t = v.type
    return isinstance(t, TensorType) and t.dtype == DType.f32 and t.device == "cpu"


def _rank(v: Value) -> int | None:
    return v.type.rank if isinstance(v.type, TensorType) else None


def uses(graph: Graph) -> Counter[str]:
    """How many times each value is read (:meth:`Graph.use_counts`)."""
    return graph.use_counts()


def same_type(ctx: ShapeContext, a: Type, b: Type) -> bool:
    """Tensors of one dtype and device whose sizes are provably equal under the graph's
    assumptions (an input's ``x_1`` pinned by ``Eq(x_1, 256)`` equals a linear's 256; ``k_2``
    equals ``q_2`` when the assumptions make them equal, :func:`context`): oneDNN's binary
    post-op wants the residual of exactly the result's shape."""
    if not (isinstance(a, TensorType) and isinstance(b, TensorType)):
        return False
    if (a.dtype, a.device, a.rank) != (b.dtype, b.device, b.rank):
        return False
    return all(
        x == y or ctx.prove(sympy.Eq(x, y)) is True or canonical(sympy.Eq(x, y)) in ctx.assumptions
        for x, y in zip(a.shape, b.shape)
    )


def context(graph: Graph) -> ShapeContext:
    """What the rewrites prove sizes with: the graph's assumptions, plus ``Eq(a, b)`` for
    every two sizes they make equal through others (``with_equalities``)."""
    return ShapeContext(assumptions=with_equalities(graph.assumptions))


def _activation(n: Node) -> str | None:
    if n.op in ("relu", "silu"):
        return n.op
    if n.op == "gelu":
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(str(n.attr("approximate")))
    return None


def rewrite(graph: Graph, enabled: frozenset[str] | None = None) -> Graph:
    """``graph`` with the chains of the module doc fused (top-level nodes only; the graph
    itself when no rule applies). Deterministic: same graph, same result."""
    rules = ENABLED if enabled is None else enabled
    if not rules or not any(n.op in ("linear", "conv") for n in graph.nodes):
        return graph
    count = uses(graph)
    ctx = context(graph)
    inputs = {v.name for v in graph.inputs}
    nodes = list(graph.nodes)
    #: value name -> the indices of the top-level nodes that read it
    user: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        for v in n.inputs:
            user.setdefault(v.name, []).append(i)

    def sole_user(v: Value) -> tuple[int, Node] | None:
        """The one node reading ``v`` once, when nothing else reads it."""
        if count[v.name] != 1 or len(user.get(v.name, ())) != 1:
            return None
        i = user[v.name][0]
        if i in removed or i in replaced:  # already in an earlier chain
            return None
        return i, nodes[i]

    def residual(n: Node, v: Value) -> Value | None:
        """The other operand of ``add(v, r)`` / ``add(r, v)``, of ``v``'s exact type."""
        if n.op != "add" or len(n.inputs) != 2 or n.attrs:
            return None
        a, b = n.inputs
        r = b if a == v else a if b == v else None
        if (
            r is None
            or r == v
            or not (same_type(ctx, r.type, v.type) and same_type(ctx, n.output.type, v.type))
        ):
            return None
        return r

    removed: set[int] = set()
    replaced: dict[int, Node] = {}
    for i, n in enumerate(nodes):
        if i in removed or i in replaced or len(n.outputs) != 1 or not is_f32(n.output):
            continue
        if n.op == "linear" and all(is_f32(v) for v in n.inputs) and _rank(n.inputs[1]) == 2:
            fused = _linear_chain(n, i, rules, sole_user, residual)
        elif n.op == "conv" and _rank(n.inputs[1]) == 4 and not isinstance(n.attr("padding"), str):
            fused = _conv_chain(n, i, rules, sole_user, residual, inputs)
        else:
            continue
        if fused is None:
            continue
        chain, node = fused
        removed.update(chain[:-1])
        replaced[chain[-1]] = node
    if not replaced:
        return graph
    out = [replaced.get(i, n) for i, n in enumerate(nodes) if i not in removed]
    return graph.replace(nodes=tuple(out))


def _linear_chain(
    n: Node, i: int, rules: frozenset[str], sole_user: Any, residual: Any
) -> tuple[list[int], Node] | None:
    has_bias = bool(n.attr("has_bias"))
    nxt = sole_user(n.output)
    if nxt is None:
        return None
    j, m = nxt
    act = _activation(m)
    if act is not None and f"linear_{act}" in rules and is_f32(m.output):
        attrs = {"has_bias": has_bias, "has_other": False, "act": act}
        return [i, j], Node("cpu_linear_epilogue", n.inputs, m.outputs, tuple(attrs.items()), loc=n.loc)
    r = residual(m, n.output)
    if r is not None and "linear_add" in rules:
        attrs = {"has_bias": has_bias, "has_other": True, "act": "none"}
        return [i, j], Node("cpu_linear_epilogue", (*n.inputs, r), m.outputs, tuple(attrs.items()), loc=n.loc)
    return None


def _conv_chain(
    n: Node, i: int, rules: frozenset[str], sole_user: Any, residual: Any, inputs: set[str]
) -> tuple[list[int], Node] | None:
    conv_attrs = n.attr_dict
    chain = [i]
    ins: list[Value] = list(n.inputs)
    cur = n.output
    attrs: dict[str, Any] = {
        "stride": conv_attrs["stride"],
        "padding": conv_attrs["padding"],
        "dilation": conv_attrs["dilation"],
        "groups": conv_attrs["groups"],
        "has_bias": bool(conv_attrs["has_bias"]),
        "bn": False,
        "eps": 0.0,
        "has_bn_weight": False,
        "has_bn_bias": False,
        "has_other": False,
        "act": "none",
    }
    nxt = sole_user(cur)
    if (
        nxt is not None
        and "conv_bn" in rules
        and nxt[1].op == "batch_norm"
        and nxt[1].inputs[0] == cur
        # parameters and statistics are graph inputs: folded once per version, not per call
        and all(v.name in inputs for v in (*n.inputs[1:], *nxt[1].inputs[1:]))
    ):
        j, bn = nxt
        chain.append(j)
        ins += bn.inputs[1:]
        attrs.update(
            bn=True,
            eps=float(bn.attr("eps")),  # type: ignore[arg-type]
            has_bn_weight=bool(bn.attr("has_weight")),
            has_bn_bias=bool(bn.attr("has_bias")),
        )
        cur = bn.output
        nxt = sole_user(cur)
    if nxt is not None and "conv_add" in rules:
        r = residual(nxt[1], cur)
        if r is not None:
            chain.append(nxt[0])
            ins.append(r)
            attrs["has_other"] = True
            cur = nxt[1].output
            nxt = sole_user(cur)
    if nxt is not None and "conv_relu" in rules and nxt[1].op == "relu":
        chain.append(nxt[0])
        attrs["act"] = "relu"
        cur = nxt[1].output
    if len(chain) == 1:
        return None
    return chain, Node("cpu_conv_epilogue", tuple(ins), (cur,), tuple(attrs.items()), loc=n.loc)
