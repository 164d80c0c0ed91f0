"""The state of every module a call ran is guarded (issue 26, items 1, 2 and 5).

Within one process a changed setting of a torch built-in submodule (``negative_slope``,
``dim``, ``eps``, ``approximate``, ...), a forward hook added or removed, or a global
forward hook recaptures with the changed entry named; across processes sharing a cache,
a stored variant is reused only when the same state holds (two real child processes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import cuvil as cu

# (name, build, mutate): ``mutate`` changes a setting after the first call
CASES = [
    ("leaky_relu", lambda: nn.LeakyReLU(0.1), lambda m: setattr(m, "negative_slope", 0.5)),
    ("softmax_dim", lambda: nn.Softmax(dim=0), lambda m: setattr(m, "dim", 1)),
    ("layer_norm_eps", lambda: nn.LayerNorm(4, eps=1e-5), lambda m: setattr(m, "eps", 10.0)),
    ("gelu_approximate", lambda: nn.GELU(), lambda m: setattr(m, "approximate", "tanh")),
    ("elu_alpha", lambda: nn.ELU(1.0), lambda m: setattr(m, "alpha", 3.0)),
    ("hardtanh", lambda: nn.Hardtanh(-1.0, 1.0), lambda m: setattr(m, "max_val", 0.25)),
    ("training", lambda: nn.Dropout(0.0), lambda m: m.train()),
]


def _model(build):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), build()).eval()


@pytest.mark.parametrize("name,build,mutate", CASES, ids=[c[0] for c in CASES])
def test_builtin_module_setting_recaptures(name, build, mutate):
    m = _model(build)
    c = cu.compile(m, target="reference", fallback="error")
    x = torch.randn(3, 4) * 3
    with torch.no_grad():
        torch.testing.assert_close(c(x), m(x))
        mutate(m[1])
        torch.testing.assert_close(c(x), m(x))
        longer = torch.randn(7, 4) * 3  # another batch size: the same symbolic variant
        torch.testing.assert_close(c(longer), m(longer))
    assert c.stats.compiles == 2, c.stats.recompile_reasons
    assert "state" in c.stats.recompile_reasons[-1]


def test_setting_restored_hits_again():
    m = _model(lambda: nn.LeakyReLU(0.1))
    c = cu.compile(m, target="reference", fallback="error")
    x = torch.randn(3, 4)
    with torch.no_grad():
        c(x)
        m[1].negative_slope = 0.5
        c(x)
        m[1].negative_slope = 0.1
        torch.testing.assert_close(c(x), m(x))
        c(x)
    assert c.stats.compiles == 2
    reason = c.stats.recompile_reasons[-1]
    assert "negative_slope: 0.1 -> 0.5" in reason, reason


def test_forward_hooks_are_guarded():
    m = _model(lambda: nn.ReLU())
    c = cu.compile(m, target="reference", fallback="error")
    x = torch.randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(c(x), m(x))
        handle = m[1].register_forward_hook(lambda mod, args, out: out * 2 + 1)
        torch.testing.assert_close(c(x), m(x))
        assert "_forward_hooks" in c.stats.recompile_reasons[-1]
        handle.remove()
        torch.testing.assert_close(c(x), m(x))
        pre = m[0].register_forward_pre_hook(lambda mod, args: (args[0] * -1,))
        torch.testing.assert_close(c(x), m(x))
        pre.remove()
        top = m.register_forward_hook(lambda mod, args, out: out - 3)
        torch.testing.assert_close(c(x), m(x))
        top.remove()
        torch.testing.assert_close(c(x), m(x))


def test_global_forward_hook_is_guarded():
    m = _model(lambda: nn.Tanh())
    c = cu.compile(m, target="reference", fallback="error")
    x = torch.randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(c(x), m(x))
        handle = nn.modules.module.register_module_forward_hook(lambda mod, args, out: out + 1)
        try:
            torch.testing.assert_close(c(x), m(x))
        finally:
            handle.remove()
        torch.testing.assert_close(c(x), m(x))
    assert c.stats.compiles >= 2


def test_library_module_in_a_function_is_guarded():
    act = nn.LeakyReLU(0.1)

    def fn(x):
        return act(x) * 2

    c = cu.compile(fn, target="reference", fallback="error")
    x = torch.randn(5)
    torch.testing.assert_close(c(x), fn(x))
    act.negative_slope = 0.7
    torch.testing.assert_close(c(x), fn(x))
    assert c.stats.compiles == 2


def test_user_module_attribute_through_config():
    class Cfg:
        def __init__(self):
            self.eps = 1e-5

    class Block(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.norm = nn.LayerNorm(4, eps=cfg.eps)

        def forward(self, x):
            return self.norm(x)

    torch.manual_seed(0)
    m = Block(Cfg()).eval()
    c = cu.compile(m, target="reference", fallback="error")
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(c(x), m(x))
        m.norm.eps = 5.0
        torch.testing.assert_close(c(x), m(x))
    assert c.stats.compiles == 2


# ---- across processes: two children share one cache folder ---------------------------

CHILD = textwrap.dedent(
    """
    import json, os, sys, torch
    from torch import nn
    import cuvil as cu
    spec = os.environ["STATE_SPEC"]
    torch.manual_seed(0)
    if spec.startswith("bert"):
        from transformers import BertConfig, BertModel
        cfg = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32, max_position_embeddings=16,
                         layer_norm_eps=float(spec.split(":")[1]))
        m = BertModel(cfg).eval()
        x = torch.randint(0, 64, (1, 8))
        want_fn = lambda: m(x).last_hidden_state
        c = cu.compile(m, target="reference")
        got_fn = lambda: c(x).last_hidden_state
    else:
        acts = {
            "leaky01": lambda: nn.LeakyReLU(0.1), "leaky05": lambda: nn.LeakyReLU(0.5),
            "softmax0": lambda: nn.Softmax(dim=0), "softmax1": lambda: nn.Softmax(dim=1),
            "gelu": lambda: nn.GELU(), "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
            "hook": lambda: nn.ReLU(), "nohook": lambda: nn.ReLU(),
        }
        m = nn.Sequential(nn.Linear(4, 4), acts[spec]()).eval()
        if spec == "hook":
            m[1].register_forward_hook(lambda mod, args, out: out * 3 - 1)
        x = torch.randn(3, 4) * 3
        want_fn = lambda: m(x)
        c = cu.compile(m, target="reference", fallback="error")
        got_fn = lambda: c(x)
    with torch.no_grad():
        want, got = want_fn(), got_fn()
    print(json.dumps({"diff": float((want - got).abs().max()), "warm": c.stats.warm_starts}))
    """
)


def _child(tmp_path, spec):
    env = dict(os.environ, CUVIL_CACHE_DIR=str(tmp_path / "cache"), STATE_SPEC=spec)
    r = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "first,second",
    [
        ("leaky01", "leaky05"),
        ("softmax0", "softmax1"),
        ("gelu", "gelu_tanh"),
        ("hook", "nohook"),
        ("nohook", "hook"),
    ],
)
def test_across_processes_a_different_setting_is_not_reused(tmp_path, first, second):
    a = _child(tmp_path, first)
    assert a["diff"] < 1e-5
    b = _child(tmp_path, second)
    assert b["diff"] < 1e-5, f"{second} reused {first}'s variant"
    assert b["warm"] == 0
    again = _child(tmp_path, second)  # the same state is reused
    assert again["diff"] < 1e-5 and again["warm"] >= 1


def test_across_processes_bert_layer_norm_eps(tmp_path):
    pytest.importorskip("transformers")
    a = _child(tmp_path, "bert:1e-12")
    assert a["diff"] < 1e-4
    b = _child(tmp_path, "bert:0.5")
    assert b["diff"] < 1e-4, "layer_norm_eps=0.5 reused the 1e-12 variant"


SCALE = 2.0


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.l = nn.Linear(4, 4)

    def forward(self, x):
        return self.l(x) * SCALE


def test_a_hooked_module_forward_is_still_captured_and_guarded():
    """A hook on the compiled module used to run its forward as is: the globals it read
    were frozen (found by the staleness fuzzer)."""
    global SCALE
    m = Scaled().eval()
    c = cu.compile(m, target="reference", fallback="error")
    x = torch.randn(2, 4)
    handle = m.register_forward_hook(lambda mod, args, out: out + 1)
    try:
        with torch.no_grad():
            torch.testing.assert_close(c(x), m(x))
            SCALE = -3.0
            torch.testing.assert_close(c(x), m(x))
            assert "global 'SCALE'" in c.stats.recompile_reasons[-1]
    finally:
        SCALE = 2.0
        handle.remove()


def test_what_a_hook_reads_is_guarded():
    global SCALE
    m = _model(lambda: nn.ReLU())
    c = cu.compile(m, target="reference", fallback="error")
    x = torch.randn(3, 4)
    handle = m[1].register_forward_hook(lambda mod, args, out: out * SCALE)
    try:
        with torch.no_grad():
            torch.testing.assert_close(c(x), m(x))
            SCALE = 7.0
            torch.testing.assert_close(c(x), m(x))
    finally:
        SCALE = 2.0
        handle.remove()
