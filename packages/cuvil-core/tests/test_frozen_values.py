"""Values that must not be frozen at capture (issue 26 items 3, 4, 9): a compiled
function's Python runs once, so anything it reads that can change between calls must be
a graph input, a guard, or a refusal -- never the value the capture happened to see.
Each case mutates between calls (or between two real processes sharing one cache) and
compares with eager."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import cuvil as cu

X = torch.arange(8.0)

# -- item 3: value reads of tensors that are not arguments --------------------------------

N_T = torch.tensor(3)
FLAG_T = torch.tensor(True)
SCALE_T = torch.tensor(1.5)


class _Holder:
    pass


HOLDER = _Holder()
HOLDER.n = torch.tensor(2)


def _slice_int(x: torch.Tensor) -> torch.Tensor:
    return x[: int(N_T)] * 2


def _slice_item(x: torch.Tensor) -> torch.Tensor:
    return x[: HOLDER.n.item()] + 1


def _if_tensor(x: torch.Tensor) -> torch.Tensor:
    if FLAG_T:
        return x + 1
    return x - 1


def _range_int(x: torch.Tensor) -> torch.Tensor:
    y = x
    for _ in range(int(N_T)):
        y = y + 1
    return y


def _float_of(x: torch.Tensor) -> torch.Tensor:
    return x * float(SCALE_T)


def _bool_of(x: torch.Tensor) -> torch.Tensor:
    return x + 1 if bool(FLAG_T) else x - 1


def _closure() -> tuple[Any, torch.Tensor]:
    n = torch.tensor(2)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return x[: int(n)] - 1

    return fn, n


def _set(value: int) -> None:
    N_T.fill_(value)
    HOLDER.n.fill_(value - 1)
    FLAG_T.fill_(value % 2 == 1)
    SCALE_T.fill_(value / 2)


@pytest.mark.parametrize("fn", [_slice_int, _slice_item, _if_tensor, _range_int, _float_of, _bool_of])
def test_value_read_of_a_global_tensor_is_not_frozen(fn: Any) -> None:
    cf = cu.compile(fn, target="reference")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # float()/bool() of a tensor: eager, as for an argument
        for value in (3, 4, 5, 2):
            _set(value)
            torch.testing.assert_close(cf(X), fn(X))
    _set(3)
    # an argument tensor's value read is a size bound when the code runs, a captured `if`
    # or a refusal: never a recapture per value
    assert cf.stats.compiles == 1


def test_value_read_of_a_closure_tensor_on_the_cpu_target() -> None:
    fn, n = _closure()
    cf = cu.compile(fn, target="cpu", fallback="error")
    for value in (2, 5, 0, 8):
        n.fill_(value)
        torch.testing.assert_close(cf(X), fn(X))
    assert cf.stats.compiles == 1 and cf.stats.fallbacks == 0


def test_float_of_a_global_tensor_is_refused_as_for_an_argument() -> None:
    cf = cu.compile(_float_of, target="reference")
    with pytest.warns(cu.CuvilFallbackWarning, match="__float__"):
        cf(X)
    assert "needs the value of a tensor" in cf.stats.fallback_reasons[0]


ARR = np.array([3, 1])
BUF = bytearray(b"\x02\x05")
HOLDER.arr = np.array([1.5, 2.0])
TABLE = [np.array([4])]
OBJECTS = np.array([1, "a"], dtype=object)


def _numpy_item(x: torch.Tensor) -> torch.Tensor:
    return x[: int(ARR[0])] + 0


def _bytearray_item(x: torch.Tensor) -> torch.Tensor:
    return x[: BUF[0]] * 2


def _numpy_attr(x: torch.Tensor) -> torch.Tensor:
    return x * float(HOLDER.arr[0])


def _numpy_in_list(x: torch.Tensor) -> torch.Tensor:
    return x[: int(TABLE[0][0])] - 1


@pytest.mark.parametrize("fn", [_numpy_item, _bytearray_item, _numpy_attr, _numpy_in_list])
def test_item_read_of_a_global_buffer_is_guarded_by_value(fn: Any) -> None:
    cf = cu.compile(fn, target="reference", fallback="error")
    for value in (3, 5, 3):
        ARR[0], BUF[0], HOLDER.arr[0], TABLE[0][0] = value, value, value / 2, value + 1
        torch.testing.assert_close(cf(X), fn(X))
    assert cf.stats.compiles == 2  # 3, 5, then 3 again from the first variant
    assert "changed" in cf.stats.recompile_reasons[0]


def test_an_object_array_is_refused() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x * OBJECTS[0]

    cf = cu.compile(fn, target="reference")
    with pytest.warns(cu.CuvilFallbackWarning, match="cannot be compared by value"):
        torch.testing.assert_close(cf(X), fn(X))


# -- across processes ------------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import json, os, sys, torch
    import cuvil as cu
    sys.path.insert(0, sys.argv[1])
    import frozendef as d
    x = torch.arange(8.0, dtype=torch.float32)
    out = {}
    for name in sys.argv[2].split(","):
        fn = getattr(d, name)
        cf = cu.compile(fn, target="reference", fallback="error")
        got = [cf(x)]
        want = [fn(x)]
        if name == "length":
            d.N_T.fill_(int(os.environ["FROZEN_N"]) + 1)  # in place, after the first call
        elif name == "env":
            os.environ["FROZEN_MODE"] = "other"
        else:  # torch's process state: the default dtype, the deterministic flag
            d.flip()
        got.append(cf(x))
        want.append(fn(x))
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
        out[name] = [cf.stats.warm_starts, cf.stats.compiles]
    print(json.dumps(out))
    """
)

DEFS = textwrap.dedent(
    """
    import os
    import torch

    N_T = torch.tensor(int(os.environ["FROZEN_N"]))

    def length(x):
        return x[: int(N_T)] * 2

    def env(x):
        if os.environ.get("FROZEN_MODE", "plain") == "plain":
            return x + 1
        return x * 3

    if os.environ.get("FROZEN_STATE") == "flipped":
        torch.set_default_dtype(torch.float64)
        torch.use_deterministic_algorithms(True)

    def flip():
        flipped = torch.get_default_dtype() is torch.float64
        torch.set_default_dtype(torch.float32 if flipped else torch.float64)
        torch.use_deterministic_algorithms(not flipped)

    def state(x):
        y = x + torch.ones(8)  # float64 under a float64 default dtype
        if torch.are_deterministic_algorithms_enabled():
            return y * 3
        return y - 1
    """
)


def _child(project: Path, cases: str, **env: str) -> dict[str, list[int]]:
    full = dict(os.environ, CUVIL_CACHE_DIR=str(project / "cache"), **env)
    full.pop("FROZEN_MODE", None)
    full.pop("FROZEN_STATE", None)
    full.update(env)
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(project), cases],
        env=full,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    assert "Traceback" not in r.stderr, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    (tmp_path / "frozendef.py").write_text(DEFS)
    return tmp_path


def test_global_tensor_length_across_processes(project: Path) -> None:
    assert _child(project, "length", FROZEN_N="3")["length"] == [0, 1]
    # another process, another value of the global tensor: the stored variant reads it
    # when it runs (a warm start, no capture), and sees the in-place update too
    assert _child(project, "length", FROZEN_N="5")["length"] == [1, 1]


# -- item 4: a source file edited on disk after import ---------------------------------------

EDITED = textwrap.dedent(
    """
    import torch

    class Base(torch.nn.Module):
        def forward(self, x):
            return x + 1

    class Net(Base):
        def forward(self, x):
            k = 2.0
            f = lambda v: v * k  # a closure cell and a nested code object
            if x.sum() > 0:  # Python control flow on a tensor: needs conversion
                return f(super().forward(x))
            return x - 1

    def fn(x):
        if x.sum() > 0:
            return x * 2
        return x - 1
    """
)


def _import_fresh(tmp_path: Path, name: str, text: str = EDITED) -> Any:
    import importlib

    (tmp_path / f"{name}.py").write_text(text)
    sys.path.insert(0, str(tmp_path))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))


def test_unedited_source_is_converted(tmp_path: Path) -> None:
    mod = _import_fresh(tmp_path, "unedited_src")
    net = mod.Net().eval()
    compiled = [(cu.compile(f, target="reference", fallback="error"), f) for f in (mod.fn, net)]
    for cf, eager in compiled:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "source changed" warning
            for x in (X, -X - 1):
                torch.testing.assert_close(cf(x), eager(x))


def test_source_edited_after_import_runs_the_code_in_memory(tmp_path: Path) -> None:
    # not the text of the test above: code objects compare equal across files, and a
    # conversion verified for equal code is reused
    text = EDITED.replace("x - 1", "x - 4")
    mod = _import_fresh(tmp_path, "edited_src", text)
    path = tmp_path / "edited_src.py"
    path.write_text(text.replace("x * 2", "x * 3"))
    cf = cu.compile(mod.fn, target="reference")
    with pytest.warns(UserWarning, match="is not the code Python is running"):
        out = cf(X)
    # the function is not converted: its tensor `if` cannot be captured, so it runs as
    # eager does, the code in memory (x * 2), never the text on disk (x * 3)
    torch.testing.assert_close(out, mod.fn(X))
    torch.testing.assert_close(out, X * 2)


# -- item 9: calls whose result differs on every call ----------------------------------------


def _py_random(x: torch.Tensor) -> torch.Tensor:
    import random

    return x * random.random()


def _py_randint(x: torch.Tensor) -> torch.Tensor:
    import random

    return x[: random.randint(1, 7)]


def _np_random(x: torch.Tensor) -> torch.Tensor:
    return x + float(np.random.rand())


def _clock(x: torch.Tensor) -> torch.Tensor:
    import time

    return x + (time.time() % 1.0)


def _new_id(x: torch.Tensor) -> torch.Tensor:
    import uuid

    return x + uuid.uuid4().int % 1000003  # equal for two calls once in a million


@pytest.mark.parametrize(
    ("fn", "call"),
    [
        (_py_random, "Random.random"),
        (_py_randint, "Random.randint"),
        (_np_random, "RandomState.rand"),
        (_clock, "time"),
        (_new_id, "uuid4"),
    ],
)
def test_a_call_with_a_new_result_each_call_is_refused(fn: Any, call: str) -> None:
    cf = cu.compile(fn, target="reference")
    with pytest.warns(cu.CuvilFallbackWarning, match=f"`{call}`"):
        a = cf(X)
    b = cf(X)
    # eager on every call: the values differ between calls, as eager's do
    assert not torch.equal(a, b) or fn is _py_randint
    reason = cf.stats.fallback_reasons[0]
    assert "would run once" in reason and "test_frozen_values.py:" in reason
    with pytest.raises(cu.CompileError, match="pass it in"):
        cu.compile(fn, target="reference", fallback="error")(X)


def _env_get(x: torch.Tensor) -> torch.Tensor:
    scale = float(os.environ.get("FROZEN_SCALE", "2"))
    if "FROZEN_FLAG" in os.environ:
        return x * scale
    return x + scale


def _env_getenv(x: torch.Tensor) -> torch.Tensor:
    return x * float(os.getenv("FROZEN_SCALE", "2"))


@pytest.mark.parametrize("fn", [_env_get, _env_getenv])
def test_environment_reads_are_guarded(fn: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FROZEN_SCALE", raising=False)
    monkeypatch.delenv("FROZEN_FLAG", raising=False)
    cf = cu.compile(fn, target="reference", fallback="error")
    torch.testing.assert_close(cf(X), fn(X))
    monkeypatch.setenv("FROZEN_SCALE", "5")
    torch.testing.assert_close(cf(X), fn(X))
    assert "environment variable 'FROZEN_SCALE' changed: <unset> -> '5'" in cf.stats.recompile_reasons
    monkeypatch.setenv("FROZEN_FLAG", "1")
    torch.testing.assert_close(cf(X), fn(X))
    monkeypatch.delenv("FROZEN_SCALE")
    monkeypatch.delenv("FROZEN_FLAG")
    torch.testing.assert_close(cf(X), fn(X))  # the first variant again
    assert cf.stats.cache_hits >= 1


def test_writing_the_environment_is_refused() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        os.environ["FROZEN_W"] = "1"
        return x + 1

    with pytest.raises(cu.CompileError, match="changes os.environ"):
        cu.compile(fn, target="reference", fallback="error")(X)
    assert "FROZEN_W" not in os.environ


def test_environment_read_across_processes(project: Path) -> None:
    # the child calls with FROZEN_MODE unset, then set: two variants, both stored
    assert _child(project, "env", FROZEN_N="3")["env"] == [0, 2]
    assert _child(project, "env", FROZEN_N="3")["env"] == [2, 2]  # both warm starts, each matching eager
    # set from the start: the unset variant's guard fails in the new process, so the
    # first call does not reuse it; the child's checks against eager hold throughout
    assert _child(project, "env", FROZEN_N="3", FROZEN_MODE="other")["env"][0] <= 1


# -- torch's process state: queries and the default dtype --------------------------------------


def _grad_branch(x: torch.Tensor) -> torch.Tensor:
    if torch.is_grad_enabled():
        return x + 1
    return x - 1


def _deterministic_branch(x: torch.Tensor) -> torch.Tensor:
    if torch.are_deterministic_algorithms_enabled():
        return x * 2
    return x * 3


def _default_dtype_factory(x: torch.Tensor) -> torch.Tensor:
    return x + torch.ones(8)  # no read in user code: torch's factory reads the default


def _default_dtype_read(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.get_default_dtype()) * 2


def _autocast_query(x: torch.Tensor) -> torch.Tensor:
    if torch.is_autocast_enabled("cpu"):
        return x * 5
    return x + torch.get_num_threads()


def _flip_grad() -> None:
    torch.set_grad_enabled(not torch.is_grad_enabled())


def _flip_deterministic() -> None:
    torch.use_deterministic_algorithms(not torch.are_deterministic_algorithms_enabled())


def _flip_dtype() -> None:
    flipped = torch.get_default_dtype() is torch.float64
    torch.set_default_dtype(torch.float32 if flipped else torch.float64)


def _flip_threads() -> None:
    torch.set_num_threads(1 if torch.get_num_threads() > 1 else 2)


@pytest.mark.parametrize(
    ("fn", "flip", "reason"),
    [
        (_grad_branch, _flip_grad, "torch.is_grad_enabled() changed: True -> False"),
        (_deterministic_branch, _flip_deterministic, "torch.are_deterministic_algorithms_enabled() changed"),
        (
            _default_dtype_factory,
            _flip_dtype,
            "torch.get_default_dtype() changed: torch.float32 -> torch.float64",
        ),
        (_default_dtype_read, _flip_dtype, "torch.get_default_dtype() changed"),
        (_autocast_query, _flip_threads, "torch.get_num_threads() changed"),
    ],
)
def test_torch_process_state_is_guarded(fn: Any, flip: Any, reason: str) -> None:
    grad, det, dtype, threads = (
        torch.is_grad_enabled(),
        torch.are_deterministic_algorithms_enabled(),
        torch.get_default_dtype(),
        torch.get_num_threads(),
    )
    try:
        cf = cu.compile(fn, target="reference", fallback="error")
        for _ in range(3):  # flipped, then back: the first variant again
            got, want = cf(X), fn(X)
            assert got.dtype == want.dtype
            torch.testing.assert_close(got, want)
            flip()
        assert cf.stats.compiles == 2
        assert any(reason in r for r in cf.stats.recompile_reasons), cf.stats.recompile_reasons
    finally:
        torch.set_grad_enabled(grad)
        torch.use_deterministic_algorithms(det)
        torch.set_default_dtype(dtype)
        torch.set_num_threads(threads)


def test_torch_process_state_across_processes(project: Path) -> None:
    # the child flips the state after its first call: both variants are stored
    assert _child(project, "state", FROZEN_N="3")["state"] == [0, 2]
    assert _child(project, "state", FROZEN_N="3")["state"] == [2, 2]
    # a process that starts flipped reuses the flipped variant, never the other
    assert _child(project, "state", FROZEN_N="3", FROZEN_STATE="flipped")["state"] == [2, 2]
