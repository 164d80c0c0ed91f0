"""CPU autocast's casting rules as Cuvil reproduces them ([Note: autocast captured] in
cuvil/autocast.py): the policy table is torch's (the ops torch 2.13 registers for
``AutocastCPU``, each policy checked against what eager does with it), and functions
using the ops of each policy compile under autocast with eager's values and dtypes, on
every installed target."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import cuvil as cu
from cuvil import autocast
from cuvil.testing.conformance import TOLERANCES

TARGETS = [t for t in ("reference", "cpu") if t in {b.name for b in cu.backends() if b.available}]
BF16 = torch.bfloat16


def test_the_table_is_torchs() -> None:
    registered = {
        r.split("::")[1].split(".")[0]
        for r in torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCPU")
        if r.startswith("aten::")
    }
    assert set(autocast.CPU_POLICY) == registered


def _g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _r(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=_g(seed))


#: a call of a table op on float32 operands (bfloat16 ones for ``fp32``), to see what eager does
EAGER_CALLS: dict[str, Callable[[torch.dtype], Any]] = {
    "linear": lambda d: F.linear(_r(3, 4).to(d), _r(5, 4).to(d)),
    "matmul": lambda d: _r(3, 4).to(d) @ _r(4, 5).to(d),
    "mm": lambda d: torch.mm(_r(3, 4).to(d), _r(4, 5).to(d)),
    "bmm": lambda d: torch.bmm(_r(2, 3, 4).to(d), _r(2, 4, 5).to(d)),
    "addmm": lambda d: torch.addmm(_r(5).to(d), _r(3, 4).to(d), _r(4, 5).to(d)),
    "baddbmm": lambda d: torch.baddbmm(_r(2, 3, 5).to(d), _r(2, 3, 4).to(d), _r(2, 4, 5).to(d)),
    "conv2d": lambda d: F.conv2d(_r(1, 2, 5, 5).to(d), _r(3, 2, 3, 3).to(d)),
    "conv_transpose2d": lambda d: F.conv_transpose2d(_r(1, 2, 5, 5).to(d), _r(2, 3, 3, 3).to(d)),
    "prelu": lambda d: F.prelu(_r(2, 3).to(d), _r(3).to(d)),
    "scaled_dot_product_attention": lambda d: F.scaled_dot_product_attention(*(_r(1, 2, 4, 8).to(d),) * 3),
    "prod": lambda d: _r(3, 4).to(d).prod(1),
    "avg_pool3d": lambda d: F.avg_pool3d(_r(1, 1, 4, 4, 4).to(d), 2),
    "max_pool3d": lambda d: F.max_pool3d(_r(1, 1, 4, 4, 4).to(d), 2),
    "reflection_pad2d": lambda d: F.pad(_r(1, 1, 4, 4).to(d), (1, 1, 1, 1), mode="reflect"),
    "mse_loss": lambda d: F.mse_loss(_r(3).to(d), _r(3, seed=1).to(d)),
    "cdist": lambda d: torch.cdist(_r(3, 4).to(d), _r(2, 4).to(d)),
    "fft_fft": lambda d: torch.fft.fft(_r(8).to(d)).real,
}


@pytest.mark.parametrize("op", sorted(EAGER_CALLS))
def test_each_policy_is_what_eager_does(op: str) -> None:
    rule = autocast.CPU_POLICY[op]
    given = BF16 if rule == autocast.FP32 else torch.float32
    with torch.autocast("cpu", dtype=BF16):
        out = EAGER_CALLS[op](given)
    assert out.dtype == (BF16 if rule == autocast.LOWER else torch.float32), (op, rule, out.dtype)


def test_promote_casts_to_the_widest() -> None:
    with torch.autocast("cpu", dtype=BF16):
        mixed = torch.cat([_r(2).to(BF16), _r(2)])
        halves = torch.stack([_r(2).to(BF16), _r(2).to(BF16)])
    assert mixed.dtype == torch.float32 and halves.dtype == BF16
    assert autocast.CPU_POLICY["cat"] == autocast.CPU_POLICY["stack"] == autocast.PROMOTE


def test_calls_are_looked_up_by_their_aten_name() -> None:
    assert autocast.policy(torch.Tensor.__matmul__, (), {}) == autocast.LOWER
    assert autocast.policy(F.linear, (), {}) == autocast.LOWER
    assert autocast.policy(torch.concat, (), {}) == autocast.PROMOTE
    assert autocast.policy(F.cross_entropy, (), {}) == autocast.FP32
    assert autocast.policy(torch.linalg.inv, (), {}) == autocast.FP32
    assert autocast.policy(torch.fft.rfft, (), {}) == autocast.FP32
    x = torch.zeros(1, 1, 4)
    assert autocast.policy(F.pad, (x, (1, 1)), {"mode": "reflect"}) == autocast.FP32
    assert autocast.policy(F.pad, (x, (1, 1)), {}) is None
    assert autocast.policy(F.layer_norm, (), {}) is None  # CPU autocast leaves it alone
    assert autocast.policy(torch.softmax, (), {}) is None


def _attention_block(x, w, wo, gamma):
    with torch.autocast("cpu", dtype=BF16):
        h = F.layer_norm(x, (x.shape[-1],), gamma)  # no policy: in x's dtype
        q = F.linear(h, w)  # lower
        a = F.scaled_dot_product_attention(q, q, q, is_causal=True)  # lower
        o = torch.einsum("bsd,ed->bse", a, wo)  # an extern whose bmm autocast casts
        s = torch.cat([o, x], -1)  # promote: bf16 and f32 -> f32
        p = torch.prod(torch.sigmoid(o[..., :2]), -1)  # fp32
    return s, p, q.float().sum()


def _conv_block(x, w, slope):
    with torch.autocast("cpu", dtype=BF16):
        y = F.conv2d(x, w, padding=1)
        y = F.prelu(y, slope)
        z = F.avg_pool3d(y.unsqueeze(0), 2)
        r = F.pad(y, (1, 1, 1, 1), mode="reflect")
    with torch.autocast("cpu", enabled=False):
        plain = y.float() @ y.float().transpose(-1, -2)  # autocast off again: float32
    return y, z, r, plain


CASES: dict[str, tuple[Callable[..., Any], Callable[[int], tuple[Any, ...]]]] = {
    "attention_block": (
        _attention_block,
        lambda n: (_r(2, n, 16), _r(16, 16, seed=1), _r(16, 16, seed=2), _r(16)),
    ),
    "conv_block": (_conv_block, lambda n: (_r(1, 2, n, n), _r(3, 2, 3, 3, seed=1), _r(3, seed=2).abs())),
}


def _close(got: Any, want: Any) -> None:
    if isinstance(want, (tuple, list)):
        for a, b in zip(got, want):
            _close(a, b)
        return
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    tol = TOLERANCES[BF16]
    torch.testing.assert_close(got.float(), want.float(), **tol)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_autocast_regions_match_eager(target: str, case: str) -> None:
    fn, make = CASES[case]
    f = cu.compile(fn, target=target, fallback="error")
    for n in (6, 9):
        _close(f(*make(n)), fn(*make(n)))
    assert f.stats.compiles == 1


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(32)
        self.qkv = torch.nn.Linear(32, 96)
        self.out = torch.nn.Linear(32, 32)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s, 3, 4, 8).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, 32)
        x = x + self.out(a)
        return x + self.mlp(self.norm(x))


@pytest.mark.parametrize("target", TARGETS)
def test_a_module_called_under_autocast(target: str) -> None:
    torch.manual_seed(0)
    m = _Block().eval()
    f = cu.compile(m, target=target, fallback="error")
    with torch.no_grad(), torch.autocast("cpu", dtype=BF16):
        for n in (5, 7):
            x = _r(2, n, 32)
            _close(f(x), m(x))
    assert f.stats.compiles == 1
    casts = [n for n in f.graphs[0].nodes if n.op == "cast"]
    assert len(casts) >= 8  # x and every weight and bias of the linears, q, k, v for sdpa


# -- CUDA autocast: torch's CUDA table, checked on CPU (cuvil.testing.cuda_autocast) ----------
HALF = torch.float16


def test_the_cuda_table_is_torchs() -> None:
    registered = {
        r.split("::")[1].split(".")[0]
        for r in torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCUDA")
        if r.startswith("aten::")
    }
    assert set(autocast.CUDA_POLICY) | autocast.BANNED["cuda"] == registered
    assert not set(autocast.CUDA_POLICY) & autocast.BANNED["cuda"]


#: a call of a CUDA table op, given a maker of (CUDA-standing) operands of one dtype
CUDA_CALLS: dict[str, Callable[[Callable[..., torch.Tensor]], Any]] = {
    "linear": lambda t: F.linear(t(3, 4), t(5, 4)),
    "matmul": lambda t: t(3, 4) @ t(4, 5),
    "bmm": lambda t: torch.bmm(t(2, 3, 4), t(2, 4, 5)),
    "addmm": lambda t: torch.addmm(t(5), t(3, 4), t(4, 5)),
    "conv2d": lambda t: F.conv2d(t(1, 2, 5, 5), t(3, 2, 3, 3)),
    "prelu": lambda t: F.prelu(t(2, 3), t(3)),
    "exp": lambda t: torch.exp(t(3)),
    "log1p": lambda t: torch.log1p(t(3).abs()),
    "rsqrt": lambda t: torch.rsqrt(t(3).abs()),
    "pow": lambda t: t(3) ** 2,
    "softplus": lambda t: F.softplus(t(3)),
    "layer_norm": lambda t: F.layer_norm(t(2, 4), (4,)),
    "group_norm": lambda t: F.group_norm(t(1, 4, 3), 2),
    "upsample_nearest2d": lambda t: F.interpolate(t(1, 1, 2, 2), scale_factor=2.0),
    "mse_loss": lambda t: F.mse_loss(t(3), t(3)),
    "logsumexp": lambda t: torch.logsumexp(t(3, 4), 1),
    "sum": lambda t: t(3, 4).sum(1),
    "softmax": lambda t: torch.softmax(t(3, 4), 1),
    "log_softmax": lambda t: F.log_softmax(t(3, 4), 1),
    "cumsum": lambda t: torch.cumsum(t(3, 4), 1),
    "prod": lambda t: torch.prod(t(3, 4), 1),
    "norm": lambda t: t(3, 4).norm(),
    "addcmul": lambda t: torch.addcmul(t(3), t(3), t(3).float()),
    "atan2": lambda t: torch.atan2(t(3), t(3).float()),
    "dot": lambda t: torch.dot(t(3), t(3).float()),
}


@pytest.mark.parametrize("op", sorted(CUDA_CALLS))
def test_each_cuda_policy_is_what_eager_does(op: str) -> None:
    """Eager under CUDA autocast (its CPU build's AutocastCUDA kernels, on tensors that say
    they are on CUDA): lower ops return float16 from float32, fp32 ops (and those float32
    unless given a dtype) float32 from float16, promote ops the widest of their operands."""
    from cuvil.testing.cuda_autocast import OnCuda, eager_under_cuda_autocast

    rule = autocast.CUDA_POLICY[op]
    given = torch.float32 if rule == autocast.LOWER else HALF
    g = _g()

    def make(*shape: int) -> torch.Tensor:
        return OnCuda(torch.randn(*shape, generator=g).to(given))

    out = eager_under_cuda_autocast(lambda: CUDA_CALLS[op](make), (), HALF)
    assert out.dtype == (HALF if rule == autocast.LOWER else torch.float32), (op, rule, out.dtype)


def test_a_named_dtype_is_kept_under_cuda_autocast() -> None:
    from cuvil.testing.cuda_autocast import eager_under_cuda_autocast

    x = _r(3, 4).to(HALF)
    assert eager_under_cuda_autocast(lambda t: t.sum(0, dtype=HALF), (x,), HALF).dtype == HALF
    assert autocast._names_dtype((x, 0, HALF), {}) and autocast._names_dtype((x,), {"dtype": HALF})
    assert not autocast._names_dtype((x, 0), {"dtype": None})


@pytest.fixture
def cuda_rules_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU autocast captured with CUDA's rules: the capture path a CUDA tensor takes, run on
    CPU tensors (a graph captured so is what a CUDA one would be, device aside)."""
    from cuvil import warm

    monkeypatch.setitem(autocast.POLICIES, "cpu", autocast.CUDA_POLICY)
    monkeypatch.setitem(autocast.BANNED, "cpu", autocast.BANNED["cuda"])
    monkeypatch.setenv(warm.ENV, "0")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.usefixtures("cuda_rules_on_cpu")
def test_cuda_rules_match_eager_under_cuda_autocast(target: str) -> None:
    """One op of each CUDA policy, compiled under autocast with CUDA's rules: eager's dtypes
    and values under CUDA autocast (float16), at two sizes with one compile."""
    from cuvil.testing.cuda_autocast import autocast_block, autocast_block_args, eager_under_cuda_autocast

    f = cu.compile(autocast_block, target=target, fallback="error")
    for n in (3, 7):
        with torch.autocast("cpu", dtype=HALF):
            got = f(*autocast_block_args(n))
        want = eager_under_cuda_autocast(autocast_block, autocast_block_args(n), HALF)
        for k, (a, b) in enumerate(zip(got, want)):
            assert a.dtype == b.dtype, (k, a.dtype, b.dtype)
            torch.testing.assert_close(a, b, **TOLERANCES[HALF], msg=lambda m, k=k: f"output {k}: {m}")
    assert f.stats.compiles == 1


@pytest.mark.usefixtures("cuda_rules_on_cpu")
def test_an_op_cuda_autocast_bans_is_a_located_error() -> None:
    from cuvil.errors import CompileError

    def bce(x, y):
        return F.binary_cross_entropy(torch.sigmoid(x), y)

    f = cu.compile(bce, target="reference", fallback="error")
    with torch.autocast("cpu", dtype=HALF), pytest.raises(CompileError, match="not allowed under") as e:
        f(_r(4), _r(4).sigmoid())
    assert e.value.loc is not None and "binary_cross_entropy" in (e.value.loc.excerpt() or "")
