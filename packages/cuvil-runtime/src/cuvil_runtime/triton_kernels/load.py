"""Loading a generated kernel's text and launching it with its error flag.

A :class:`~cuvil_ir.triton_source.emit.TritonKernel`'s text comes from the program
cache (signed, never from a file another user could write) and is executed in a
fresh namespace whose ``cu`` is the target's device library for the mode. Its
lines are registered with :mod:`linecache` because ``triton.jit`` reads a
kernel's source.
"""

from __future__ import annotations

import hashlib
import linecache
import types
from typing import Any

from cuvil_ir.triton_source.emit import TritonKernel
from cuvil_runtime.target import Launch


def load(tk: TritonKernel, cu: types.ModuleType, mode: str) -> Any:
    """The kernel's ``@triton.jit`` function with ``cu`` bound; ``mode`` names the
    device library in the kernel's file name (tracebacks say which one ran)."""
    digest = hashlib.sha256(tk.source.encode()).hexdigest()[:16]
    filename = f"<cuvil triton {tk.name} {digest} {mode}>"
    linecache.cache[filename] = (len(tk.source), None, tk.source.splitlines(True), filename)
    ns: dict[str, Any] = {"__name__": f"cuvil_triton_{tk.name}", "cu": cu}
    exec(compile(tk.source, filename, "exec"), ns)
    return ns[tk.name]


def pow2(n: int) -> int:
    """The least power of two >= ``n`` (1 for ``n <= 1``)."""
    return 1 << max(0, int(n) - 1).bit_length()


def run(
    fn: Any, tk: TritonKernel, grid: tuple[int, ...], args: tuple[Any, ...], config: dict[str, Any]
) -> int:
    """``fn[grid](*args, **config)``; for a kernel with ``may_fail``, with the int32
    error flag after the buffers, and its value returned (nonzero: an integer
    division met a zero divisor)."""
    if not tk.may_fail:
        fn[grid](*args, **config)
        return 0
    import torch

    nbuf = len(tk.buffers)
    err = torch.zeros(1, dtype=torch.int32, device=args[0].device)
    fn[grid](*args[:nbuf], err, *args[nbuf:], **config)
    return int(err.item())


def launch_of(tk: TritonKernel, launcher: Any) -> Launch:
    """The runner's :class:`Launch` of ``tk``: ``launcher`` takes the kernel's buffers
    (as tensors), sizes, derived sizes and scalars, and returns :func:`run`'s flag."""
    return Launch(
        fn=launcher,
        buffers=tk.buffers,
        sizes=tk.sizes,
        derived=tk.derived,
        scalars=tk.args,
        may_fail=tk.may_fail,
        tensors=True,
    )


__all__ = ["launch_of", "load", "pow2", "run"]
