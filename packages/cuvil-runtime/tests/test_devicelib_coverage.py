"""Every Tensor IR scalar function reaches every Triton device library.

A kernel's scalar functions (:data:`cuvil_ir.tensor_ir.expr.FUNCTIONS`) become Triton
text in :mod:`cuvil_ir.triton_source.functions`: ``tl`` operators and builtins, or
calls of the device library a target binds as ``cu`` (``cu.exp``, ``cu.floordiv``
...). For each function and each kernel dtype this renders the call and checks that:

* every function has a Triton form for some dtype, or a stated reason why none
  (:data:`NO_TRITON_FORM`);
* every ``cu.<name>`` the generated text calls (those calls, and the reduction
  combiners the kernel renderer calls) is in the library's :data:`NAMES`;
* every name of :data:`NAMES` is defined by each library: the interpreter's
  (:mod:`cuvil_runtime.triton_kernels.devicelib.interpreted`), the ``cuda`` target's
  (``cuvil_backend_cuda.devicelib.compiled``) and the ``ascend`` target's
  (``cuvil_backend_ascend.devicelib``).

The libraries import triton (absent from the test environment without a GPU), so
their definitions are read from their source: top-level ``def``s and assignments,
plus :data:`~cuvil_runtime.triton_kernels.devicelib.common.SHARED` where a module
binds the shared helpers (``globals().update(common.decorated(...))``), plus the
table's libdevice functions where a compiled library binds those it does not write
itself (:data:`~cuvil_ir.scalar_functions.LIBDEVICE`), and the decomposed device
functions where the interpreted library binds their float64 forms. The values
of the forms are tested per target (``test_triton_functions.py`` of the cuda backend).
"""

from __future__ import annotations

import ast
import importlib.util
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

from cuvil_ir.graph_ir.types import DType
from cuvil_ir.scalar_functions import LIBDEVICE, TABLE
from cuvil_ir.tensor_ir.expr import FUNCTIONS
from cuvil_ir.triton_source import functions
from cuvil_runtime.triton_kernels.devicelib import NAMES

#: scalar function -> why Triton kernels never call it (none today)
NO_TRITON_FORM: dict[str, str] = {}

_ROOT = Path(__file__).resolve().parents[3]
#: library -> its source, in this repository's layout
LIBRARIES = {
    "interpreted": _ROOT / "packages/cuvil-runtime/src/cuvil_runtime/triton_kernels/devicelib/interpreted.py",
    "cuda": _ROOT / "packages/cuvil-backend-cuda/src/cuvil_backend_cuda/devicelib/compiled.py",
    "ascend": _ROOT / "packages/cuvil-backend-ascend/src/cuvil_backend_ascend/devicelib.py",
}
_COMMON = _ROOT / "packages/cuvil-runtime/src/cuvil_runtime/triton_kernels/devicelib/common.py"
#: the line by which a compiled library binds the libdevice functions it does not write
_LIBDEVICE_BINDING = "for n in LIBDEVICE if n not in globals()"
#: the line by which the interpreted library binds the decomposed functions it does not write
_DECOMPOSED_BINDING = "f.name: _float64_form(f.name)"
_CU_CALL = re.compile(r"\bcu\.([A-Za-z_]\w*)")


def _arg_forms(fn: str, d: DType) -> list[tuple[tuple[DType, ...], DType]]:
    """(argument dtypes, result dtype) of the calls of ``fn`` worth rendering for ``d``."""
    if fn == "where":
        return [((DType.bool, d, d), d)]
    if fn == "rand":
        return [((DType.i64, DType.i64), DType.f32)]
    args = (d,) * FUNCTIONS[fn]
    return [(args, d), (args, DType.bool)] + [((d,), t) for t in functions.TL_DTYPES if fn == "cast"]


def triton_calls(fn: str) -> set[str] | None:
    """The ``cu`` names the Triton forms of ``fn`` call (over every kernel dtype), or
    None when no dtype has a Triton form of it."""
    names: set[str] = set()
    rendered = False
    for d in functions.TL_DTYPES:
        for args, result in _arg_forms(fn, d):
            try:
                text = functions.call(fn, [f"a{k}" for k in range(len(args))], args, result)
            except functions.TritonSourceError:
                continue
            rendered = True
            names.update(_CU_CALL.findall(text))
    return names if rendered else None


def renderer_calls() -> set[str]:
    """``cu`` names the kernel renderer writes itself (reduction combiners, index math)."""
    import cuvil_ir.triton_source as package

    out: set[str] = set()
    for path in Path(package.__file__).parent.glob("*.py"):
        if path.name != "functions.py":  # its calls are rendered above, per dtype
            out.update(_CU_CALL.findall(path.read_text()))
    return out


def _shared() -> set[str]:
    for node in ast.parse(_COMMON.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SHARED" for t in node.targets):
            call = node.value
            assert isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            assert isinstance(call.func.value, ast.Constant)
            return set(str(call.func.value.value).split())
    raise AssertionError("common.py defines no SHARED")


def _compiled_bf16() -> set[str]:
    """The names ``common.decorated(False)`` adds for compiled libraries (``COMPILED_BF16``)."""
    for node in ast.parse(_COMMON.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            getattr(t, "id", None) == "COMPILED_BF16" for t in node.targets
        ):
            assert isinstance(node.value, ast.Tuple)
            return {str(e.value) for e in node.value.elts if isinstance(e, ast.Constant)}
    raise AssertionError("common.py defines no COMPILED_BF16")


def defined(path: Path) -> set[str]:
    """The names a library module defines at top level, with the shared helpers it binds."""
    source = path.read_text()
    out: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            out.add(node.name)
        elif isinstance(node, ast.Assign):
            out.update(t.id for t in node.targets if isinstance(t, ast.Name))
    if "globals().update(common.decorated(" in source:
        out |= _shared()
    if "globals().update(common.decorated(False))" in source:
        out |= _compiled_bf16()
    if _LIBDEVICE_BINDING in source:
        out |= set(LIBDEVICE)
    if _DECOMPOSED_BINDING in source:
        out |= {f.name for f in TABLE.values() if f.device and f.decomposition is not None}
    return out


def problems(
    names: Iterable[str], libraries: Mapping[str, set[str]], reasons: Mapping[str, str] = NO_TRITON_FORM
) -> list[str]:
    """What is missing: a function without Triton form or reason, a ``cu`` call outside
    ``names``, a name of ``names`` some library does not define."""
    names = set(names)
    out = []
    used = renderer_calls()
    for fn in sorted(FUNCTIONS):
        calls = triton_calls(fn)
        if calls is None:
            if fn not in reasons:
                out.append(f"{fn}: no Triton form and no reason in NO_TRITON_FORM")
            continue
        used |= calls
    out += [f"cu.{n}: called by generated kernels, not in devicelib.NAMES" for n in sorted(used - names)]
    for lib, found in sorted(libraries.items()):
        out += [f"cu.{n}: not defined by the {lib} library" for n in sorted(names - found)]
    return out


@pytest.fixture(scope="module")
def libraries() -> dict[str, set[str]]:
    present = {lib: path for lib, path in LIBRARIES.items() if path.exists()}
    if len(present) < len(LIBRARIES):  # an installed runtime without the repository
        pytest.skip(f"device library sources not found: {sorted(set(LIBRARIES) - set(present))}")
    return {lib: defined(path) for lib, path in present.items()}


def test_every_scalar_function_reaches_every_device_library(libraries: dict[str, set[str]]) -> None:
    assert not problems(NAMES, libraries)
    assert set(NO_TRITON_FORM) <= set(FUNCTIONS)
    # the float functions the device library provides are rendered as its calls
    assert {n for fn in functions._CU_FLOAT for n in triton_calls(fn) or ()} >= functions._CU_FLOAT


def test_every_name_is_called_by_some_kernel(libraries: dict[str, set[str]]) -> None:
    """No dead entries: each name of NAMES is called by some rendered form."""
    used = renderer_calls().union(*(triton_calls(fn) or set() for fn in FUNCTIONS))
    assert set(NAMES) <= used, sorted(set(NAMES) - used)


def test_a_missing_entry_is_found(libraries: dict[str, set[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks can fail: a name out of NAMES, a definition out of a library, a
    function the renderer loses (``erf`` out of ``_CU_FLOAT``: no dtype has a form of
    it), unless a reason is stated for it."""
    assert problems([n for n in NAMES if n != "atan2"], libraries) == [
        "cu.atan2: called by generated kernels, not in devicelib.NAMES"
    ]
    less = {lib: found - {"erf"} if lib == "ascend" else found for lib, found in libraries.items()}
    assert problems(NAMES, less) == ["cu.erf: not defined by the ascend library"]
    monkeypatch.setattr(functions, "_CU_FLOAT", functions._CU_FLOAT - {"erf"})
    assert problems(NAMES, libraries) == ["erf: no Triton form and no reason in NO_TRITON_FORM"]
    assert problems(NAMES, libraries, {"erf": "a stated reason"}) == []


def test_the_device_libraries_are_where_their_packages_put_them() -> None:
    """The paths above are the modules the targets bind (where their packages are installed)."""
    for lib, module in (
        ("interpreted", "cuvil_runtime.triton_kernels.devicelib.interpreted"),
        ("cuda", "cuvil_backend_cuda.devicelib.compiled"),
        ("ascend", "cuvil_backend_ascend.devicelib"),
    ):
        try:
            spec = importlib.util.find_spec(module)
        except ModuleNotFoundError:  # the backend package is not installed here
            continue
        if spec is not None and spec.origin is not None:
            assert Path(spec.origin).resolve() == LIBRARIES[lib].resolve(), lib


def test_a_library_without_its_libdevice_binding_misses_those_names(tmp_path: Path) -> None:
    """The compiled libraries define the table's libdevice functions only through their
    binding line: without it, each of them is reported."""
    lib = tmp_path / "compiled.py"
    lib.write_text(LIBRARIES["cuda"].read_text().replace(_LIBDEVICE_BINDING, "for n in ()"))
    assert problems(NAMES, {"cuda": defined(lib)}) == [
        f"cu.{n}: not defined by the cuda library" for n in sorted(LIBDEVICE)
    ]


def test_the_interpreted_library_binds_the_decomposed_device_functions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device function with a decomposition and no form written in the interpreted
    library is defined by its binding line only (asinh given one for the test)."""
    import dataclasses

    lib = tmp_path / "interpreted.py"
    source = LIBRARIES["interpreted"].read_text()
    lib.write_text(source.replace("\ndef asinh(", "\ndef _asinh_written_out("))
    assert problems(NAMES, {"interpreted": defined(lib)}) == [
        "cu.asinh: not defined by the interpreted library"
    ]
    row = dataclasses.replace(TABLE["asinh"], decomposition="log(x + sqrt(x * x + 1))")
    monkeypatch.setitem(TABLE, "asinh", row)
    assert problems(NAMES, {"interpreted": defined(lib)}) == []
    lib.write_text(
        source.replace("\ndef asinh(", "\ndef _asinh_written_out(").replace(_DECOMPOSED_BINDING, "f")
    )
    bound = sorted(f.name for f in TABLE.values() if f.device and f.decomposition is not None)
    assert problems(NAMES, {"interpreted": defined(lib)}) == [
        f"cu.{n}: not defined by the interpreted library" for n in bound
    ]


def test_the_float_only_flag_is_what_the_triton_renderer_does() -> None:
    """A function the table marks ``float_only`` has no integer Triton form; every other
    one (but ``rand``, whose result is a float) has one on int32."""
    for fn, row in TABLE.items():
        if fn == "rand":
            continue
        args = (DType.i32,) * row.arity
        if fn == "where":
            args = (DType.bool, DType.i32, DType.i32)
        try:
            functions.call(fn, [f"a{k}" for k in range(row.arity)], args, DType.i32)
            rendered = True
        except functions.TritonSourceError:
            rendered = False
        assert rendered != row.float_only, fn
