"""The fast path of a cache hit: one generated function per compiled variant that
checks every guard of that variant and runs it, for calls of plain tensors passed
positionally or by keyword (``model(input_ids=ids, attention_mask=mask)``).

[Note: the fast path of a hit]
``CompiledFunction.__call__`` first tries the fast path of the variant it served
last. The function is generated once per artifact (``of``), from the artifact's
own guards, so a hit does no generic work: no tree flattening, no structure key
built and compared as tuples, no artifact search, no size symbols bound into a
list, no result tree rebuilt through pytree. It checks, in this order, exactly what
``CompiledFunction._find`` checks for that artifact, each written out for its
values:

1. the call: as many positional arguments as the variant had and the same keywords in
   the same order (the tree structure's dict keys), each exactly a ``torch.Tensor``
   (or ``nn.Parameter``);
2. each tensor's structure key (``guards.leaf_key``): dtype, rank, dense strided
   layout, not nested, device, the shape under ``dynamic=False``, and not requiring
   grad while grad mode is on;
3. autocast off everywhere (the variant was compiled outside it);
4. the module's key (training flags, submodules, parameter/buffer slots:
   ``CompiledFunction._extra_key``);
5. the read guards (``ReadGuards.holds``: globals, closures, attributes, in read
   order), then each lifted tensor's dtype/device/shape;
6. the size facts (``AssumptionCheck.holds``): static sizes, layout guards, the
   size symbols (one symbol read from two places must agree) and the assumptions
   as one exact-arithmetic expression.

Any check that fails returns ``MISS`` and the call takes the full path, which finds
(or compiles) the right variant and records why; a check here may be stricter
than the full path's (a device compared by identity of its type), never looser.
Then the hit is counted, grad mode turned off around the run (inference), and the
result built from the outputs directly. ``source`` of the returned function is the
generated text (deterministic for a variant).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sympy
import torch
from torch.utils import _pytree as pytree

from cuvil.arguments import PLAIN_TENSORS
from cuvil.results import unflatten
from cuvil_ir.symbolic import EXACT_NAMESPACE, exact_code

#: what a fast path returns when a guard does not hold (the call takes the full path)
MISS: Any = object()

#: an artifact whose structure the fast path does not take (objects in the arguments,
#: keyword arguments, arguments written back, an eager fallback)
NONE: Any = object()


class FastPath:
    """A generated hit function and its source."""

    __slots__ = ("fn", "source")

    def __init__(self, fn: Callable[[tuple[Any, ...], dict[str, Any]], Any], source: str) -> None:
        self.fn = fn
        self.source = source


def of(cf: Any, art: Any) -> Callable[[tuple[Any, ...], dict[str, Any]], Any] | None:
    """The fast path of ``art`` (an artifact of ``cf``), generated at its first hit;
    None when the artifact's structure is not tensors passed positionally or by keyword."""
    fp = art.fast
    if fp is None:
        fp = art.fast = _generate(cf, art) or NONE
    return None if fp is NONE else fp.fn  # type: ignore[no-any-return]


def _eligible(cf: Any, art: Any) -> bool:
    c = art.captured
    if (
        c is None
        or art.executable is None
        or art.amp
        or len(art.key) != 2
        or c.write_backs
        or c.input_updates
    ):
        return False
    leaves = art.key[1]
    if not all(k[0] == "tensor" and len(k) == 6 and not k[5] for k in leaves):
        return False
    if _call_form(art) is None:
        return False  # containers
    if any(kind not in ("graph", "item", "const") for kind, _ in c.outputs):
        return False
    return all(isinstance(k, tuple) and k and k[0] != "not a tensor" for k in art.lifted_keys)


def _call_form(art: Any) -> tuple[int, tuple[str, ...]] | None:
    """``(positional count, keyword names in call order)`` when the variant's argument tree
    is tensors passed positionally and by keyword, each a leaf; None for containers."""
    spec = art.key[0]
    if spec.type is not tuple or spec.num_children != 2:
        return None
    pos, kw = spec.children()
    if pos.type is not tuple or kw.type is not dict:
        return None
    if not all(ch.is_leaf() for ch in (*pos.children(), *kw.children())):
        return None
    names = tuple(kw.context)
    if not all(isinstance(k, str) for k in names):
        return None
    form = (pos.num_children, names)
    # the spec such a call flattens to, rebuilt: only this exact structure is served here
    if spec != pytree.tree_structure(((0,) * form[0], dict.fromkeys(names, 0))):
        return None
    return form


def _generate(cf: Any, art: Any) -> FastPath | None:
    if not _eligible(cf, art):
        return None
    c = art.captured
    check = c.check
    leaves = art.key[1]
    n = len(leaves)
    form = _call_form(art)
    assert form is not None
    positional, keywords = form
    ns: dict[str, Any] = {
        **EXACT_NAMESPACE,
        "MISS": MISS,
        "_plain": PLAIN_TENSORS,
        "_strided": torch.strided,
        "_grad_on": torch.is_grad_enabled,
        "_set_grad": torch._C._set_grad_enabled,
        "_autocast_on": torch._C._is_any_autocast_enabled,
        "_Tensor": torch.Tensor,
        "_cf": cf,
        "_art": art,
        "_stats": cf.stats,
    }
    body: list[str] = []
    a = [f"a{i}" for i in range(n)]
    # 1. the call's form: the positional count, and the keywords' names in the call's order
    # (a dict's order is its tree structure's: the full path keys variants so too)
    body.append(f"if len(args) != {positional}: return MISS")
    if keywords:
        ns["_names"] = keywords
        body.append("if tuple(kwargs) != _names: return MISS")
    else:
        body.append("if kwargs: return MISS")
    if positional:
        body.append(f"{', '.join(a[:positional])}, = args")
    for i, name in enumerate(keywords):
        body.append(f"a{positional + i} = kwargs[{name!r}]")
    # 1-2. each argument's structure key
    for i, (_, dtype, device, rank, shape, _) in enumerate(leaves):
        ns[f"_d{i}"], ns[f"_dev{i}"] = dtype, device
        conds = [
            f"type(a{i}) not in _plain",
            f"a{i}.dtype is not _d{i}",
            f"a{i}.dim() != {int(rank)}",
            f"a{i}.layout is not _strided",
            f"a{i}.is_nested",
            f"a{i}.device != _dev{i}",
        ]
        if shape is not None:
            ns[f"_shape{i}"] = tuple(shape)
            conds.append(f"a{i}.shape != _shape{i}")
        body.append(f"if {' or '.join(conds)}: return MISS")
    body.append("_g = _grad_on()")
    if n:
        body.append(f"if _g and ({' or '.join(f'{x}.requires_grad' for x in a)}): return MISS")
    # 3. autocast
    body.append("if _autocast_on(): return MISS")
    # 4. the module
    if cf.module is not None:
        ns["_extra_key"], ns["_extra"] = cf._extra_key, art.extra
        body.append("_e = _extra_key()")
        body.append("if _e is not _extra and _e != _extra: return MISS")
    # 5. reads, then lifted tensors (read once: the same object is checked and passed)
    if len(c.guards):
        ns["_reads_hold"] = c.guards.holds
        body.append("if not _reads_hold(): return MISS")
    lifted_vars: dict[int, str] = {}
    for j, (lifted, meta) in enumerate(zip(c.lifted, art.lifted_keys)):
        ns[f"_lg{j}"], ns[f"_ld{j}"], ns[f"_ldev{j}"], ns[f"_lshape{j}"] = (
            lifted.getter,
            meta[0],
            meta[1],
            tuple(meta[2]),
        )
        body.append(f"_l{j} = _lg{j}()")
        body.append(
            f"if not isinstance(_l{j}, _Tensor) or _l{j}.dtype is not _ld{j} or "
            f"_l{j}.device != _ldev{j} or _l{j}.shape != _lshape{j}: return MISS"
        )
        lifted_vars[id(lifted.getter)] = f"_l{j}"
    # 6. sizes: static sizes, layouts, symbols, assumptions
    # a symbol read from one place and in no assumption constrains nothing: not read
    facts = set().union(*(a.free_symbols for a in check.assumptions))
    places: dict[sympy.Symbol, int] = {}
    for slot in check.slots:
        places[slot.symbol] = places.get(slot.symbol, 0) + 1
    slots = [s for s in check.slots if places[s.symbol] > 1 or s.symbol in facts]
    for i in sorted({i for i, *_ in check.fixed} | {s.leaf for s in slots}):
        body.append(f"_sh{i} = a{i}.shape")
    for i, axis, size, _ in check.fixed:
        body.append(f"if _sh{i}[{axis}] != {size}: return MISS")
    for i, order, _ in check.layouts:
        if tuple(order) == tuple(range(len(order))):
            body.append(f"if not a{i}.is_contiguous(): return MISS")
        else:
            body.append(f"if not a{i}.permute({tuple(order)!r}).is_contiguous(): return MISS")
    names: dict[sympy.Symbol, str] = {}
    for slot in slots:
        here = f"_sh{slot.leaf}[{slot.axis}]"
        if slot.symbol in names:
            body.append(f"if {here} != {names[slot.symbol]}: return MISS")
        else:
            names[slot.symbol] = f"_s{len(names)}"
            body.append(f"{names[slot.symbol]} = {here}")
    if check.assumptions:
        if facts - set(names):
            return None  # an assumption on a symbol no argument binds: the full path decides
        # exact arithmetic, as AssumptionCheck: see [Note: exact size arithmetic] in cuvil_ir.symbolic
        body.append(f"if not ({exact_code(sympy.And(*check.assumptions), names)}): return MISS")
    # the hit
    body.append("_cf._last = _art")
    body.append("_stats.cache_hits += 1")
    inputs: list[str] = []
    for k, (kind, where) in enumerate(c.inputs):
        if kind == "leaf":
            inputs.append(a[where])
        elif kind == "state":
            ns[f"_st{k}"], ns[f"_sk{k}"] = where[0], where[1]
            inputs.append(f"_st{k}[_sk{k}]")
        else:
            var = lifted_vars.get(id(where))
            if var is None:  # a getter of no lifted tensor: read as the full path does
                ns[f"_in{k}"] = where
                var = f"_in{k}()"
            inputs.append(var)
    ns["_run"] = getattr(art.executable, "call_no_grad", art.executable)
    call = f"_run({', '.join(inputs)})"
    body += [
        "if _g:",
        "    _set_grad(False)",
        "    try:",
        f"        _r = {call}",
        "    finally:",
        "        _set_grad(True)",
        "else:",
        f"    _r = {call}",
    ]
    outs: list[str] = []
    for k, (kind, v) in enumerate(c.outputs):
        if kind == "graph":
            outs.append(f"_r[{int(v)}]")
        elif kind == "item":
            outs.append(f"_r[{int(v)}].item()")
        else:
            ns[f"_const{k}"] = v
            outs.append(f"_const{k}")
    spec = c.out_spec
    if spec.is_leaf():
        body.append(f"return {outs[0]}")
    elif spec.type in (tuple, list) and all(ch.is_leaf() for ch in spec.children()):
        items = "".join(f"{o}, " for o in outs)
        body.append(f"return ({items})" if spec.type is tuple else f"return [{items}]")
    else:
        ns["_unflatten"], ns["_spec"] = unflatten, spec
        body.append(f"return _unflatten([{', '.join(outs)}], _spec)")
    source = "def hit(args, kwargs):\n" + "".join(f"    {line}\n" for line in body)
    exec(compile(source, f"<cuvil hit {cf.__qualname__}>", "exec"), ns)
    return FastPath(ns["hit"], source)


__all__ = ["MISS", "FastPath", "of"]
