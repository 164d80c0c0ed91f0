"""Backend conformance: every corpus program, compiled for one target, matches eager.

A backend package's ``tests/test_conformance.py`` is these lines (plus
``import pytest``)::

    from cuvil.testing.conformance import check_program, conformance_params
    @pytest.mark.parametrize("program", conformance_params({"some_program": "why it fails yet"}))
    def test_conformance(program): check_program(program, "cpu")

For each program of :data:`cuvil.testing.corpus.PROGRAMS`, :func:`check_program`
compiles a fresh callable with ``cuvil.compile(fn, target=..., fallback="error")``,
runs every shape variant on fresh inputs and compares with eager PyTorch
(:func:`assert_same`: same output structure, same dtypes, values within the
program's tolerance), then runs variant 0 again (the artifact is reused, and a
second run of an executable gives the same result). It fails when a call falls
back to eager, a variant compiles more than once, or an artifact ran on another
target.

``dtype=torch.bfloat16`` (or ``float16``) runs the program in that type: its float32
input tensors and a module's float32 parameters and buffers are converted first, for
eager and compiled alike, and values are compared within :data:`TOLERANCES` of the
type (or the program's own tolerance where that is looser). A backend runs the corpus
per half type with ``conformance_params(xfail, dtype=...)``; programs eager itself
cannot run in the type are :data:`EAGER_REFUSES` and skipped.

pytest is imported inside :func:`conformance_params`, the one function that needs it:
``cuvil`` does not depend on pytest, and importing this module must not need it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.utils import _pytree as pytree

from cuvil.api import CompiledFunction, Stats
from cuvil.api import compile as cuvil_compile
from cuvil.testing.corpus import PROGRAMS, Program, instantiate

__all__ = [
    "EAGER_REFUSES",
    "HALF_SMOKE",
    "TOLERANCES",
    "assert_same",
    "check_program",
    "compile_and_check",
    "conformance_params",
    "in_dtype",
]

#: [Note: half-precision tolerances] How close a program run in a half type must come to
#: eager in the same type, the one place they are stated (the conformance kit and the
#: backends' half-precision tests read them). A compiled program rounds where eager does
#: ([Note: opmath] in cuvil_ir), but fused float32 math (exp, a reassociated sum, a
#: composite computed in float32 that eager computes op by op) can move a value across a
#: rounding boundary, and a later op can magnify that one-ulp step (a layer norm of
#: nearly equal values, a subtraction that cancels): a few ulps of the type, relative,
#: and as many absolute around zero. bfloat16 has 8 significant bits (ulp 2^-7 at 1),
#: float16 11 (2^-10).
TOLERANCES: dict[torch.dtype, dict[str, float]] = {
    torch.bfloat16: {"rtol": 2**-5, "atol": 2**-5},
    torch.float16: {"rtol": 2**-8, "atol": 2**-8},
}

#: program -> why eager cannot run it in a half type on CPU (no comparison to make)
EAGER_REFUSES: dict[str, str] = {
    "factories": "a float32 tensor made inside @ a half one: matmul refuses mixed dtypes",
    "global_const_tensor": "addmv of a float32 global and a half vector refuses mixed dtypes",
    "group_norm_fn": "avg_pool3d has no Half/BFloat16 CPU kernel",
}


#: the corpus programs a target whose kernels run slowly off the device (Triton's
#: interpreter: ``cuda`` and ``ascend``) runs in each half type in the fast sessions; the
#: rest are marked ``slow`` (``conformance_params(..., fast=HALF_SMOKE)``). One of each
#: kind of kernel: pointwise math and casts, a row reduction (a norm), a half GEMM with its
#: epilogue, dropout's random numbers, a module (the targets' own half tests cover softmax).
HALF_SMOKE: tuple[str, ...] = (
    "ew_arith",
    "casts",
    "layer_norm_fn",
    "dropout_eval",
    "mlp",
)


def in_dtype(tree: Any, dtype: torch.dtype | None) -> Any:
    """``tree`` with its float32 tensors converted to ``dtype`` (unchanged for ``None``)."""
    if dtype is None:
        return tree

    def convert(t: Any) -> Any:
        return t.to(dtype) if isinstance(t, torch.Tensor) and t.dtype == torch.float32 else t

    return pytree.tree_map(convert, tree)


def assert_same(actual: Any, expected: Any, *, rtol: float | None, atol: float | None, where: str) -> None:
    """Same pytree structure, and leaf by leaf: same dtype and close values (or equal non-tensors).

    ``rtol``/``atol`` are both ``None`` (``torch.testing.assert_close``'s
    dtype-based defaults) or both set; NaNs compare equal. ``where`` starts
    every failure message (``"layer_norm on cpu, variant 1"``).
    """
    a_leaves, a_spec = pytree.tree_flatten(actual)
    e_leaves, e_spec = pytree.tree_flatten(expected)
    assert a_spec == e_spec, f"{where}: output structure differs:\n  compiled {a_spec}\n  eager    {e_spec}"
    for k, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        if isinstance(e, torch.Tensor):
            assert isinstance(a, torch.Tensor), (
                f"{where}: output leaf {k} is a {type(a).__name__}, not a tensor"
            )
            assert a.dtype == e.dtype, f"{where}: output leaf {k} has dtype {a.dtype}, eager {e.dtype}"
            torch.testing.assert_close(
                a,
                e,
                rtol=rtol,
                atol=atol,
                equal_nan=True,
                msg=_prefixed(f"{where}, output leaf {k}"),
            )
        else:
            assert type(a) is type(e) and a == e, f"{where}: output leaf {k} is {a!r}, eager {e!r}"


def _prefixed(prefix: str) -> Callable[[str], str]:
    """An ``assert_close`` message callback: its own message, after ``prefix``."""
    return lambda message: f"{prefix}: {message}"


def tolerance(program: Program, dtype: torch.dtype | None) -> dict[str, float]:
    """``assert_close``'s ``rtol``/``atol`` for ``program`` run in ``dtype`` (empty: its
    dtype-based defaults): the program's own, or the type's (:data:`TOLERANCES`), the looser."""
    own = program.tolerance
    if dtype is None or dtype not in TOLERANCES:
        return own
    return {k: max(v, own.get(k, 0.0)) for k, v in TOLERANCES[dtype].items()}


def compile_and_check(
    program: Program,
    target: str,
    *,
    compile_kwargs: Mapping[str, Any] | None = None,
    dtype: torch.dtype | None = None,
    autocast: torch.dtype | None = None,
) -> CompiledFunction:
    """:func:`check_program`, returning the compiled callable (its ``graphs``, ``artifacts``, ``stats``)."""
    options = dict(compile_kwargs or {})
    clash = sorted({"target", "fallback"} & options.keys())
    if clash:
        raise ValueError(f"compile_kwargs must not set {clash}: conformance runs target=, fallback='error'")
    fn = instantiate(program)
    if dtype is not None and program.is_module:
        fn = fn.to(dtype)  # type: ignore[union-attr]
    compiled = cuvil_compile(fn, target=target, fallback="error", **options)
    tol = tolerance(program, dtype or autocast)
    label = target if dtype is None else f"{target} in {str(dtype).removeprefix('torch.')}"
    if autocast is not None:
        label += f" under cpu autocast {str(autocast).removeprefix('torch.')}"

    def amp() -> Any:
        return torch.autocast("cpu", dtype=autocast) if autocast is not None else contextlib.nullcontext()

    def run(variant: int) -> None:
        args, kwargs = in_dtype(program.call_args(variant), dtype)
        with amp():
            expected = fn(*args, **kwargs)
        args, kwargs = in_dtype(program.call_args(variant), dtype)  # fresh: eager must not leak into compiled
        with amp():
            actual = compiled(*args, **kwargs)
        where = f"{program.name} on {label}, variant {variant}"
        assert_same(actual, expected, rtol=tol.get("rtol"), atol=tol.get("atol"), where=where)

    for variant in range(program.num_variants):
        run(variant)
    stats = compiled.stats
    assert stats.fallbacks == 0, f"{program.name} on {target} fell back to eager: {stats.fallback_reasons}"
    assert 1 <= stats.compiles <= program.num_variants, (
        f"{program.name} on {target}: {stats.compiles} compiles for {program.num_variants} shape variants; "
        f"recompile reasons: {stats.recompile_reasons}"
    )
    compiles = stats.compiles
    run(0)  # a variant seen before runs its artifact again, after the others ran
    assert compiled.stats.compiles == compiles, (
        f"{program.name} on {target}: variant 0 compiled again: {compiled.stats.recompile_reasons}"
    )
    elsewhere = sorted({str(a.target) for a in compiled.artifacts if a.target != target})
    assert not elsewhere, f"{program.name}: asked for target {target!r}, artifacts ran on {elsewhere}"
    return compiled


def check_program(
    program: Program,
    target: str,
    *,
    compile_kwargs: Mapping[str, Any] | None = None,
    dtype: torch.dtype | None = None,
    autocast: torch.dtype | None = None,
) -> Stats:
    """Compile ``program`` for ``target`` (``fallback="error"``), run every shape variant, compare with eager.

    ``compile_kwargs`` go to ``cuvil.compile`` too (``opt_level``, ``dynamic``,
    ...; not ``target`` or ``fallback``). ``dtype``: run the program in that float
    type (see the module docstring); ``autocast``: call it (eager and compiled) under
    ``torch.autocast("cpu", dtype=autocast)``, within that type's tolerance. A target that cannot compile a
    program raises ``cuvil.CompileError``; a wrong result, a fallback or an
    extra compile fails an assertion. Returns the compiled callable's ``stats``.
    """
    return compile_and_check(
        program, target, compile_kwargs=compile_kwargs, dtype=dtype, autocast=autocast
    ).stats


def conformance_params(
    xfail: Mapping[str, str] = {},
    *,
    raises: type[BaseException] | tuple[type[BaseException], ...] | None = None,
    dtype: torch.dtype | None = None,
    fast: tuple[str, ...] | None = None,
) -> list[Any]:
    """One ``pytest.param`` per corpus program (id: its name), for ``@pytest.mark.parametrize``.

    ``xfail`` maps program names to the reason a target cannot run them yet;
    those get a strict ``xfail`` mark (an unexpected pass fails, so a fixed
    program must leave the list), restricted to ``raises`` when given. A name
    that is not a corpus program is an error, so a renamed program cannot keep
    a stale entry. With a half ``dtype``, :data:`EAGER_REFUSES` are skipped. With
    ``fast`` (names of corpus programs, such as :data:`HALF_SMOKE`), every other program is
    marked ``slow`` (run by ``nox -s slow``, not by the fast sessions).
    """
    import pytest

    names = {p.name for p in PROGRAMS}
    unknown = sorted(set(xfail) - names)
    if unknown:
        raise ValueError(f"xfail names programs that are not in the corpus: {unknown}")
    unknown = sorted(set(fast or ()) - names)
    if unknown:
        raise ValueError(f"fast names programs that are not in the corpus: {unknown}")
    params = []
    for p in PROGRAMS:
        marks = []
        if p.name in xfail:
            marks.append(pytest.mark.xfail(reason=xfail[p.name], strict=True, raises=raises))
        if dtype in TOLERANCES and p.name in EAGER_REFUSES:
            marks.append(pytest.mark.skip(reason=f"eager refuses it: {EAGER_REFUSES[p.name]}"))
        if fast is not None and p.name not in fast:
            marks.append(pytest.mark.slow)
        params.append(pytest.param(p, id=p.name, marks=marks))
    return params
