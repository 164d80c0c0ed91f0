"""What the tracer's torch-function handler tells about a call before recording it.

Which calls read a tensor's value (refused, or a size bound when the code runs), which
factories must run on every call, the out-of-place twin of an in-place method, whether
an argument tree holds traced values or symbolic sizes, the weak promotion of carried
Python numbers, and the argument tree with sizes and real tensors in Graph IR terms
(:func:`normalize`). Used by :meth:`cuvil.frontend.tracer.Tracer.handle`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

from cuvil.frontend.proxy import TensorProxy
from cuvil_ir.graph_ir.registry import REGISTRY
from cuvil_ir.graph_ir.types import DType

#: torch's symbolic numbers: a size (or a fact about sizes) user code holds
SYM = (torch.SymInt, torch.SymBool, torch.SymFloat)
#: calls without tensor arguments that must run on every call, not once at trace time
NONDETERMINISTIC = frozenset(
    {
        "rand",
        "randn",
        "randint",
        "randperm",
        "rand_like",
        "randn_like",
        "randint_like",
        "normal",
        "bernoulli",
        "multinomial",
        "poisson",
        "empty",
        "empty_like",
        "empty_strided",
    }
)
#: calls that need a tensor's value (or its storage), only known when the code runs
DATA_DEPENDENT = frozenset(
    {
        "__bool__",
        "__int__",
        "__float__",
        "__index__",
        "__complex__",
        "item",
        "tolist",
        "numpy",
        "__array__",
        "__iter__",
        "__reversed__",
        "__format__",
        "__str__",
        "__contains__",
        "data_ptr",
        "storage",
    }
)

#: the value reads (of DATA_DEPENDENT) that a tensor read from outside the call answers
#: on every call, as an argument does: lifted first, never the value at capture
VALUE_READS = DATA_DEPENDENT - {"__format__", "__str__", "data_ptr", "storage"}


def inplace_twin(func: Any) -> Any:
    """The registry entry of the out-of-place twin of in-place method ``func``
    (``x.add_`` -> ``x.add``, ``x += y`` -> ``x + y``), or None."""
    name = getattr(func, "__name__", "")
    if name.startswith("__i") and name.endswith("__"):
        twin = getattr(torch.Tensor, "__" + name[3:], None)
    elif name.endswith("_") and not name.startswith("_") and getattr(torch.Tensor, name, None) is func:
        twin = getattr(torch.Tensor, name[:-1], None)
    else:
        return None
    return REGISTRY.for_torch(twin) if twin is not None else None


def any_leaf(args: Any, kwargs: Any, pred: Callable[[Any], bool]) -> bool:
    """Whether ``pred`` holds for a leaf of the argument trees (slices' bounds included)."""
    return any(pred(x) for x in _leaves((args, kwargs)))


def _leaves(tree: Any) -> Any:
    if isinstance(tree, (list, tuple)):
        for x in tree:
            yield from _leaves(x)
    elif isinstance(tree, dict):
        for x in tree.values():
            yield from _leaves(x)
    elif isinstance(tree, slice):
        yield from _leaves((tree.start, tree.stop, tree.step))
    else:
        yield tree


def normalize(tree: Any, sym: Callable[[Any], Any], lift: Callable[[torch.Tensor], TensorProxy]) -> Any:
    """Sizes become sympy expressions (``sym``) and real tensors lifted proxies (``lift``)."""
    if isinstance(tree, tuple):
        return tuple(normalize(x, sym, lift) for x in tree)
    if isinstance(tree, list):
        return [normalize(x, sym, lift) for x in tree]
    if isinstance(tree, dict):
        return {k: normalize(v, sym, lift) for k, v in tree.items()}
    if isinstance(tree, slice):
        start, stop, step = (normalize(x, sym, lift) for x in (tree.start, tree.stop, tree.step))
        return slice(start, stop, step)
    if isinstance(tree, SYM):
        return sym(tree)
    if isinstance(tree, TensorProxy):
        return tree
    if isinstance(tree, torch.Tensor):
        return lift(tree)
    return tree


def weak_numbers(args: Any, kwargs: Any) -> tuple[Any, Any]:
    """A carried Python float (a float64 :class:`NumberProxy`) combined with tensors none
    of which is floating is cast to the default dtype first: eager promotes the number it
    stands for with them to the default dtype (``int_tensor * 0.5`` is float32), while a
    float64 0-d tensor would make the result float64. With a floating tensor the 0-d
    float64 already loses to it, as the number would."""
    leaves = pytree.tree_leaves((args, kwargs))
    if not any(isinstance(x, TensorProxy) and x._cuvil_weak and x.ir_type.dtype == DType.f64 for x in leaves):
        return args, kwargs
    others = [x for x in leaves if isinstance(x, torch.Tensor) and not getattr(x, "_cuvil_weak", False)]
    dtypes = [x.ir_type.dtype.torch if isinstance(x, TensorProxy) else x.dtype for x in others]
    if not others or any(d.is_floating_point or d.is_complex for d in dtypes):
        return args, kwargs
    default = torch.get_default_dtype()

    def cast(x: Any) -> Any:
        weak = isinstance(x, TensorProxy) and x._cuvil_weak and x.ir_type.dtype == DType.f64
        return torch.Tensor.to(x, default) if weak else x

    return pytree.tree_map(cast, (args, kwargs))  # type: ignore[no-any-return]


__all__ = [
    "DATA_DEPENDENT",
    "NONDETERMINISTIC",
    "SYM",
    "VALUE_READS",
    "any_leaf",
    "inplace_twin",
    "normalize",
    "weak_numbers",
]
