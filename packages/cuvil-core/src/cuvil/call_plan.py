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
from cuvil.frontend import arg_objects
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
    if c.input_updates:
        raise CompileError(
            "cannot save: the function updates argument tensors in place, which a saved "
            "program's call plan does not write back yet"
        )
    _, spec = arg_objects.flatten((bargs, bkwargs))
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


#: the keys of an artifact's call.json (encode_call's and aot.save's ``inputs``)
CALL_KEYS = (
    "signature",
    "arguments",
    "leaves",
    "symbols",
    "reasons",
    "layouts",
    "fixed",
    "outputs",
    "result",
    "frozen",
    "inputs",
)
_KINDS = ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD", "VAR_POSITIONAL", "KEYWORD_ONLY", "VAR_KEYWORD")


def validate_call(call: Any, graph: Any, members: Sequence[str] | Any) -> None:
    """Check an artifact's decoded call.json against its schema and against ``graph``
    (its inputs and outputs) before anything reads it; raises :class:`PlanError`
    naming the field (``inputs[1].shape``) and what is wrong with it. ``members``
    holds the artifact's member names (a tensor's ``file`` must be one)."""

    def fail(field: str, problem: str) -> None:
        raise PlanError(f"{field}: {problem}")

    def is_int(v: Any) -> bool:
        return type(v) is int

    def obj(v: Any, field: str, keys: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, Any]:
        if not isinstance(v, dict):
            fail(field, f"expected an object, got {type(v).__name__}")
        missing = [k for k in keys if k not in v]
        if missing:
            fail(field, f"missing key(s) {missing}")
        extra = sorted(set(v) - set(keys) - set(optional))
        if extra:
            fail(field, f"unexpected key(s) {extra}")
        return v  # type: ignore[no-any-return]

    def typed(v: Any, field: str, kind: type | tuple[type, ...], what: str) -> Any:
        ok = is_int(v) if kind is int else isinstance(v, kind)
        if not ok:
            fail(field, f"expected {what}, got {type(v).__name__} {v!r:.60}")
        return v

    def array(v: Any, field: str) -> list[Any]:
        return typed(v, field, list, "a list")  # type: ignore[no-any-return]

    def index(v: Any, field: str, n: int, of: str) -> int:
        if not is_int(v) or not 0 <= v < n:
            fail(field, f"expected an index into {of} (0..{n - 1}), got {v!r:.60}")
        return v  # type: ignore[no-any-return]

    def dtype(v: Any, field: str) -> None:
        typed(v, field, str, "a dtype name")
        if not isinstance(getattr(torch, v, None), torch.dtype):
            fail(field, f"unknown dtype {v!r:.60}")

    obj(call, "call.json", CALL_KEYS)
    sig = call["signature"]
    if sig is not None:
        for i, p in enumerate(array(sig, "signature")):
            f = f"signature[{i}]"
            obj(p, f, ("name", "kind", "has_default"))
            typed(p["name"], f + ".name", str, "a str")
            if p["kind"] not in _KINDS:
                fail(f + ".kind", f"expected one of {list(_KINDS)}, got {p['kind']!r:.60}")
            typed(p["has_default"], f + ".has_default", bool, "a bool")
    leaves = array(call["leaves"], "leaves")
    for i, w in enumerate(leaves):
        f = f"leaves[{i}]"
        if not isinstance(w, dict) or w.get("kind") not in ("tensor", "value", "dtype", "device"):
            fail(f + ".kind", "expected tensor, value, dtype or device")
        if w["kind"] == "tensor":
            obj(w, f, ("kind", "name", "dtype", "device", "rank", "shape"))
            dtype(w["dtype"], f + ".dtype")
            typed(w["device"], f + ".device", str, "a str")
            if not is_int(w["rank"]) or w["rank"] < 0:
                fail(f + ".rank", f"expected a non-negative int, got {w['rank']!r:.60}")
            shape = w["shape"]
            if shape is not None and (
                not isinstance(shape, list)
                or len(shape) != w["rank"]
                or not all(is_int(d) and d >= 0 for d in shape)
            ):
                fail(f + ".shape", f"expected null or {w['rank']} non-negative ints, got {shape!r:.60}")
        elif w["kind"] == "value":
            obj(w, f, ("kind", "name", "type", "value"))
            t = VALUE_TYPES.get(w["type"]) if isinstance(w["type"], str) else None
            if t is None:
                fail(f + ".type", f"expected one of {sorted(VALUE_TYPES)}, got {w['type']!r:.60}")
            elif type(w["value"]) is not t and not (t is float and is_int(w["value"])):
                fail(f + ".value", f"expected a {w['type']}, got {type(w['value']).__name__}")
        else:
            obj(w, f, ("kind", "name", "value"))
            typed(w["value"], f + ".value", str, "a str")
        typed(w["name"], f + ".name", str, "a str")
    for key in ("arguments", "result"):
        typed(call[key], key, str, "a tree spec (str)")
    try:
        n_args = decode_spec(call["arguments"]).num_leaves
        n_result = decode_spec(call["result"]).num_leaves
    except PlanError as e:
        raise PlanError(f"arguments/result: {e}") from None
    if n_args != len(leaves):
        fail("arguments", f"the argument tree has {n_args} leaves, and leaves lists {len(leaves)}")
    for i, s in enumerate(array(call["symbols"], "symbols")):
        f = f"symbols[{i}]"
        obj(s, f, ("symbol", "leaf", "axis", "name"))
        typed(s["symbol"], f + ".symbol", str, "a str")
        typed(s["name"], f + ".name", str, "a str")
        leaf = leaves[index(s["leaf"], f + ".leaf", len(leaves), "leaves")]
        if leaf["kind"] != "tensor":
            fail(f + ".leaf", f"leaf {s['leaf']} is not a tensor")
        index(s["axis"], f + ".axis", leaf["rank"], f"leaf {s['leaf']}'s dims")
    for i, r in enumerate(array(call["reasons"], "reasons")):
        if not (isinstance(r, list) and len(r) == 2 and all(isinstance(x, str) for x in r)):
            fail(f"reasons[{i}]", "expected [assumption text, reason text]")
    for i, lay in enumerate(array(call["layouts"], "layouts")):
        f = f"layouts[{i}]"
        if not (isinstance(lay, list) and len(lay) == 3 and isinstance(lay[1], list)) or not isinstance(
            lay[2], str
        ):
            fail(f, "expected [leaf, [dims...], name]")
        leaf = leaves[index(lay[0], f + "[0]", len(leaves), "leaves")]
        dims = lay[1]
        if leaf["kind"] != "tensor" or not all(map(is_int, dims)) or sorted(dims) != [*range(leaf["rank"])]:
            fail(f + "[1]", f"expected a permutation of leaf {lay[0]}'s dims, got {lay[1]!r:.60}")
    for i, fx in enumerate(array(call["fixed"], "fixed")):
        f = f"fixed[{i}]"
        if not (isinstance(fx, list) and len(fx) == 4 and all(map(is_int, fx[:3]))) or not isinstance(
            fx[3], str
        ):
            fail(f, "expected [leaf, axis, size, name]")
        leaf = leaves[index(fx[0], f + "[0]", len(leaves), "leaves")]
        if leaf["kind"] != "tensor":
            fail(f + "[0]", f"leaf {fx[0]} is not a tensor")
        index(fx[1], f + "[1]", leaf["rank"], f"leaf {fx[0]}'s dims")
    for i, fr in enumerate(array(call["frozen"], "frozen")):
        typed(fr, f"frozen[{i}]", str, "a str")
    n_graph_out = len(graph.outputs)
    outputs = array(call["outputs"], "outputs")
    for i, o in enumerate(outputs):
        f = f"outputs[{i}]"
        if not isinstance(o, dict) or o.get("kind") not in ("graph", "item", "const"):
            fail(f + ".kind", "expected graph, item or const")
        if o["kind"] == "const":
            obj(o, f, ("kind", "value"))
            if not isinstance(o["value"], (bool, int, float, str, type(None))):
                fail(f + ".value", f"expected a number, str, bool or null, got {type(o['value']).__name__}")
        else:
            obj(o, f, ("kind", "index"))
            index(o["index"], f + ".index", n_graph_out, "the program's outputs")
    if n_result != len(outputs):
        fail("result", f"the result tree has {n_result} leaves, and outputs lists {len(outputs)}")
    inputs = array(call["inputs"], "inputs")
    wanted = list(graph.inputs)
    if len(inputs) != len(wanted):
        fail(
            "inputs",
            f"the program takes {len(wanted)} inputs ({', '.join(v.name for v in wanted)}), "
            f"and inputs lists {len(inputs)}",
        )
    for i, (e, v) in enumerate(zip(inputs, wanted)):
        f = f"inputs[{i}]"
        if not isinstance(e, dict) or e.get("kind") not in ("leaf", "parameter", "constant"):
            fail(f + ".kind", "expected leaf, parameter or constant")
        if e["kind"] == "leaf":
            obj(e, f, ("kind", "leaf"))
            leaf = leaves[index(e["leaf"], f + ".leaf", len(leaves), "leaves")]
            if leaf["kind"] == "tensor" and getattr(v.type, "shape", None) is not None:
                if len(v.type.shape) != leaf["rank"]:
                    fail(
                        f + ".leaf",
                        f"leaf {e['leaf']} has rank {leaf['rank']}; the program's input "
                        f"{v.name} has rank {len(v.type.shape)}",
                    )
            continue
        need = ("kind", "name", "dtype", "shape", "device") + (("file",) if e["kind"] == "constant" else ())
        obj(e, f, need, optional=("file",))
        typed(e["name"], f + ".name", str, "a str")
        dtype(e["dtype"], f + ".dtype")
        typed(e["device"], f + ".device", str, "a str")
        shape = e["shape"]
        if not isinstance(shape, list) or not all(is_int(d) and d >= 0 for d in shape):
            fail(f + ".shape", f"expected a list of non-negative ints, got {shape!r:.60}")
        vshape = getattr(v.type, "shape", None)
        if vshape is not None and (
            len(vshape) != len(shape) or any(isinstance(d, int) and d != s for d, s in zip(vshape, shape))
        ):
            fail(f + ".shape", f"{shape} does not fit the program's input {v.name} {list(vshape)}")
        if "file" in e:
            typed(e["file"], f + ".file", str, "a member name")
            if e["file"] not in members or not e["file"].startswith("tensors/"):
                fail(f + ".file", f"the artifact has no tensor member {e['file']!r:.60}")


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
    "CALL_KEYS",
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
    "validate_call",
]
