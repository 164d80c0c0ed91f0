"""Differential staleness fuzzing: state that changes between calls or processes.

Beside ``test_fuzz.py`` (random programs, fixed state), this fuzzer draws small
``nn.Module`` programs whose results depend on long-lived state and then changes that
state, comparing every compiled call with eager on the same inputs. The state
("knobs") is what a capture reads and a stale variant would get wrong:

- settings of torch built-in submodules (``LeakyReLU.negative_slope``, ``Softmax.dim``,
  ``LayerNorm.eps``, ``GELU.approximate``, ``ELU.alpha``, ``Hardtanh.max_val``);
- forward hooks and pre-hooks on submodules and on the model;
- user globals (a float, a dict entry deciding a branch, a tensor filled in place, a
  tensor whose ``int()`` slices the output), a plain attribute of the model, and which
  of two lambdas defined on one line a global names;
- torch's process state: the deterministic-algorithms flag a branch asks for, and the
  default dtype a factory call (``torch.ones``) reads;
- across processes only: the text of a helper function in the program's file.

A program is written as source text to a file and imported, as a user's would be.
*In one process* each program is compiled once, called, and then mutated several
times, one knob at a time, with a call after each. *Across processes* two (then
three) child processes share a fresh cache folder: the first builds each program with
one set of knob values, the second with another, the third again with the second's
(which should reuse the second's variants: warm starts are counted, not required).

Any compiled result that differs from eager (values, dtype or shape) is a finding.
Budgets: a fixed, seeded budget in the test suite; ``CUVIL_STALE_PROGRAMS`` raises
it, and ``python test_staleness_fuzz.py --programs 200`` prints the counts of a long
run (docs/testing.md).
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

FEATURES = 6

#: built-in modules: (constructor text, setting, values it may take)
BUILTINS = [
    ("nn.LeakyReLU({v})", "negative_slope", [0.01, 0.3, 2.0]),
    ("nn.Softmax(dim={v})", "dim", [0, 1, -1]),
    ("nn.LayerNorm(FEATURES, eps={v})", "eps", [1e-5, 0.5, 4.0]),
    ("nn.GELU(approximate={v!r})", "approximate", ["none", "tanh"]),
    ("nn.ELU({v})", "alpha", [1.0, 0.2, 3.0]),
    ("nn.Hardtanh(-1.0, {v})", "max_val", [1.0, 0.3, 2.5]),
]
#: the bodies a helper function may have (the cross-process "edited file" knob)
HELPER_BODIES = ["t * 2.0 - 1.0", "t * 0.5 + 2.0", "torch.sin(t)"]
HOOKS = {
    None: None,
    "scale": lambda mod, args, out: out * 1.5,
    "shift": lambda mod, args, out: out - 0.25,
}
PRE_HOOKS = {None: None, "neg": lambda mod, args: (-args[0],), "half": lambda mod, args: (args[0] * 0.5,)}


@dataclass
class Program:
    seed: int
    source: str  # the module's text, with a {BODY} slot for the helper's body
    knobs: dict[str, list[Any]]  # knob -> the values it may take (first: the default)
    hooked: list[str]  # submodule paths that may get a hook


def draw_program(seed: int) -> Program:
    rng = random.Random(seed)
    knobs: dict[str, list[Any]] = {}
    init, body, hooked = [], [], [""]
    for i in range(rng.randint(2, 4)):
        ctor, setting, values = rng.choice(BUILTINS)
        values = values[:]
        rng.shuffle(values)
        init.append(f"self.l{i} = nn.Linear(FEATURES, FEATURES)")
        init.append(f"self.a{i} = {ctor.format(v=values[0])}")
        knobs[f"attr:a{i}:{setting}"] = values
        hooked.append(f"a{i}")
        body.append(f"y = self.a{i}(self.l{i}(y))")
    extras = [
        ("y = y * SCALE", "global:SCALE", [1.0, 2.0, -0.5]),
        (
            'y = torch.tanh(y) if CFG["mode"] == "tanh" else torch.sigmoid(y)',
            "cfg:mode",
            ["tanh", "sigmoid"],
        ),
        ("y = HELPER(y)", "helper", ["A", "B"]),
        ("y = y + BIAS", "fill:BIAS", [0.0, 1.0, -2.0]),
        ("y = y * self.k", "plain:k", [1, 3]),
        ("y = helper(y)", "body", [0, 1, 2]),
        (
            "y = y * 2.0 if torch.are_deterministic_algorithms_enabled() else y - 0.5",
            "torch:deterministic",
            [False, True],
        ),
    ]
    for stmt, knob, values in rng.sample(extras, rng.randint(2, len(extras))):
        values = values[:]
        if not knob.startswith("torch:"):  # torch's settings start as the process has them
            rng.shuffle(values)
        knobs[knob] = values
        body.insert(rng.randint(0, len(body)), stmt)
    if rng.random() < 0.3:  # a factory reads torch's default dtype (float64: a float64 result)
        body.append("y = y + torch.ones(FEATURES) * 0.5")
        knobs["torch:dtype"] = ["float32", "float64"]
    if rng.random() < 0.5:
        body.append("y = y[:, : int(N_T)]")
        knobs["fill:N_T"] = rng.sample([FEATURES, 4, 2], 3)
    for path in hooked:
        if rng.random() < 0.4:
            knobs[f"hook:{path}"] = [None, *rng.sample(["scale", "shift"], 2)]
    if rng.random() < 0.3:
        knobs["prehook:"] = [None, *rng.sample(["neg", "half"], 2)]
    lines = "\n".join
    source = textwrap.dedent(
        """\
        import torch
        from torch import nn

        FEATURES = {features}
        SCALE = 1.0
        CFG = {{"mode": "tanh"}}
        A, B = (lambda t: t + 1.0), (lambda t: t * 3.0)
        HELPER = A
        BIAS = torch.zeros(FEATURES)
        N_T = torch.tensor(FEATURES)


        def helper(t):
            return {{BODY}}


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                torch.manual_seed({seed})
        {init}
                self.k = 1

            def forward(self, x):
                y = x
        {body}
                return y
        """
    ).format(
        features=FEATURES,
        seed=seed,
        init=lines("        " + s for s in init),
        body=lines("        " + s for s in body),
    )
    return Program(seed, source, knobs, hooked)


def write(program: Program, folder: Path, values: dict[str, Any]) -> Path:
    """The program's file, with the helper body ``values`` chooses."""
    body = HELPER_BODIES[values.get("body", 0)]
    path = folder / f"stale_{program.seed}.py"
    path.write_text(program.source.replace("{BODY}", body))
    return path


def load(path: Path) -> Any:
    name = path.stem  # stable across processes: the warm-start key names the class by module
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


class Live:
    """A program's module and model, with the knobs applied to the live objects."""

    def __init__(self, mod: Any) -> None:
        self.mod = mod
        self.model = mod.Net().eval()
        self.handles: dict[str, Any] = {}

    def apply(self, knob: str, value: Any) -> None:
        kind, _, rest = knob.partition(":")
        mod, model = self.mod, self.model
        if kind == "attr":
            path, name = rest.split(":")
            setattr(model.get_submodule(path), name, value)
        elif kind == "global":
            setattr(mod, rest, value)
        elif kind == "cfg":
            mod.CFG[rest] = value
        elif kind == "helper":
            mod.HELPER = getattr(mod, value)
        elif kind == "fill":
            getattr(mod, rest).fill_(value)
        elif kind == "plain":
            setattr(model, rest, value)
        elif kind in ("hook", "prehook"):
            old = self.handles.pop(knob, None)
            if old is not None:
                old.remove()
            if value is not None:
                target = model.get_submodule(rest)
                if kind == "hook":
                    self.handles[knob] = target.register_forward_hook(HOOKS[value])
                else:
                    self.handles[knob] = target.register_forward_pre_hook(PRE_HOOKS[value])
        elif kind == "torch":  # torch's process state
            if rest == "dtype":
                torch.set_default_dtype(getattr(torch, value))
            else:
                torch.use_deterministic_algorithms(value)
        elif kind == "body":
            pass  # the file's text: chosen when it is written
        else:
            raise AssertionError(knob)

    def setup(self, values: dict[str, Any]) -> None:
        for knob, value in sorted(values.items()):
            self.apply(knob, value)

    def close(self) -> None:
        """Hooks removed, torch's process state as before."""
        for handle in self.handles.values():
            handle.remove()
        torch.set_default_dtype(torch.float32)
        torch.use_deterministic_algorithms(False)


def inputs(seed: int) -> torch.Tensor:
    return torch.randn(3, FEATURES, generator=torch.Generator().manual_seed(seed), dtype=torch.float32) * 2


def compare(compiled: Any, model: Any, x: torch.Tensor) -> str | None:
    """None when the compiled call gives eager's result, else what differs."""
    with torch.no_grad():
        want = model(x)
        try:
            got = compiled(x)
        except Exception as e:  # noqa: BLE001 -- any failure of a valid program is a finding
            return f"raised {type(e).__name__}: {str(e)[:300]}"
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"dtype/shape {got.dtype}{tuple(got.shape)} vs eager {want.dtype}{tuple(want.shape)}"
    if not torch.allclose(got, want, rtol=1e-4, atol=1e-5, equal_nan=True):
        return f"values differ by {float((got - want).abs().max()):.3g}"
    return None


@dataclass
class Counts:
    programs: int = 0
    mutations: int = 0
    calls: int = 0
    recompiles: int = 0
    warm_starts: int = 0
    findings: list[str] = field(default_factory=list)

    def add(self, other: dict[str, Any]) -> None:
        for k in ("programs", "mutations", "calls", "recompiles", "warm_starts"):
            setattr(self, k, getattr(self, k) + other.get(k, 0))
        self.findings += other.get("findings", [])


def run_in_process(
    program: Program, folder: Path, mutations: int, target: str = "reference"
) -> dict[str, Any]:
    import cuvil as cu

    rng = random.Random(program.seed * 7919 + 1)
    live = Live(load(write(program, folder, {})))
    compiled = cu.compile(live.model, target=target, fallback="error")
    out: dict[str, Any] = {"programs": 1, "mutations": 0, "calls": 0, "findings": []}
    x = inputs(program.seed)
    knobs = sorted(k for k in program.knobs if k != "body")
    history = []
    for step in range(mutations + 1):
        if step:
            knob = rng.choice(knobs)
            value = rng.choice(program.knobs[knob])
            live.apply(knob, value)
            history.append(f"{knob}={value!r}")
            out["mutations"] += 1
        why = compare(compiled, live.model, x)
        out["calls"] += 1
        if why is not None:
            out["findings"].append(f"seed {program.seed} ({target}) after [{', '.join(history)}]: {why}")
            break
    live.close()
    out["recompiles"] = compiled.stats.compiles - 1
    return out


def values_for(program: Program, rng: random.Random) -> dict[str, Any]:
    return {k: rng.choice(v) for k, v in sorted(program.knobs.items())}


# ---- across processes: a child runs a batch of programs against the shared cache -----


def child_main(batch_file: str) -> None:
    import cuvil as cu

    batch = json.loads(Path(batch_file).read_text())
    out: dict[str, Any] = {"programs": 0, "calls": 0, "warm_starts": 0, "findings": []}
    for item in batch["programs"]:
        live = Live(load(Path(item["path"])))
        live.setup(item["values"])
        compiled = cu.compile(live.model, target=batch["target"], fallback="error")
        why = compare(compiled, live.model, inputs(item["seed"]))
        live.close()
        out["programs"] += 1
        out["calls"] += 1
        out["warm_starts"] += compiled.stats.warm_starts
        if why is not None:
            out["findings"].append(
                f"seed {item['seed']} ({batch['target']}, process {batch['name']}) with {item['values']}: {why}"
            )
    print(json.dumps(out))


def run_across(programs: list[Program], folder: Path, target: str = "reference") -> dict[str, Any]:
    """Process 1 with one set of knob values, process 2 with another (the file's helper
    rewritten where its body differs), process 3 with process 2's again."""
    cache = folder / "cache"
    firsts, seconds = [], []
    for p in programs:
        rng = random.Random(p.seed * 31 + 7)
        a = values_for(p, rng)
        b = dict(a)
        for knob in rng.sample(sorted(p.knobs), rng.randint(1, min(3, len(p.knobs)))):
            b[knob] = rng.choice([v for v in p.knobs[knob] if v != a[knob]] or p.knobs[knob])
        firsts.append(a)
        seconds.append(b)
    total: dict[str, Any] = {"programs": len(programs), "calls": 0, "warm_starts": 0, "findings": []}
    for name, chosen in (("1", firsts), ("2", seconds), ("3", seconds)):
        items = []
        for p, values in zip(programs, chosen):
            sub = folder / f"p{p.seed}"
            sub.mkdir(exist_ok=True)
            items.append({"seed": p.seed, "path": str(write(p, sub, values)), "values": values})
        batch = folder / f"batch{name}.json"
        batch.write_text(json.dumps({"name": name, "target": target, "programs": items}))
        env = dict(os.environ, CUVIL_CACHE_DIR=str(cache))
        r = subprocess.run(
            [sys.executable, __file__, "--child", str(batch)],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        if r.returncode != 0:
            total["findings"].append(f"process {name} failed: {r.stderr[-2000:]}")
            break
        got = json.loads(r.stdout.strip().splitlines()[-1])
        total["calls"] += got["calls"]
        total["findings"] += got["findings"]
        if name == "3":
            total["warm_starts"] += got["warm_starts"]
    return total


# ---- the test suite's budget -------------------------------------------------------------

PROGRAMS = int(os.environ.get("CUVIL_STALE_PROGRAMS", "6"))


def test_staleness_in_one_process(tmp_path):
    counts = Counts()
    for seed in range(PROGRAMS):
        counts.add(run_in_process(draw_program(seed), tmp_path, mutations=8))
    assert not counts.findings, "\n".join(counts.findings)
    assert counts.recompiles > 0  # the mutations did change what the programs read


def test_staleness_across_processes(tmp_path):
    programs = [draw_program(1000 + s) for s in range(max(2, PROGRAMS // 2))]
    total = run_across(programs, tmp_path)
    assert not total["findings"], "\n".join(total["findings"])


def test_the_fuzzer_finds_a_stale_variant(tmp_path, monkeypatch):
    """The fuzzer's own check: with the module-state guards switched off (the code
    before issue 26), a built-in module's changed setting is a finding."""
    from cuvil.frontend import reads

    monkeypatch.setattr(reads.Reads, "module_states", lambda self: None)
    found: list[str] = []
    for seed in range(20):
        found += run_in_process(draw_program(seed), tmp_path, mutations=8)["findings"]
        if found:
            break
    assert found, "no stale result found with the guards off"


def _main(argv: list[str]) -> None:
    if argv[:1] == ["--child"]:
        child_main(argv[1])
        return
    import argparse
    import tempfile
    import time

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=int, default=100)
    ap.add_argument("--mutations", type=int, default=8)
    ap.add_argument("--target", default="reference")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    counts = Counts()
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.programs):
            counts.add(run_in_process(draw_program(seed), Path(tmp), args.mutations, args.target))
        across = run_across([draw_program(10_000 + s) for s in range(args.programs)], Path(tmp), args.target)
    print(
        f"in one process: {counts.programs} programs, {counts.mutations} mutations, {counts.calls} calls, "
        f"{counts.recompiles} recompiles, {len(counts.findings)} findings"
    )
    print(
        f"across processes: {across['programs']} programs x 3 processes, {across['calls']} calls, "
        f"{across['warm_starts']} warm starts in process 3, {len(across['findings'])} findings"
    )
    print(f"{time.perf_counter() - start:.0f} s")
    for f in counts.findings + across["findings"]:
        print("FINDING:", f)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    _main(sys.argv[1:])
