"""A compiled variant's call, as plain data: how arguments become graph inputs and
graph outputs the result.

Shared by ahead-of-time artifacts (``call.json``, :mod:`cuvil.aot`) and the
cache of captured variants (:mod:`cuvil.warm`): the signature, the argument tree
(``treespec_dumps``), what each argument leaf must be, the size symbols with the
reasons of the size assumptions, the outputs and the result's tree, and the reads
whose values the variant depends on. Decoding rebuilds only those; nothing is
evaluated.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from cuvil.errors import CompileError
from cuvil.guards import AssumptionCheck, SymbolSlot, describe_leaf

#: types of a Python leaf checked by value (JSON has the rest)
VALUE_TYPES: dict[str, type] = {"bool": bool, "int": int, "float": float, "str": str, "NoneType": type(None)}


#: what a rebuilt signature's defaults are: only whether there is one matters
_DEFAULT = object()


class PlanError(ValueError):
    """Data that is not a valid encoded call."""


def encode_call(
    cf: Any, c: Any, key: tuple[Any, ...], bargs: tuple[Any, ...], bkwargs: dict[str, Any]
) -> dict[str, Any]:
    """Everything of ``c`` (a capture of ``cf`` for the structure ``key``) but its inputs;
    raises :class:`CompileError` for what plain data cannot hold (an object argument)."""
    if len(key) > 2 or c.write_backs or any(kind in ("arg", "object") for kind, _ in c.outputs):
        # their state, write-backs and identities are this process's objects
        raise CompileError(
            "cannot save: the call passes or returns Python objects holding tensors (not only "
            "tensors, numbers and containers), which an artifact cannot hold"
        )
    _, spec = pytree.tree_flatten((bargs, bkwargs))
    return {
        "signature": signature_json(cf),
        "arguments": spec_text(spec, "the argument tree"),
        "leaves": [leaf_json(k, n) for k, n in zip(key[1], cf._leaf_names(bargs, bkwargs))],
        "symbols": [
            {"symbol": s.symbol.name, "leaf": s.leaf, "axis": s.axis, "name": s.leaf_name}
            for s in c.check.slots
        ],
        "reasons": [[expr_text(a), why] for a, why in c.check.reasons.items() if a in c.graph.assumptions],
        "layouts": [[i, list(order), name] for i, order, name in c.check.layouts],
        "fixed": [list(f) for f in c.check.fixed],
        "outputs": [output_json(kind, v) for kind, v in c.outputs],
        "result": spec_text(c.out_spec, "the result's tree"),
        "frozen": [f"{g.what} = {g.shown}" for g in c.guards.guards],
    }


def decode_check(call: dict[str, Any], graph: Any) -> AssumptionCheck:
    """The size check of an encoded call over ``graph``'s assumptions."""
    from cuvil_ir.symbolic import symbol

    slots = [
        SymbolSlot(symbol(str(s["symbol"])), int(s["leaf"]), int(s["axis"]), str(s["name"]))
        for s in call["symbols"]
    ]
    saved = {text: why for text, why in call.get("reasons", [])}
    reasons = {a: saved[expr_text(a)] for a in graph.assumptions if expr_text(a) in saved}
    layouts = [(int(i), tuple(int(d) for d in order), str(n)) for i, order, n in call.get("layouts", [])]
    fixed = [(int(i), int(a), int(n), str(name)) for i, a, n, name in call.get("fixed", [])]
    return AssumptionCheck(graph.assumptions, slots, reasons, layouts, fixed)


def decode_outputs(call: dict[str, Any]) -> list[tuple[str, Any]]:
    return [
        (o["kind"], o["index"] if o["kind"] in ("graph", "item") else o.get("value")) for o in call["outputs"]
    ]


def output_leaf(kind: str, value: Any, results: Sequence[Any]) -> Any:
    """One leaf of the result: a graph output, a Python number a graph output holds as a
    0-d tensor (cuvil/frontend/numbers.py), or a constant."""
    if kind == "graph":
        return results[value]
    if kind == "item":
        return results[value].item()
    return value


def decode_spec(text: str) -> Any:
    try:
        return pytree.treespec_loads(text)
    except Exception as e:
        raise PlanError(f"a tree spec cannot be read: {e}") from None


def signature_json(cf: Any) -> list[dict[str, Any]] | None:
    sig = cf._sig
    if sig is None:
        return None
    # whether each parameter has a default, not its value: calls are replayed as made,
    # so the signature only checks a call's arity; a default the saved call left out is
    # in the graph (frozen), one it passed is a leaf
    return [
        {"name": p.name, "kind": p.kind.name, "has_default": p.default is not p.empty}
        for p in sig.parameters.values()
    ]


def spec_text(spec: Any, what: str) -> str:
    try:
        return pytree.treespec_dumps(spec)  # type: ignore[no-any-return]
    except Exception as e:
        raise CompileError(
            f"cannot save {what}: {e} (only tuples, lists, dicts, namedtuples and registered pytree types)"
        ) from e


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def leaf_json(key: tuple[Any, ...], name: str) -> dict[str, Any]:
    if key[0] == "tensor":
        if len(key) == 7:  # sparse or nested: such calls never compile
            raise CompileError(f"cannot save: argument {name} is {describe_leaf(key)}")
        return {
            "kind": "tensor",
            "name": name,
            "dtype": dtype_name(key[1]),
            "device": str(key[2]),
            "rank": key[3],
            "shape": None if key[4] is None else list(key[4]),
        }
    if key[0] == "value" and key[1].__name__ in VALUE_TYPES:
        return {"kind": "value", "name": name, "type": key[1].__name__, "value": key[2]}
    if key[0] == "value" and key[1] in (torch.dtype, torch.device):
        return {"kind": key[1].__name__, "name": name, "value": str(key[2])}
    raise CompileError(
        f"cannot save: argument {name} is {describe_leaf(key)}, which an artifact cannot hold; "
        "pass tensors and Python numbers, strings, bools, dtypes or devices"
    )


def output_json(kind: str, value: Any) -> dict[str, Any]:
    if kind in ("graph", "item"):
        return {"kind": kind, "index": value}
    if isinstance(value, (bool, int, float, str, type(None))):
        return {"kind": "const", "value": value}
    raise CompileError(
        f"cannot save: the function returns a {type(value).__name__}, which an artifact cannot hold"
    )


def expr_text(expr: Any) -> str:
    from cuvil_ir.symbolic import expr_str

    return expr_str(expr)


def rebuild_signature(params: list[dict[str, Any]]) -> inspect.Signature:
    out = []
    for p in params:
        kind = getattr(inspect.Parameter, str(p["kind"]), None)
        if not isinstance(kind, inspect._ParameterKind):
            raise PlanError(f"the artifact's signature has an unknown parameter kind {p['kind']!r}")
        default = _DEFAULT if p.get("has_default") else inspect.Parameter.empty
        out.append(inspect.Parameter(p["name"], kind, default=default))
    return inspect.Signature(out)


def dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise PlanError(f"the artifact names an unknown dtype {name!r}")
    return dtype


def state_slot(module: torch.nn.Module, name: str, path: Path) -> tuple[dict[str, Any], str]:
    owner_path, _, key = name.rpartition(".")
    try:
        owner = module.get_submodule(owner_path) if owner_path else module
    except AttributeError:
        raise TypeError(f"{path}: the module has no submodule {owner_path!r} (for {name})") from None
    for d in (owner._parameters, owner._buffers):
        if d.get(key) is not None:
            return d, key
    raise TypeError(f"{path}: the module has no parameter or buffer {name!r}")


__all__ = [
    "VALUE_TYPES",
    "PlanError",
    "decode_check",
    "decode_outputs",
    "decode_spec",
    "dtype_name",
    "dtype_of",
    "encode_call",
    "leaf_json",
    "output_leaf",
    "rebuild_signature",
    "signature_json",
    "state_slot",
]
