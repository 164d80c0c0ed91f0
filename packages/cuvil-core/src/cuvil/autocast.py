"""Autocast (``torch.autocast``, ``torch.amp.autocast``, ``torch.set_autocast_enabled``).

Under autocast eager PyTorch runs some ops (matmul, linear, conv, ...) in a lower
dtype; a graph captured without autocast's op rules would silently compute in fp32.
Cuvil does not capture autocast yet, so:

* the autocast state of the call (enabled, and the dtype, for the inputs' device
  types) is part of the structure key: an artifact from outside autocast never runs
  inside it, nor the other way round;
* capturing while autocast is on for the graph's devices -- on at the call, or entered
  in the function -- is a located :class:`CompileError` (eager under ``fallback="eager"``).

Only the devices the tensors live on matter: CUDA autocast does not change CPU ops.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from cuvil.errors import CompileError, SourceLoc

HINT = (
    "autocast regions are not supported yet: cast explicitly instead (x.to(torch.bfloat16) @ "
    "w.to(torch.bfloat16)), or compile the function with a bf16 model and inputs, or leave "
    "fallback='eager' (the default) so such calls run eagerly"
)

_is_any_enabled = torch._C._is_any_autocast_enabled


def state(leaves: list[Any]) -> tuple[tuple[str, torch.dtype], ...]:
    """The autocast state of a call: ``(device type, dtype)`` for each device type of the
    tensor leaves (cpu when there are none) where autocast is enabled.

    Called on every call: one C call when autocast is off everywhere.
    """
    if not _is_any_enabled():
        return ()
    devices = {x.device.type for x in leaves if isinstance(x, torch.Tensor)} or {"cpu"}
    return tuple((d, torch.get_autocast_dtype(d)) for d in sorted(devices) if _enabled(d))


def _enabled(device: str) -> bool:
    try:
        return torch.is_autocast_enabled(device)
    except RuntimeError:  # a device type autocast does not know (meta): it never casts there
        return False


@contextlib.contextmanager
def entered_again(amp: tuple[tuple[str, torch.dtype], ...]) -> Iterator[None]:
    """Autocast as it was at the call (``state``), on this thread: an eager fallback of a
    call made under autocast that runs on another thread (``submit``) casts like eager."""
    with contextlib.ExitStack() as stack:
        for device, dtype in amp:
            stack.enter_context(torch.autocast(device, dtype=dtype))
        yield


def describe(amp: tuple[tuple[str, torch.dtype], ...]) -> str:
    return ", ".join(f"{d} {str(t).removeprefix('torch.')}" for d, t in amp) if amp else "off"


def at_call(amp: tuple[tuple[str, torch.dtype], ...]) -> CompileError:
    """The error for a call made with autocast on (the function itself is not at fault)."""
    return CompileError(f"called under autocast ({describe(amp)}), which Cuvil does not capture", None, HINT)


def check_in_trace(tracer: Any) -> None:
    """Raise when autocast is on, for a device of the graph being captured, while an op
    is captured: the result would be computed in fp32 where eager computes in the lower
    dtype. This catches every way in (a context manager object made elsewhere, library
    code, ``torch.set_autocast_enabled``); :func:`check_entered` names the line."""
    if not _is_any_enabled():
        return
    on = [(d, torch.get_autocast_dtype(d)) for d in _graph_devices(tracer) if _enabled(d)]
    if on:
        raise CompileError(f"op captured under autocast ({describe(tuple(on))})", tracer.source_loc(), HINT)


def check_entered(tracer: Any, fn: Any, args: tuple[Any, ...], result: Any, loc: SourceLoc | None) -> None:
    """Raise when a call in compiled code made an enabled autocast context manager
    (``torch.autocast``, ``torch.amp.autocast`` or a subclass) or enabled autocast
    (``torch.set_autocast_enabled``) for a device of the graph. ``autocast(enabled=False)``
    (as models use around rotary embeddings) is fine: nothing is cast inside it."""
    if isinstance(result, torch.amp.autocast):
        device, on = result.device, bool(result._enabled)
    elif fn is torch.set_autocast_enabled and len(args) == 2:
        device, on = str(args[0]), bool(args[1])
    else:
        return
    if on and device in _graph_devices(tracer):
        if fn is torch.set_autocast_enabled:
            # undo it: the error leaves the function before its own reset. It was off
            # before (on at the call, or on at an earlier op, is an error already).
            torch.set_autocast_enabled(device, False)
        raise CompileError(f"autocast entered for {device} in compiled code", loc, HINT)


def _graph_devices(tracer: Any) -> list[str]:
    """The device types of the graph's inputs and lifted tensors (cpu when none)."""
    values = [*tracer.inputs, *(x.value for x in tracer.lifted)]
    devices = {str(d).split(":")[0] for v in values if (d := getattr(v.type, "device", None))}
    return sorted(devices or {"cpu"})
