"""What the ``cpu`` target asks of lowering and scheduling, as data.

The fusion policy (which ops stay extern calls, which write into planned buffers,
which want channels-last tensors, which reductions the scheduler cannot keep in a
kernel) and the schedule policy (OpenMP threshold, collapsing, SIMD, tiling) for
a given ``opt_level``. Lowering and the scheduler read only these fields.
"""

from __future__ import annotations

from dataclasses import replace

from cuvil_backend_cpu import decode_attention, quant_linear
from cuvil_backend_cpu.externs import FAST_EXTERNS, OUT_VARIANTS
from cuvil_backend_cpu.half import HALF
from cuvil_backend_cpu.loop_ir.schedule import SchedulePolicy
from cuvil_backend_cpu.shared_input_linears import LinearGroup
from cuvil_ir.tensor_ir.fusion_policy import FusionPolicy
from cuvil_ir.tensor_ir.hoist import must_realize
from cuvil_runtime.target import CompileOptions

FUSION = FusionPolicy(
    # float16 and bfloat16 are held as bits and computed in float ([Note: half precision in C])
    dtypes=FusionPolicy().dtypes | HALF,
    # (weight-only linears write into the plan's buffer too: cuvil_backend_cpu.quant_linear)
    out_variants=(frozenset(OUT_VARIANTS) - frozenset(FAST_EXTERNS))
    | {quant_linear.OP, LinearGroup.name, decode_attention.OP},
    # oneDNN runs these about twice as fast on channels-last tensors (measured here)
    channels_last_ops=frozenset(
        {"conv", "cpu_conv_epilogue", "max_pool", "avg_pool", "adaptive_avg_pool", "adaptive_max_pool"}
    ),
    realize_reduction=must_realize,
    native="cpu",  # cu.custom_op(..., lower={"cpu": "<C expression>"})
)


#: the fusion policy where the toolchain's half conversions failed their probe
#: (``Toolchain.half``): float16/bfloat16 ops are torch calls
FUSION_NO_HALF = replace(FUSION, dtypes=FUSION.dtypes - HALF)


def schedule_policy(options: CompileOptions) -> SchedulePolicy:
    extra = dict(options.extra)
    if options.opt_level <= 0:
        return SchedulePolicy(
            parallel_threshold=1 << 62, collapse=False, vectorize=False, stash=False, tile_size=1
        )
    return SchedulePolicy(parallel_threshold=int(extra.get("parallel_threshold", 32768)))
