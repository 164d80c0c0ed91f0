"""Every kernel the ``ascend`` target generates for the corpus, through Ascend's own compiler.

Runs where triton-ascend is the installed ``triton`` (``nox -s tests_ascend_compile``
builds such an environment; no CANN, no NPU): each corpus program is captured,
compiled by the ``ascend`` target, and every kernel's ``ttir`` (triton-ascend's
``make_ttir``) and ``linalg`` (its ``triton-adapter-opt``) stages must be produced,
for both variants of a row kernel, with the corpus in float32 and in each half type
(float16 and bfloat16 pointers, float32 math: [Note: half precision in Triton]). Nothing
runs: without CANN there is no ``bishengir-compile`` and no device.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import cuvil as cu
from cuvil.testing.conformance import EAGER_REFUSES, in_dtype
from cuvil.testing.corpus import PROGRAMS, instantiate
from cuvil_backend_ascend.policy import FUSION, POLICY, RULES
from cuvil_backend_ascend.target import AscendTarget
from cuvil_ir.tensor_ir.lower import lower
from cuvil_ir.triton_source.emit import generate_triton
from cuvil_runtime.target import CompileOptions

pytestmark = pytest.mark.usefixtures("ascend_compiler")


def corpus_graphs(dtype=None):
    """Each corpus program's graphs; with ``dtype``, its float32 tensors and parameters in it."""
    for p in PROGRAMS:
        if dtype is not None and p.name in EAGER_REFUSES:
            continue
        fn = instantiate(p)
        if dtype is not None and p.is_module:
            fn = fn.to(dtype)
        f = cu.compile(fn, target="reference", fallback="error")
        args, kwargs = in_dtype(p.call_args(0), dtype)
        with torch.no_grad():
            f(*args, **kwargs)
        for g in f.graphs:
            yield p.name, g


@pytest.mark.parametrize(
    "dtype", [None, torch.bfloat16, torch.float16], ids=["float32", "bfloat16", "float16"]
)
def test_every_corpus_kernel_passes_make_ttir_and_ttir_to_linalg(capsys, dtype):
    target = AscendTarget()
    counts = {"programs": 0, "kernels": 0, "ttir": 0, "linalg": 0, "variants": 0, "half": 0}
    half = {torch.bfloat16: "xbf16>", torch.float16: "xf16>"}.get(dtype)
    for name, graph in corpus_graphs(dtype):
        counts["programs"] += 1
        exe = target.compile(graph, CompileOptions())
        for kernel, texts in exe.kernel_texts.items():
            where = f"{name} kernel {kernel}"
            counts["kernels"] += 1
            assert "@triton.jit" in texts["triton"], where
            assert "tt.func" in texts["ttir"], where
            counts["ttir"] += 1
            assert "func.func" in texts["linalg"], where
            counts["linalg"] += 1
            counts["half"] += bool(half) and f"memref<?{half}" in texts["linalg"]
            counts["variants"] += texts["linalg"].count("\n// XBLOCK=") + texts["linalg"].startswith(
                "// XBLOCK="
            )
        assert list(exe.stages) == ["graph_ir", "tensor_ir", "triton", "ttir", "linalg", "wrapper"]
    with capsys.disabled():
        print(f"\nascend compile check ({dtype or torch.float32}): {counts}")
    assert counts["kernels"] == counts["ttir"] == counts["linalg"] > 200
    if half:  # most kernels read or write a half buffer (the rest: integer and bool kernels)
        assert counts["half"] > counts["kernels"] // 2, counts


def test_yolox_head_kernels_pass(yolox_head):
    """The mission's example: every kernel of a YOLOX-style head through both stages."""
    f = cu.compile(yolox_head, target="reference", fallback="error")
    with torch.no_grad():
        f(torch.randn(1, 16, 8, 8))
    exe = AscendTarget().compile(f.graphs[0], CompileOptions())
    assert exe.kernel_texts
    for kernel, texts in exe.kernel_texts.items():
        assert "func.func" in texts["linalg"], kernel


def test_stage_texts_are_deterministic():
    """The same kernel gives the same TTIR and Linalg text twice (no temporary paths,
    no addresses), so the ``ttir``/``linalg`` hashes of ``cu.audit`` are stable."""
    from cuvil_backend_ascend.compiler import compile_stages  # triton-ascend's modules

    _, graph = next(corpus_graphs())
    program = lower(graph, FUSION)
    tk = generate_triton(next(iter(program.kernels())), program, RULES)
    assert compile_stages(tk, POLICY) == compile_stages(tk, POLICY)


def test_simulation_beside_triton_ascend_is_unavailable_and_says_why():
    """Simulation needs upstream Triton's interpreter: with triton-ascend installed the
    target says so, with the install command."""
    code = (
        "from cuvil_runtime.registry import discover\n"
        "b = {x.name: x for x in discover()}['ascend']\n"
        "print(b.available, b.reason)\n"
    )
    env = {**os.environ, "CUVIL_ASCEND_SIM": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert out.startswith("False") and "cuvil-backend-ascend[sim]" in out and "triton-ascend" in out, out


@pytest.mark.parametrize(
    "fn",
    [
        torch.asinh,
        torch.atanh,
        torch.atan,
        torch.log1p,
        torch.expm1,
        torch.tanh,
        torch.erf,
        torch.log2,
        torch.sin,
    ],
    ids=lambda f: f.__name__,
)
def test_float_functions_of_the_device_library_pass_both_stages(fn):
    """A device-library function the corpus may not use (asinh, added after it) still goes
    through triton-ascend's make_ttir and ttir_to_linalg."""
    f = cu.compile(lambda x: fn(x) * 2, target="reference", fallback="error")
    with torch.no_grad():
        f(torch.randn(8, 16))
    exe = AscendTarget().compile(f.graphs[0], CompileOptions())
    assert exe.kernel_texts
    for kernel, texts in exe.kernel_texts.items():
        assert f"cu.{fn.__name__}" in texts["triton"], texts["triton"]
        assert "tt.func" in texts["ttir"] and "func.func" in texts["linalg"], kernel


@pytest.mark.parametrize(
    "group,head_dim,dtype,cache_dtype",
    [(1, 64, "fp32", "fp32"), (4, 128, "fp32", "fp32"), (2, 80, "bf16", "bf16"), (8, 128, "fp16", "fp16")],
)
def test_paged_attention_kernel_passes_make_ttir_and_ttir_to_linalg(group, head_dim, dtype, cache_dtype):
    """The hand-written paged attention kernel (cuvil_runtime/triton_kernels/paged_attention.py)
    with the tiles the ascend target launches it with (cuvil_backend_ascend/paged_attention.py)."""
    from cuvil_backend_ascend import paged_attention as ascend_paged
    from cuvil_backend_ascend.compiler import front_half_of
    from cuvil_runtime.triton_kernels.paged_attention import (
        merge_signature,
        paged_attention_kernel,
        paged_attention_merge,
        signature,
    )

    cache_bytes = 4 if cache_dtype == "fp32" else 2
    config = ascend_paged.choose(group, head_dim, cache_bytes, POLICY)
    ascend_paged.check_launch(config, (40,), cache_bytes, POLICY)
    sig = {k: v for k, v in signature().items() if v != "constexpr"}
    sig.update(out_ptr=f"*{dtype}", q_ptr=f"*{dtype}", k_ptr=f"*{cache_dtype}", v_ptr=f"*{cache_dtype}")
    ttir, linalg = front_half_of(paged_attention_kernel, sig, config, "paged_attention_kernel")
    assert "tt.func" in ttir and "scf.for" in ttir  # the items and the positions are loops
    assert "func.func" in linalg
    merge = {k: v for k, v in merge_signature(dtype).items() if v != "constexpr"}
    ttir, linalg = front_half_of(paged_attention_merge, merge, {"SP": 16, "DP": config["DP"]}, "merge")
    assert "tt.func" in ttir and "func.func" in linalg
