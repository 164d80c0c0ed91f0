"""One sympy -> arithmetic walk, one floor semantics: every consumer of
:class:`cuvil_ir.size_visitor.SizeVisitor` against Python on negative operands.

[Note: size division semantics] says floor division rounds toward -inf and ``%`` takes the
divisor's sign. Each case below is a size expression that is negative for small ``x``
(``floor((x - 7)/3)`` at ``x = 0`` is -3; truncation gives -2), run through exact Python
(``exact_code``), C (gcc), the Triton text, MLIR (the ExecutionEngine) and ONNX
(onnxruntime), and compared with the Python lambda beside it. A consumer that truncated
anywhere fails here.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sympy

from cuvil_ir.size_visitor import SizeVisitor, integer_valued, quotient
from cuvil_ir.symbolic import EXACT_NAMESPACE, exact_code, expr_str, symbol
from cuvil_ir.tensor_ir import expr as E

X = symbol("x_0")
#: the loop index the C and Triton index text prints inline (a size is a derived argument)
IDX = E.index_symbol(0)
XS = range(0, 16)


def _cases() -> list[tuple[Any, Callable[[int], int]]]:
    x = X
    return [
        (sympy.floor((x - 7) / 3), lambda a: (a - 7) // 3),
        (sympy.floor((7 - 2 * x) / 5), lambda a: (7 - 2 * a) // 5),
        (sympy.Mod(x - 5, 3), lambda a: (a - 5) % 3),
        (sympy.Mod(2 - x, 3), lambda a: (2 - a) % 3),
        (sympy.Mod(x - 5, -3), lambda a: (a - 5) % -3),
        (sympy.ceiling((2 - x) / 4), lambda a: -((a - 2) // 4)),
        (sympy.ceiling((x - 9) / 4), lambda a: -((9 - a) // 4)),
        (sympy.Min(x - 9, 2 - x), lambda a: min(a - 9, 2 - a)),
        (
            sympy.Max(x - 9, 3 - 2 * x, sympy.floor((x - 11) / 2)),
            lambda a: max(a - 9, 3 - 2 * a, (a - 11) // 2),
        ),
        (
            sympy.Piecewise((sympy.floor((x - 7) / 3), x < 4), (sympy.Mod(2 - x, 3), True)),
            lambda a: (a - 7) // 3 if a < 4 else (2 - a) % 3,
        ),
        (
            sympy.Piecewise((x - 3, sympy.And(x > 2, sympy.Ne(x, 5))), (sympy.ceiling((3 - x) / 2), True)),
            lambda a: a - 3 if (a > 2 and a != 5) else -((a - 3) // 2),
        ),
        (sympy.floor((x - 7) / 2) * 3 + sympy.Mod(x - 7, 5), lambda a: (a - 7) // 2 * 3 + (a - 7) % 5),
    ]


CASES = _cases()


def _check(values: Callable[[int], list[int]], who: str) -> None:
    wrong = []
    for a in XS:
        got = values(a)
        for (e, py), g in zip(CASES, got):
            if int(g) != py(a):
                wrong.append(f"{who}: {expr_str(e)} at x = {a} gives {int(g)}, Python {py(a)}")
    assert not wrong, "\n".join(wrong[:20])


def test_the_cases_tell_floor_from_truncation() -> None:
    """Each division case differs between Python's floor and truncation somewhere in XS."""

    def trunc_div(a: int, b: int) -> int:
        return int(a / b)

    assert trunc_div(0 - 7, 3) != (0 - 7) // 3 and (2 - 4) % 3 != int(np.fmod(2 - 4, 3))
    for e, py in CASES:
        assert any(py(a) < 0 for a in XS) or e.has(sympy.Mod), expr_str(e)


def test_the_visitor_decomposes_into_its_hooks() -> None:
    """A visitor that records the abstract operations: floor of a sum of fractions is one
    floordiv of one quotient, ceiling a ceildiv, Piecewise selects from its last branch."""

    class Ops(SizeVisitor[str]):
        def on_integer(self, value: int) -> str:
            return str(value)

        def on_symbol(self, s: sympy.Symbol, ctx: Any) -> str:
            return s.name

        def on_add(self, a: str, b: str) -> str:
            return f"add({a}, {b})"

        def on_mul(self, a: str, b: str) -> str:
            return f"mul({a}, {b})"

        def on_floordiv(self, a: str, b: str, q: Any) -> str:
            return f"floordiv({a}, {b})"

        def on_ceildiv(self, a: str, b: str, q: Any) -> str:
            return f"ceildiv({a}, {b})"

        def on_mod(self, a: str, b: str, q: Any) -> str:
            return f"mod({a}, {b})"

        def on_compare(self, op: str, a: str, b: str) -> str:
            return f"({a} {op} {b})"

        def on_select(self, c: str, t: str, o: str) -> str:
            return f"select({c}, {t}, {o})"

    v = Ops()
    assert v.visit_size(sympy.floor(X / 3 + sympy.Rational(2, 3))) == "floordiv(add(2, x_0), 3)"
    assert v.visit_size(sympy.ceiling((2 - X) / 4)) == "ceildiv(add(2, mul(-1, x_0)), 4)"
    assert v.visit_size(sympy.Mod(2 - X, 3)) == "mod(add(2, mul(-1, x_0)), 3)"
    assert v.visit_size(sympy.Piecewise((X, X < 4), (1, True))) == "select((x_0 < 4), x_0, 1)"
    assert quotient(X / 6 + sympy.Rational(1, 4)) == (2 * X + 3, 12)
    with pytest.raises(NotImplementedError, match="min"):
        v.visit_size(sympy.Min(X, 3 - X))


def test_exact_python() -> None:
    codes = [exact_code(e, {X: "x"}) for e, _ in CASES]
    assert not any("Fraction" in c or "math.floor" in c for c in codes), codes  # integer arithmetic
    _check(lambda a: [eval(c, {**EXACT_NAMESPACE, "x": a}) for c in codes], "exact_code")


def _c_text() -> list[str]:
    codegen = pytest.importorskip("cuvil_backend_cpu.codegen")
    gen = codegen._Gen(None, False, 0)
    texts = [gen.index(e.xreplace({X: IDX})) for e, _ in CASES]
    assert not gen.derived, "every case is printed inline, none is a derived argument"
    return texts


def test_c(tmp_path: Path) -> None:
    codegen = pytest.importorskip("cuvil_backend_cpu.codegen")
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("no gcc")
    texts = _c_text()
    funcs = "".join(f"int64_t f{k}(int64_t i0) {{ return {t}; }}\n" for k, t in enumerate(texts))
    src = tmp_path / "sizes.c"
    src.write_text(codegen.PRELUDE + funcs)
    lib = tmp_path / "sizes.so"
    subprocess.run([gcc, "-O1", "-shared", "-fPIC", str(src), "-o", str(lib), "-lm"], check=True)
    so = ctypes.CDLL(str(lib))
    fns = [getattr(so, f"f{k}") for k in range(len(texts))]
    for f in fns:
        f.restype, f.argtypes = ctypes.c_int64, [ctypes.c_int64]
    _check(lambda a: [f(a) for f in fns], "C")


def test_triton_text() -> None:
    """The Triton index text, evaluated over a lane vector with numpy standing in for
    ``tl`` and Python's ``//``/``%`` for ``cu.floordiv``/``cu.mod`` (the device library's
    own tests check those two against Python on negative operands:
    cuvil-backend-cuda's test_triton_functions)."""
    from cuvil_ir.graph_ir.parser import parse_graph
    from cuvil_ir.tensor_ir.lower import lower
    from cuvil_ir.triton_source.emit import CUDA_RULES
    from cuvil_ir.triton_source.render import Renderer

    graph = parse_graph(
        "graph @g(%x: Tensor[f32, (x_0,), cpu]) {\n  %0 = neg(%x) : Tensor[f32, (x_0,), cpu]\n  return %0\n}"
    )
    program = lower(graph)
    (kernel,) = program.kernels()
    r = Renderer(kernel, program, CUDA_RULES)
    ctx = types.SimpleNamespace(names={IDX: "lane"})
    texts = [r.index(e.xreplace({X: IDX}), ctx) for e, _ in CASES]
    assert not r.derived
    tl = types.SimpleNamespace(
        minimum=np.minimum,
        maximum=np.maximum,
        where=np.where,
        int64=np.int64,
        full=lambda shape, v, dt: np.int64(v),
    )
    cu = types.SimpleNamespace(floordiv=np.floor_divide, mod=np.mod)
    lane = np.array(list(XS), dtype=np.int64)
    columns = [np.broadcast_to(eval(t, {"tl": tl, "cu": cu, "lane": lane}), lane.shape) for t in texts]
    _check(lambda a: [col[a] for col in columns], "Triton")


def test_mlir() -> None:
    pytest.importorskip("torch_mlir")
    import torch

    from cuvil_ir.graph_ir.parser import parse_graph
    from cuvil_ir.mlir.run import Compiled

    lines = [
        f"  %{k} = const() {{value = <{expr_str(e)}>}} : Scalar[int]\n" for k, (e, _) in enumerate(CASES)
    ]
    outs = ", ".join(f"%{k}" for k in range(len(CASES)))
    g = parse_graph(
        "graph @sizes(%x: Tensor[f32, (x_0,), cpu]) {\n" + "".join(lines) + f"  return {outs}\n}}"
    )
    run = Compiled(g)
    _check(lambda a: [int(v) for v in run(torch.randn(a))], "MLIR")


def test_onnx() -> None:
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    export = pytest.importorskip("cuvil.onnx.export")
    ex = export.Exporter()
    ex.sources = {X: ("a", 0)}
    outs = [ex.op("Identity", [ex.expr(e)]) for e, _ in CASES]
    h = onnx.helper
    graph = h.make_graph(
        ex.prologue.nodes + ex.scope.nodes,
        "sizes",
        [h.make_tensor_value_info("a", onnx.TensorProto.FLOAT, ["x_0"])],
        [h.make_tensor_value_info(o, onnx.TensorProto.INT64, [1]) for o in outs],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", ex.opset)], ir_version=9)
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    _check(lambda a: [g[0] for g in sess.run(None, {"a": np.zeros(a, np.float32)})], "ONNX")


# -- float-valued size expressions ([Note: float size semantics]) -------------------------
#: x >= 1: a negative power of 0 has no value
XS_FLOAT = range(1, 16)


def _float_cases() -> list[tuple[Any, Callable[[int], float]]]:
    x = X
    return [
        (x ** sympy.Float(-0.5), lambda a: a**-0.5),  # the default attention scale
        (1 / sympy.sqrt(x), lambda a: a**-0.5),  # a rational exponent, -1/2
        (x ** sympy.Rational(3, 2), lambda a: a**1.5),  # a symbol to a fractional power
        ((x - 20) ** -3, lambda a: (a - 20) ** -3),  # a negative integer exponent, a negative base
        (x / (x + 1), lambda a: a / (a + 1)),  # a size over a size
        (x / (sympy.floor((x - 7) / 3) + 9), lambda a: a / ((a - 7) // 3 + 9)),
        (sympy.Rational(1, 3) * x + sympy.Rational(1, 2), lambda a: a / 3 + 0.5),  # rationals
        (sympy.Float(2.5) * x - sympy.Rational(7, 3), lambda a: 2.5 * a - 7 / 3),
        (sympy.floor((x - 7) / 3) / 2, lambda a: ((a - 7) // 3) / 2),  # a float of a floor division
        (
            sympy.Mod(2 - x, 3) * sympy.Float(0.25) + sympy.ceiling((x - 9) / 4) / 3,
            lambda a: ((2 - a) % 3) * 0.25 + -((9 - a) // 4) / 3,
        ),
        (
            sympy.sqrt(3 * x + 1) * (2 * sympy.Min(x - 9, 2) + 1) ** -1,
            lambda a: (3 * a + 1) ** 0.5 / (2 * min(a - 9, 2) + 1),
        ),
        (x * (x + 3) / 4 + sympy.Float(0.125), lambda a: a * (a + 3) / 4 + 0.125),
    ]


FLOAT_CASES = _float_cases()


def _check_float(values: Callable[[int], list[float]], who: str) -> None:
    wrong = []
    for a in XS_FLOAT:
        for (e, py), g in zip(FLOAT_CASES, values(a)):
            if not np.isclose(float(g), py(a), rtol=1e-12, atol=1e-12):
                wrong.append(f"{who}: {expr_str(e)} at x = {a} gives {float(g)!r}, Python {py(a)!r}")
    assert not wrong, "\n".join(wrong[:20])


def test_the_float_cases_take_the_float_walk() -> None:
    """None is provably an integer (each is a float walk), and the floor and modulo inside
    them differ from truncation somewhere in XS_FLOAT (a consumer that truncated fails)."""
    rounded = 0
    for e, _ in FLOAT_CASES:
        assert sympy.sympify(e).is_integer is not True, expr_str(e)
        for r in sympy.sympify(e).atoms(sympy.floor, sympy.ceiling, sympy.Mod):
            num, den = quotient(r.args[0]) if len(r.args) == 1 else r.args
            values = [(num.subs(X, a), den.subs(X, a)) for a in XS_FLOAT]
            assert any(n < 0 and n % d != 0 for n, d in values), expr_str(r)
            rounded += 1
    assert rounded == 4


def test_the_float_walk_decomposes_into_its_hooks() -> None:
    """Numbers become doubles, integer-valued parts go through the integer walk and are
    converted once, sums and products fold, powers keep their exponent."""

    class Ops(SizeVisitor[str]):
        def on_integer(self, value: int) -> str:
            return str(value)

        def on_symbol(self, s: sympy.Symbol, ctx: Any) -> str:
            return s.name

        def on_add(self, a: str, b: str) -> str:
            return f"add({a}, {b})"

        def on_floordiv(self, a: str, b: str, q: Any) -> str:
            return f"floordiv({a}, {b})"

        def on_mod(self, a: str, b: str, q: Any) -> str:
            return f"mod({a}, {b})"

        def on_float(self, value: float) -> str:
            return repr(value)

        def on_to_float(self, a: str) -> str:
            return f"float({a})"

        def on_fadd(self, a: str, b: str) -> str:
            return f"fadd({a}, {b})"

        def on_fmul(self, a: str, b: str) -> str:
            return f"fmul({a}, {b})"

        def on_fpow(self, base: str, exp: str) -> str:
            return f"fpow({base}, {exp})"

    v = Ops()
    assert v.visit_float(X ** sympy.Float(-0.5)) == "fpow(float(x_0), -0.5)"
    assert v.visit_float(1 / sympy.sqrt(X + 2)) == "fpow(float(add(2, x_0)), -0.5)"
    assert v.visit_float(sympy.floor(X / 3) / 2) == "fmul(0.5, float(floordiv(x_0, 3)))"
    assert (
        v.visit_float(X / 3 + sympy.Rational(1, 3))
        == "fadd(0.3333333333333333, fmul(0.3333333333333333, float(x_0)))"
    )
    assert v.visit_float(2) == "2.0"
    # sympy leaves floor(x_0/x_1) undecided (x_1 may be 0): it is still an integer part
    y = symbol("x_1")
    assert sympy.floor(X / y).is_integer is None
    assert v.visit_float(sympy.floor(X / y) / 2) == "fmul(0.5, float(floordiv(x_0, x_1)))"
    assert v.visit_float(sympy.Mod(X, y) * sympy.Float(0.5)) == "fmul(0.5, float(mod(x_0, x_1)))"
    with pytest.raises(NotImplementedError, match="float size expression"):
        v.visit_float(sympy.Piecewise((X / 2, X < 3), (1, True)))
    with pytest.raises(NotImplementedError, match="float size expression"):
        v.visit_float(X < 3)


def test_floor_ceiling_and_mod_of_anything_are_integer_valued() -> None:
    """Division by a nonnegative (possibly zero) size leaves sympy's is_integer None;
    :func:`integer_valued` decides it (the ONNX exporter's int/float split uses it)."""
    y = symbol("x_1")
    for e in (sympy.floor(X / y), sympy.ceiling(X / y), sympy.Mod(X, y)):
        assert e.is_integer is None and integer_valued(e), expr_str(e)
        assert integer_valued(e * X + 3) and integer_valued(sympy.Max(e, 1) ** 2)
        assert not integer_valued(e / 2) and not integer_valued(e**-1)
    assert integer_valued(X) and not integer_valued(X ** sympy.Float(-0.5))


def test_float_consumers_share_the_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    """MLIR and ONNX define the float walk's hooks, not a walk of their own: every float
    case they emit goes through :meth:`SizeVisitor.decompose_float`."""
    walked: list[tuple[str, Any]] = []
    shared = SizeVisitor.decompose_float

    def spy(self: SizeVisitor[Any], e: Any, ctx: Any) -> Any:
        walked.append((self.language, e))
        return shared(self, e, ctx)

    monkeypatch.setattr(SizeVisitor, "decompose_float", spy)
    from cuvil_ir.mlir.emit import to_mlir
    from cuvil_ir.mlir.sizes import SizeEmitter

    consumers: list[type] = [SizeEmitter]
    to_mlir(_float_graph())
    export = None
    try:
        import cuvil.onnx.export as export
    except ImportError:
        pass
    if export is not None:
        consumers.append(export.sizes.SizeExprs)
        ex = export.Exporter()
        ex.sources = {X: ("a", 0)}
        for e, _ in FLOAT_CASES:
            ex.expr(e)
    for cls in consumers:
        for walk in ("decompose_float", "decompose_size"):
            assert walk not in vars(cls), f"{cls.__name__} overrides {walk}"
        missing = [expr_str(e) for e, _ in FLOAT_CASES if (cls.language, sympy.sympify(e)) not in walked]
        assert not missing, f"{cls.__name__} emits {missing} without the shared float walk"


def test_float_exact_python() -> None:
    """Exact Python (which also computes the C and Triton generators' float derived
    arguments) against Python."""
    codes = [exact_code(e, {X: "x"}) for e, _ in FLOAT_CASES]
    _check_float(lambda a: [float(eval(c, {**EXACT_NAMESPACE, "x": a})) for c in codes], "exact_code")


def test_float_c_and_triton_take_float_sizes_whole() -> None:
    """The C and Triton generators have no float walk: a float-valued size is a derived
    argument, computed by the wrapper with exact_code (test_float_exact_python)."""
    from cuvil_ir.graph_ir.types import DType

    codegen = pytest.importorskip("cuvil_backend_cpu.codegen")
    gen = codegen._Gen(None, False, 0)
    for e, _ in FLOAT_CASES:
        gen.expr(E.Index(e, DType.f32))
    assert [k for k, _ in gen.derived] == [e for e, _ in FLOAT_CASES]
    assert {t for _, t in gen.derived} == {"double"}


def _float_graph() -> Any:
    """A graph returning each float case as a ``Scalar[float]`` constant (the parser does
    not read ``sqrt``: the values are set on parsed placeholders)."""
    from cuvil_ir.graph_ir.parser import parse_graph

    lines = [f"  %{k} = const() {{value = 0.5}} : Scalar[float]\n" for k in range(len(FLOAT_CASES))]
    outs = ", ".join(f"%{k}" for k in range(len(FLOAT_CASES)))
    g = parse_graph(
        "graph @fsizes(%x: Tensor[f32, (x_0,), cpu]) {\n" + "".join(lines) + f"  return {outs}\n}}"
    )
    nodes = tuple(n.replace(attrs=(("value", e),)) for n, (e, _) in zip(g.nodes, FLOAT_CASES))
    return g.replace(nodes=nodes)


def test_float_mlir() -> None:
    pytest.importorskip("torch_mlir")
    import torch

    from cuvil_ir.mlir.emit import to_mlir
    from cuvil_ir.mlir.run import Compiled

    g = _float_graph()
    text = to_mlir(g).text
    assert "f64" in text and "math.powf" in text and "arith.floordivsi" in text
    run = Compiled(g)
    _check_float(lambda a: [float(v) for v in run(torch.randn(a))], "MLIR")


def test_float_onnx() -> None:
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    export = pytest.importorskip("cuvil.onnx.export")
    ex = export.Exporter()
    ex.sources = {X: ("a", 0)}
    exprs = [ex.expr(e) for e, _ in FLOAT_CASES]
    assert all(o in ex.floats for o in exprs)
    outs = [ex.op("Identity", [o]) for o in exprs]
    h = onnx.helper
    graph = h.make_graph(
        ex.prologue.nodes + ex.scope.nodes,
        "fsizes",
        [h.make_tensor_value_info("a", onnx.TensorProto.FLOAT, ["x_0"])],
        [h.make_tensor_value_info(o, onnx.TensorProto.DOUBLE, [1]) for o in outs],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", ex.opset)], ir_version=9)
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    _check_float(lambda a: [g[0] for g in sess.run(None, {"a": np.zeros(a, np.float32)})], "ONNX")
