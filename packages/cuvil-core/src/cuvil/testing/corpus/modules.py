"""The module programs of the corpus: ``nn.Module`` factories (MLPs, conv blocks,
attention, a transformer encoder layer, ResNet and CNN blocks ...) with fixed weights.

Registered in file order by :func:`~cuvil.testing.corpus.registry.module`, after the
function programs; see :mod:`cuvil.testing.corpus` for the rules.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cuvil.testing.corpus.functions import _gelu_tanh
from cuvil.testing.corpus.registry import _randint, _randn, _ready, _seeded, module

# These programs stand for user code: Cuvil converts them from source (control flow
# hooks, source locations) even though they live inside an installed package.
__cuvil_convert__ = True


class MLP(nn.Module):
    def __init__(self, d_in: int = 16, hidden: int = 32, d_out: int = 8, approximate: str = "none") -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.act = nn.GELU(approximate=approximate)
        self.fc2 = nn.Linear(hidden, d_out)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


@module("mlp", lambda g, b: (_randn(g, b, 16),), sizes=[2, 5])
def _mlp() -> nn.Module:
    with _seeded(1):
        return _ready(MLP())


@module("mlp_sequential_3d", lambda g, s: (_randn(g, 2, s, 16),), sizes=[3, 7])
def _mlp_sequential() -> nn.Module:
    with _seeded(2):
        return _ready(
            nn.Sequential(nn.Linear(16, 24), nn.SiLU(), nn.Dropout(0.1), nn.Linear(24, 4), nn.Tanh())
        )


class ConvBlock(nn.Module):
    def __init__(self, c_in: int = 3, c_out: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.pool = nn.MaxPool2d(2)

    def forward(self, x):
        return self.pool(self.relu(self.bn(self.conv(x))))


def _randomize_bn(m: nn.Module) -> None:
    """Non-trivial running statistics, as a trained network has."""
    for bn in m.modules():
        if isinstance(bn, nn.modules.batchnorm._BatchNorm):
            n = bn.num_features
            assert bn.running_mean is not None and bn.running_var is not None
            bn.running_mean.copy_(torch.randn(n) * 0.1)
            bn.running_var.copy_(torch.rand(n) + 0.5)
            bn.weight.data.copy_(torch.rand(n) + 0.5)
            bn.bias.data.copy_(torch.randn(n) * 0.1)


@module("conv_block", lambda g, b, h: (_randn(g, b, 3, h, 10),), sizes=[(1, 8), (2, 12)])
def _conv_block() -> nn.Module:
    with _seeded(3):
        m = ConvBlock()
        _randomize_bn(m)
        return _ready(m)


class AttentionBlock(nn.Module):
    """q/k/v projections, split into heads, attention, output projection, residual + LayerNorm."""

    def __init__(self, dim: int = 16, heads: int = 4, use_sdpa: bool = True, causal: bool = False) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.use_sdpa = use_sdpa
        self.causal = causal
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        if self.use_sdpa:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
            if self.causal:
                mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
                scores = scores.masked_fill(mask, float("-inf"))
            o = torch.softmax(scores, dim=-1) @ v
        o = o.transpose(1, 2).reshape(b, s, -1)
        return self.norm(x + self.out(o))


@module("attention_block_sdpa", lambda g, b, s: (_randn(g, b, s, 16),), sizes=[(2, 5), (3, 9)])
def _attention_sdpa() -> nn.Module:
    with _seeded(4):
        return _ready(AttentionBlock(use_sdpa=True))


@module("attention_block_manual_causal", lambda g, b, s: (_randn(g, b, s, 16),), sizes=[(2, 5), (3, 9)])
def _attention_manual() -> nn.Module:
    with _seeded(4):
        return _ready(AttentionBlock(use_sdpa=False, causal=True))


class BufferModule(nn.Module):
    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.register_buffer("scale", torch.linspace(0.5, 2.0, dim))
        self.register_buffer("offset", torch.arange(dim, dtype=torch.float32) / dim, persistent=False)
        self.register_buffer("steps", torch.tensor(3, dtype=torch.int64))
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        y = self.proj(x) * self.scale + self.offset
        return y * self.steps, self.scale.sum() + self.offset.mean()


@module("buffers", lambda g, b: (_randn(g, b, 8),), sizes=[2, 4])
def _buffers() -> nn.Module:
    with _seeded(5):
        return _ready(BufferModule())


class Gate(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.lin = nn.Linear(dim, dim)

    def forward(self, x):
        return torch.sigmoid(self.lin(x))


class GatedLayer(nn.Module):
    """A submodule that calls another submodule."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.value = nn.Linear(dim, dim)
        self.gate = Gate(dim)

    def forward(self, x):
        return self.value(x) * self.gate(x)


class Nested(nn.Module):
    def __init__(self, dim: int = 8, depth: int = 3) -> None:
        super().__init__()
        self.layers = nn.ModuleList([GatedLayer(dim) for _ in range(depth)])
        self.heads = nn.ModuleDict({"a": nn.Linear(dim, 2), "b": nn.Linear(dim, 3)})
        self.final = nn.Sequential(nn.LayerNorm(dim), nn.ReLU())

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        x = self.final(x)
        return {name: head(x) for name, head in self.heads.items()}


@module("nested_modules", lambda g, b: (_randn(g, b, 8),), sizes=[2, 5])
def _nested() -> nn.Module:
    with _seeded(6):
        return _ready(Nested())


def _squash(x, dim: int = -1):
    n2 = (x * x).sum(dim, keepdim=True)
    return n2 / (1 + n2) * x / torch.sqrt(n2 + 1e-8)


class HelperForward(nn.Module):
    def __init__(self, dim: int = 6) -> None:
        super().__init__()
        self.lin = nn.Linear(dim, dim)

    def forward(self, x):
        return _squash(self.lin(x)) + _gelu_tanh(x)


@module("helper_forward", lambda g, b: (_randn(g, b, 6),), sizes=[3, 6])
def _helper_forward() -> nn.Module:
    with _seeded(7):
        return _ready(HelperForward())


class EncoderLayer(nn.Module):
    """A hand-written pre-norm transformer encoder layer."""

    def __init__(self, dim: int = 16, heads: int = 2, ff: int = 32, dropout: float = 0.1) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.ff1 = nn.Linear(dim, ff)
        self.ff2 = nn.Linear(ff, dim)
        self.drop = nn.Dropout(dropout)

    def attention(self, x, key_padding_mask=None):
        b, s, d = x.shape
        qkv = self.qkv(x).reshape(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = (q @ k.transpose(-2, -1)) * (k.shape[-1] ** -0.5)
        if key_padding_mask is not None:
            scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
        attn = self.drop(scores.softmax(dim=-1))
        return self.proj((attn @ v).transpose(1, 2).reshape(b, s, d))

    def forward(self, x, key_padding_mask=None):
        x = x + self.drop(self.attention(self.ln1(x), key_padding_mask))
        return x + self.drop(self.ff2(F.gelu(self.ff1(self.ln2(x)), approximate="tanh")))


def _encoder_inputs(g: torch.Generator, b: int, s: int) -> tuple[Any, ...]:
    pad = torch.arange(s)[None, :] >= torch.tensor([s, s - 2, s - 1][:b])[:, None]
    return _randn(g, b, s, 16), pad


@module("encoder_layer", _encoder_inputs, sizes=[(2, 6), (3, 10)])
def _encoder_layer() -> nn.Module:
    with _seeded(8):
        return _ready(EncoderLayer())


class BasicBlock(nn.Module):
    """ResNet basic block with a strided 1x1-conv downsample path."""

    def __init__(self, c_in: int = 4, c_out: int = 8, stride: int = 2) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.downsample: nn.Module | None = None
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x):
        identity = x
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return F.relu(out)


@module("resnet_basic_block", lambda g, b, h, w: (_randn(g, b, 4, h, w),), sizes=[(1, 8, 8), (2, 11, 7)])
def _basic_block() -> nn.Module:
    with _seeded(9):
        m = BasicBlock()
        _randomize_bn(m)
        return _ready(m)


class EmbedPositional(nn.Module):
    def __init__(self, vocab: int = 30, dim: int = 8, max_len: int = 16) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim, padding_idx=0)
        self.pos = nn.Parameter(torch.randn(1, max_len, dim) * 0.02)
        self.register_buffer("pos_ids", torch.arange(max_len).unsqueeze(0), persistent=False)
        self.pos_table = nn.Embedding(max_len, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, ids):
        s = ids.shape[1]
        h = self.tok(ids) + self.pos[:, :s] + self.pos_table(self.pos_ids[:, : ids.size(1)])
        return self.norm(h)


@module("embedding_positional", lambda g, b, s: (_randint(g, 0, 30, b, s),), sizes=[(2, 5), (3, 11)])
def _embed_positional() -> nn.Module:
    with _seeded(10):
        return _ready(EmbedPositional())


class TiedLM(nn.Module):
    """Input embedding and output projection share one Parameter."""

    def __init__(self, vocab: int = 24, dim: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, ids):
        h = torch.tanh(self.mix(self.embed(ids)))
        return self.head(h), F.linear(h, self.embed.weight).log_softmax(-1)


@module("tied_weights", lambda g, b, s: (_randint(g, 0, 24, b, s),), sizes=[(2, 3), (4, 6)])
def _tied() -> nn.Module:
    with _seeded(11):
        return _ready(TiedLM())


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 5) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 6, 3, padding=1),
            nn.BatchNorm2d(6),
            nn.ReLU(),
            nn.Conv2d(6, 6, 3, stride=2, padding=1, groups=3),
            nn.ReLU6(),
            nn.AvgPool2d(2),
        )
        self.pool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(6, classes)

    def forward(self, x):
        x = self.features(x)
        x = self.pool(x)
        x = torch.flatten(x, 1)
        return self.fc(x)


@module("small_cnn_classifier", lambda g, b, h: (_randn(g, b, 3, h, h),), sizes=[(1, 8), (3, 12)])
def _small_cnn() -> nn.Module:
    with _seeded(12):
        m = SmallCNN()
        _randomize_bn(m)
        return _ready(m)


class UpsampleDecoder(nn.Module):
    def __init__(self, c: int = 4) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(c, c, 1)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.fuse = nn.Conv2d(2 * c, c, 3, padding=1)

    def forward(self, low, high):
        up = self.up(self.reduce(low))
        skip = F.interpolate(high, size=up.shape[-2:], mode="bilinear", align_corners=False)
        return self.fuse(torch.cat([up, skip], dim=1))


@module(
    "upsample_decoder",
    lambda g, b, h: (_randn(g, b, 4, h, h), _randn(g, b, 4, h + 3, h + 1)),
    sizes=[(1, 4), (2, 6)],
)
def _upsample_decoder() -> nn.Module:
    with _seeded(13):
        return _ready(UpsampleDecoder())
