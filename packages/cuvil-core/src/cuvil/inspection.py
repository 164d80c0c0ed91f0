"""What a compile captured: :func:`explain` says it for people (the Graph IR, the size
symbols and where they come from, the guards and why, the recompiles so far);
:func:`captured_call` hands the capture and the graph's inputs to other emitters
(``cuvil.mlir``).
"""

from __future__ import annotations

from typing import Any

from cuvil.api import CompiledFunction, compile
from cuvil.artifacts import graph_inputs
from cuvil.errors import CompileError
from cuvil.frontend import arg_objects
from cuvil.frontend.capture import Captured
from cuvil.guards import describe_leaf
from cuvil_ir.symbolic import expr_str


def captured_call(f: Any, *args: Any, **kwargs: Any) -> tuple[Captured, list[Any]]:
    """Compile ``f`` (a function, module or ``cu.compile`` result) for these arguments
    on the reference target, and return the capture and the graph's inputs."""
    compiled = f if isinstance(f, CompiledFunction) else compile(f, target="reference", fallback="error")
    compiled(*args, **kwargs)
    art = compiled.artifacts[-1]
    if art.captured is None:
        raise CompileError(art.reason or "did not compile")
    bargs, bkwargs = compiled._check_call(args, kwargs)
    leaves, _ = arg_objects.flatten((bargs, bkwargs), sizes=compiled.int_sizes)
    return art.captured, graph_inputs(art.captured, leaves)


def explain(fn: Any, *args: Any, **kwargs: Any) -> str:
    """Compile (or reuse) ``fn`` for these arguments and say what was captured and why:
    the Graph IR, the size symbols and where they come from, the guards a later
    call must pass (with the reason for each), and every recompile so far."""
    cf = fn if isinstance(fn, CompiledFunction) else compile(fn)
    cf(*args, **kwargs)
    art = cf._last
    assert art is not None
    lines = [f"{cf.__qualname__}: {cf.stats}"]
    if art.captured is None:
        lines.append(f"runs eagerly: {art.reason}")
        return "\n".join(lines) + "\n"
    c = art.captured
    lines.append(f"target: {art.target}")
    lines.append("symbols:")
    for slot in c.check.slots:
        lines.append(
            f"  {slot.symbol} = {slot.leaf_name if slot.axis < 0 else f'{slot.leaf_name}.shape[{slot.axis}]'}"
        )
    lines.append("guards:")
    names = cf._leaf_names(*cf._check_call(args, kwargs))
    for name, key in zip(names, art.key[1]):
        lines.append(
            f"  {name}: {describe_leaf(key)}" + (" (any sizes)" if key[0] == "tensor" and cf.dynamic else "")
        )
    if cf.module is not None:
        lines.append("  module: training flags and parameter/buffer dtypes and shapes as now")
    for fact in c.graph.assumptions:
        why = c.check.reasons.get(fact)
        lines.append(f"  {expr_str(fact)}" + (f"    <- {why}" if why else ""))
    if cf.stats.recompile_reasons:
        lines.append("recompiles:")
        lines += [f"  {r}" for r in cf.stats.recompile_reasons]
    lines.append("graph:")
    lines += ["  " + x for x in str(c.graph).rstrip("\n").split("\n")]
    return "\n".join(lines) + "\n"
