"""``cu.custom_op``: one declaration gives an op its Graph IR node (its region: the
decomposition captured from the reference), eager and torch.library forms, and
fusion with its neighbours on every target that compiles through Tensor IR."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import cuvil as cu
from cuvil.errors import CompileError
from cuvil_ir.graph_ir.parser import parse_graph
from cuvil_ir.graph_ir.printer import print_graph
from cuvil_ir.graph_ir.verifier import verify


def _available(name: str) -> bool:
    from cuvil_runtime.registry import discover

    return any(i.name == name and i.available for i in discover())


TARGETS = ["reference"] + (["cpu"] if _available("cpu") else [])


@cu.custom_op("cuvil_test::scaled_gelu")
def scaled_gelu(x: torch.Tensor, *, alpha: float = 1.0) -> torch.Tensor:
    return F.gelu(x) * alpha


@cu.custom_op("cuvil_test::split_scale")
def split_scale(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x * y, x - y


@cu.custom_op("cuvil_test::signed_square")
def signed_square(x: torch.Tensor) -> torch.Tensor:
    if x.sum() > 0:  # a tensor condition: captured as a structured if inside the region
        return x * x
    return -x * x


def softmax_chain(x, b):
    return torch.softmax(scaled_gelu(x + b, alpha=0.5), dim=-1)


def test_eager_calls_run_the_reference_and_torch_knows_the_op():
    x = torch.randn(3, 5)
    torch.testing.assert_close(scaled_gelu(x, alpha=2.0), F.gelu(x) * 2.0)
    torch.testing.assert_close(torch.ops.cuvil_test.scaled_gelu(x, alpha=2.0), F.gelu(x) * 2.0)
    assert scaled_gelu.schema == "scaled_gelu(Tensor x, *, float alpha=1.0) -> Tensor"
    assert split_scale.schema == "split_scale(Tensor x, Tensor y) -> (Tensor, Tensor)"
    a, b = split_scale(x, x + 1)
    torch.testing.assert_close(a, x * (x + 1))


@pytest.mark.parametrize("target", TARGETS)
def test_a_custom_op_in_a_softmax_chain_is_one_node_and_matches_eager(target):
    f = cu.compile(softmax_chain, target=target, fallback="error")
    for n in (4, 7):
        x, b = torch.randn(n, 16), torch.randn(16)
        torch.testing.assert_close(f(x, b), softmax_chain(x, b))
    assert f.stats.compiles == 1
    (graph,) = f.graphs
    verify(graph)
    assert "cuvil_test::scaled_gelu(%" in graph.text and "{alpha = 0.5} (" in graph.text
    assert print_graph(parse_graph(graph.text)) == graph.text  # print -> parse -> print


def test_calls_through_torch_ops_are_captured_too():
    def f(x):
        return torch.ops.cuvil_test.scaled_gelu(x, alpha=3.0) + 1

    cf = cu.compile(f, target="reference", fallback="error")
    x = torch.randn(5)
    torch.testing.assert_close(cf(x), f(x))
    assert "cuvil_test::scaled_gelu(%x) {alpha = 3.0}" in cf.graphs[0].text


@pytest.mark.skipif("cpu" not in TARGETS, reason="the cpu target is not installed here")
def test_the_decomposition_fuses_with_its_neighbours_on_cpu():
    f = cu.compile(softmax_chain, target="cpu", fallback="error")
    f(torch.randn(4, 16), torch.randn(16))
    report = f.artifacts[-1].executable.report
    assert (report.kernels, report.externs) == (1, 0)  # add, gelu, mul and softmax: one kernel


@pytest.mark.parametrize("target", TARGETS)
def test_two_results_and_control_flow_inside_the_reference(target):
    def f(x, y):
        a, b = split_scale(x, y)
        return signed_square(a) + b

    cf = cu.compile(f, target=target, fallback="error")
    for sign in (1.0, -1.0):
        x, y = torch.rand(3, 4) * sign, torch.rand(3, 4)
        torch.testing.assert_close(cf(x, y), f(x, y))
    assert cf.stats.compiles == 1
    assert " if(" in cf.graphs[0].text  # the reference's `if` is in the op's region


def test_torch_compile_runs_the_op():
    x, b = torch.randn(4, 16), torch.randn(16)
    torch.testing.assert_close(torch.compile(softmax_chain)(x, b), softmax_chain(x, b))


def test_mlir_runs_the_decomposition():
    pytest.importorskip("torch_mlir")
    x, b = torch.randn(3, 16), torch.randn(16)
    (out,) = cu.run_mlir(softmax_chain, x, b)
    torch.testing.assert_close(torch.as_tensor(out), softmax_chain(x, b))
    assert "cuvil_test" not in cu.to_mlir(softmax_chain, x, b)  # inlined: upstream dialects only


def test_onnx_export_of_a_custom_op(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    x, b = torch.randn(3, 16), torch.randn(16)
    path = tmp_path / "chain.onnx"
    cu.export_onnx(softmax_chain, x, b, path=str(path))
    (out,) = ort.InferenceSession(str(path)).run(None, {"x": x.numpy(), "b": b.numpy()})
    torch.testing.assert_close(torch.from_numpy(out), softmax_chain(x, b))


def test_declaring_again_from_the_same_place_replaces_the_definition(tmp_path):
    """A module or cell run again: the compiled function reads the op as a global, its
    guard fails, and the new definition is compiled (the old artifact's graph had the
    old region, so nothing stale is reused)."""
    code = textwrap.dedent(
        """
        import torch, cuvil as cu

        def declare(k):
            global scale
            @cu.custom_op("again::scale")
            def scale(x):
                return x * k

        def f(x):
            return scale(x) + 1

        def g(x):  # through torch.ops: no global of its own changes
            return torch.ops.again.scale(x) + 1

        declare(2.0)
        cf, cg = (cu.compile(h, target="reference", fallback="error") for h in (f, g))
        print(cf(torch.ones(2)).tolist(), cg(torch.ones(2)).tolist())
        declare(3.0)
        print(cf(torch.ones(2)).tolist(), cg(torch.ones(2)).tolist())
        print(cf.stats.compiles, cg.stats.compiles, cf.graphs[0].text != cf.graphs[1].text)
        print(cg.stats.recompile_reasons[-1])
        """
    )
    script = tmp_path / "again.py"  # a file: its functions are converted, as user code is
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert lines[:3] == ["[3.0, 3.0] [3.0, 3.0]", "[4.0, 4.0] [4.0, 4.0]", "2 2 True"], out
    assert "custom op again::scale" in lines[3], out


def test_bad_declarations_are_located_errors():
    with pytest.raises(ValueError, match="namespace::name"):
        cu.custom_op("no_namespace")
    with pytest.raises(CompileError, match="neither a tensor operand") as info:

        @cu.custom_op("cuvil_test::bad_param")
        def bad(x, alpha=1.0):  # an attribute must be keyword-only
            return x * alpha

    assert "test_custom_ops.py" in str(info.value)
    with pytest.raises(CompileError, match="declared twice"):

        @cu.custom_op("cuvil_test::scaled_gelu")
        def other(x):
            return x


def test_a_reference_returning_no_tensor_is_a_compile_error():
    @cu.custom_op("cuvil_test::no_tensor")
    def no_tensor(x):
        return 3

    cf = cu.compile(lambda x: no_tensor(x), target="reference", fallback="error")
    with pytest.raises(CompileError, match="must return a tensor"):
        cf(torch.randn(2))


def test_attributes_must_be_python_constants():
    def f(x, k):
        return scaled_gelu(x, alpha=k)

    cf = cu.compile(f, target="reference", fallback="error")
    with pytest.raises(CompileError, match="attribute 'alpha'"):
        cf(torch.randn(2), torch.tensor(2.0))


@cu.custom_op(
    "cuvil_test::softsign",
    lower={
        "cpu": "x / (k + (x < 0 ? -x : x))",
        "cuda": "x / (k + tl.abs(x))",
        "ascend": "x / (k + tl.abs(x))",
    },
)
def softsign(x: torch.Tensor, *, k: float = 1.0) -> torch.Tensor:
    return x / (k + x.abs())


def softsign_chain(x, b):
    return torch.softmax(softsign(x + b, k=2.0), dim=-1)


@pytest.mark.parametrize("target", TARGETS)
def test_a_native_lowering_replaces_the_decomposition(target):
    """On cpu the op is its C expression, fused into the softmax's kernel; the
    reference target (and MLIR, ONNX) still run the reference or the region."""
    f = cu.compile(softsign_chain, target=target, fallback="error")
    for n in (3, 6):
        x, b = torch.randn(n, 16), torch.randn(16)
        torch.testing.assert_close(f(x, b), softsign_chain(x, b))
    assert f.stats.compiles == 1
    text = f.graphs[0].text
    assert 'lower_cpu = "x / (k + (x < 0 ? -x : x))"' in text  # in the graph: in every cache key
    assert print_graph(parse_graph(text)) == text
    if target == "cpu":
        exe = f.artifacts[-1].executable
        assert (exe.report.kernels, exe.report.externs) == (1, 0)
        assert "static inline float cu_native_cuvil_test__softsign__f32(float x, float k)" in exe.stages["c"]
        assert "native:cuvil_test__softsign__f32" in exe.stages["tensor_ir"]


def test_lowering_errors_name_what_is_wrong():
    with pytest.raises(
        CompileError, match="no installed distribution registers; the targets are .*reference"
    ):

        @cu.custom_op("cuvil_test::bad_target", lower={"gpu9000": "x"})
        def bad_target(x):
            return x

    with pytest.raises(CompileError, match="numeric attributes"):

        @cu.custom_op("cuvil_test::bad_attr", lower={"cpu": "x"})
        def bad_attr(x, *, flag=True):
            return x

    @cu.custom_op("cuvil_test::row_sum", lower={"cpu": "x"})
    def row_sum(x):
        return x.sum(-1)

    cf = cu.compile(lambda x: row_sum(x), target="reference", fallback="error")
    with pytest.raises(CompileError, match="does not broadcast to its result"):
        cf(torch.randn(3, 4))


def test_a_reference_that_cannot_be_captured_is_refused_at_the_declaration():
    with pytest.raises(CompileError, match="cannot be captured") as info:

        @cu.custom_op("cuvil_test::with_try")
        def with_try(x):
            try:
                return x + 1
            except RuntimeError:
                return x

    assert "test_custom_ops.py" in str(info.value)


@cu.custom_op("cuvil_test::opaque_twice", shape=lambda x, *, k: x, lower={"cpu": "x * (2 * k)"})
def opaque_twice(x: torch.Tensor, *, k: float = 1.0) -> torch.Tensor:
    return torch.from_numpy(x.numpy() * (2 * k))  # numpy: nothing Cuvil could capture


@cu.custom_op("cuvil_test::opaque_split", shape=lambda x: (x, x[:-1] + (1,)))
def opaque_split(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x * 2, x.sum(-1, keepdim=True)


@pytest.mark.parametrize("target", TARGETS)
def test_a_shape_function_declares_an_op_whose_reference_is_not_captured(target):
    def f(x):
        a, s = opaque_split(torch.relu(opaque_twice(x + 1, k=1.5)))
        return a - s

    cf = cu.compile(f, target=target, fallback="error")
    for n in (3, 5):
        x = torch.randn(n, 4)
        torch.testing.assert_close(cf(x), f(x))
    assert cf.stats.compiles == 1
    text = cf.graphs[0].text
    assert (
        "cuvil_test::opaque_twice(" in text and " (\n" not in text.split("opaque_twice")[1][:80]
    )  # no region
    if target == "cpu":  # opaque_twice is its C expression, fused; opaque_split runs its reference
        report = cf.artifacts[-1].executable.report
        assert report.externs == 1 and report.kernels >= 1, report


def test_an_opaque_op_runs_under_torch_compile_through_its_fake():
    x = torch.randn(3, 4)
    torch.testing.assert_close(
        torch.compile(lambda x: opaque_split(x)[1] + 1)(x), x.sum(-1, keepdim=True) + 1
    )


def test_cuvil_ops_says_how_each_custom_op_is_lowered():
    from cuvil.plugins import op_infos

    infos = {i.name: i for i in op_infos()}
    assert infos["cuvil_test::scaled_gelu"].lowering == "region"
    assert infos["cuvil_test::softsign"].lowering == "region; native on ascend, cpu, cuda"
    assert infos["cuvil_test::opaque_twice"].lowering == "extern; native on cpu"
    assert infos["cuvil_test::opaque_split"].kind == "custom"


def test_onnx_custom_domain_node_with_its_decomposition_as_a_function(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")

    def f(x, b):
        return scaled_gelu(x + b, alpha=0.5) + scaled_gelu(x, alpha=0.5) * scaled_gelu(b, alpha=2.0)

    x, b = torch.randn(3, 16), torch.randn(16)
    path = tmp_path / "domain.onnx"
    model = cu.export_onnx(f, x, b, path=str(path), custom_ops="domain")
    onnx.checker.check_model(model)
    calls = [n for n in model.graph.node if n.domain == "cuvil_test"]
    assert [n.op_type for n in calls] == ["scaled_gelu"] * 3
    # equal bodies share one function; alpha=2.0 (and b's rank) make other overloads
    assert {fn.name for fn in model.functions} == {"scaled_gelu"}
    assert len({n.overload for n in calls}) == len(model.functions) >= 2
    (out,) = ort.InferenceSession(str(path)).run(None, {"x": x.numpy(), "b": b.numpy()})
    torch.testing.assert_close(torch.from_numpy(out), f(x, b))
    inline = cu.export_onnx(f, x, b)
    assert not inline.functions and all(n.domain == "" for n in inline.graph.node)


def test_lowerings_can_be_added_right_after_the_declaration_not_after_a_compile():
    @cu.custom_op("cuvil_test::late")
    def late(x, *, k: float = 1.0):
        return x * k + 1

    @late.lower("cpu")
    def _():
        return "x * k + 1"

    assert late.lowerings == {"cpu": "x * k + 1"}
    cf = cu.compile(lambda x: late(x, k=2.0), target="reference", fallback="error")
    x = torch.randn(3)
    torch.testing.assert_close(cf(x), x * 2.0 + 1)
    assert 'lower_cpu = "x * k + 1"' in cf.graphs[0].text
    with pytest.raises(CompileError, match="added after the op was compiled"):
        late.lower("cuda", "x * k + 1")
