"""Passes as named objects (cuvil_ir.passes) and the Tensor IR verifier (tensor_ir/verify.py).

A pipeline runs its passes in order, reports each to the pass trace (what CUVIL_DUMP
writes), and with verification on names the pass whose output its level's verifier
rejects. The Tensor IR verifier accepts what lowering produces and rejects each kind
of broken program with a message naming the step."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

import cuvil_ir as ir
from cuvil_ir.graph_ir.verifier import verify as verify_graph
from cuvil_ir.passes import Pass, PassError, Pipeline, tracing
from cuvil_ir.symbolic import symbol
from cuvil_ir.tensor_ir import expr as E
from cuvil_ir.tensor_ir import lower
from cuvil_ir.tensor_ir.program import Buffer
from cuvil_ir.tensor_ir.verify import TensorVerifyError, verify

X0 = symbol("x_0")
F32 = ir.DType.f32
LOWER = importlib.import_module("cuvil_ir.tensor_ir.lower")


def t(*shape):
    return ir.TensorType(F32, shape)


def graph(ops=("relu",)):
    x = ir.Value("x", t(X0, 4))
    c = ir.Value("c", ir.ScalarType(ir.ScalarKind.float))
    a = ir.Value("a", t(X0, 4))
    nodes = [ir.Node("const", (), (c,), (("value", 1.0),)), ir.Node("add", (x, c), (a,))]
    last = a
    for k, op in enumerate(ops):
        out = ir.Value(f"o{k}", t(X0, 4))
        nodes.append(ir.Node(op, (last,), (out,)))
        last = out
    return verify_graph(ir.Graph("f", (x,), tuple(nodes), (last,), ()))


def test_a_pipeline_runs_its_passes_in_order_and_traces_each():
    seen = []
    double = Pass("double", lambda v: v * 2)
    inc = Pass("inc", lambda v: v + 1)
    p = Pipeline("numbers", [double, inc])
    assert p.names == ("double", "inc")
    with tracing(lambda level, name, value: seen.append((level, name, value))):
        assert p(3) == 7
    assert seen == [("numbers", "double", 6), ("numbers", "inc", 7)]
    assert p(3) == 7 and len(seen) == 2  # outside the context: no trace
    with pytest.raises(ValueError, match="repeat"):
        Pipeline("numbers", [inc, inc])


def _drop_first_add(g):
    """A broken rewrite: removes the node that defines a value later nodes use."""
    return dataclasses.replace(g, nodes=tuple(n for n in g.nodes if n.op != "add"))


def test_a_pass_that_breaks_graph_ir_is_named():
    p = Pipeline("graph_ir", [Pass("identity", lambda g: g), Pass("drop_add", _drop_first_add)], verify_graph)
    g = graph()
    p(g, verify=False)  # unchecked, the broken graph goes on
    with pytest.raises(PassError, match="graph_ir pass 'drop_add' produced invalid IR"):
        p(g, verify=True)


def test_verification_follows_the_environment(monkeypatch):
    p = Pipeline("graph_ir", [Pass("drop_add", _drop_first_add)], verify_graph)
    monkeypatch.setenv("CUVIL_VERIFY_PASSES", "0")
    p(graph())
    monkeypatch.setenv("CUVIL_VERIFY_PASSES", "1")
    with pytest.raises(PassError):
        p(graph())


def test_lowering_is_a_pipeline_and_its_output_verifies():
    assert LOWER.GRAPH_PASSES.names == ("specialize",)
    assert LOWER.TENSOR_PASSES.names == ("plan_memory",)
    seen = []
    with tracing(lambda level, name, value: seen.append((level, name))):
        program = lower(graph(("relu", "exp", "neg")))
    assert seen == [("graph_ir", "specialize"), ("tensor_ir", "lower"), ("tensor_ir", "plan_memory")]
    assert verify(program) is program


def _program():
    return lower(graph(("relu",)))


def _with_body(program, body, **buffers):
    (k,) = program.steps
    return dataclasses.replace(
        program,
        steps=(dataclasses.replace(k, body=body),),
        buffers={**program.buffers, **buffers},
    )


def _arg_load(program):
    (inp,) = [i.name for i in program.inputs if i.is_tensor]
    return E.Load(inp, 4 * E.index_symbol(0) + E.index_symbol(1), F32)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p: _with_body(p, E.Load("nowhere", E.index_symbol(0), F32)), "undeclared buffer %nowhere"),
        (
            lambda p: _with_body(
                p, E.Load("tmp", E.index_symbol(0), F32), tmp=Buffer("tmp", F32, (X0, 4), "temp")
            ),
            "reads %tmp before any step writes it",
        ),
        (
            lambda p: _with_body(p, E.Call("exp", (_arg_load(p), _arg_load(p)), F32)),
            "calls exp with 2 arguments",
        ),
        (
            lambda p: _with_body(p, E.Call("frobnicate", (_arg_load(p),), F32)),
            "unknown function 'frobnicate'",
        ),
        (
            lambda p: _with_body(p, E.Load(_arg_load(p).buf, E.index_symbol(2), F32)),
            "loop symbol _i2 outside its range",
        ),
        (lambda p: _with_body(p, E.Arg("k", F32)), "reads the scalar k"),
        (
            lambda p: _with_body(p, E.Reduce("mean", _arg_load(p), ((E.reduce_symbol(0), 4),), F32)),
            "unknown reduction 'mean'",
        ),
        (
            lambda p: dataclasses.replace(p, steps=(dataclasses.replace(p.steps[0], domain=(X0,)),)),
            "domain of rank 1",
        ),
        (lambda p: dataclasses.replace(p, steps=()), "output 0: %b0 is never written"),
        (lambda p: dataclasses.replace(p, steps=(p.steps[0], p.steps[0])), "used twice"),
    ],
)
def test_the_tensor_ir_verifier_rejects_a_broken_program(damage, message):
    program = _program()
    verify(program)
    with pytest.raises(TensorVerifyError, match=message) as e:
        verify(damage(program))
    assert "program f" in str(e.value)


def test_a_reduce_binds_its_own_symbol():
    program = _program()
    r = E.reduce_symbol(0)
    inp = _arg_load(program).buf
    body = E.Reduce("sum", E.Load(inp, 4 * E.index_symbol(0) + r, F32), ((r, 4),), F32)
    verify(_with_body(program, body))  # _r0 is bound inside the Reduce
    with pytest.raises(TensorVerifyError, match="_r0 outside its range"):
        verify(_with_body(program, E.Load(inp, 4 * E.index_symbol(0) + r, F32)))
