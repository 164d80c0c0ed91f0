"""Which tensor arguments a target can run, said before anything touches their data.

Graph IR has dense (strided) tensors of the dtypes in :class:`cuvil_ir.DType`, on
the devices a target declares (``Capabilities.devices``). Anything else -- a sparse,
quantized or nested tensor, a meta tensor on a target that reads data -- used to
reach the generated code (a null data pointer: a segfault) or fail deep inside
capture. :func:`check_tensors` turns each into a :class:`CompileError` naming the
argument and what to do; under ``fallback="eager"`` the call then runs eagerly.

Inputs that require grad, while grad mode is on, are refused the same way: Cuvil
compiles inference, and compiled results carry no autograd history. Eager keeps
autograd working (``fallback="eager"``); ``torch.no_grad()`` /
``torch.inference_mode()`` or ``.detach()`` use the compiled code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from cuvil.errors import CompileError
from cuvil_ir.graph_ir.types import DType

#: the argument types the per-call fast paths take as they are: pytree leaves whose
#: structure key is their tensor metadata alone (a Parameter is a plain tensor to a graph;
#: the torch.compile backend passes them as inputs); a tensor subclass takes the full path
PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)

_LAYOUT_NAMES = {
    torch.sparse_coo: "a sparse COO",
    torch.sparse_csr: "a sparse CSR",
    torch.sparse_csc: "a sparse CSC",
    torch.sparse_bsr: "a sparse BSR",
    torch.sparse_bsc: "a sparse BSC",
}


def _supported_dtype(dtype: torch.dtype) -> bool:
    try:
        DType.from_torch(dtype)
    except (TypeError, ValueError, KeyError):
        return False
    return True


def tensor_problem(x: torch.Tensor, devices: frozenset[str], target: str) -> str | None:
    """Why ``target`` (running on ``devices``) cannot take ``x``, with the fix; ``None`` if it can."""
    if x.is_nested:
        return "is a nested tensor, which Cuvil does not compile; pass padded dense tensors (x.to_padded_tensor(0))"
    layout = x.layout
    if layout is not torch.strided:
        kind = _LAYOUT_NAMES.get(layout, f"a {layout}")
        return f"is {kind} tensor; Cuvil compiles dense (strided) tensors: pass x.to_dense()"
    if x.is_quantized:
        return f"is a quantized ({x.dtype}) tensor, which Cuvil does not compile; pass x.dequantize()"
    if not _supported_dtype(x.dtype):
        return f"has dtype {x.dtype}, which Cuvil does not compile"
    device = x.device.type
    if device not in devices:
        runs = ", ".join(sorted(devices))
        hint = (
            "meta tensors have no data to compute on; use target='reference' to propagate shapes"
            if device == "meta"
            else f"move it with .to('{sorted(devices)[0]}') or pick a target for {device}"
        )
        return f"is on the {device} device, but target {target!r} runs on {runs} tensors: {hint}"
    if x.requires_grad and torch.is_grad_enabled():
        return (
            "requires grad while grad mode is on; Cuvil compiles inference and its results carry "
            "no autograd history: run under torch.no_grad() or torch.inference_mode(), or pass "
            "x.detach() (fallback='eager' runs such calls eagerly, with autograd)"
        )
    return None


def check_tensors(leaves: Sequence[Any], names: Sequence[str], devices: frozenset[str], target: str) -> None:
    """Raise :class:`CompileError` for the first tensor argument ``target`` cannot take,
    or for tensor arguments on two devices (``cuda:0`` and ``cuda:1``, or CPU and GPU)."""
    first: tuple[str, torch.device] | None = None
    for name, leaf in zip(names, leaves):
        if isinstance(leaf, torch.Tensor):
            problem = tensor_problem(leaf, devices, target)
            if problem is not None:
                raise CompileError(f"argument {name!r} {problem}")
            if first is None:
                first = (name, leaf.device)
            elif leaf.device != first[1]:
                raise CompileError(
                    f"argument {name!r} is on {leaf.device} but argument {first[0]!r} is on {first[1]}: "
                    f"a compiled program runs on one device; move them with .to({str(first[1])!r})"
                )


def check_module_state(module: torch.nn.Module) -> None:
    """Raise :class:`CompileError` for a parameter or buffer that is a tensor subclass holding
    other tensors (torchao's quantized weights): each parameter slot becomes one dense graph
    input, and the data of such a tensor is not its own. ``cu.quantize(model)`` converts torchao's
    weight-only linears to Cuvil's ``weight_only_linear`` layers (docs/quantization.md)."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    for kind, named in (("parameter", module.named_parameters()), ("buffer", module.named_buffers())):
        for name, t in named:
            if type(t) in PLAIN_TENSORS or not is_traceable_wrapper_subclass(t):
                continue
            what = f"{type(t).__module__}.{type(t).__name__}"
            hint = (
                "convert the model first with cu.quantize(model): torchao's int8/int4 weight-only "
                "linears become Cuvil's weight_only_linear layers, with the same codes"
                if what.startswith("torchao.")
                else "pass a module whose parameters are plain tensors"
            )
            raise CompileError(
                f"{kind} {name!r} is a {what} tensor subclass, which compiled code cannot read; {hint}"
            )


__all__ = ["check_module_state", "check_tensors", "tensor_problem"]
