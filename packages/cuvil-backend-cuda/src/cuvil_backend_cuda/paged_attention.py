"""``paged_attention`` on the ``cuda`` target: the shared Triton kernel
(:mod:`cuvil_runtime.triton_kernels.paged_attention`), one program per (query token, kv head),
on CUDA tensors, or on CPU tensors in Triton's interpreter (``TRITON_INTERPRET=1``).

:func:`ptx` compiles the kernel ahead of time for an architecture (sm_90 by default, no GPU
needed); under the interpreter it does so in a child process started without the variable,
since Triton's library functions were made interpreter functions when triton was imported
(as :mod:`cuvil_backend_cuda.ptx` does for generated kernels).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import torch

from cuvil_backend_cuda.declared import interpreting
from cuvil_backend_cuda.policy import LAUNCH
from cuvil_ir.graph_ir.ops import paged

#: the Graph IR op this module runs
OP = paged.PagedAttention.name

#: positions per step of an item: K and V tiles of BLOCK_N x head_dim
BLOCK_N = 32

#: the operand dtypes the kernel takes, and Triton's names for their pointers
DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def takes(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor) -> bool:
    """Whether the kernel runs these operands here (the rest runs the reference)."""
    device = "cpu" if interpreting() else "cuda"
    return (
        query.device.type == key_cache.device.type == value_cache.device.type == device
        and query.dtype in DTYPES
        and key_cache.dtype == value_cache.dtype
        and key_cache.dtype in DTYPES
        and query.dim() == 3
        and key_cache.dim() == 4
    )


def extern(reference: Callable[..., Any]) -> Callable[..., Any]:
    """What a ``paged_attention`` extern call runs: the kernel where it takes the operands,
    else ``reference``."""
    from cuvil_runtime.triton_kernels.paged_attention import launch

    options = {} if interpreting() else {"num_warps": LAUNCH.num_warps}

    def run(
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        query_start_loc: torch.Tensor,
        *,
        scale: float,
    ) -> torch.Tensor:
        operands = (query, key_cache, value_cache, block_tables, seq_lens, query_start_loc)
        if not takes(query, key_cache, value_cache):
            return reference(*operands, scale=scale)  # type: ignore[no-any-return]
        return launch(*operands, scale=scale, block_n=BLOCK_N, target=_programs(query), options=options)

    return run


def _programs(query: torch.Tensor) -> int:
    """Programs the device runs at once, about: two per multiprocessor (an H100's 132 under the
    interpreter), below which items are split along the sequence."""
    if query.device.type != "cuda":
        return 2 * 132
    return 2 * torch.cuda.get_device_properties(query.device).multi_processor_count


def compile_here(arch: int, group: int, head_dim: int, dtype: str = "fp32", cache_dtype: str = "fp32") -> str:
    """PTX of the kernel and of the split's merge for ``sm_<arch>`` with these tile sizes and
    operand types, compiled in this process (not under the interpreter)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from cuvil_runtime.triton_kernels import paged_attention as kernels

    sig = kernels.signature()
    sig.update(out_ptr=f"*{dtype}", q_ptr=f"*{dtype}", k_ptr=f"*{cache_dtype}", v_ptr=f"*{cache_dtype}")
    tiles = kernels.tile_sizes(group, head_dim, BLOCK_N)
    target = GPUTarget("cuda", arch, 32)
    options = {"num_warps": LAUNCH.num_warps}
    main = triton.compile(
        ASTSource(kernels.paged_attention_kernel, signature=sig, constexprs=tiles), target, options
    )
    merge_src = ASTSource(
        kernels.paged_attention_merge,
        signature=kernels.merge_signature(dtype),
        constexprs={"SP": 16, "DP": tiles["DP"]},
    )
    merge = triton.compile(merge_src, target, options)
    return f"{main.asm['ptx']}\n{merge.asm['ptx']}"


def ptx(
    arch: int = 90, group: int = 4, head_dim: int = 128, dtype: str = "fp32", cache_dtype: str = "fp32"
) -> str:
    """:func:`compile_here`, in a child process under the interpreter."""
    if not interpreting():
        return compile_here(arch, group, head_dim, dtype, cache_dtype)
    args = {"arch": arch, "group": group, "head_dim": head_dim, "dtype": dtype, "cache_dtype": cache_dtype}
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "cuvil_backend_cuda.paged_attention", json.dumps(args)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode:
        raise RuntimeError(f"compiling paged_attention to PTX failed: {proc.stderr.strip()[-2000:]}")
    return proc.stdout


if __name__ == "__main__":
    sys.stdout.write(compile_here(**json.loads(sys.argv[1])))

__all__ = ["BLOCK_N", "DTYPES", "OP", "compile_here", "extern", "ptx", "takes"]
