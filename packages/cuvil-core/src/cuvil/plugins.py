"""Plugins while running: what ops are registered and from where, and rescanning
entry points (``cu.reload_plugins()``).

Ops come from the built-in declarations (``cuvil-ir``), from modules named by
``cuvil.ops`` entry points (imported on the first lookup of an op), and from
``cu.custom_op`` declarations; targets from ``cuvil.backends`` entry points. A
distribution installed after ``import cuvil`` becomes usable with
:func:`reload_plugins`, without a restart; a plugin that fails to import is
listed with its error (``cuvil ops``, ``cuvil backends``) and never breaks the others.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from cuvil_ir.graph_ir.ops.composite import Composite, Opaque
from cuvil_ir.graph_ir.registry import REGISTRY, describe_origin


@dataclass(frozen=True, slots=True)
class OpInfo:
    """What ``cuvil ops`` shows about one op."""

    name: str
    #: "built-in" (cuvil-ir), "custom" (``cu.custom_op``) or "declared" (an ``Op``
    #: subclass of another module)
    kind: str
    #: the distribution (and module) that declared it
    origin: str
    #: how targets that compile through Tensor IR run it: "kernel" (a Tensor IR rule),
    #: "decomposition" or "region" (inlined and fused; "native on cpu": its own
    #: expression there), "control flow" (its regions lowered), or "extern" (a torch call)
    lowering: str


def _lowering(name: str) -> str:
    from cuvil_ir.tensor_ir.rules import RULES

    op = REGISTRY.get(name)
    if "control_flow" in op.traits:
        how = "control flow"
    elif "composite" in op.traits:
        how = "region"
    elif dict.__contains__(RULES, name):
        how = "kernel"
    elif op.decompose is not None and "tensor_ir" not in op.extern_reasons:
        how = "decomposition"
    else:
        how = "extern"
    native = [a.removeprefix("lower_") for a in op.attr_names if a.startswith("lower_")]
    return how + (f"; native on {', '.join(native)}" if native else "")


def op_infos() -> list[OpInfo]:
    """Every registered op (plugins loaded first), by name."""
    REGISTRY.load_plugins()
    out = []
    for name in REGISTRY.names():
        module = REGISTRY.origin(name)
        op = REGISTRY.get(name)
        custom = issubclass(op, (Composite, Opaque))
        kind = "built-in" if module.startswith("cuvil_ir.") else "custom" if custom else "declared"
        out.append(OpInfo(name, kind, describe_origin(module), _lowering(name)))
    return out


def plugin_errors() -> dict[str, tuple[str, str]]:
    """``cuvil.ops`` entry points whose import failed: name -> (distribution, error)."""
    return REGISTRY.plugin_errors()


def reload_plugins() -> dict[str, list[str]]:
    """Rescan the ``cuvil.backends`` and ``cuvil.ops`` entry points: distributions
    installed since ``import cuvil`` become usable. Targets are discovered again (the
    ones in use keep working); op plugins not imported yet are imported. Returns the
    target names, the op names and the op plugins that failed (``"name (dist): error"``)."""
    from cuvil_runtime.registry import discover, reset

    importlib.invalidate_caches()  # the import system's cached folder listings
    reset()
    REGISTRY.load_plugins(rescan=True)
    return {
        "targets": [b.name for b in discover()],
        "ops": REGISTRY.names(),
        "errors": [f"{name} ({dist}): {err}" for name, (dist, err) in sorted(plugin_errors().items())],
    }


__all__ = ["OpInfo", "op_infos", "plugin_errors", "reload_plugins"]
