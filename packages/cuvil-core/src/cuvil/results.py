"""A compiled call's result rebuilt from its leaves, with the types eager returns."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree


def unflatten(leaves: list[Any], spec: pytree.TreeSpec) -> Any:
    """``pytree.tree_unflatten``, except that a ``torch.Size`` comes back a ``torch.Size``:
    pytree rebuilds one as a plain tuple (its leaves could be anything), but a result's
    sizes are ints, and eager returns ``x.shape`` as a ``torch.Size``."""
    if spec.is_leaf():
        return leaves[0]
    if not _has_size(spec):
        return pytree.tree_unflatten(leaves, spec)
    children, at = [], 0
    for child in spec.children():
        children.append(unflatten(leaves[at : at + child.num_leaves], child))
        at += child.num_leaves
    if spec.type is torch.Size:
        return torch.Size(children)
    # the node itself (a tuple, a dict, a namedtuple ...) rebuilt over its rebuilt children
    one_level = pytree.TreeSpec(spec.type, spec.context, [pytree.treespec_leaf()] * len(children))
    return pytree.tree_unflatten(children, one_level)


def _has_size(spec: pytree.TreeSpec) -> bool:
    return spec.type is torch.Size or any(_has_size(c) for c in spec.children())
