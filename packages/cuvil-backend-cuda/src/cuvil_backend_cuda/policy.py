"""What the ``cuda`` target asks of lowering and of its kernel launches, as data.

Lowering: every reduction a kernel keeps must vary with the kernel's row indices
(:func:`cuvil_ir.tensor_ir.hoist.must_realize`), because a program computes each
of its rows' reductions once; matmul, convolution and attention stay extern calls
to torch (cuBLAS, cuDNN, flash attention); float16 and bfloat16 are fused like
float32 (loaded and stored in their type, computed in float32). Launches: block sizes and warps per
kernel, the starting point of the autotuner (docs/cuda-backend.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from cuvil_ir.tensor_ir.fusion_policy import FusionPolicy
from cuvil_ir.tensor_ir.hoist import must_realize
from cuvil_ir.triton_source.functions import HALF

FUSION = FusionPolicy(
    realize_reduction=must_realize,
    # float16 and bfloat16 in memory, float32 in registers ([Note: half precision in Triton])
    dtypes=FusionPolicy().dtypes | HALF,
    native="cuda",
)


@dataclass(frozen=True)
class LaunchPolicy:
    #: elements per program of a pointwise kernel (``XBLOCK``)
    block: int = 1024
    #: a row up to this long is held in one tile (``ONE_TILE``: read once)
    one_tile_max: int = 4096
    #: ``RBLOCK`` of rows longer than that (each reduction loops over the row)
    loop_block: int = 1024
    #: at most this many elements per tile (``XBLOCK * RBLOCK``)
    tile_elements: int = 4096
    #: warps per program before autotuning
    num_warps: int = 4
    #: measure a few configurations per kernel and size bucket on the GPU (cached on disk)
    autotune: bool = True


LAUNCH = LaunchPolicy()

__all__ = ["FUSION", "LAUNCH", "LaunchPolicy"]
