"""Loop IR: explicit loop nests (par/seq/vec), index arithmetic, locals. See docs/tensor-and-loop-ir.md."""

from cuvil_backend_cpu.loop_ir.nodes import Accumulate, Let, Loop, LoopFunc, Param, Prefetch, Store
from cuvil_backend_cpu.loop_ir.schedule import SchedulePolicy, schedule_kernel, schedule_program

__all__ = [
    "Accumulate",
    "Let",
    "Loop",
    "LoopFunc",
    "Param",
    "Prefetch",
    "SchedulePolicy",
    "Store",
    "schedule_kernel",
    "schedule_program",
]
