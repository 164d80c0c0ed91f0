"""Every registered op reaches every consumer of Graph IR in this package.

For each op and each consumer -- Tensor IR lowering, MLIR emission -- one of: the
consumer has a native form of it (a rule, an emitter), the op declares a decomposition
(:mod:`cuvil_ir.graph_ir.decompose`) the consumer lowers instead, or the declaration
states why the consumer runs it as an extern (``Op.extern_reasons``). An op without any
of these would silently become an extern call. An elementwise primitive whose scalar
function has a decomposition (``cuvil_ir.scalar_functions``) is emitted by MLIR from it. ONNX export is checked the same way in
``packages/cuvil-core/tests/test_onnx_coverage.py``.
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Callable, Iterator, Mapping

import pytest

from cuvil_ir import REGISTRY
from cuvil_ir.graph_ir.decompose import Builder, Sym, expand
from cuvil_ir.graph_ir.registry import Op


def missing(consumer: str, native: Callable[[str], bool]) -> list[str]:
    """Ops ``consumer`` neither lowers natively, nor by decomposition, nor states a reason for."""
    out = []
    for name in REGISTRY.names():
        op = REGISTRY.get(name)
        if not (native(name) or op.decompose is not None or consumer in op.extern_reasons):
            out.append(name)
    return out


def tensor_ir_native(name: str) -> bool:
    from cuvil_ir.tensor_ir.rules import RULES

    op = REGISTRY.get(name)
    # a declared scalar function: its rule is derived (cuvil_ir.tensor_ir.rules.scalar);
    # control flow: Lowering lowers the regions of if/for/while itself (lower_control)
    return dict.__contains__(RULES, name) or op.scalar is not None or "control_flow" in op.traits


def operand_count(op: type[Op]) -> int:
    """The number of operands ``op.infer`` takes (its positional parameters after ``ctx``)."""
    params = list(inspect.signature(op.infer).parameters.values())[1:]
    return sum(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)


def bad_scalars(functions: Mapping[str, int]) -> list[str]:
    """Ops whose declared scalar function is not a Tensor IR function (a name of
    ``functions``, as :data:`cuvil_ir.tensor_ir.expr.FUNCTIONS`) of one argument per
    operand, or that declare one without being elementwise."""
    out = []
    for name in REGISTRY.names():
        op = REGISTRY.get(name)
        fn = op.scalar
        if fn is None:
            continue
        if fn not in functions or functions[fn] != operand_count(op) or "elementwise" not in op.traits:
            out.append(f"{name}: {fn}")
    return out


def mlir_native(name: str) -> bool:
    from cuvil_ir.mlir.emit import _ELEMENTWISE, _REDUCTIONS, _Emitter, mlir_fallback

    # a primitive MLIR has no emitter for (sdpa) is emitted from its fallback decomposition
    native = hasattr(_Emitter, f"op_{name}") or name in _ELEMENTWISE or name in _REDUCTIONS
    return native or mlir_fallback(name) is not None


def test_every_op_lowers_to_tensor_ir_or_says_why_not() -> None:
    assert not missing("tensor_ir", tensor_ir_native), (
        "ops without a Tensor IR rule, a decomposition or extern_reasons['tensor_ir']"
    )


def test_every_op_emits_mlir_or_says_why_not() -> None:
    assert not missing("mlir", mlir_native), (
        "ops without an MLIR emitter, a decomposition or extern_reasons['mlir']"
    )


def test_every_declared_scalar_is_a_tensor_ir_function() -> None:
    from cuvil_ir.tensor_ir.expr import FUNCTIONS

    assert not bad_scalars(FUNCTIONS), (
        "Op.scalar must name a function of expr.FUNCTIONS, one argument per operand"
    )
    # the hand tables this replaced: an op that names its function has no rule written out
    assert REGISTRY.get("maximum").scalar == "max" and REGISTRY.get("exp").scalar == "exp"
    assert REGISTRY.get("silu").scalar is None  # a composite: lowered from its decomposition


def test_a_bad_scalar_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: a function missing from FUNCTIONS, a misspelt one, one of the
    wrong arity, or one declared by an op that is not elementwise."""
    from cuvil_ir.tensor_ir.expr import FUNCTIONS

    assert bad_scalars({k: v for k, v in FUNCTIONS.items() if k != "exp"}) == ["exp: exp"]
    monkeypatch.setattr(REGISTRY.get("maximum"), "scalar", "maximum")
    monkeypatch.setattr(REGISTRY.get("neg"), "scalar", "add")
    monkeypatch.setattr(REGISTRY.get("matmul"), "scalar", "mul")
    assert bad_scalars(FUNCTIONS) == ["matmul: mul", "maximum: maximum", "neg: add"]


def test_the_rule_of_a_scalar_op_is_its_function() -> None:
    """An op that declares ``scalar`` lowers to one call of that function of its
    operands' elements (a comparison in the operands' promoted dtype)."""
    from cuvil_ir import parse_graph
    from cuvil_ir.tensor_ir.lower import lower

    g = parse_graph(
        "graph @f(%x: Tensor[f32, (4,), cpu], %y: Tensor[i64, (4,), cpu]) {\n"
        "  %0 = maximum(%x, %x) : Tensor[f32, (4,), cpu]\n"
        "  %1 = lt(%0, %y) : Tensor[bool, (4,), cpu]\n"
        "  return %1\n}"
    )
    assert "lt(max(%in0[_i0], %in0[_i0]), cast<f32>(%in1[_i0]))" in lower(g).text


def test_reasons_name_known_consumers() -> None:
    for name in REGISTRY.names():
        assert set(REGISTRY.get(name).extern_reasons) <= {"tensor_ir", "mlir", "onnx"}, name


def test_a_missing_entry_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: an op that loses its decomposition (gelu has no Tensor IR
    rule or MLIR emitter of its own) or its stated reason (matmul) is reported."""
    gelu, matmul = REGISTRY.get("gelu"), REGISTRY.get("matmul")
    monkeypatch.setattr(gelu, "decompose", None)
    monkeypatch.setattr(matmul, "extern_reasons", {})
    assert missing("tensor_ir", tensor_ir_native) == ["gelu", "matmul"]
    assert missing("mlir", mlir_native) == ["gelu"]


@pytest.fixture
def tanhshrink() -> Iterator[type[Op]]:
    """``tanhshrink`` declared the way a new elementwise op is: its declaration with its
    decomposition, nothing else (removed again afterwards: the registry keeps no copy)."""
    import torch.nn.functional as F

    from cuvil_ir.graph_ir.ops.elementwise import unary

    def decompose(b: Builder, x: Sym) -> Sym:
        return x - x.tanh()

    assert "tanhshrink" not in REGISTRY
    op = unary("tanhshrink", lambda: (F.tanhshrink,), F.tanhshrink, floating=True, decompose=decompose)
    try:
        yield op
    finally:
        REGISTRY._ops.pop("tanhshrink")  # test-only: the registry has no unregistering
        REGISTRY._origin.pop("tanhshrink")
        REGISTRY._by_torch = None


def test_a_new_elementwise_op_needs_only_its_declaration(tanhshrink: type[Op]) -> None:
    """Declared once (see the fixture), tanhshrink is captured, lowered to one fused CPU
    kernel and emitted to MLIR; no consumer was edited."""
    import torch
    import torch.nn.functional as F

    from cuvil_ir import parse_graph
    from cuvil_ir.tensor_ir.lower import lower
    from cuvil_ir.tensor_ir.program import Kernel
    from cuvil_ir.testing import In, OpCase, check_case, spec

    assert not tensor_ir_native("tanhshrink") and not mlir_native("tanhshrink")
    assert "tanhshrink" not in missing("tensor_ir", tensor_ir_native) + missing("mlir", mlir_native)
    check_case(OpCase("tanhshrink", F.tanhshrink, (In(0),), (spec(4, 5),), ops=frozenset({"tanhshrink"})))

    g = parse_graph(
        "graph @f(%x: Tensor[f32, (x_0, 8), cpu]) {\n"
        "  %0 = tanhshrink(%x) : Tensor[f32, (x_0, 8), cpu]\n"
        "  %1 = exp(%0) : Tensor[f32, (x_0, 8), cpu]\n"
        "  return %1\n}"
    )
    p = lower(g)
    assert [type(s) for s in p.steps] == [Kernel], p.text  # tanhshrink and exp fused, no extern
    assert "tanh" in p.text and "sub" in p.text

    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))
    expand(g.nodes[0])  # the mechanism every consumer uses
    if importlib.util.find_spec("torch_mlir") is not None:
        from cuvil_ir.mlir import run_mlir

        (y,) = run_mlir(g, x)
        torch.testing.assert_close(y, F.tanhshrink(x).exp())


def test_a_new_primitive_elementwise_op_needs_only_its_declaration() -> None:
    """A primitive naming a scalar function Tensor IR has (here ``sqrt``, under another op
    name) is lowered from its declaration alone, even declared after the rule table was
    filled, as a plugin's op is: no rule is written for it."""
    import torch

    from cuvil_ir import parse_graph
    from cuvil_ir.graph_ir.ops.elementwise import unary
    from cuvil_ir.tensor_ir.lower import lower
    from cuvil_ir.tensor_ir.program import Kernel
    from cuvil_ir.tensor_ir.rules import RULES

    assert "square_root" not in REGISTRY
    op = unary("square_root", tuple, torch.sqrt, floating=True, scalar="sqrt")
    try:
        assert not dict.__contains__(RULES, "square_root") and RULES.get("square_root") is not None
        assert "square_root" not in missing("tensor_ir", tensor_ir_native) + bad_scalars(_functions())
        g = parse_graph(
            "graph @f(%x: Tensor[f32, (x_0, 8), cpu]) {\n"
            "  %0 = square_root(%x) : Tensor[f32, (x_0, 8), cpu]\n"
            "  return %0\n}"
        )
        p = lower(g)
        assert [type(s) for s in p.steps] == [Kernel] and "sqrt(%in0[" in p.text, p.text
    finally:
        REGISTRY._ops.pop(op.name)  # test-only: the registry has no unregistering
        REGISTRY._origin.pop(op.name)
        REGISTRY._by_torch = None


def _functions() -> Mapping[str, int]:
    from cuvil_ir.tensor_ir.expr import FUNCTIONS

    return FUNCTIONS


def _with_decomposition(monkeypatch: pytest.MonkeyPatch, fn: str, text: str) -> None:
    """``fn`` given the decomposition ``text`` for one test (the parse cache too)."""
    import dataclasses
    import functools

    from cuvil_ir import scalar_functions

    row = dataclasses.replace(scalar_functions.TABLE[fn], decomposition=text)
    monkeypatch.setitem(scalar_functions.TABLE, fn, row)
    monkeypatch.setattr(scalar_functions, "_parsed", functools.cache(scalar_functions._parsed.__wrapped__))


def test_every_decomposition_calls_functions_of_the_table() -> None:
    """[Note: scalar decompositions]: each calls functions of the table with their arity,
    each of them computed by some primitive op (what MLIR and ONNX emit it with)."""
    from cuvil_ir import scalar_functions
    from cuvil_ir.graph_ir.scalar_decompositions import op_computing

    for fn in scalar_functions.TABLE:
        if scalar_functions.decomposed(fn):
            for name, n in scalar_functions.calls(fn):
                assert scalar_functions.TABLE[name].arity == n, (fn, name)
                assert op_computing(name), (fn, name)


def test_a_decomposition_names_only_table_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    from cuvil_ir import scalar_functions

    _with_decomposition(monkeypatch, "asinh", "log(x) ** 2")
    with pytest.raises(ValueError, match=r"log\(x\) \*\* 2 is not a scalar expression"):
        scalar_functions.calls("asinh")


def test_mlir_emits_a_function_without_a_math_op_from_its_decomposition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """asinh without its rule is not emitted; with the function's decomposition and the
    generic rule, one generic computing log(x + sqrt(x*x + 1)) (run: x >= 0)."""
    pytest.importorskip("torch_mlir")
    import torch

    from cuvil_ir import parse_graph
    from cuvil_ir.mlir import MlirError, elementwise, run_mlir
    from cuvil_ir.mlir.emit import to_mlir_text

    g = parse_graph(
        "graph @g(%x: Tensor[f32, (4, 3), cpu]) {\n"
        "  %0 = asinh(%x) : Tensor[f32, (4, 3), cpu]\n"
        "  return %0\n}"
    )
    monkeypatch.delitem(elementwise.ARITH, "asinh")
    with pytest.raises(MlirError, match="asinh is not emitted"):
        to_mlir_text(g)
    _with_decomposition(monkeypatch, "asinh", "log(x + sqrt(x * x + 1))")
    monkeypatch.setitem(elementwise.ARITH, "asinh", elementwise.from_decomposition)
    text, externs = to_mlir_text(g)
    assert not externs and "math.asinh" not in text and "math.sqrt" in text and "math.log" in text
    x = torch.rand(4, 3) * 4
    (y,) = run_mlir(g, x)
    torch.testing.assert_close(y, torch.asinh(x))
