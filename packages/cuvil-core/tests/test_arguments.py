"""Arguments a target cannot run get a clear error naming them, or eager under
``fallback="eager"``; inputs that require grad never lose their autograd history
silently; threads racing on first calls compile each key once."""

from __future__ import annotations

import threading
import warnings

import pytest
import torch

import cuvil as cu


def _available(name: str) -> bool:
    from cuvil_runtime.registry import discover

    return any(i.name == name and i.available for i in discover())


TARGETS = ["reference"] + (["cpu"] if _available("cpu") else [])


def g(x):
    return x * 2 + 1


def r(x):
    return torch.relu(x)


UNSUPPORTED = {
    "sparse COO": (lambda: torch.randn(3, 4).to_sparse(), "sparse COO tensor"),
    "sparse CSR": (lambda: torch.randn(3, 4).to_sparse_csr(), "sparse CSR tensor"),
    "quantized": (lambda: torch.quantize_per_tensor(torch.randn(3, 4), 0.1, 0, torch.qint8), "quantized"),
    "nested": (lambda: torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(3, 4)]), "nested tensor"),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("kind", sorted(UNSUPPORTED))
def test_unsupported_tensor_is_named_or_run_eagerly(kind, target):
    make, words = UNSUPPORTED[kind]
    strict = cu.compile(r, target=target, fallback="error")
    with pytest.raises(cu.CompileError, match=f"argument 'x' .*{words}"):
        strict(make())
    lenient = cu.compile(r, target=target, fallback="eager")
    x = make()
    with pytest.warns(cu.CuvilFallbackWarning, match="argument 'x'"):
        out = lenient(x)
    expected = torch.relu(x)
    assert out.layout == expected.layout and out.dtype == expected.dtype
    assert lenient.stats.fallbacks == 1


@pytest.mark.skipif("cpu" not in TARGETS, reason="the cpu target is not installed here")
def test_meta_tensor_on_cpu_is_an_error_not_a_segfault():
    f = cu.compile(g, target="cpu", fallback="error")
    with pytest.raises(cu.CompileError, match="argument 'x' is on the meta device.*target='reference'"):
        f(torch.randn(3, 4, device="meta"))
    # after a dense compile, a meta tensor must not hit the cpu artifact either
    f = cu.compile(g, target="cpu", fallback="eager")
    x = torch.randn(3, 4)
    torch.testing.assert_close(f(x), g(x))
    with pytest.warns(cu.CuvilFallbackWarning):
        out = f(torch.randn(3, 4, device="meta"))
    assert out.device.type == "meta" and out.shape == (3, 4)


@pytest.mark.skipif("cpu" not in TARGETS, reason="the cpu target is not installed here")
def test_sparse_after_dense_does_not_reuse_the_dense_artifact():
    f = cu.compile(r, target="cpu", fallback="eager")
    x = torch.randn(3, 4)
    torch.testing.assert_close(f(x), r(x))
    with pytest.warns(cu.CuvilFallbackWarning):
        out = f(x.to_sparse())
    torch.testing.assert_close(out.to_dense(), r(x))
    assert f.stats.compiles == 2 and "sparse" in f.stats.recompile_reasons[-1]


def test_meta_tensors_run_on_the_reference_target():
    f = cu.compile(g, target="reference", fallback="error")
    out = f(torch.randn(3, 4, device="meta"))
    assert out.device.type == "meta" and out.shape == (3, 4)


@pytest.mark.parametrize("target", TARGETS)
def test_requires_grad_keeps_autograd(target):
    f = cu.compile(lambda x, w: (x @ w).relu().sum(), target=target, fallback="eager")
    x, w = torch.randn(4, 3), torch.randn(3, 2, requires_grad=True)
    with pytest.warns(cu.CuvilFallbackWarning, match="requires grad"):
        out = f(x, w)
    out.backward()  # eager ran, with autograd: the gradient is there
    expected_w = w.detach().clone().requires_grad_()
    (x @ expected_w).relu().sum().backward()
    torch.testing.assert_close(w.grad, expected_w.grad)
    # under no_grad the same inputs use the compiled code
    with torch.no_grad():
        torch.testing.assert_close(f(x, w), (x @ w).relu().sum())
    assert f.stats.fallbacks == 1 and len([a for a in f.artifacts if a.captured is not None]) == 1
    strict = cu.compile(lambda x: x * 2, target=target, fallback="error")
    with pytest.raises(cu.CompileError, match="argument 'x' requires grad.*torch.no_grad"):
        strict(torch.randn(3, requires_grad=True))
    with torch.inference_mode():
        torch.testing.assert_close(strict(torch.ones(3)), torch.full((3,), 2.0))


@pytest.mark.parametrize("target", TARGETS)
def test_threads_racing_on_new_keys_compile_each_once(target):
    """8 threads x 4 ranks, all first calls at once: one compile per key (19 for 8 before)."""
    f = cu.compile(lambda x: torch.softmax(x * 3, dim=-1) + 1, target=target, fallback="error")
    inputs = [torch.randn(*([2] * (rank + 1))) for rank in range(4)]
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            barrier.wait()
            for k in range(4):
                x = inputs[(i + k) % 4]
                torch.testing.assert_close(f(x), torch.softmax(x * 3, dim=-1) + 1)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors
    assert f.stats.compiles == 4, f.stats
    assert f.stats.cache_hits == 8 * 4 - 4


@pytest.mark.parametrize("target", TARGETS)
def test_module_parameters_requiring_grad_warn_once_and_match(target):
    """Parameters require grad by default: the compiled module says, once, that its
    results carry no autograd history, and every target agrees on that."""
    m = torch.nn.Linear(3, 2)
    c = cu.compile(m, target=target, fallback="error")
    x = torch.randn(4, 3)
    with pytest.warns(UserWarning, match="carry no autograd history.*torch.no_grad"):
        y = c(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y2 = c(torch.randn(6, 3))  # a second compile does not warn again
        with torch.no_grad():
            torch.testing.assert_close(c(x), m(x))
    assert not y.requires_grad and y.grad_fn is None and not y2.requires_grad
    torch.testing.assert_close(y, m(x).detach())


SCALE = 0.0


def scaled(x):
    return x * SCALE


def test_a_value_changing_every_call_is_correct_bounded_and_warned():
    """Every call recompiles (the global changes), results stay eager's, the artifact list
    and the reasons stay bounded, and one warning says what to do."""
    global SCALE
    from cuvil import api

    f = cu.compile(scaled, target="reference", fallback="error")
    x = torch.randn(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(api.MAX_ARTIFACTS + 10):
            SCALE = float(i)
            torch.testing.assert_close(f(x), x * SCALE)
    assert f.stats.compiles == api.MAX_ARTIFACTS + 10
    assert len(f.artifacts) == api.MAX_ARTIFACTS
    assert len(f.stats.recompile_reasons) <= api.MAX_REASONS
    many = [w for w in caught if "has been compiled" in str(w.message)]
    assert len(many) == 1 and "global 'SCALE' changed" in str(many[0].message)
    SCALE = 2.0  # an evicted value compiles again, correctly
    torch.testing.assert_close(f(x), x * 2.0)
