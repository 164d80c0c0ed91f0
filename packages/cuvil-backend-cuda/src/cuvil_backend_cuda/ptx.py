"""Ahead-of-time compilation of a generated kernel to PTX (no GPU needed).

``triton.compile(ASTSource(...), target=GPUTarget("cuda", arch, 32))`` runs
Triton's whole NVIDIA pipeline on the host. Under ``TRITON_INTERPRET=1`` Triton's
own library functions (``tl.max``, ``tl.sum`` ...) were made interpreter functions
when triton was imported, so they cannot be compiled in that process: the
kernels then go to one long-lived worker process started without the variable
(``python -m cuvil_backend_cuda.ptx``), one JSON line per kernel each way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from typing import Any

from cuvil_backend_cuda.declared import interpreting
from cuvil_backend_cuda.policy import LAUNCH
from cuvil_ir.triton_source.emit import TritonKernel


def aot_constexprs(tk: TritonKernel) -> dict[str, Any]:
    """Block sizes of the ahead-of-time variant: the looped one, which serves every size."""
    if tk.rows:
        return {
            "XBLOCK": max(1, LAUNCH.tile_elements // LAUNCH.loop_block),
            "RBLOCK": LAUNCH.loop_block,
            "ONE_TILE": False,
        }
    return {"XBLOCK": LAUNCH.block}


def compile_here(tk: TritonKernel, arch: int) -> str:
    """PTX of ``tk`` for ``sm_<arch>``, compiled in this process (not under the interpreter)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from cuvil_backend_cuda.launch import load

    src = ASTSource(load(tk, interpret=False), signature=dict(tk.signature), constexprs=aot_constexprs(tk))
    compiled = triton.compile(
        src, target=GPUTarget("cuda", arch, 32), options={"num_warps": LAUNCH.num_warps}
    )
    return str(compiled.asm["ptx"])


class _Worker:
    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None
        self.lock = threading.Lock()

    def compile(self, tk: TritonKernel, arch: int) -> str:
        from cuvil_ir.serial import Codec

        request = json.dumps({"kernel": Codec(extra=(TritonKernel,)).dumps(tk).decode(), "arch": arch})
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "cuvil_backend_cuda.ptx"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    env=env,
                    text=True,
                )
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.write(request + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the PTX compile worker exited (see its error output above)")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"compiling kernel {tk.name} to PTX failed: {reply['error']}")
        return str(reply["ptx"])


_WORKER = _Worker()


def compile_ptx(tk: TritonKernel, arch: int) -> str:
    """PTX of ``tk`` for ``sm_<arch>``: here, or in the worker under the interpreter."""
    if interpreting():
        return _WORKER.compile(tk, arch)
    return compile_here(tk, arch)


def _serve() -> None:
    from cuvil_ir.serial import Codec

    codec = Codec(extra=(TritonKernel,))
    for line in sys.stdin:
        request = json.loads(line)
        try:
            tk = codec.loads(request["kernel"].encode())
            reply = {"ptx": compile_here(tk, int(request["arch"]))}
        except Exception as e:  # reported to the compiling process, which raises it
            reply = {"error": f"{type(e).__name__}: {e}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve()

__all__ = ["aot_constexprs", "compile_here", "compile_ptx"]
