"""A decode step's attention over a contiguous cache (``decode_attention``: the paged kernel with
the identity block table, or its direct form) against torch's ``sdpa``: every mask of a decode
step's shape and the ones it leaves to torch, grouped and plain heads, batches, the cache's
layout as transformers keeps it and transposed; the ``cpu_decode_attention`` rewrite and its
native step against the steps from Python and eager; then a Llama's ``generate()`` with a
static cache, compiled, against eager."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import cuvil as cu
import cuvil.api
from cuvil_backend_cpu import decode_attention, paged_attention
from cuvil_backend_cpu.kernel_cache import KernelCache
from cuvil_backend_cpu.paged_attention import PagedAttentionKernel
from cuvil_backend_cpu.testing import native_runs_here, native_runs_used
from cuvil_runtime.cache import CompileCache
from cuvil_runtime.pipeline import ProgramExecutable

LOWEST = torch.finfo(torch.float32).min


@pytest.fixture(scope="module")
def pa() -> PagedAttentionKernel:
    return paged_attention.kernel(KernelCache())


def _bool(lens: list[int], positions: int) -> torch.Tensor:
    m = torch.zeros(len(lens), 1, 1, positions, dtype=torch.bool)
    for b, n in enumerate(lens):
        m[b, ..., :n] = True
    return m


def _additive(lens: list[int], positions: int, dropped: float = LOWEST) -> torch.Tensor:
    return torch.where(_bool(lens, positions), 0.0, dropped)


def _run(mask: torch.Tensor | None, batch: int, positions: int) -> tuple[Any, Any]:
    """What ``attend`` gives for this mask, and torch's (None where torch takes no such mask)."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(batch, 4, 1, 8, generator=g)
    k, v = torch.randn(batch, 2, positions, 8, generator=g), torch.randn(batch, 2, positions, 8, generator=g)
    got = decode_attention.attend(
        lambda: paged_attention.kernel(KernelCache()), q, k, v, mask, scale=0.5, enable_gqa=True
    )
    if mask is not None and mask.dtype not in (torch.bool, torch.float32):
        return got, None
    return got, F.scaled_dot_product_attention(q, k, v, mask, scale=0.5, enable_gqa=True)


def test_every_mask_of_a_decode_step_runs_the_kernel(monkeypatch: Any) -> None:
    """Prefix masks by the split kernel, any other ``[B or 1, 1, 1, S]`` boolean or float32 mask
    by the C call's direct form, both against torch's: holes (a left-padded batch), a row that
    sees nothing (zeros, as torch's), finite penalties, biases on the allowed positions, NaN and
    +inf (NaN rows, as torch's)."""
    monkeypatch.setattr(decode_attention, "MIN_CACHED", 1)
    hole = _bool([6, 12, 2], 12)
    hole[0, ..., 2] = False
    hole[1, ..., :5] = False  # left padding
    nan = _additive([7], 12)
    nan[..., 3] = float("nan")
    inf = _additive([7], 12)
    inf[..., 1] = float("inf")
    taken = [
        (_bool([5, 9, 1], 12), 3),
        (_additive([12, 3], 12), 2),
        (_additive([4], 12, float("-inf")), 3),  # one row for every sequence
        (_bool([3, 5], 24)[..., ::2], 2),  # positions with stride 2: copied, then read
        (None, 2),
        (hole, 3),
        (_bool([0, 4], 12), 2),  # a row that sees nothing
        (_additive([4], 12, -1e4), 2),  # a finite penalty: its exp is not exactly 0
        (_additive([4, 9], 12) + torch.linspace(0, 1, 12), 2),  # a bias on the allowed positions
        (torch.full((1, 1, 1, 12), LOWEST), 2),  # every position at float32's lowest: uniform
        (_additive([0], 12, float("-inf")), 1),  # -inf everywhere: zeros
        (nan, 1),
        (inf, 1),
    ]
    for mask, batch in taken:
        got, want = _run(mask, batch, 12)
        assert got is not None, mask
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)
    refused = [
        _bool([4], 12).expand(1, 4, 1, 12),  # per-head masks
        _bool([4], 12).to(torch.float16),
    ]
    for mask in refused:
        assert _run(mask, 1, 12)[0] is None, mask


@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (4, 4), (6, 1)])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("mask_kind", ["bool", "additive", "none"])
def test_against_torch(heads: int, kv_heads: int, batch: int, mask_kind: str, monkeypatch: Any) -> None:
    monkeypatch.setattr(decode_attention, "MIN_CACHED", 1)
    g = torch.Generator().manual_seed(0)
    positions, dim = 70, 24
    lens = [70, 33, 1][:batch]
    mask = {"bool": _bool(lens, positions), "additive": _additive(lens, positions), "none": None}[mask_kind]
    q = torch.randn(batch, heads, 1, dim, generator=g)
    # transformers' cache layout [B, Hk, S, D], and the transposed [B, S, Hk, D] viewed as it
    k = torch.randn(batch, kv_heads, positions, dim, generator=g)
    v = torch.randn(batch, positions, kv_heads, dim, generator=g).transpose(1, 2)
    gqa = heads != kv_heads
    want = F.scaled_dot_product_attention(q, k, v, mask, enable_gqa=gqa, scale=0.3)
    got = decode_attention.attend(
        lambda: paged_attention.kernel(KernelCache()), q, k, v, mask, scale=0.3, enable_gqa=gqa
    )
    assert got is not None and got.shape == want.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_what_it_leaves_to_torch(monkeypatch: Any) -> None:
    monkeypatch.setattr(decode_attention, "MIN_CACHED", 1)
    kern = lambda: paged_attention.kernel(KernelCache())  # noqa: E731
    q, k = torch.randn(1, 4, 1, 8), torch.randn(1, 2, 20, 8)
    assert decode_attention.attend(kern, q, k, k, None, scale=1.0, enable_gqa=False) is None  # 4 vs 2 heads
    assert decode_attention.attend(kern, q.repeat(1, 1, 2, 1), k, k, None, scale=1.0, enable_gqa=True) is None
    assert (
        decode_attention.attend(kern, q.double(), k.double(), k.double(), None, scale=1.0, enable_gqa=True)
        is None
    )
    monkeypatch.setattr(decode_attention, "MIN_CACHED", 21)  # 1 x 20 cached positions: torch's
    assert decode_attention.attend(kern, q, k, k, None, scale=1.0, enable_gqa=True) is None


@torch.no_grad()
@pytest.mark.parametrize("native", [False, True])
def test_compiled_generate_with_a_static_cache_runs_it(native: bool, monkeypatch: Any) -> None:
    """Each decode step's attention runs the kernel: from Python (``attend``, counted), or in
    the decode step's native run (``cpu_decode_attention`` a step of it, its tables used)."""
    transformers = pytest.importorskip("transformers")
    if native and not native_runs_here():
        pytest.skip("emulated kernels (another ISA under qemu) take tensors: no native runs")
    monkeypatch.setenv("CUVIL_NATIVE_RUNS", "1" if native else "0")
    monkeypatch.setattr(cuvil.api, "_EXECUTABLES", CompileCache())  # (a wrapper made under the setting)
    monkeypatch.setattr(decode_attention, "MIN_CACHED", 1)
    calls = {"n": 0}
    real = decode_attention.attend

    def spy(*args: Any, **kw: Any) -> Any:
        out = real(*args, **kw)
        calls["n"] += out is not None
        return out

    monkeypatch.setattr(decode_attention, "attend", spy)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 96, (2, 7))
    kw: dict[str, Any] = {"max_new_tokens": 6, "min_new_tokens": 6, "do_sample": False}
    want = copy.deepcopy(model).generate(ids, **kw, cache_implementation="static")
    f = cu.compile(model, target="cpu", fallback="error")
    got = f.generate(ids, **kw, cache_implementation="static")
    assert torch.equal(got, want)
    if not native:
        assert calls["n"] >= 2 * 5, calls  # every layer of every decode step (the first token: prefill)
        return
    decode = [a.executable for a in f.artifacts if isinstance(a.executable, ProgramExecutable)][-1]
    ops = [s.extern.node.op for r in decode._runner.runs for s in r.steps if s.extern is not None]
    assert ops.count(decode_attention.OP) == 2, ops  # both layers' attention inside runs
    # the float32 decode step is one run: each linear a group's GEMV (of one where alone: the
    # output and down projections, the LM head), the attention and the cache writes steps of it
    runs = decode._runner.runs
    assert len(runs) == 1 and len(runs[0].steps) >= len(decode._runner.program.steps) - 2, [
        len(r.steps) for r in runs
    ]
    used = native_runs_used(decode)
    assert used and all(all(v) for v in used.values()), used
    assert calls["n"] == 2  # the decode binding's first call, from Python (2 layers); then natively


def decode_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A decode step's attention (one query position per head: ``q [B, H, D]``) between two
    kernels (so that it sits inside a native run)."""
    out = F.scaled_dot_product_attention((q * 1.5).unsqueeze(2), k, v, mask, scale=0.25, enable_gqa=True)
    return torch.tanh(out.transpose(1, 2).reshape(q.shape[0], 1, -1))


def _compiled(native: bool, monkeypatch: Any, *example: Any) -> Any:
    monkeypatch.setenv("CUVIL_NATIVE_RUNS", "1" if native else "0")
    monkeypatch.setattr(cuvil.api, "_EXECUTABLES", CompileCache())
    f = cu.compile(decode_step, target="cpu", fallback="error")
    with torch.no_grad():
        f(*example)
    return f


def test_a_decode_step_attention_is_rewritten_and_runs_in_a_native_run(monkeypatch: Any) -> None:
    """``sdpa`` with one query position becomes ``cpu_decode_attention``, written into its
    buffer; natively (a run's step) and from Python it gives the same bits, and eager's values,
    for prefix masks and others (data: the same program), at several cache lengths and batches,
    below :data:`MIN_CACHED` too."""
    g = torch.Generator().manual_seed(1)

    def case(batch: int, positions: int, kind: str) -> tuple[torch.Tensor, ...]:
        q = torch.randn(batch, 8, 16, generator=g)
        k, v = (
            torch.randn(batch, 2, positions, 16, generator=g),
            torch.randn(batch, 2, positions, 16, generator=g),
        )
        lens = [max(1, positions - 3 * b) for b in range(batch)]
        mask = _bool(lens, positions)
        if kind == "holes":
            mask[0, ..., 0] = False
            mask[-1] = False  # a sequence that sees nothing
        return q, k, v, mask

    first = case(2, 9, "prefix")
    native = _compiled(True, monkeypatch, *first)
    python = _compiled(False, monkeypatch, *first)
    assert "cpu_decode_attention" in native.artifacts[-1].executable.stages["tensor_ir"]
    if native_runs_here():
        ops = [
            s.extern.node.op
            for r in native.artifacts[-1].executable._runner.runs
            for s in r.steps
            if s.extern is not None
        ]
        assert decode_attention.OP in ops, native.artifacts[-1].executable.stages["wrapper"]
    for batch, positions, kind in ((2, 9, "prefix"), (2, 9, "holes"), (3, 70, "holes"), (1, 300, "prefix")):
        args = case(batch, positions, kind)
        want = decode_step(*args)
        b = python(*args)
        for _ in range(2):  # a binding's first call from Python, then natively
            a = native(*args)
            assert a.dtype == want.dtype == torch.float32
            assert torch.equal(a, b), (batch, positions, kind)
            torch.testing.assert_close(a, want, rtol=1e-5, atol=1e-5)
    assert native.stats.compiles == 1 and python.stats.compiles == 1
    if native_runs_here():
        used = native_runs_used(native)
        assert used and all(all(v) for v in used.values()), used


def test_other_attention_is_not_rewritten_or_runs_torch(monkeypatch: Any) -> None:
    """Query positions not known to be one, a causal flag: ``sdpa`` as before. A per-head mask
    or a float16 one of a decode step: rewritten, and torch's attention copied in (checked per
    call), natively and from Python."""
    q, k = torch.randn(1, 4, 3, 8), torch.randn(1, 4, 10, 8)
    cases = [
        (lambda q, k: F.scaled_dot_product_attention(q, k, k), (q, k)),
        (lambda q, k: F.scaled_dot_product_attention(q, k, k, is_causal=True), (q[:, :, :1], k)),
        (lambda q, k: F.scaled_dot_product_attention(q.unsqueeze(2), k, k, is_causal=True), (q[:, :, 0], k)),
    ]
    for fn, args in cases:
        f = cu.compile(fn, target="cpu", fallback="error")
        torch.testing.assert_close(f(*args), fn(*args), rtol=1e-5, atol=1e-5)
        assert "cpu_decode_attention" not in f.artifacts[-1].executable.stages["tensor_ir"]
    per_head = torch.rand(2, 8, 1, 11) > 0.3
    per_head[..., 0] = True
    args = (torch.randn(2, 8, 16), torch.randn(2, 2, 11, 16), torch.randn(2, 2, 11, 16), per_head)
    for native in (True, False):
        f = _compiled(native, monkeypatch, *args)
        assert "cpu_decode_attention" in f.artifacts[-1].executable.stages["tensor_ir"]
        for _ in range(2):
            torch.testing.assert_close(f(*args), decode_step(*args), rtol=1e-5, atol=1e-5)


def test_a_saved_decode_step_loads_and_runs_it(tmp_path: Any) -> None:
    """A loaded artifact runs ``cpu_decode_attention`` by its out-variant (this host's kernel),
    natively from its second call: eager's values, prefix masks and others."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (
        torch.randn(2, 8, 16, generator=g),
        torch.randn(2, 2, 40, 16, generator=g),
        torch.randn(2, 2, 40, 16, generator=g),
    )
    f = cu.load(cu.save(decode_step, tmp_path / "decode.cuvil", q, k, v, _bool([40, 7], 40)))
    steps = f.executable._runner.program.steps
    assert decode_attention.OP in [s.node.op for s in steps if hasattr(s, "node")]
    holes = _bool([40, 30], 40)
    holes[1, ..., :4] = False
    for mask in (_bool([40, 7], 40), holes, holes):
        torch.testing.assert_close(f(q, k, v, mask), decode_step(q, k, v, mask), rtol=1e-5, atol=1e-5)
