"""Tensor proxies: what user code holds instead of tensors while it is traced.

A :class:`TensorProxy` is a ``torch.Tensor`` subclass without storage (so
``isinstance(x, torch.Tensor)`` holds and ``nn.Module`` code runs unchanged)
that stands for one Graph IR value. Every torch-level use of it reaches
:meth:`Tracer.handle` through ``__torch_function__``; nothing ever reaches the
dispatcher (``__torch_dispatch__`` guards that invariant).
"""

from __future__ import annotations

from typing import Any

import torch

from cuvil.frontend.tracer_view import TracerView
from cuvil_ir.graph_ir.nodes import Value
from cuvil_ir.graph_ir.types import TensorType


class TensorProxy(torch.Tensor):
    _cuvil_tracer: TracerView
    _cuvil_value: Value
    #: the proxy this one is a view of (in-place updates of aliases are refused)
    _cuvil_base: TensorProxy | None
    _cuvil_has_views: bool
    _cuvil_is_input: bool
    #: stands for a Python number (a NumberProxy): weak in type promotion, as the number is
    _cuvil_weak = False
    #: what eager's layout of the value is found from (cuvil/frontend/layout.py): the call
    #: that made it (func, args, kwargs, result leaf), or the argument it is (leaf, name,
    #: example shape and strides), and the fake tensor computed from either, once asked
    _cuvil_made: tuple[Any, Any, Any, int] | None = None
    _cuvil_argument: tuple[int, str, tuple[int, ...], tuple[int, ...]] | None = None
    _cuvil_fake: tuple[Any, dict[int, Any]] | None = None

    @staticmethod
    def __new__(cls, tracer: TracerView, value: Value) -> TensorProxy:
        t = value.type
        assert isinstance(t, TensorType)
        hint = [tracer.example_dim(d) for d in t.shape]
        device = torch.device(t.device)
        self = torch.Tensor._make_wrapper_subclass(cls, hint, dtype=t.dtype.torch, device=device)
        self._cuvil_tracer = tracer
        self._cuvil_value = value
        self._cuvil_base = None
        self._cuvil_has_views = False
        self._cuvil_is_input = False
        return self  # type: ignore[no-any-return]

    @property
    def ir_type(self) -> TensorType:
        t = self._cuvil_value.type
        assert isinstance(t, TensorType)
        return t

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        tracer = _owner(args, kwargs)
        return tracer.handle(func, args, kwargs or {})

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:  # type: ignore[override]
        raise RuntimeError(
            f"internal error: {func} reached the dispatcher with a Cuvil proxy; "
            "every tensor operation should be intercepted at the torch-function level"
        )

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        return f"TensorProxy(%{self._cuvil_value.name}: {self._cuvil_value.type})"


def _owner(args: Any, kwargs: Any) -> TracerView:
    from torch.utils import _pytree as pytree

    for leaf in pytree.tree_leaves((args, kwargs)):
        if isinstance(leaf, TensorProxy):
            return leaf._cuvil_tracer
    raise RuntimeError("internal error: no proxy among the arguments")
