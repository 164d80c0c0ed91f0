"""Python values as Graph IR attributes: op attributes, and the argument trees of extern calls.

A capture rule's keyword attributes (:func:`attribute`) and an extern call's arguments
(:func:`argument_tree`, with ``$i`` references for the traced values among them) are
recorded in the attribute language of :mod:`cuvil_ir.graph_ir.nodes` (numbers, strings,
dtypes, tuples, ``KV`` records, ``Ref``); ``materialize`` reads them back.

[Note: list indices]
Attributes have no list type: argument lists of extern calls are recorded as tuples,
which every torch function accepts alike, except an index key: there a list is
advanced indexing (`x[[1, 2]]` is `x[torch.tensor([1, 2])]`, shape (2, ...)) while a
tuple is one index per dim (`x[1, 2]`). So the lists of an index key are recorded as
`{__list__ = [...]}` and `materialize` turns them back into lists.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sympy
import torch

from cuvil.errors import CompileError, SourceLoc
from cuvil.frontend.proxy import TensorProxy
from cuvil.frontend.torch_calls import SYM
from cuvil_ir.graph_ir.nodes import KV, AttrValue, Ref, Value
from cuvil_ir.graph_ir.types import DType
from cuvil_ir.symbolic import ShapeContext

#: extern calls whose second argument is an index key (see [Note: list indices])
INDEXING = frozenset({"__getitem__", "__setitem__"})


class UnrecordableArgument(TypeError):
    """An extern call's argument that has no attribute form."""


def attribute(v: Any) -> AttrValue:
    """``v`` as an attribute; ``TypeError`` for a value that has none."""
    if isinstance(v, (list, tuple, torch.Size)):
        return tuple(attribute(x) for x in v)
    if isinstance(v, torch.dtype):
        return DType.from_torch(v)
    if isinstance(v, torch.device):
        return str(v)
    if isinstance(v, torch.memory_format):  # read back by `materialize`
        return KV((("__memory_format__", str(v).removeprefix("torch.")),))
    if isinstance(v, sympy.Basic):
        e = sympy.sympify(v)
        return int(e) if e.is_Integer else e
    if v is None or isinstance(v, (bool, int, float, str, DType, KV, Ref)):
        return v
    raise TypeError(f"attribute value of type {type(v).__name__} is not supported: {v!r}")


def argument_tree(
    tree: Any, inputs: list[Value], value_of: Callable[[Any], Value], *, keep_lists: bool = False
) -> AttrValue:
    """An extern call's argument tree as an attribute, with ``$i`` for traced values
    (``value_of`` each, appended to ``inputs`` once; ``keep_lists``: lists are marked as
    such, see [Note: list indices]). :class:`UnrecordableArgument` for a leaf that has
    no attribute form."""
    if isinstance(tree, TensorProxy):
        v = value_of(tree)
        if v in inputs:
            return Ref(inputs.index(v))
        inputs.append(v)
        return Ref(len(inputs) - 1)
    if keep_lists and isinstance(tree, list):
        items = tuple(argument_tree(x, inputs, value_of, keep_lists=True) for x in tree)
        return KV((("__list__", items),))
    if isinstance(tree, (list, tuple, torch.Size)):
        return tuple(argument_tree(x, inputs, value_of, keep_lists=keep_lists) for x in tree)
    if isinstance(tree, dict):
        return KV.of(
            {str(k): argument_tree(v, inputs, value_of, keep_lists=keep_lists) for k, v in tree.items()}
        )
    if isinstance(tree, slice):
        return KV((("__slice__", argument_tree((tree.start, tree.stop, tree.step), inputs, value_of)),))
    if tree is Ellipsis:
        return KV((("__ellipsis__", None),))
    try:
        return attribute(tree)
    except TypeError as e:
        raise UnrecordableArgument(str(e)) from None


def mask_lists(x: Any, key: Any, ctx: ShapeContext, where: Callable[[], SourceLoc | None]) -> Any:
    """A list of Python bools in an index key is a mask of constant values: the
    list of its true positions, once its length is checked against the dim it
    indexes (torch's fake kernels would see a data-dependent mask instead). ``where``
    locates the check (a size assumption) and its error."""
    items = key if isinstance(key, tuple) else (key,)

    def is_mask(it: Any) -> bool:
        return isinstance(it, list) and bool(it) and all(isinstance(b, bool) for b in it)

    if not isinstance(x, TensorProxy) or not any(is_mask(it) for it in items):
        return key
    simple = (int, slice, list, sympy.Basic, *SYM)
    if not all(
        it is None or it is Ellipsis or (isinstance(it, simple) and not isinstance(it, bool)) for it in items
    ):
        return key  # tensor or bool indices: torch's rules decide the dims
    if isinstance(key, list) and any(isinstance(b, (list, slice)) or b is None for b in key):
        return key  # a list holding sequences is a tuple to torch
    shape = x.ir_type.shape
    consuming = sum(1 for it in items if it is not None and it is not Ellipsis)
    out: list[Any] = []
    d = 0
    for it in items:
        if it is Ellipsis:
            d += max(len(shape) - consuming, 0)
        elif it is not None:
            if is_mask(it) and d < len(shape):
                size = shape[d]
                same = (
                    size == len(it)
                    if isinstance(size, int)
                    else ctx.decide(sympy.Eq(size, len(it)), f"{where()}: boolean index list length")
                )
                if not same:
                    raise CompileError(
                        f"a boolean index list of length {len(it)} indexes a dim of size {size}",
                        where(),
                        "a list of bools is a mask: it needs one entry per element of the dim",
                    )
                it = [i for i, b in enumerate(it) if b]
            d += 1
        out.append(it)
    return tuple(out) if isinstance(key, tuple) else out[0]


__all__ = ["INDEXING", "UnrecordableArgument", "argument_tree", "attribute", "mask_lists"]
