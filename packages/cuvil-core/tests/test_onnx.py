"""ONNX export (Graph IR -> ONNX, checked and run by onnxruntime) and import
(ONNX -> Graph IR -> any Cuvil target), on corpus programs."""

from __future__ import annotations

import io
import warnings

import pytest
import torch
from torch.utils import _pytree as pytree

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import cuvil as cu  # noqa: E402
from cuvil.onnx import compile_onnx, export_onnx  # noqa: E402
from cuvil.onnx.import_ import OnnxImportError  # noqa: E402
from cuvil.testing import get_program, instantiate  # noqa: E402

ort.set_default_logger_severity(3)

# elementwise, reductions, softmax/layernorm, matmul/linear, MLP modules, conv, pooling,
# attention, shape ops, interpolation, embeddings
ROUND_TRIP = [
    "ew_arith",
    "unary_math",  # exp2 decomposes into pow (docs/ops.md, decompositions)
    "pairwise_distances",  # vector_norm decomposes too
    "ew_broadcast_3d",
    "int_float_promotion",
    "comparisons",
    "where_select",
    "clamp_ops",
    "activations",
    "reductions_sum_mean",
    "reductions_minmax",
    "var_std",
    "softmax_family",
    "layer_norm_fn",
    "rms_norm_manual",
    "batch_norm_inference",
    "matmul_variants",
    "linear_addmm",
    "bmm_baddbmm",
    "conv2d_basic",
    "view_reshape",
    "permute_transpose",
    "slicing",
    "cat_stack",
    "split_chunk",
    "sdpa_causal",
    "interpolate_bilinear",
    "mlp",
    "conv_block",
    "encoder_layer",
    "resnet_basic_block",
    "small_cnn_classifier",
]

# corpus programs our exporter cannot translate (an extern torch call or a shape ONNX
# pooling cannot express); see docs/onnx.md for the counts
EXPORT_SKIPS = {
    "pooling": "adaptive pooling to a size that does not divide the input",
    "embedding_lookup": "extern __getitem__ with a tensor index",
    "factories": "extern torch.eye",
    "extern_ops": "extern torch.flip/roll/cumprod",
}

TORCH_EXPORT = [
    "ew_arith",
    "ew_broadcast_3d",
    "comparisons",
    "activations",
    "reductions_sum_mean",
    "reductions_minmax",
    "var_std",
    "softmax_family",
    "rms_norm_manual",
    "batch_norm_inference",
    "matmul_variants",
    "linear_addmm",
    "conv2d_basic",
    "embedding_lookup",
    "slicing",
    "cat_stack",
    "sdpa_basic",
    "interpolate_nearest",
    "mlp",
    "mlp_sequential_3d",
    "conv_block",
    "attention_block_sdpa",
    "resnet_basic_block",
    "small_cnn_classifier",
]
DYNAMO_EXPORT = ["ew_arith", "softmax_family", "mlp", "conv_block"]


def _available(name: str) -> bool:
    from cuvil_runtime.registry import discover

    return any(i.name == name and i.available for i in discover())


#: every target these tests compile for; cpu only where its distribution is installed
TARGETS = ("reference", "cpu") if _available("cpu") else ("reference",)


def _tensors(args):
    return [a for a in pytree.tree_leaves(args) if isinstance(a, torch.Tensor)]


def _ort(model, args):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    leaves = _tensors(args)
    out = sess.run(None, {i.name: x.numpy() for i, x in zip(sess.get_inputs(), leaves)})
    return [torch.from_numpy(o) if hasattr(o, "shape") else torch.tensor(o) for o in out]


def _close(got, want, tol=None):
    tol = tol or {"atol": 1e-4, "rtol": 1e-4}
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **tol)


def _variants_served(p, cf):
    """The variants one captured graph serves (the exported model is that graph)."""
    out = []
    for i in range(p.num_variants):
        args, _ = p.call_args(i)
        cf(*args)
        if cf.stats.compiles > 1:
            break
        out.append(args)
    return out


@pytest.mark.parametrize("name", ROUND_TRIP)
def test_round_trip(name):
    p = get_program(name)
    f = instantiate(p)
    cf = cu.compile(f, target="reference", fallback="error")
    model = export_onnx(cf, *p.call_args(0)[0])
    onnx.checker.check_model(model, full_check=True)
    compiled = {t: compile_onnx(model, target=t) for t in TARGETS}
    for args in _variants_served(p, cf):
        eager = _tensors(f(*args))
        want = _ort(model, args)
        _close(want, eager, p.tolerance or None)
        for fn in compiled.values():
            got = fn(*_tensors(args))
            _close(list(got) if isinstance(got, tuple) else [got], want, {"atol": 1e-4, "rtol": 1e-3})


@pytest.mark.parametrize("name", sorted(EXPORT_SKIPS))
def test_export_refuses_clearly(name):
    p = get_program(name)
    with pytest.raises(NotImplementedError, match="no ONNX translation|adaptive pooling"):
        export_onnx(instantiate(p), *p.call_args(0)[0])


def test_dim_params_and_determinism(tmp_path):
    p = get_program("ew_broadcast_3d")
    args = p.call_args(0)[0]
    m1 = export_onnx(p.fn, *args, path=tmp_path / "m.onnx")
    m2 = export_onnx(p.fn, *args)
    assert m1.SerializeToString() == m2.SerializeToString()
    assert onnx.load(tmp_path / "m.onnx").SerializeToString() == m1.SerializeToString()
    dims = [[d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in m1.graph.input]
    assert dims[0][0] == "x_0" and all(isinstance(d, str) for d in dims[0])


def test_control_flow_if_and_loops():
    @cu.compile(target="reference", fallback="error")
    def branchy(x):
        if x.sum() > 0:
            y = x * 2
        else:
            y = x.abs()
        return y + 1

    @cu.compile(target="reference", fallback="error")
    def looped(x):
        acc = torch.zeros_like(x[0])
        for i in range(x.shape[0]):
            acc = acc + x[i] * 2
        return acc

    @cu.compile(target="reference", fallback="error")
    def halve(x):
        steps = torch.zeros((), dtype=torch.int64)
        while x.abs().sum() > 1.0:
            x = x / 2
            steps = steps + 1
        return x, steps

    @cu.compile(target="reference", fallback="error")
    def size_if(x):
        if x.shape[0] > 2:
            x = x[:2]
        return x * 2

    cases = [
        (branchy, [torch.randn(3, 4).abs(), -torch.randn(5, 4).abs()], "If"),
        (looped, [torch.randn(3, 4), torch.randn(6, 4)], "Loop"),
        (halve, [torch.full((5,), 3.0), torch.full((5,), 0.01)], "Loop"),
        (size_if, [torch.randn(1, 3), torch.randn(5, 3)], "If"),
    ]
    for fn, inputs, op_type in cases:
        model = export_onnx(fn, inputs[0])
        onnx.checker.check_model(model, full_check=True)
        assert op_type in [n.op_type for n in model.graph.node]
        for x in inputs:
            _close(_ort(model, (x,)), _tensors(fn.__wrapped__(x)))


def _torch_export(p, dynamo):
    args, _ = p.call_args(0)
    other, _ = p.call_args(1)
    f = instantiate(p)

    class Wrap(torch.nn.Module):
        def forward(self, *a):
            return f(*a)

    m = f if isinstance(f, torch.nn.Module) else Wrap()
    names = [f"in{i}" for i in range(len(args))]
    # axes that differ between the first two variants are dynamic; one name per size
    dyn = [
        {j: f"d{a}_{b}" for j, (a, b) in enumerate(zip(x.shape, y.shape)) if a != b}
        for x, y in zip(args, other)
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            dims: dict[str, object] = {}
            shapes: tuple[object, ...] = tuple(
                {j: dims.setdefault(n, torch.export.Dim(n)) for j, n in d.items()} or None for d in dyn
            )
            if m is not f:  # Wrap.forward(*a): one (tuple) argument
                shapes = (shapes,)
            return torch.onnx.export(
                m, args, dynamo=True, dynamic_shapes=shapes, input_names=names
            ).model_proto
        buf = io.BytesIO()
        torch.onnx.export(
            m,
            args,
            buf,
            dynamo=False,
            input_names=names,
            dynamic_axes={n: d for n, d in zip(names, dyn) if d},
        )
        return onnx.load_from_string(buf.getvalue())


def _check_import(p, model, targets=("reference",)):
    fns = [compile_onnx(model, target=t) for t in targets]
    for i in range(p.num_variants):
        args, _ = p.call_args(i)
        want = _ort(model, args)
        for fn in fns:
            got = fn(*args)
            _close(list(got) if isinstance(got, tuple) else [got], want, {"atol": 1e-4, "rtol": 1e-3})
    assert len(fns[0].graphs) == 1  # every variant served by one graph: symbolic sizes


@pytest.mark.parametrize("name", TORCH_EXPORT)
def test_import_torchscript_export(name):
    p = get_program(name)
    _check_import(p, _torch_export(p, dynamo=False), targets=TARGETS)


@pytest.mark.parametrize("name", DYNAMO_EXPORT)
def test_import_dynamo_export(name):
    pytest.importorskip("onnxscript")
    p = get_program(name)
    _check_import(p, _torch_export(p, dynamo=True))


def test_unknown_op_is_a_clear_error():
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    g = helper.make_graph([helper.make_node("Hardmax", ["x"], ["y"], name="my_node")], "g", [x], [y])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    fn = compile_onnx(model, target="reference")
    with pytest.raises(OnnxImportError, match="'Hardmax'.*'my_node'"):
        fn(torch.randn(2, 4))


def test_dim_params_share_one_symbol():
    from onnx import TensorProto, helper

    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", 3])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])
    g = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "g", [a, b], [y])
    fn = compile_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), target="reference")
    for n in (1, 4, 7):
        x1, x2 = torch.randn(n, 3), torch.randn(n, 3)
        torch.testing.assert_close(fn(x1, x2), x1 + x2)
    assert len(fn.graphs) == 1
    assert [str(s) for s in fn.graphs[0].symbols] == ["batch"]
    with pytest.raises(ValueError, match="batch"):
        fn(torch.randn(2, 3), torch.randn(3, 3))


# -- control flow: import ------------------------------------------------------------------
def _branchy(x):
    if x.sum() > 0:
        y = x * 2
    else:
        y = x.abs()
    return y + 1


def _looped(x):
    acc = torch.zeros_like(x[0])
    for i in range(x.shape[0]):
        acc = acc + x[i] * 2
    return acc


def _halve(x):
    steps = torch.zeros((), dtype=torch.int64)
    while x.abs().sum() > 1.0:
        x = x / 2
        steps = steps + 1
    return x, steps


def _size_if(x):
    if x.shape[0] > 2:
        x = x[:2]
    return x * 2


CONTROL_FLOW = {
    "if": (_branchy, [torch.randn(3, 4).abs(), -torch.randn(5, 4).abs()], "if"),
    "for": (_looped, [torch.randn(3, 4), torch.randn(6, 4)], "for"),
    "while": (_halve, [torch.full((5,), 3.0), torch.full((5,), 0.01)], "while"),
    # a size predicate is decided when importing: one graph per outcome
    "size_if": (_size_if, [torch.randn(1, 3), torch.randn(5, 3)], None),
}


@pytest.mark.parametrize("case", sorted(CONTROL_FLOW))
def test_control_flow_round_trip(case):
    fn, inputs, ir_op = CONTROL_FLOW[case]
    cf = cu.compile(fn, target="reference", fallback="error")
    model = export_onnx(cf, inputs[0])
    for target in TARGETS:
        imported = compile_onnx(model, target=target)
        for x in inputs:
            want = _ort(model, (x,))
            _close(want, _tensors(fn(x)))
            got = imported(x)
            _close(list(got) if isinstance(got, tuple) else [got], want)
        ops = {n.op for g in imported.graphs for n in g.walk()}
        if ir_op is not None:
            assert ir_op in ops


def _model(nodes, inputs, outputs, inits=()):
    from onnx import helper

    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model, full_check=True)
    return model


def test_import_hand_built_if():
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    then_g = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", f, None)],
    )
    else_g = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"])], "else", [], [helper.make_tensor_value_info("e", f, None)]
    )
    model = _model(
        [
            helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
            helper.make_node("Greater", ["s", "zero"], ["c"]),
            helper.make_node("If", ["c"], ["y"], name="my_if", then_branch=then_g, else_branch=else_g),
        ],
        [helper.make_tensor_value_info("x", f, ["N", 3])],
        [helper.make_tensor_value_info("y", f, ["N", 3])],
        [helper.make_tensor("two", f, [], [2.0]), helper.make_tensor("zero", f, [], [0.0])],
    )
    for target in TARGETS:
        fn = compile_onnx(model, target=target)
        for x in (torch.rand(2, 3), -torch.rand(4, 3)):
            _close([fn(x)], _ort(model, (x,)))
        assert len(fn.graphs) == 1 and "if" in {n.op for n in fn.graphs[0].walk()}


def _loop_body(cond_out_node=None):
    """Loop body (i, cond, acc) -> (cond, acc + x * i)."""
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["x", "fi"], ["xi"]),
        helper.make_node("Add", ["acc", "xi"], ["acc_out"]),
    ]
    nodes.append(cond_out_node or helper.make_node("Identity", ["cond"], ["cond_out"]))
    return helper.make_graph(
        nodes,
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc", TensorProto.FLOAT, ["N", 3]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, ["N", 3]),
        ],
    )


@pytest.mark.parametrize("kind", ["trip_count", "trip_count_and_cond"])
def test_import_hand_built_loop(kind):
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    if kind == "trip_count":  # a for over range(4)
        body, ir_op = _loop_body(), "for"
    else:  # the body computes the condition (sum(acc) < 10): a while with a counter
        extra = [
            helper.make_node("ReduceSum", ["acc_out"], ["s"], keepdims=0),
            helper.make_node("Less", ["s", "ten"], ["cond_out"]),
        ]
        body, ir_op = _loop_body(), "while"
        del body.node[-1]
        body.node.extend(extra)
        body.initializer.append(helper.make_tensor("ten", f, [], [10.0]))
    model = _model(
        [
            helper.make_node("Mul", ["x", "zero"], ["acc0"]),
            helper.make_node("Loop", ["m", "" if kind == "trip_count" else "t", "acc0"], ["y"], body=body),
        ],
        [helper.make_tensor_value_info("x", f, ["N", 3])],
        [helper.make_tensor_value_info("y", f, ["N", 3])],
        [
            helper.make_tensor("m", TensorProto.INT64, [], [4]),
            helper.make_tensor("zero", f, [], [0.0]),
            helper.make_tensor("t", TensorProto.BOOL, [], [True]),
        ],
    )
    for target in TARGETS:
        fn = compile_onnx(model, target=target)
        for x in (torch.rand(2, 3), torch.rand(5, 3) * 3):
            _close([fn(x)], _ort(model, (x,)))
        assert ir_op in {n.op for n in fn.graphs[0].walk()}


def test_import_loop_scan_output_is_a_clear_error():
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    body = _loop_body()
    body.node.append(helper.make_node("Identity", ["acc_out"], ["scan"]))
    body.output.append(helper.make_tensor_value_info("scan", f, ["N", 3]))
    model = _model(
        [helper.make_node("Loop", ["m", "", "x"], ["y", "ys"], name="my_loop", body=body)],
        [helper.make_tensor_value_info("x", f, ["N", 3])],
        [helper.make_tensor_value_info("y", f, ["N", 3])],
        [helper.make_tensor("m", TensorProto.INT64, [], [4])],
    )
    with pytest.raises(OnnxImportError, match="Loop node 'my_loop'.*scan outputs.*'ys'"):
        compile_onnx(model, target="reference")(torch.rand(2, 3))


def test_the_device_picks_the_target_and_types_the_graph():
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])
    c = helper.make_tensor("c", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
    g = helper.make_graph([helper.make_node("Mul", ["x", "c"], ["y"])], "g", [x], [y], initializer=[c])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    # meta tensors: only the reference target runs them, and the importer types the
    # graph's inputs and constants on that device (no hard-coded cpu)
    fn = compile_onnx(model, device="meta")
    assert fn.target == "reference"
    out = fn(torch.empty(5, 3, device="meta"))
    assert out.device.type == "meta" and out.shape == (5, 3)
    assert {v.type.device for v in fn.graphs[0].inputs} == {"meta"}
    if "cpu" in {b.name for b in cu.backends() if b.available}:
        with pytest.raises(ValueError, match="does not run on 'meta'"):
            compile_onnx(model, target="cpu", device="meta")
