"""The benchmark workloads: each builds a callable (a function or an eval-mode
``nn.Module`` whose parameters do not require grad) and its example arguments,
deterministically (seeded), so a child process rebuilds exactly what the parent
measured.

Only plain torch ops are used (``F.*``, ``nn.Linear``/``LayerNorm``/``Conv2d``/
``BatchNorm2d``); attention is written out by hand.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.zoo import zoo_workloads

SEED = 0

#: the float dtype the workloads run in (``benchmarks.run --dtype bfloat16``): modules are
#: converted with ``.to(dtype)`` and float32 inputs cast; an environment variable, so the
#: child processes that measure first calls build the same
DTYPE_ENV = "CUVIL_BENCH_DTYPE"


def bench_dtype() -> torch.dtype | None:
    """The dtype of :data:`DTYPE_ENV` (``None``: the workloads as written, float32)."""
    name = os.environ.get(DTYPE_ENV, "").strip()
    if not name:
        return None
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"{DTYPE_ENV}={name!r} is not a torch floating dtype (bfloat16, float16)")
    return dtype


def _in_bench_dtype(args: tuple[Any, ...]) -> tuple[Any, ...]:
    dtype = bench_dtype()
    if dtype is None:
        return args
    return tuple(a.to(dtype) if isinstance(a, torch.Tensor) and a.dtype == torch.float32 else a for a in args)


def _gen(offset: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(SEED + offset)


def _prepare(module: nn.Module) -> nn.Module:
    module.eval()
    for p in module.parameters():
        p.requires_grad_(False)
    return module


# -- 1. softmax + dropout (a fused pointwise/reduction workload) ----------------


def softmax_dropout(x):
    return F.dropout(torch.softmax(x, -1), p=0.1, training=False)


# -- 2. LayerNorm + GELU -----------------------------------------------------------


class LayerNormGELU(nn.Module):
    def __init__(self, d: int = 1024) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        with torch.no_grad():  # not the identity affine
            self.ln.weight.normal_(1.0, 0.1)
            self.ln.bias.normal_(0.0, 0.1)

    def forward(self, x):
        return F.gelu(self.ln(x))


# -- 3. GELU MLP -------------------------------------------------------------------


def gelu_mlp_module() -> nn.Module:
    return nn.Sequential(nn.Linear(768, 3072), nn.GELU(), nn.Linear(3072, 768))


# -- 4. BERT-tiny-like encoder layer (post-LN) ------------------------------------------


class BertEncoderLayer(nn.Module):
    def __init__(self, d: int = 256, heads: int = 4, ffn: int = 1024) -> None:
        super().__init__()
        self.d = d
        self.heads = heads
        self.head_dim = d // heads
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.out = nn.Linear(d, d)
        self.ln1 = nn.LayerNorm(d)
        self.ffn_in = nn.Linear(d, ffn)
        self.ffn_out = nn.Linear(ffn, d)
        self.ln2 = nn.LayerNorm(d)

    def forward(self, x):
        b, t, d = x.shape
        q = self.q(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        probs = torch.softmax(scores, dim=-1)
        ctx = (probs @ v).transpose(1, 2).contiguous().view(b, t, d)
        h = self.ln1(x + self.out(ctx))
        ff = self.ffn_out(F.gelu(self.ffn_in(h)))
        return self.ln2(h + ff)


# -- 5. GPT-2-small-like block (pre-LN, causal) ------------------------------------------


class GPT2Block(nn.Module):
    def __init__(self, d: int = 768, heads: int = 12, mlp: int = 3072, max_pos: int = 1024) -> None:
        super().__init__()
        self.d = d
        self.heads = heads
        self.head_dim = d // heads
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, mlp)
        self.mlp_proj = nn.Linear(mlp, d)
        self.act = nn.GELU(approximate="tanh")
        self.register_buffer("bias", torch.tril(torch.ones(max_pos, max_pos, dtype=torch.bool)))

    def attn(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(self.d, dim=2)
        q = q.view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, t, self.heads, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.heads, self.head_dim).transpose(1, 2)
        att = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        att = att.masked_fill(~self.bias[:t, :t], float("-inf"))
        att = torch.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, d)
        return self.c_proj(y)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp_proj(self.act(self.c_fc(self.ln_2(x))))
        return x


# -- 6. ResNet-18 ------------------------------------------------------------------------


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.down is not None:
            identity = self.down(x)
        return F.relu(out + identity)


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        blocks = []
        cin = 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*blocks)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)
        with torch.no_grad():  # non-trivial eval-mode batch norms
            for m in self.modules():
                if isinstance(m, nn.BatchNorm2d):
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.normal_(0.0, 0.1)
                    m.running_mean.normal_(0.0, 0.1)
                    m.running_var.uniform_(0.5, 1.5)

    def forward(self, x):
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layers(x)
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


# -- 7. the mission function ----------------------------------------------------------------

w = torch.randn(3, 1000, generator=_gen(7))


def head(x):
    if x.size(0) > 1:
        x = torch.nn.functional.interpolate(x, scale_factor=0.5)
    return torch.softmax(x.mean((2, 3)) @ w, dim=-1)


# -- the registry ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """One benchmark workload.

    ``make`` builds the callable (seeded); ``inputs(size)`` builds its arguments for
    one point of the sweep (``size`` is a batch size or a row count);
    ``default_size`` is the size that is timed; ``sweep`` the sizes of the
    recompile count; ``sweep_group`` lets workloads with the same callable and
    sweep (resnet18_b1/_b8) share one sweep measurement.
    """

    name: str
    kind: str  # "fused" (pointwise/reduction), "mlp", "transformer", "cnn", "mission"
    description: str
    make: Callable[[], Any]
    inputs: Callable[[int], tuple[Any, ...]]
    default_size: int
    sweep: tuple[int, ...]
    sweep_axis: str = "batch"
    sweep_group: str | None = None
    #: why the workload cannot run in another dtype (``--dtype``), or ``None``
    float32_only: str | None = None

    def __post_init__(self) -> None:
        raw = self.inputs  # inputs in the run's dtype (bench_dtype), read when called
        object.__setattr__(self, "inputs", lambda size: _in_bench_dtype(raw(size)))

    def build(self) -> tuple[Any, tuple[Any, ...]]:
        """(callable, example arguments) at the timed size."""
        return self.build_fn(), self.inputs(self.default_size)

    def build_fn(self) -> Any:
        torch.manual_seed(SEED)
        fn = self.make()
        if isinstance(fn, nn.Module):
            fn = _prepare(fn)
            dtype = bench_dtype()
            if dtype is not None:
                fn = fn.to(dtype)
        return fn


def _randn(*shape: int, offset: int = 1) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(offset))


WORKLOADS: dict[str, Workload] = {
    wl.name: wl
    for wl in [
        Workload(
            "softmax_dropout",
            "fused",
            "F.dropout(softmax(x, -1), p=0.1, training=False); x rows x 1024",
            make=lambda: softmax_dropout,
            inputs=lambda rows: (_randn(rows, 1024),),
            default_size=4096,
            sweep=(1024, 2048, 4096),
            sweep_axis="rows",
        ),
        Workload(
            "layernorm_gelu",
            "fused",
            "GELU(LayerNorm(1024)(x)); x rows x 1024",
            make=LayerNormGELU,
            inputs=lambda rows: (_randn(rows, 1024),),
            default_size=4096,
            sweep=(1024, 2048, 4096),
            sweep_axis="rows",
        ),
        Workload(
            "gelu_mlp",
            "mlp",
            "Linear(768,3072) -> GELU -> Linear(3072,768); batch 32",
            make=gelu_mlp_module,
            inputs=lambda b: (_randn(b, 768),),
            default_size=32,
            sweep=(1, 2, 3, 4, 8, 32),
        ),
        Workload(
            "bert_encoder",
            "transformer",
            "BERT-tiny-like encoder layer: seq 128, d 256, 4 heads, FFN 1024, post-LN; batch 1",
            make=BertEncoderLayer,
            inputs=lambda b: (_randn(b, 128, 256),),
            default_size=1,
            sweep=(1, 2, 3, 4, 8),
        ),
        Workload(
            "gpt2_block",
            "transformer",
            "GPT-2-small-like block: seq 128, d 768, 12 heads, causal masked_fill, pre-LN, tanh-GELU MLP 3072; batch 1",
            make=GPT2Block,
            inputs=lambda b: (_randn(b, 128, 768),),
            default_size=1,
            sweep=(1, 2, 3, 4, 8),
        ),
        Workload(
            "resnet18_b1",
            "cnn",
            "ResNet-18 (basic blocks, BN eval), 224x224; batch 1",
            make=ResNet18,
            inputs=lambda b: (_randn(b, 3, 224, 224),),
            default_size=1,
            sweep=(1, 2, 3, 4, 8),
            sweep_group="resnet18",
        ),
        Workload(
            "resnet18_b8",
            "cnn",
            "ResNet-18 (basic blocks, BN eval), 224x224; batch 8",
            make=ResNet18,
            inputs=lambda b: (_randn(b, 3, 224, 224),),
            default_size=8,
            sweep=(1, 2, 3, 4, 8),
            sweep_group="resnet18",
        ),
        Workload(
            "head",
            "mission",
            "if x.size(0) > 1: interpolate(x, 0.5); softmax(x.mean((2,3)) @ w); x (4,3,64,64)",
            make=lambda: head,
            inputs=lambda b: (_randn(b, 3, 64, 64),),
            default_size=4,
            sweep=(1, 2, 3, 4, 8),
            float32_only="its weight `w` is a float32 global: x @ w of another dtype is an error in eager",
        ),
    ]
}


#: the model zoo (benchmarks/zoo.py), where transformers is installed: kind "zoo"
WORKLOADS.update((wl.name, wl) for wl in zoo_workloads(Workload))


def select(names: str | None) -> list[Workload]:
    """The workloads named in a comma-separated list (all of them for None/"all";
    "suite": all but the model zoo; "zoo": the zoo only)."""
    fits = bench_dtype() is None or bench_dtype() == torch.float32
    if not names or names == "all":
        return [wl for wl in WORKLOADS.values() if fits or wl.float32_only is None]
    if names in ("suite", "zoo"):
        return [
            wl
            for wl in WORKLOADS.values()
            if (wl.kind == "zoo") == (names == "zoo") and (fits or wl.float32_only is None)
        ]
    chosen = []
    for name in (n.strip() for n in names.split(",")):
        if not name:
            continue
        if name not in WORKLOADS:
            raise SystemExit(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
        chosen.append(WORKLOADS[name])
    return chosen
