"""The model the example serves: a small text classifier head (a pre-LN transformer
block over token embeddings, mean-pooled, a linear layer to 4 classes), seeded.

Only this file knows the model's Python code. ``save_artifact`` compiles it with
Cuvil for a symbolic batch size and writes the ahead-of-time artifact that the
Ray Serve replicas load: they never import this module.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

SEQ, D, CLASSES = 16, 64, 4


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.ln = nn.LayerNorm(D)
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
        self.head = nn.Linear(D, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.ln(x)).chunk(3, dim=-1)
        att = torch.softmax(q @ k.transpose(-1, -2) / D**0.5, dim=-1)
        x = x + self.proj(att @ v)
        x = x + self.mlp(self.ln(x))
        return torch.softmax(self.head(x.mean(1)), dim=-1)


def build() -> Classifier:
    m = Classifier().eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m


def save_artifact(path: str | Path) -> Path:
    import cuvil as cu

    example = torch.randn(2, SEQ, D)  # any batch size: the batch is symbolic
    return cu.save(cu.compile(build(), target="cpu", fallback="error"), path, example)  # type: ignore[no-any-return]
