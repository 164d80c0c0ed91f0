"""The reference executor against eager torch, on Graph IR built by hand."""

from __future__ import annotations

from typing import Any

import pytest
import sympy
import torch

from cuvil_ir import (
    KV,
    Block,
    DType,
    Graph,
    Node,
    Ref,
    ScalarKind,
    ScalarType,
    TensorType,
    Type,
    Value,
    symbol,
    verify,
)
from cuvil_runtime.executor import AssumptionError, Interpreter
from cuvil_runtime.registry import get_target
from cuvil_runtime.target import CompileOptions

B, S = symbol("B"), symbol("S")
F32 = DType.f32


def f32(*shape: Any) -> TensorType:
    return TensorType(F32, shape)


class Builder:
    """Appends nodes and numbers their results, so a test reads like the program."""

    def __init__(self, *inputs: tuple[str, Type]) -> None:
        self.inputs = tuple(Value(name, t) for name, t in inputs)
        self.nodes: list[Node] = []

    def __call__(self, op: str, inputs: tuple[Value, ...], *types: Type, **attrs: Any) -> Any:
        outs = tuple(Value(f"v{len(self.nodes)}_{i}", t) for i, t in enumerate(types))
        self.nodes.append(Node(op, inputs, outs, tuple(attrs.items())))
        return outs[0] if len(outs) == 1 else outs

    def graph(self, *outputs: Value, assumptions: tuple[sympy.Basic, ...] = ()) -> Graph:
        return verify(Graph("f", self.inputs, tuple(self.nodes), outputs, assumptions))


def extern(target: str, args: Any, kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"target": target, "args": args, "kwargs": KV.of(kwargs or {}), "mutates": None}


def test_symbolic_elementwise_graph_matches_eager_at_two_sizes() -> None:
    b = Builder(("x", f32(B, 16)), ("y", f32(16)))
    x, y = b.inputs
    two = b("const", (), ScalarType(ScalarKind.float), value=2.0)
    s = b("add", (x, y), f32(B, 16))
    p = b("mul", (s, two), f32(B, 16))
    r = b("relu", (b("sub", (p, x), f32(B, 16)),), f32(B, 16))
    # Broadcasting two B-sized dims relies on B != 1: the graph records it.
    run = Interpreter(b.graph(r, p, assumptions=(sympy.Ne(B, 1),)))

    for batch in (3, 7):
        xt, yt = torch.randn(batch, 16), torch.randn(16)
        out = run(xt, yt)
        assert isinstance(out, tuple) and len(out) == 2
        torch.testing.assert_close(out[0], torch.relu((xt + yt) * 2.0 - xt))
        torch.testing.assert_close(out[1], (xt + yt) * 2.0)


def test_size_expressions_in_extern_attributes_are_evaluated_per_call() -> None:
    # reshape to (B*S,) and narrow to the first B*S - 1 elements: the sizes live in
    # attributes (in a tuple and in a KV) and differ on every call.
    b = Builder(("x", f32(B, S)))
    (x,) = b.inputs
    flat = b("extern", (x,), f32(B * S), **extern("torch.Tensor.reshape", (Ref(0), (B * S,))))
    head = b(
        "extern",
        (flat,),
        f32(B * S - 1),
        **extern("torch.narrow", (Ref(0),), {"dim": 0, "start": 0, "length": B * S - 1}),
    )
    run = Interpreter(b.graph(head))
    for shape in ((2, 3), (5, 4)):
        xt = torch.randn(shape)
        (out,) = run(xt)
        torch.testing.assert_close(out, xt.reshape(-1)[:-1])


def test_multi_output_extern() -> None:
    b = Builder(("x", f32(B, 4)))
    (x,) = b.inputs
    lo, hi = b("extern", (x,), f32(B, 2), f32(B, 2), **extern("torch.split", (Ref(0), 2), {"dim": 1}))
    run = Interpreter(b.graph(b("sub", (hi, lo), f32(B, 2)), assumptions=(sympy.Ne(B, 1),)))
    xt = torch.randn(6, 4)
    torch.testing.assert_close(run(xt)[0], xt[:, 2:] - xt[:, :2])


def test_scalar_graph_input() -> None:
    b = Builder(("x", f32(B)), ("alpha", ScalarType(ScalarKind.float)))
    x, alpha = b.inputs
    run = Interpreter(b.graph(b("mul", (x, alpha), f32(B))))
    xt = torch.randn(5)
    torch.testing.assert_close(run(xt, 0.5)[0], xt * 0.5)
    torch.testing.assert_close(run(xt, 3)[0], xt * 3)  # an int is a valid float scalar
    with pytest.raises(TypeError, match=r"input 1 \(%alpha: Scalar\[float\]\): expected a Python scalar"):
        run(xt, torch.tensor(0.5))


def test_graph_returning_an_input_and_the_reference_target() -> None:
    b = Builder(("x", f32(B)))
    (x,) = b.inputs
    graph = b.graph(x, b("neg", (x,), f32(B)))
    exe = get_target("reference").compile(graph, CompileOptions())
    xt = torch.randn(4)
    same, neg = exe(xt)
    assert same is xt
    torch.testing.assert_close(neg, -xt)


def test_rank_mismatch_is_a_type_error() -> None:
    b = Builder(("x", f32(B, 16)))
    run = Interpreter(b.graph(b("neg", b.inputs, f32(B, 16))))
    with pytest.raises(TypeError, match=r"input 0 \(%x: .*\): expected a rank-2 tensor, got rank 1"):
        run(torch.randn(16))


def test_dtype_mismatch_is_a_type_error() -> None:
    b = Builder(("x", f32(B)))
    run = Interpreter(b.graph(b("neg", b.inputs, f32(B))))
    with pytest.raises(TypeError, match="expected dtype torch.float32, got torch.float64"):
        run(torch.randn(3, dtype=torch.float64))


def test_static_dimension_mismatch() -> None:
    b = Builder(("x", f32(B, 16)))
    run = Interpreter(b.graph(b("neg", b.inputs, f32(B, 16))))
    with pytest.raises(ValueError, match="dim 1 must be 16, got 8"):
        run(torch.randn(2, 8))


def test_inconsistent_symbol_binding_names_both_inputs() -> None:
    b = Builder(("x", f32(B, 16)), ("z", f32(B, 16)))
    x, z = b.inputs
    run = Interpreter(b.graph(b("add", (x, z), f32(B, 16)), assumptions=(sympy.Ne(B, 1),)))
    with pytest.raises(ValueError, match=r"size symbol B is 3 in input 0 \(%x.*dim 0 but 4 in input 1 \(%z"):
        run(torch.randn(3, 16), torch.randn(4, 16))


def test_wrong_number_of_inputs() -> None:
    b = Builder(("x", f32(B)))
    run = Interpreter(b.graph(b("neg", b.inputs, f32(B))))
    with pytest.raises(TypeError, match=r"takes 1 inputs \(%x\), got 2"):
        run(torch.randn(2), torch.randn(2))


def test_violated_assumption_is_reported() -> None:
    b = Builder(("x", f32(B)))
    graph = b.graph(b("neg", b.inputs, f32(B)), assumptions=(sympy.Ne(B, 1),))
    run = Interpreter(graph)
    run(torch.randn(2))
    with pytest.raises(AssumptionError, match=r"assuming Ne\(B, 1\).*B=1"):
        run(torch.randn(1))


def test_regions_on_an_op_without_control_flow_are_rejected_at_construction() -> None:
    x = Value("x", f32(B))
    y = Value("y", f32(B))
    body = Block((), (), (x,))
    graph = Graph("g", (x,), (Node("neg", (x,), (y,), regions=(body,)),), (y,))
    with pytest.raises(NotImplementedError, match="runs only well-formed if, for and while"):
        Interpreter(graph)


def test_reference_errors_name_the_failing_node() -> None:
    b = Builder(("x", f32(B, 4)))
    (x,) = b.inputs
    bad = b("extern", (x,), f32(B, 3), **extern("torch.Tensor.reshape", (Ref(0), (B, 3))))
    run = Interpreter(b.graph(bad))
    with pytest.raises(RuntimeError) as err:
        run(torch.randn(2, 4))
    assert any("while running extern in graph @f" in note for note in err.value.__notes__)


def test_attribute_with_an_unbound_symbol_is_rejected_at_construction() -> None:
    x = Value("x", f32(B))
    y = Value("y", f32(S))
    node = Node("extern", (x,), (y,), tuple(extern("torch.Tensor.reshape", (Ref(0), (S,))).items()))
    with pytest.raises(ValueError, match="uses size symbols S, which no graph input binds"):
        Interpreter(Graph("g", (x,), (node,), (y,)))
