"""A template op library for Cuvil: copy it to ship ops of your own (docs/plugins.md).

Its ``cuvil.ops`` entry point names this module, so Cuvil imports it (and so
declares the ops) the first time it looks an op up; importing it yourself gives
you the op objects to call. Each op is declared once, from a torch reference:
Cuvil captures the reference into the op's Graph IR node (its decomposition), so
every target fuses it with its neighbours; ``swish_gate`` also brings its own C
expression for the ``cpu`` target. Eager code and ``torch.compile`` call them as
``torch.ops.example.<name>``.
"""

from __future__ import annotations

import torch

import cuvil as cu


# Its own CPU kernel: on the ``cpu`` target this C expression (one element of each
# operand in, one out; ``exp`` keeps float64 inputs exact) replaces the decomposition,
# and is still fused with the ops around it. Elsewhere the decomposition is used.
@cu.custom_op("example::swish_gate", lower={"cpu": "x / (1 + exp(-beta * gate))"})
def swish_gate(x: torch.Tensor, gate: torch.Tensor, *, beta: float = 1.0) -> torch.Tensor:
    """``x * sigmoid(beta * gate)``: a gated activation (GLU-style), elementwise."""
    return x * torch.sigmoid(beta * gate)


@cu.custom_op("example::rms_scale")
def rms_scale(x: torch.Tensor, *, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(mean(x**2, -1) + eps)``: RMS normalization without a weight, a row reduction."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


__all__ = ["rms_scale", "swish_gate"]
