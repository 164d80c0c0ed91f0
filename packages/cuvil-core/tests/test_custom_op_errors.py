"""A custom op's declaration that its code contradicts is a clear, located error, never
a wrong result or a crash: a reference whose result disagrees with ``shape=``/``dtype=``
(issue 26 item 8), a C lowering the compiler rejects, a data-dependent result shape with
no ``shape=`` (item 13)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

import cuvil as cu
from cuvil.custom_ops import ContractError
from cuvil.errors import CompileError


def _available(name: str) -> bool:
    from cuvil_runtime.registry import discover

    return any(i.name == name and i.available for i in discover())


TARGETS = ["reference"] + (["cpu"] if _available("cpu") else [])
HERE = __file__.rsplit("/", 1)[-1]


# -- item 8: the reference's result against shape= / dtype= ----------------------------------


@cu.custom_op("cuvil_err::short_rows", shape=lambda x: x)
def short_rows(x):  # declared: x's shape; returns one row
    return x[:1].clone()


@cu.custom_op("cuvil_err::as_int64", shape=lambda x: x)
def as_int64(x):  # declared: x's dtype (float32); returns int64
    return (x * 4).to(torch.int64)


@cu.custom_op("cuvil_err::wrong_second", shape=lambda x: (x, x))
def wrong_second(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x + 1, x.sum(0)


DECLARED_AT = {
    "short_rows": short_rows.reference.__code__.co_firstlineno,
    "as_int64": as_int64.reference.__code__.co_firstlineno,
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    "op, got",
    [
        (short_rows, "got shape (1, 8), dtype torch.float32"),
        (as_int64, "got shape (5, 8), dtype torch.int64"),
    ],
    ids=["shape", "dtype"],
)
def test_a_reference_that_contradicts_its_declaration_is_a_located_error(target, op, got):
    cf = cu.compile(lambda x: op(x + 1) * 2, target=target, fallback="error")
    with pytest.raises(ContractError) as info:
        cf(torch.randn(5, 8))
    text = str(info.value)
    assert f"custom op {op.name}" in text and "disagrees with the declaration" in text, text
    assert f"{HERE}:{DECLARED_AT[op.__name__]}:" in text, text  # the declaration's file:line
    assert "expected shape (5, 8), dtype torch.float32, device cpu" in text and got in text, text
    assert isinstance(info.value, CompileError)


@pytest.mark.parametrize("target", TARGETS)
def test_each_result_of_a_multi_result_op_is_checked(target):
    cf = cu.compile(lambda x: wrong_second(x)[1] * 2, target=target, fallback="error")
    with pytest.raises(ContractError, match=r"result 1: expected shape \(3, 4\).*got shape \(4,\)"):
        cf(torch.randn(3, 4))


def test_eager_calls_check_the_declaration_too():
    with pytest.raises(ContractError, match="dtype torch.int64"):
        as_int64(torch.randn(2, 3))
    with pytest.raises(ContractError, match="got shape"):
        torch.ops.cuvil_err.short_rows(torch.randn(2, 3))


def test_large_contradicting_calls_raise_in_a_process_that_survives(tmp_path):
    """The kernels after the op are sized by the declaration: before the check they read
    (and wrote) far past the reference's buffer, garbage at small sizes and a segfault at
    large ones. The run happens in a child process so a crash is seen, not suffered."""
    script = tmp_path / "contract.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import torch, cuvil as cu
            from cuvil.custom_ops import ContractError

            @cu.custom_op("contract::short_rows", shape=lambda x: x)
            def short_rows(x):
                return x[:1].clone()

            @cu.custom_op("contract::as_int64", shape=lambda x: x)
            def as_int64(x):
                return (x * 4).to(torch.int64)

            for target in {TARGETS!r}:
                for op in (short_rows, as_int64):
                    cf = cu.compile(lambda x: op(x + 1) * 2, target=target, fallback="error")
                    for n in (4, 1 << 16):
                        try:
                            cf(torch.randn(n, 64))
                            print(target, op.name, n, "no error")
                        except ContractError as e:
                            print(target, op.name, n, "raised", "expected shape (%d, 64)" % n in str(e))
            print("survived")
            """
        )
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr[-3000:])
    lines = proc.stdout.splitlines()
    assert lines[-1] == "survived", proc.stdout
    assert len(lines) == 1 + 4 * len(TARGETS), proc.stdout
    assert all(line.endswith("raised True") for line in lines[:-1]), proc.stdout


# -- item 13: what the capture or the C compiler refuses, named and located ------------------


@cu.custom_op("cuvil_err::positives")
def positives(x):  # its result's size is computed from x's values
    return x[x > 0]


@pytest.mark.parametrize("target", TARGETS)
def test_a_data_dependent_result_shape_without_shape_is_a_located_error(target):
    cf = cu.compile(lambda x: positives(x + 1) * 2, target=target, fallback="error")
    with pytest.raises(CompileError) as info:
        cf(torch.randn(4, 8))
    text = str(info.value)
    line = positives.reference.__code__.co_firstlineno
    assert text.startswith(f"{__file__}:{line}:"), text  # the declaration
    assert "custom op cuvil_err::positives: its result has a data-dependent shape (u0,)" in text, text
    assert "declare it with shape=" in text and "shape=lambda x: x" in text, text
    assert "internal error" not in text and "unbound symbols" not in text, text


@cu.custom_op("cuvil_err::unbalanced", lower={"cpu": "x * (k +"})
def unbalanced(x, *, k: float = 1.0):
    return x * k


@cu.custom_op("cuvil_err::unknown_fn", lower={"cpu": "x + my_scale(x)"})
def unknown_fn(x):
    return x + x


@cu.custom_op("cuvil_err::bad_name", lower={"cpu": "y * 2"})
def bad_name(x):
    return x * 2


needs_cpu = pytest.mark.skipif("cpu" not in TARGETS, reason="the cpu target (a C compiler) is not available")


@needs_cpu
@pytest.mark.parametrize(
    "op, diagnostic",
    [
        (unbalanced, "at the end of the text: error: expected expression before"),
        (unknown_fn, "column 5: error: implicit declaration of function ‘my_scale’"),
        (bad_name, "column 1: error: ‘y’ undeclared"),
    ],
    ids=["syntax", "unknown-function", "unknown-name"],
)
def test_a_c_lowering_the_compiler_rejects_names_the_op_and_the_diagnostic(op, diagnostic):
    cf = cu.compile(lambda x: op(x * 3) + 1, target="cpu", fallback="error")
    with pytest.raises(CompileError) as info:
        cf(torch.randn(4, 8))
    text = str(info.value)
    line = op.reference.__code__.co_firstlineno
    assert f"custom op {op.name} (declared at {__file__}:{line})" in text, text
    assert f"its cpu lowering {op.lowerings['cpu']!r} does not compile as C for float" in text, text
    assert diagnostic in text, text
    assert "internal error" not in text and "KernelBuildError" not in text and "KernelLoadError" not in text
    assert "command:" not in text and ".c:" not in text, text  # no compiler dump of the whole kernel
    # the reference target does not use the C text: the op still compiles there
    ok = cu.compile(lambda x: op(x * 3) + 1, target="reference", fallback="error")
    x = torch.randn(4, 8)
    torch.testing.assert_close(ok(x), op.reference(x * 3) + 1)


@needs_cpu
def test_a_lowering_that_compiles_still_fuses_and_matches_eager():
    @cu.custom_op("cuvil_err::good", lower={"cpu": "x * k + fabs(x)"})
    def good(x, *, k: float = 2.0):
        return x * k + x.abs()

    cf = cu.compile(lambda x: good(x - 1) * 2, target="cpu", fallback="error")
    x = torch.randn(4, 8)
    torch.testing.assert_close(cf(x), (good.reference(x - 1)) * 2)
    assert "cu_native_cuvil_err__good__f32" in cf.artifacts[-1].executable.stages["c"]
