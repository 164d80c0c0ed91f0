"""What the ``ascend`` target asks of lowering, of its kernels' text and of their
launches, as data: Ascend's rules (docs/ascend-backend.md says where each comes from).

* Lowering (:data:`FUSION`): every reduction a kernel keeps varies with the
  kernel's rows (as on CUDA: a program computes each of its rows' reductions
  once); no float64 in kernels (the AI core's vector unit has no float64
  arithmetic; such ops stay torch calls); matmul, convolution and attention stay
  extern calls (torch-npu's aclnn kernels on an NPU).
* Kernel text (:data:`RULES`): programs loop over the blocks they own (a grid of one
  program per vector core serves any size), and long rows' variance takes two
  passes (triton-ascend lowers ``tl.reduce`` of at most two operands, so Welford's
  three-operand merge is out, and it would need float64).
* Launches (:class:`AscendPolicy`): no ``num_warps``/``num_stages`` (SIMD vector
  cores, not warps); a 1-D grid of at most 65535 programs, by default one per
  vector core; block sizes such that a kernel's live tiles fit the unified buffer,
  with 32-byte-aligned tile rows. :mod:`cuvil_backend_ascend.rules` picks and checks them.
"""

from __future__ import annotations

from dataclasses import dataclass

from cuvil_ir.graph_ir.types import DType
from cuvil_ir.tensor_ir.fusion_policy import FusionPolicy
from cuvil_ir.tensor_ir.hoist import must_realize
from cuvil_ir.triton_source.emit import TritonRules
from cuvil_ir.triton_source.functions import HALF

FUSION = FusionPolicy(
    realize_reduction=must_realize,
    # no float64; float16 and bfloat16 in the UB in their type, computed in float32
    # ([Note: half precision in Triton])
    dtypes=(FusionPolicy().dtypes - {DType.f64}) | HALF,
    native="ascend",  # cu.custom_op(..., lower={"ascend": "<Triton expression>"})
)

RULES = TritonRules(persistent=True, welford=False)


@dataclass(frozen=True, slots=True)
class AscendPolicy:
    #: bytes of one vector core's unified buffer (UB): 192 KB on Atlas A2 (Ascend 910B)
    ub_bytes: int = 192 * 1024
    #: the share of the UB a kernel's live tiles may take: triton-ascend double-buffers
    #: loads by default (``multibuffer``), so each tile may need two copies
    ub_share: float = 0.5
    #: bytes each tile element costs besides its value: one int64 address per element
    #: (a load's or store's offsets are an ``[XBLOCK, RBLOCK]`` int64 value of their own)
    address_bytes: int = 8
    #: programs per launch when the device does not say: Ascend 910B3's 40 vector
    #: cores (20 AI cores with two vector units each); on an NPU the driver's count
    cores: int = 40
    #: the most programs one launch may have (the runtime's block-dimension limit)
    max_programs: int = 65535
    #: a tile's rows start and end on this many bytes (the UB is read in 32-byte blocks)
    align_bytes: int = 32
    #: the largest block of a pointwise kernel (elements per program and step)
    max_block: int = 8192
    #: the ``RBLOCK`` of the looped variant (rows longer than one tile), at most
    loop_block: int = 1024

    @property
    def budget(self) -> int:
        """Bytes a kernel's live tiles may take."""
        return int(self.ub_bytes * self.ub_share)


POLICY = AscendPolicy()

__all__ = ["FUSION", "POLICY", "RULES", "AscendPolicy"]
