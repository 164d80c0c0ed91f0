"""Graph IR -> upstream MLIR: every corpus graph emits a verified module (or reports why),
and hand-written graphs run through MLIR's ExecutionEngine match plain torch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("torch_mlir")

from cuvil_ir import Graph, parse_graph  # noqa: E402
from cuvil_ir.mlir import MlirError, run_mlir, to_mlir  # noqa: E402
from cuvil_ir.testing import CONTROL_FLOW_GRAPHS  # noqa: E402

GOLDEN = Path(__file__).resolve().parents[2] / "cuvil-core" / "tests" / "golden"
UPSTREAM = ("func.", "arith.", "math.", "tensor.", "linalg.", "scf.")


def test_every_corpus_graph_emits_a_verified_module() -> None:
    files = sorted(GOLDEN.glob("*.txt"))
    assert len(files) >= 70
    verified, lowerable, failed = 0, 0, {}
    reported: dict[str, list[str]] = {}
    for f in files:
        g = parse_graph(f.read_text())
        try:
            r = to_mlir(g)
        except MlirError as e:
            failed[f.stem] = str(e)
            continue
        verified += 1
        assert r.text == to_mlir(g).text  # deterministic
        if r.lowerable:
            lowerable += 1
        else:
            reported[f.stem] = r.externs
            for op in r.externs:  # every op not emitted is an external call, with a reason
                assert op in r.reasons
            assert "func.func private @cuvil_extern_" in r.text
    print(
        f"\nMLIR emission: {verified}/{len(files)} verified, {lowerable} fully lowerable, "
        f"{len(reported)} with external calls {reported}, {len(failed)} failed {failed}"
    )
    assert not failed
    assert lowerable >= 50


def test_only_upstream_dialects() -> None:
    r = to_mlir(parse_graph((GOLDEN / "encoder_layer.txt").read_text()))
    ops = {line.split("=", 1)[-1].strip().split(" ")[0] for line in r.text.splitlines() if "." in line}
    for op in ops:
        if "." in op and op[0].isalpha() and not op.startswith(("affine_map", "tensor<")):
            assert op.startswith(UPSTREAM), op


def test_softmax_mapping_text() -> None:
    g = parse_graph(
        "graph @sm(%x: Tensor[f32, (x_0, 8), cpu]) {\n"
        "  %0 = softmax(%x) {dim = 1, dtype = none} : Tensor[f32, (x_0, 8), cpu]\n"
        "  return %0\n}"
    )
    text = to_mlir(g).text
    assert "tensor<?x8xf32>" in text and "tensor.dim" in text
    assert "linalg.generic" in text and '"reduction"' in text and "math.exp" in text


def test_externs_are_reported_never_dropped() -> None:
    r = to_mlir(parse_graph((GOLDEN / "interpolate_bilinear.txt").read_text()))
    assert r.externs == ["interpolate"] and not r.lowerable
    assert "call @cuvil_extern_interpolate_0(" in r.text
    with pytest.raises(MlirError, match="interpolate"):
        run_mlir(parse_graph((GOLDEN / "interpolate_bilinear.txt").read_text()), torch.randn(1, 2, 3, 3))


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.allclose(a, b, rtol=1e-4, atol=1e-5)


T = "Tensor[f32, ({}), cpu]"


def test_elementwise_chain_with_scalars_and_broadcast() -> None:
    g = parse_graph(
        f"graph @ew(%x: {T.format('x_0, x_1')}, %b: {T.format('x_1,')}, %s: Scalar[float]) {{\n"
        f"  %0 = add(%x, %b) : {T.format('x_0, x_1')}\n"
        f"  %1 = mul(%0, %s) : {T.format('x_0, x_1')}\n"
        f"  %2 = tanh(%1) : {T.format('x_0, x_1')}\n"
        "  %3 = const() {value = 0.5} : Scalar[float]\n"
        f"  %4 = gt(%2, %3) : Tensor[bool, (x_0, x_1), cpu]\n"
        f"  %5 = where(%4, %2, %x) : {T.format('x_0, x_1')}\n"
        f"  %6 = clamp(%5) {{max = 0.75, min = -0.25}} : {T.format('x_0, x_1')}\n"
        "  return %6, %4\n}"
    )
    x, b = torch.randn(3, 5), torch.randn(5)
    y, m = run_mlir(g, x, b, 2.0)
    t = torch.tanh((x + b) * 2.0)
    assert torch.equal(m, t > 0.5)
    assert _close(y, torch.where(t > 0.5, t, x).clamp(-0.25, 0.75))


def test_softmax_matmul_reduction() -> None:
    g = parse_graph(
        f"graph @f(%x: {T.format('x_0, x_1')}, %w: {T.format('x_1, 4')}) {{\n"
        f"  %0 = matmul(%x, %w) : {T.format('x_0, 4')}\n"
        f"  %1 = softmax(%0) {{dim = 1, dtype = none}} : {T.format('x_0, 4')}\n"
        f"  %2 = sum(%1) {{dims = [0], dtype = none, keepdim = true}} : {T.format('1, 4')}\n"
        f"  %3 = amax(%x) {{dims = [1], keepdim = false}} : {T.format('x_0,')}\n"
        f"  %4 = mean(%x) {{dims = [0, 1], dtype = none, keepdim = false}} : {T.format('')}\n"
        "  return %1, %2, %3, %4\n}"
    )
    x, w = torch.randn(6, 3), torch.randn(3, 4)
    p, s, m, mu = run_mlir(g, x, w)
    want = torch.softmax(x @ w, dim=1)
    assert _close(p, want) and _close(s, want.sum(0, keepdim=True))
    assert _close(m, x.amax(1)) and _close(mu, x.mean())


def test_views_layer_norm_dynamic_shapes() -> None:
    g = parse_graph(
        f"graph @v(%x: {T.format('x_0, x_1, 4')}, %g: {T.format('4,')}, %b: {T.format('4,')}) {{\n"
        f"  %0 = permute(%x) {{perm = [1, 0, 2]}} : {T.format('x_1, x_0, 4')}\n"
        f"  %1 = reshape(%0) {{shape = [-1, 4]}} : {T.format('x_0*x_1, 4')}\n"
        f"  %2 = layer_norm(%1, %g, %b) {{eps = 1e-05, has_bias = true, has_weight = true, "
        f"normalized_shape = [4]}} : {T.format('x_0*x_1, 4')}\n"
        f"  %3 = slice(%2) {{dim = 1, end = 3, start = 1, step = 1}} : {T.format('x_0*x_1, 2')}\n"
        f"  %4 = cat(%3, %3) {{dim = 1}} : {T.format('x_0*x_1, 4')}\n"
        "  return %4\n}"
    )
    x, gw, gb = torch.randn(2, 3, 4), torch.randn(4), torch.randn(4)
    (y,) = run_mlir(g, x, gw, gb)
    ln = torch.nn.functional.layer_norm(x.permute(1, 0, 2).reshape(-1, 4), (4,), gw, gb)[:, 1:3]
    assert _close(y, torch.cat([ln, ln], 1))


def test_control_flow_graphs_emit_scf() -> None:
    for name, make in sorted(CONTROL_FLOW_GRAPHS.items()):
        text = to_mlir(make()).text
        assert any(k in text for k in ("scf.if", "scf.for", "scf.while")), name


def test_if_on_a_size_predicate() -> None:
    g = CONTROL_FLOW_GRAPHS["if_symbolic"]()  # x[:2] if x.shape[0] > 2 else -x
    assert "arith.cmpi sgt" in to_mlir(g).text
    for rows in (1, 2, 5):
        x = torch.randn(rows, 4)
        (y,) = run_mlir(g, x)
        assert _close(y, x[:2] if rows > 2 else -x)


def test_for_loop() -> None:
    g = CONTROL_FLOW_GRAPHS["for_step_2"]()
    x = torch.randn(5, 4)
    acc, y = x.sum(0), x
    for i in range(0, 5, 2):
        acc = acc + x[i] * i + x[:i].sum(0)
        y = y * 0.5
    got = run_mlir(g, x)
    assert _close(got[0], acc) and _close(got[1], y)


def test_while_loop() -> None:
    g = CONTROL_FLOW_GRAPHS["while"]()  # while (x * x).sum() >= 1: x = x * 0.5; n = n + 1
    assert "scf.while" in to_mlir(g).text
    x = torch.randn(6) * 3
    y, n = x, torch.tensor(0.0)
    while (y * y).sum() >= 1.0:
        y, n = y * 0.5, n + 1.0
    got = run_mlir(g, x)
    assert _close(got[0], y) and _close(got[1], n)


# -- bf16 without compiler-runtime helpers (see [Note: bf16 in the oracle] in cuvil_ir/mlir/run.py) --

#: f32 bit patterns around every bf16 rounding case: ties to even (down and up), just above a tie,
#: overflow to inf, subnormals (kept, rounded, rounded up into the normals), signed zero, infinities
#: and NaNs (a signalling NaN must not round into inf).
BF16_EDGES = [
    0x3F808000, 0x3F818000, 0x3F808001, 0x3F80FFFF, 0x7F7FFFFF, 0x7F7F7FFF, 0xFF7FFFFF,
    0x00000001, 0x00008000, 0x00018000, 0x007FFFFF, 0x00400000, 0x80400000, 0x80000000,
    0x00000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFC00000, 0xFF800001,
]  # fmt: skip

BF16_GRAPH = (
    "graph @bf(%x: Tensor[f32, (x_0,), cpu], %d: Tensor[f64, (x_0,), cpu], %i: Tensor[i64, (x_0,), cpu]) {\n"
    "  %0 = cast(%x) {dtype = bf16} : Tensor[bf16, (x_0,), cpu]\n"
    "  %1 = cast(%0) {dtype = f32} : Tensor[f32, (x_0,), cpu]\n"
    "  %2 = cast(%d) {dtype = bf16} : Tensor[bf16, (x_0,), cpu]\n"
    "  %3 = cast(%i) {dtype = bf16} : Tensor[bf16, (x_0,), cpu]\n"
    "  %4 = mul(%0, %2) : Tensor[bf16, (x_0,), cpu]\n"
    "  %5 = amax(%0) {dims = [0], keepdim = false} : Tensor[bf16, (), cpu]\n"
    "  %6 = cast(%x) {dtype = f16} : Tensor[f16, (x_0,), cpu]\n"
    "  %7 = cast(%6) {dtype = bf16} : Tensor[bf16, (x_0,), cpu]\n"
    "  return %1, %2, %3, %4, %5, %7\n}"
)


def _f32(bits: list[int]) -> torch.Tensor:
    return torch.tensor([b - (1 << 32) if b >= 1 << 31 else b for b in bits], dtype=torch.int32).view(
        torch.float32
    )


def _same_bf16_values(got: torch.Tensor, want: torch.Tensor) -> None:
    """Bit-identical where not NaN, NaN where torch has NaN (torch's NaN bits vary by code path)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan)
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))


def test_bf16_lowering_needs_no_runtime_helpers() -> None:
    """An AVX2-only host's LLVM calls ``__truncsfbf2`` (missing from gcc 12's libgcc) for any bf16
    conversion left in the LLVM dialect: none may remain, on any host."""
    import re

    from cuvil_ir.mlir.run import BF16_PASSES, lower_to_llvm, pipeline

    g = parse_graph(BF16_GRAPH)
    assert "arith.truncf" in to_mlir(g).text  # the emitted module stays plain: the lowering expands
    llvm = lower_to_llvm(g)
    assert "bf16" in llvm  # bf16 loads and stores remain; only bit operations touch them
    bad = re.compile(
        r"llvm\.(fptrunc|fpext|sitofp|uitofp|fptosi|fptoui|fadd|fsub|fmul|fdiv|frem|fneg|fcmp|intr\.\w+)\b.*bf16"
    )
    assert not [line for line in llvm.splitlines() if bad.search(line)]
    assert "__truncsfbf2" not in llvm and "__extendbfsf2" not in llvm and "__truncdfbf2" not in llvm
    # f32 programs keep the pipeline they always had
    assert BF16_PASSES in pipeline("bf16") and BF16_PASSES not in pipeline(to_mlir(_ew_graph()).text)


def _ew_graph() -> Graph:
    return parse_graph(
        f"graph @ew(%x: {T.format('x_0,')}) {{\n  %0 = neg(%x) : {T.format('x_0,')}\n  return %0\n}}"
    )


def test_bf16_rounding_matches_torch() -> None:
    """Round to nearest even, subnormals kept, NaN stays NaN; f64 and i64 round through f32 as
    torch's c10::BFloat16 does (so 1 + 2**-8 + 2**-40 becomes 1.0, not the nearer 1 + 2**-7)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.cat(
        [_f32(BF16_EDGES), torch.randn(300, generator=gen) * 10.0 ** torch.randint(-40, 38, (300,))]
    )
    d = torch.cat(
        [torch.tensor([1 + 2**-8 + 2**-40, -(1 + 2**-8 + 2**-40)], dtype=torch.float64), x[2:].double()]
    )
    i = torch.cat(
        [
            torch.tensor([(1 << 40) + (1 << 32) + 1, -(2**62) - 3]),
            torch.randint(-(2**40), 2**40, (x.numel() - 2,)),
        ]
    )
    g = parse_graph(BF16_GRAPH)
    roundtrip, from_f64, from_i64, product, amax, via_f16 = run_mlir(g, x, d, i)
    xb = x.to(torch.bfloat16)
    _same_bf16_values(roundtrip, xb.float())
    _same_bf16_values(from_f64, d.to(torch.bfloat16))
    assert from_f64[0].item() == 1.0
    _same_bf16_values(from_i64, i.to(torch.bfloat16))
    _same_bf16_values(product, xb * d.to(torch.bfloat16))
    assert amax.isnan()  # NaN propagates through max, as in torch
    _same_bf16_values(via_f16, x.to(torch.float16).to(torch.bfloat16))


def test_elementwise_rules_are_the_registry_primitives(monkeypatch: pytest.MonkeyPatch) -> None:
    """[Note: MLIR elementwise rules]: a scalar rule for exactly the registry's elementwise ops
    without a decomposition, all of them emitted natively; an op that gains a decomposition
    leaves its rule unused, one that loses it has none, and both are reported."""
    from cuvil_ir import REGISTRY
    from cuvil_ir.mlir.elementwise import ARITH, TYPED, elementwise_primitives
    from cuvil_ir.mlir.emit import _ELEMENTWISE

    def mismatch() -> tuple[list[str], list[str]]:
        rules, prims = set(ARITH) | set(TYPED), elementwise_primitives()
        return sorted(prims - rules), sorted(rules - prims)

    assert mismatch() == ([], [])
    assert _ELEMENTWISE == elementwise_primitives()
    monkeypatch.setattr(REGISTRY.get("gelu"), "decompose", None)
    monkeypatch.setattr(REGISTRY.get("sigmoid"), "decompose", lambda b, x: 1 / (1 + (-x).exp()))
    assert mismatch() == (["gelu"], ["sigmoid"])


def test_size_division_has_python_semantics_on_negative_operands() -> None:
    """[Note: size division semantics]: a size expression can be negative (``x_0 - 7`` at a
    small size, a loop index over a negative range); floor, ceiling and Mod give Python's
    ``//``, ``-(-a // b)`` and ``%`` (remsi alone gave -2 for ``-5 % 3``)."""
    g = parse_graph(
        "graph @neg(%x: Tensor[f32, (x_0,), cpu], %y: Tensor[f32, (x_1,), cpu]) {\n"
        "  %0 = const() {value = <floor((x_0 - 7)/x_1)>} : Scalar[int]\n"
        "  %1 = const() {value = <ceiling((x_0 - 7)/x_1)>} : Scalar[int]\n"
        "  %2 = const() {value = <Mod(x_0 - 7, x_1)>} : Scalar[int]\n"
        "  %3 = const() {value = <floor((x_0 - 7)/3)>} : Scalar[int]\n"
        "  return %0, %1, %2, %3\n}"
    )
    for n in range(10):
        for m in (2, 3, 5):
            got = tuple(int(v) for v in run_mlir(g, torch.randn(n), torch.randn(m)))
            assert got == ((n - 7) // m, -((7 - n) // m), (n - 7) % m, (n - 7) // 3), (n, m)


def test_sdpa_softmax_is_the_registry_decomposition(monkeypatch: pytest.MonkeyPatch) -> None:
    """sdpa's softmax is emitted from the softmax op's decomposition, not from math of
    MLIR's own: without that decomposition sdpa becomes an external call."""
    from cuvil_ir import REGISTRY
    from cuvil_ir.graph_ir.decompose import NotDecomposed

    g = parse_graph((GOLDEN / "sdpa_causal.txt").read_text())
    assert to_mlir(g).lowerable

    def declined(*args: object, **kwargs: object) -> None:
        raise NotDecomposed("softmax declined")

    monkeypatch.setattr(REGISTRY.get("softmax"), "decompose", declined)
    r = to_mlir(g)
    assert r.externs == ["sdpa"] and "softmax declined" in r.reasons["sdpa"]


# -- sdpa, emitted from its fallback decomposition (cuvil_ir.graph_ir.fallbacks.sdpa) --------
_SDPA = torch.nn.functional.scaled_dot_product_attention


def _sdpa_graph(
    inputs: list[tuple[int, ...]], args: int, mask_dtype: torch.dtype | None = None, **kw: object
) -> Graph:
    """sdpa captured (every size a symbol) from a torch call on ``inputs``' shapes: the
    first ``args`` inputs are q, k, v (k = v for 2), a last one the mask when given."""
    from cuvil_ir.testing import In, OpCase, capture, spec

    specs = [spec(*s) for s in inputs]
    if mask_dtype is not None:
        specs[-1] = spec(*inputs[-1], dtype=mask_dtype)
    order = (In(0), In(1), In(1)) if args == 2 else (In(0), In(1), In(2))
    if mask_dtype is not None:
        kw = {**kw, "attn_mask": In(len(inputs) - 1)}
    em, values, _, result = capture(OpCase("sdpa", _SDPA, order, tuple(specs), dict(kw)))
    assert [n.op for n in em.nodes if n.op != "const"] == ["sdpa"]
    return Graph("sdpa", tuple(values), tuple(em.nodes), (result.value,), tuple(em.ctx.assumptions))


_SDPA_MLIR = {
    # name: (capture shapes, q/k/v inputs, mask dtype, kwargs, shapes run as well)
    "bool-mask": (
        [(2, 2, 3, 4), (2, 2, 5, 4), (1, 1, 3, 5)],
        2,
        torch.bool,
        {},
        [(2, 2, 6, 4), (2, 2, 2, 4), (1, 1, 6, 2)],
    ),
    "float-mask": ([(1, 4, 4), (1, 6, 4), (4, 6)], 2, torch.float32, {}, [(1, 3, 4), (1, 7, 4), (3, 7)]),
    "causal": ([(1, 2, 4, 8), (1, 2, 6, 8)], 2, None, {"is_causal": True}, [(1, 2, 9, 8), (1, 2, 5, 8)]),
    "scale": (
        [(2, 3, 4, 8), (2, 3, 5, 8), (2, 3, 5, 6)],
        3,
        None,
        {"scale": 0.3},
        [(2, 3, 7, 8), (2, 3, 2, 8), (2, 3, 2, 6)],
    ),
    "gqa": (
        [(2, 6, 3, 8), (2, 2, 5, 8), (2, 3, 5, 4)],
        3,
        None,
        {"enable_gqa": True},
        [(2, 6, 4, 8), (2, 2, 7, 8), (2, 3, 7, 4)],
    ),
}


def _sdpa_inputs(
    shapes: list[tuple[int, ...]], mask_dtype: torch.dtype | None, seed: int
) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(*s, generator=g) for s in shapes]
    if mask_dtype == torch.bool:
        xs[-1] = torch.rand(*shapes[-1], generator=g) > 0.3
    return xs


@pytest.mark.parametrize("name", sorted(_SDPA_MLIR))
def test_sdpa_from_its_fallback_matches_eager(name: str) -> None:
    """Mask kinds, causal, explicit scale and grouped-query heads, each at the captured
    sizes and at other sequence lengths (the sizes are symbols in the module)."""
    shapes, args, mask_dtype, kw, other = _SDPA_MLIR[name]
    g = _sdpa_graph(shapes, args, mask_dtype, **kw)
    r = to_mlir(g)
    assert r.lowerable, r.reasons
    assert "linalg.matmul" in r.text or "linalg.batch_matmul" in r.text or "linalg.generic" in r.text
    for seed, sizes in enumerate([shapes, other]):
        xs = _sdpa_inputs(sizes, mask_dtype, seed)
        q, k = xs[0], xs[1]
        v = xs[2] if args == 3 else k
        mask = xs[-1] if mask_dtype is not None else None
        (got,) = run_mlir(g, *xs)
        assert _close(got, _SDPA(q, k, v, attn_mask=mask, **kw)), (name, sizes)


def test_sdpa_row_masked_entirely_gives_zeros() -> None:
    """As eager (torch's _safe_softmax), not the NaN of a softmax over -inf."""
    g = _sdpa_graph([(1, 2, 3, 4), (1, 2, 5, 4), (3, 5)], 2, torch.bool)
    q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4)
    keep = torch.ones(3, 5, dtype=torch.bool)
    keep[1] = False
    (got,) = run_mlir(g, q, k, keep)
    assert (got[:, :, 1] == 0).all() and _close(got, _SDPA(q, k, k, attn_mask=keep))


def test_sdpa_without_its_fallback_is_an_external_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """MLIR has no sdpa of its own: the fallback table is what emits it."""
    from cuvil_ir.graph_ir import fallbacks

    g = parse_graph((GOLDEN / "sdpa_basic.txt").read_text())
    assert to_mlir(g).lowerable
    monkeypatch.delitem(fallbacks.FALLBACKS, "sdpa")
    r = to_mlir(g)
    assert r.externs == ["sdpa"]
