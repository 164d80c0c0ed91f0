"""No float16/bfloat16 tensor forces an extern call where the same float32 program is a
kernel (issue 30): every corpus program is captured with float32 inputs and again with
its float32 inputs (and a module's parameters) in each half type, both graphs are lowered
with the ``cpu`` target's fusion policy, and the half program may call torch only where
the float32 one does (op by op, counted: :mod:`cuvil.testing.half_coverage`). The target's
float32-only Graph IR rewrites (fused GEMM epilogues, hand-written attention, small matrix
products) are left out of both sides: they replace float32 chains by extern calls, which
would hide the comparison.
"""

from __future__ import annotations

import pytest
import torch

from cuvil.testing import half_coverage
from cuvil_backend_cpu.policy import FUSION


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=str)
def test_half_programs_call_torch_only_where_float32_does(dtype: torch.dtype) -> None:
    half_coverage.check(FUSION, dtype)
