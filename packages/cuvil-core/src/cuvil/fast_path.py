"""The fast path of a cache hit: one generated function per compiled variant that
checks every guard of that variant and runs it, for calls of tensors passed positionally
or by keyword (``model(input_ids=ids, attention_mask=mask)``), and of the containers and
attribute objects around them (a decoder's cache: ``model(ids, past_key_values=cache)``).

[Note: the fast path of a hit]
``CompiledFunction.__call__`` first tries the fast path of the variant it served
last. The function is generated once per artifact (``of``), from the artifact's
own guards, so a hit does no generic work: no tree flattening, no structure key
built and compared as tuples, no artifact search, no size symbols bound into a
list, no result tree rebuilt through pytree. It checks, in this order, exactly what
``CompiledFunction._find`` checks for that artifact, each written out for its
values:

1. the call's structure, walked as ``arg_objects.flatten`` walks it (:class:`_Walk`):
   as many positional arguments as the variant had and the same keywords in the same
   order (the tree structure's dict keys); inside them each list and tuple of its type
   and length, each dict of its keys in order, and each attribute object
   of its exact class with the same attribute names in the same order (its
   ``__dict__``), each such object met once (one met twice is a leaf of the full path's
   tree: another structure); a registered pytree node or a namedtuple is not walked
   here (no fast path for such a variant);
2. each leaf's structure key (``guards.leaf_key``): a tensor exactly a
   ``torch.Tensor`` (or ``nn.Parameter``) of its dtype, rank, dense strided layout, not
   nested, device, the shape under ``dynamic=False``, and not requiring grad while grad
   mode is on; an int attribute that is a size symbol an ``int`` above 0
   ([Note: int attributes are sizes]); a value (a bool flag, a 0, a string, a dtype)
   of its type and equal to it;
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
Then the hit is counted, grad mode turned off around the run (inference) and the run
made as ``artifacts.run_artifact`` makes it (arguments written in place where the storage
check allows, the arguments' updates and write-backs after it), and the result built
from the outputs directly (an argument returned as itself, a new object rebuilt around
the outputs). ``source`` of the returned function is the
generated text (deterministic for a variant).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sympy
import torch
from torch.utils import _pytree as pytree

from cuvil.arguments import PLAIN_TENSORS
from cuvil.artifacts import size_carrier
from cuvil.frontend import arg_objects
from cuvil.frontend.arg_objects import ObjectNode
from cuvil.results import unflatten
from cuvil_ir.graph_ir import in_place
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
    None when its structure is not one the fast path walks (see the note)."""
    fp = art.fast
    if fp is None:
        fp = art.fast = _generate(cf, art) or NONE
    return None if fp is NONE else fp.fn  # type: ignore[no-any-return]


def _eligible(cf: Any, art: Any) -> bool:
    c = art.captured
    if c is None or art.executable is None or art.amp:
        return False
    # (a third part: the registered objects' state; () when the tree holds none, which
    # the structure walk then checks: it takes no registered node)
    if len(art.key) not in (2, 3) or (len(art.key) == 3 and art.key[2] != ()):
        return False
    for k in art.key[1]:
        if k[0] == "tensor":
            if len(k) != 6 or k[5]:
                return False
        elif k[0] == "size":
            if not cf.int_sizes:
                return False
        elif k[0] != "value":
            return False  # an object leaf (compared by id): the full path decides
    if any(kind not in ("graph", "item", "const", "arg", "object") for kind, _ in c.outputs):
        return False
    return all(isinstance(k, tuple) and k and k[0] != "not a tensor" for k in art.lifted_keys)


class _Walk:
    """The generated statements that take a call's ``(args, kwargs)`` apart as
    ``arg_objects.flatten`` does for one argument structure, checking each node on the way
    (type, length, keys: what the structure key's tree spec says), and bind each leaf to
    ``a<i>``; :meth:`node` returns False for a node it does not take."""

    def __init__(self, ns: dict[str, Any]) -> None:
        self.ns = ns
        self.body: list[str] = []
        self.leaves = 0
        self.temps = 0
        #: the attribute objects met: one object met twice is a leaf of the full path's tree
        self.objects: list[str] = []

    def _name(self, value: Any) -> str:
        name = f"_c{len(self.ns)}"
        self.ns[name] = value
        return name

    def node(self, expr: str, spec: pytree.TreeSpec) -> bool:
        if spec.is_leaf():
            self.body.append(f"a{self.leaves} = {expr}")
            self.leaves += 1
            return True
        t = spec.type
        v = f"_n{self.temps}"
        self.temps += 1
        self.body.append(f"{v} = {expr}")
        kids = spec.children()
        if t is ObjectNode:
            cls, keys = spec.context
            d = f"{v}d"
            self.body.append(f"if type({v}) is not {self._name(cls)}: return MISS")
            self.body.append(f"{d} = {v}.__dict__")
            self.body.append(f"if tuple({d}) != {self._name(tuple(keys))}: return MISS")
            self.objects.append(v)
            return all(self.node(f"{d}[{k!r}]", c) for k, c in zip(keys, kids))
        if t in (tuple, list):
            self.body.append(f"if type({v}) is not {t.__name__} or len({v}) != {len(kids)}: return MISS")
            return all(self.node(f"{v}[{i}]", c) for i, c in enumerate(kids))
        if t is dict:
            keys = tuple(spec.context)
            if not all(type(k) in (str, int) for k in keys):
                return False
            self.body.append(f"if type({v}) is not dict or tuple({v}) != {self._name(keys)}: return MISS")
            return all(self.node(f"{v}[{k!r}]", c) for k, c in zip(keys, kids))
        return False  # a registered node or a namedtuple: the full path


def _generate(cf: Any, art: Any) -> FastPath | None:
    if not _eligible(cf, art):
        return None
    c = art.captured
    check = c.check
    leaves = art.key[1]
    n = len(leaves)
    spec = art.key[0]
    if spec.type is not tuple or spec.num_children != 2:
        return None
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
    # 1. the call's structure: the positional count, the keywords' names in the call's order
    # (a dict's order is its tree structure's: the full path keys variants so too), and
    # inside each argument the containers and attribute objects as the key's tree has them
    walk = _Walk(ns)
    pos, kw = spec.children()
    if pos.type is not tuple or kw.type is not dict or not all(type(k) is str for k in kw.context):
        return None
    # (args is a tuple and kwargs a dict of str keys by the call itself: their sizes and names only)
    walk.body.append(f"if len(args) != {pos.num_children}: return MISS")
    if kw.num_children:
        ns["_names"] = tuple(kw.context)
        walk.body.append("if tuple(kwargs) != _names: return MISS")
    else:
        walk.body.append("if kwargs: return MISS")
    if pos.num_children and all(ch.is_leaf() for ch in pos.children()):
        walk.body.append(f"{''.join(f'a{i}, ' for i in range(pos.num_children))}= args")
        walk.leaves = pos.num_children
    elif not all(walk.node(f"args[{i}]", ch) for i, ch in enumerate(pos.children())):
        return None
    if not all(walk.node(f"kwargs[{k!r}]", ch) for k, ch in zip(kw.context, kw.children())):
        return None
    assert walk.leaves == n
    body = walk.body
    if len(walk.objects) > 1:  # each attribute object once (one met twice is a leaf there)
        ids = ", ".join(f"id({o})" for o in walk.objects)
        body.append(f"if len({{{ids}}}) != {len(walk.objects)}: return MISS")
    a = [f"a{i}" for i in range(n)]
    tensors = [i for i, k in enumerate(leaves) if k[0] == "tensor"]
    # 1-2. each argument's structure key
    for i, k in enumerate(leaves):
        if k[0] == "size":  # an int attribute that is a size symbol: [Note: int attributes are sizes]
            body.append(f"if type(a{i}) is not int or a{i} <= 0: return MISS")
            continue
        if k[0] == "value":
            ns[f"_vt{i}"], ns[f"_v{i}"] = k[1], k[2]
            body.append(f"if type(a{i}) is not _vt{i} or a{i} != _v{i}: return MISS")
            continue
        _, dtype, device, rank, shape, _ = k
        ns[f"_d{i}"], ns[f"_dev{i}"] = dtype, device
        conds = [
            f"type(a{i}) not in _plain",
            f"a{i}.dtype is not _d{i}",
            f"a{i}.dim() != {int(rank)}",
            f"a{i}.layout is not _strided",
            f"a{i}.is_nested",
            # (``is_cpu`` reads a flag; ``device`` makes a device object to compare)
            f"not a{i}.is_cpu" if device == torch.device("cpu") else f"a{i}.device != _dev{i}",
        ]
        if shape is not None:
            ns[f"_shape{i}"] = tuple(shape)
            conds.append(f"a{i}.shape != _shape{i}")
        body.append(f"if {' or '.join(conds)}: return MISS")
    body.append("_g = _grad_on()")
    if tensors:
        body.append(f"if _g and ({' or '.join(f'a{i}.requires_grad' for i in tensors)}): return MISS")
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
    for i in sorted({i for i, *_ in check.fixed} | {s.leaf for s in slots if s.axis >= 0}):
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
        here = f"a{slot.leaf}" if slot.axis < 0 else f"_sh{slot.leaf}[{slot.axis}]"
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
        elif kind == "size":  # an int attribute as a size: [Note: int attributes are sizes]
            ns["_carrier"] = size_carrier
            inputs.append(f"_carrier({a[where]})")
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
    # the run, as artifacts.run_artifact makes it: arguments written in place where the
    # storage check allows ([Note: updates in place]), then the arguments' updates
    run: list[str] = []
    if c.written_in_place:
        ns["_exclusive"], ns["_writing"], ns["_written"] = (
            in_place.exclusive,
            in_place.writing,
            c.written_in_place,
        )
        run += [
            f"_i = [{', '.join(inputs)}]",
            "if _exclusive(_i, _written):",
            "    with _writing(True):",
            "        _r = _run(*_i)",
            "else:",
            "    _r = _run(*_i)",
        ]
    else:
        run.append(f"_r = _run({', '.join(inputs)})")
    for i, j in c.input_updates:  # (written in place: the result is the argument itself)
        run += [f"_u = _r[{j}]", f"if _u is not {a[i]}: {a[i]}.copy_(_u)"]
    body += [
        "if _g:",
        "    _set_grad(False)",
        "    try:",
        *(f"        {line}" for line in run),
        "    finally:",
        "        _set_grad(True)",
        "else:",
        *(f"    {line}" for line in run),
    ]
    if c.write_backs:  # arguments the function changes in place end as in eager
        ns["_write_back"], ns["_writes"] = arg_objects.write_back, c.write_backs
        body.append(f"_write_back(_writes, _r, [{''.join(f'{x}, ' for x in a)}], (args, kwargs))")
    outs: list[str] = []
    for k, (kind, v) in enumerate(c.outputs):
        if kind == "graph":
            outs.append(f"_r[{int(v)}]")
        elif kind == "item":
            outs.append(f"_r[{int(v)}].item()")
        elif kind == "arg":  # an argument itself (changed in place, returned)
            ns["_at"], ns[f"_path{k}"] = arg_objects.at, v
            outs.append(f"_at((args, kwargs), _path{k})")
        elif kind == "object":  # a new object holding results
            ns["_rebuild"], ns[f"_tmpl{k}"] = arg_objects.rebuild, v
            outs.append(f"_rebuild(_tmpl{k}, _r)")
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
