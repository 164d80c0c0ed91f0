"""Ascend's own compiler on a generated kernel: triton-ascend's front half, no CANN needed.

``make_ttir`` (Triton's frontend and its TTIR passes, as triton-ascend configures
them) and ``ttir_to_linalg`` (the ``triton-adapter-opt`` binary in the triton-ascend
wheel: ``--triton-to-hivm``, ``--triton-to-hfusion``, ``--triton-to-linalg`` ...)
are the steps of ``AscendBackend.add_stages`` before ``bishengir-compile``, the one
step that needs CANN. Each kernel goes through them for every launch variant the
target may use (:func:`cuvil_backend_ascend.rules.aot_configs`), so a construct
Ascend's compiler rejects fails the compile here, with the compiler's message.

Importable only where triton-ascend is the installed ``triton``; the ``ascend``
target uses it when it is (``declared.ASCEND_COMPILER``).
"""

from __future__ import annotations

import functools
import subprocess
from typing import Any

from cuvil_backend_ascend import devicelib
from cuvil_backend_ascend.policy import AscendPolicy
from cuvil_backend_ascend.rules import aot_configs
from cuvil_ir.triton_source.emit import TritonKernel
from cuvil_runtime.target import TargetError
from cuvil_runtime.triton_kernels.load import load

#: the architecture the front half compiles for when no device says (Atlas A2)
DEFAULT_ARCH = "Ascend910B3"


class AscendCompileError(TargetError):
    """triton-ascend's compiler rejected a generated kernel."""


@functools.cache
def _backend(arch: str) -> Any:
    from triton.backends.ascend.compiler import AscendBackend
    from triton.backends.compiler import GPUTarget

    return AscendBackend(GPUTarget("npu", arch, 0))


def front_half(tk: TritonKernel, config: dict[str, Any], arch: str = DEFAULT_ARCH) -> tuple[str, str]:
    """``(ttir, linalg)`` texts of ``tk`` with these constexprs, from triton-ascend."""
    fn = load(tk, devicelib, "ascend")
    signature = {p: t for p, t in tk.signature if t != "constexpr"}
    return front_half_of(fn, signature, config, tk.name, arch)


def front_half_of(
    fn: Any, signature: dict[str, str], config: dict[str, Any], name: str, arch: str = DEFAULT_ARCH
) -> tuple[str, str]:
    """``(ttir, linalg)`` texts of any ``@triton.jit`` function (a generated kernel, or a
    hand-written one: ``cuvil_runtime.triton_kernels.paged_attention``) with these argument
    types and constexprs, from triton-ascend."""
    from triton._C.libtriton import ir
    from triton.backends.ascend.compiler import make_ttir, ttir_to_linalg
    from triton.compiler.compiler import ASTSource

    backend = _backend(arch)
    options = backend.parse_options({})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    src = ASTSource(fn, signature=signature, constants=dict(config))
    metadata = {
        "hash": name,
        "enable_nd2nz_on_vector": options.enable_nd2nz_on_vector,
        "enable_select_analysis": options.enable_select_analysis,
        "compile_on_910_95": options.compile_on_910_95,
        "force_simt_template": options.force_simt_template,
    }
    stage = "make_ttir"
    try:
        module = src.make_ir(options, backend.get_codegen_implementation(), backend.get_module_map(), context)
        ttir = make_ttir(module, metadata, options)
        ttir_text = str(ttir)
        stage = "ttir_to_linalg (triton-adapter-opt)"
        linalg = ttir_to_linalg(ttir, metadata, options, named_ops=True)
    except subprocess.CalledProcessError as e:
        raise AscendCompileError(
            f"kernel {name} {config}: triton-ascend's {stage} failed: {_first_error(e.stderr)}"
        ) from None
    except Exception as e:
        raise AscendCompileError(f"kernel {name} {config}: triton-ascend's {stage} failed: {e}") from e
    return ttir_text, str(linalg)


def _first_error(stderr: bytes | str | None) -> str:
    text = stderr.decode(errors="replace") if isinstance(stderr, bytes) else (stderr or "")
    lines = [line for line in text.splitlines() if "error" in line.lower() or "assert" in line.lower()]
    return (lines[0] if lines else text.strip().splitlines()[0] if text.strip() else "no message").strip()


def compile_stages(
    tk: TritonKernel, policy: AscendPolicy, arch: str = DEFAULT_ARCH
) -> tuple[tuple[str, str], ...]:
    """The ``ttir`` and ``linalg`` stage texts of ``tk``: every variant in
    :func:`~cuvil_backend_ascend.rules.aot_configs`, each headed by its constexprs."""
    ttirs, linalgs = [], []
    for config in aot_configs(tk, policy):
        ttir, linalg = front_half(tk, config, arch)
        head = "// " + ", ".join(f"{k}={v}" for k, v in config.items())
        ttirs.append(f"{head}\n{ttir}")
        linalgs.append(f"{head}\n{linalg}")
    return (("ttir", "\n".join(ttirs)), ("linalg", "\n".join(linalgs)))


__all__ = ["DEFAULT_ARCH", "AscendCompileError", "compile_stages", "front_half", "front_half_of"]
