"""``cu.audit``: every stage of one compile, as canonical text and a stable hash.

    hashes = cu.audit(f, x, y)                    # {"graph_ir": "9f2c…", "tensor_ir": …}
    cu.audit(f, x, y, out_dir="audit/")           # also writes each stage's text
    $ cuvil audit mymodel:head --args-spec "f32[4,3,64,64]" --out audit/

Stages, in pipeline order: whatever the target declares (``Target.stages``;
``cuvil backends -v`` lists them), then ``mlir``. For ``cpu``:

==============  ==============================================================
``graph_ir``    the captured Graph IR (``Graph.text``: no source locations)
``tensor_ir``   fused kernels, externs, buffers and the arena plan
``loop_ir``     every kernel's loop nest
``c``           the C source of every kernel
``wrapper``     the generated per-call Python function
``mlir``        the Graph IR as upstream MLIR (with ``cuvil-ir[mlir]`` installed and
                a graph the emitter accepts; absent otherwise)
==============  ==============================================================

Every text is a pure function of the program and the compiler: the same input
gives byte-identical texts in every process (``PYTHONHASHSEED`` included), so the
hashes are what the caches key on -- the in-process executable cache on
``graph_ir``, the CPU program cache on ``graph_ir`` plus the compiler's code, the
kernel cache on each kernel's ``code``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

#: the stage every audit ends with, after the target's own (when the MLIR emitter can run)
MLIR_STAGE = "mlir"


def stage_texts(
    f: Any, *example_args: Any, target: str | None = None, **example_kwargs: Any
) -> dict[str, str]:
    """The text of every stage of compiling ``f`` for ``example_args``, in pipeline order."""
    from cuvil.api import CompiledFunction
    from cuvil.api import compile as cu_compile

    compiled = f if isinstance(f, CompiledFunction) else cu_compile(f, target=target, fallback="error")
    import torch

    with torch.no_grad():  # inference: parameters that require grad need no warning here
        compiled(*example_args, **example_kwargs)
    art = compiled.artifacts[-1]
    if art.captured is None:
        raise RuntimeError(f"cuvil.audit: {compiled.__qualname__} did not compile: {art.reason}")
    graph = art.captured.graph
    from cuvil_runtime.registry import get_target

    assert art.executable is not None and art.target is not None
    produced = art.executable.stages
    texts = {"graph_ir": graph.text}
    for stage in get_target(art.target).stages:  # the target's order
        if stage.name in produced:
            texts[stage.name] = produced[stage.name]
    mlir = _mlir_text(graph)
    if mlir is not None:
        texts[MLIR_STAGE] = mlir
    return texts


def _mlir_text(graph: Any) -> str | None:
    import importlib

    try:
        to_mlir = importlib.import_module("cuvil_ir.mlir").to_mlir
    except (ImportError, AttributeError):  # cuvil-ir[mlir] not installed
        return None
    try:
        return str(to_mlir(graph).text)
    except Exception:  # no bindings, or a graph the emitter rejects: the stage is absent
        return None


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def audit(
    f: Any,
    *example_args: Any,
    target: str | None = None,
    out_dir: str | os.PathLike[str] | None = None,
    **example_kwargs: Any,
) -> dict[str, str]:
    """Stage name -> sha256 hex digest of the stage's canonical text (see module doc).

    ``f`` is a function, an ``nn.Module`` or a ``cu.compile`` result; it is called
    once with the example arguments. With ``out_dir``, each stage's text is written
    to ``<out_dir>/<stage>.txt`` and the hashes to ``<out_dir>/hashes.json``.
    """
    texts = stage_texts(f, *example_args, target=target, **example_kwargs)
    hashes = {name: digest(text) for name, text in texts.items()}
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for name, text in texts.items():
            (out / f"{name}.txt").write_text(text)
        (out / "hashes.json").write_text(json.dumps(hashes, indent=2) + "\n")
    return hashes


__all__ = ["MLIR_STAGE", "audit", "digest", "stage_texts"]
