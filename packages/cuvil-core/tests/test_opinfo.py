"""The OpInfo sweep: every op in torch's OpInfo database, compiled and compared with eager.

For each op of ``torch.testing._internal.common_methods_invocations.op_db`` that supports
float32 on CPU, the first ``SAMPLES`` float32 CPU samples are called through one compiled
function per target (``fallback="error"``; ``reference`` and ``cpu``): the samples' sizes
differ, so a later sample with the structure of an earlier one is a cache hit that runs the
symbolic artifact.
Each op ends in one of three outcomes:

- ``pass``: every sample compiled and matched eager (values, dtypes, NaN where eager has NaN);
- ``refused``: a clear :class:`CompileError` (an acceptable refusal, counted);
- ``finding``: a wrong result or any other exception -- never acceptable.

Random and uninitialized results are left out (the exclusion rule): an op named in
``RANDOM`` (samplers, ``empty*``, dropouts) is excluded, and so is a sample whose eager call
runs an aten op tagged ``nondeterministic_seeded`` or disagrees with itself under two seeds
(:func:`random_sample`: ``sdpa`` with ``dropout_p > 0``); an op whose samples are all random
is excluded.

``opinfo_pass.txt`` (sorted, one op a line) lists the ops that pass on every target: one
failing is a regression; an op passing that is not listed is reported (a warning saying to
add it).
Regenerate the list with ``python test_opinfo.py --update``.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import cuvil as cu
from cuvil.errors import CompileError

PASS_LIST = Path(__file__).with_name("opinfo_pass.txt")
SAMPLES = 3
#: the targets the sweep runs on (the cpu target costs about as much as the reference)
TARGETS = [t for t in ("reference", "cpu") if t in {b.name for b in cu.backends() if b.available}]

#: ops that draw random numbers or return uninitialized memory: eager itself disagrees
#: with itself, so no comparison is meaningful (the seed check below catches the rest)
RANDOM = frozenset(
    {
        "bernoulli",
        "cauchy",
        "exponential",
        "geometric",
        "log_normal",
        "multinomial",
        "normal",
        "poisson",
        "rand_like",
        "randint",
        "randint_like",
        "randn",
        "randn_like",
        "uniform",
        "empty",
        "empty_like",
        "empty_strided",
        "empty_permuted",
        "new_empty",
        "new_empty_strided",
    }
)

#: (rtol, atol) per result dtype; integers and bools compare exactly
TOLERANCES = {
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.float32: (1e-4, 1e-5),
    torch.complex64: (1e-4, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex128: (1e-7, 1e-7),
}


def op_name(op: Any) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


@functools.cache
def sweep_ops() -> dict[str, Any]:
    from torch.testing._internal.common_methods_invocations import op_db

    return {op_name(op): op for op in op_db if torch.float32 in op.supported_dtypes("cpu")}


def samples(op: Any) -> list[Any]:
    out = []
    for s in op.sample_inputs("cpu", torch.float32, requires_grad=False):
        out.append(s)
        if len(out) == SAMPLES:
            break
    return out


def _clone(tree: Any) -> Any:
    return torch.utils._pytree.tree_map(lambda v: v.clone() if isinstance(v, torch.Tensor) else v, tree)


def _eager(op: Any, sample: Any, seed: int = 0) -> Any:
    torch.manual_seed(seed)
    return op.op(*_clone((sample.input, *sample.args)), **_clone(sample.kwargs))


def random_sample(op: Any, sample: Any) -> bool:
    """Whether eager runs an aten op tagged ``nondeterministic_seeded`` (it draws random
    numbers: OpInfo reseeds inside such calls, so eager repeats itself and the compiled
    call, drawing from the generator at run time, cannot match) or disagrees with itself
    under two seeds (uninitialized memory)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seeded(TorchDispatchMode):
        drew = False

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            Seeded.drew |= torch.Tag.nondeterministic_seeded in func.tags
            return func(*args, **(kwargs or {}))

    try:
        with Seeded():
            a = _eager(op, sample, 0)
        b = _eager(op, sample, 1)
    except Exception:
        return False  # eager cannot run it: the sweep skips the sample
    return Seeded.drew or compare(a, b) is not None


def compare(actual: Any, expected: Any) -> str | None:
    """None if ``actual`` matches ``expected``, else what differs."""
    flat_a, spec_a = torch.utils._pytree.tree_flatten(actual)
    flat_e, spec_e = torch.utils._pytree.tree_flatten(expected)
    if spec_a != spec_e:
        return f"structure {spec_a} != {spec_e}"
    for a, e in zip(flat_a, flat_e, strict=True):
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                return f"{type(a).__name__} where eager returns a tensor"
            if a.dtype != e.dtype or a.shape != e.shape:
                return f"{a.dtype}{tuple(a.shape)} != {e.dtype}{tuple(e.shape)}"
            rtol, atol = TOLERANCES.get(e.dtype, (0.0, 0.0))
            try:
                torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True, check_layout=False)
            except AssertionError as err:
                return str(err).splitlines()[0] + " " + " ".join(str(err).split("\n")[1:4])
        elif isinstance(e, float) and isinstance(a, float):
            if not (a == e or (a != a and e != e) or abs(a - e) <= 1e-5 + 1e-4 * abs(e)):
                return f"{a} != {e}"
        elif a != e or type(a) is not type(e):
            return f"{a!r} != {e!r}"
    return None


@dataclasses.dataclass(frozen=True)
class Outcome:
    kind: str  # "pass", "refused", "finding", "excluded" or "skipped" (eager cannot run any sample)
    detail: str = ""


def _compiled(op: Any, target: str) -> Any:
    fn = op.op

    def run(args: Any, kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return cu.compile(run, target=target, fallback="error")


def check(op: Any, target: str) -> Outcome:
    """Compile ``op`` for ``target`` and run its samples through it against eager."""
    todo = samples(op)
    if not todo:
        return Outcome("skipped", "no float32 samples")
    if op.name.split(".")[-1] in RANDOM or op.name.startswith("nn.functional.dropout"):
        return Outcome("excluded", "random or uninitialized")
    todo = [s for s in todo if not random_sample(op, s)]
    if not todo:
        return Outcome("excluded", "every sample draws random numbers")
    # one compiled function per argument structure: samples alike but for their sizes
    # share it (one compile, a symbolic artifact); a leaf that is a tensor in one sample
    # and a number in another is another function to cuvil (a TypeError, by design)
    compiled: dict[Any, Any] = {}
    ran = 0
    for i, s in enumerate(todo):
        try:
            expected = _eager(op, s)
        except Exception:
            continue  # a sample eager refuses says nothing about us
        args, kwargs = _clone((s.input, *s.args)), _clone(s.kwargs)
        leaves, spec = torch.utils._pytree.tree_flatten((list(args), kwargs))
        f = compiled.setdefault(
            (spec, tuple(isinstance(v, torch.Tensor) for v in leaves)), _compiled(op, target)
        )
        try:
            actual = f(list(args), kwargs)
        except CompileError as e:
            return Outcome("refused", f"sample {i}: {e.message.splitlines()[0]}")
        except Exception as e:
            return Outcome("finding", f"sample {i}: crash: {type(e).__name__}: {str(e)[:300]}")
        diff = compare(actual, expected)
        if diff is not None:
            return Outcome("finding", f"sample {i}: wrong result: {diff}")
        ran += 1
    return Outcome("pass") if ran else Outcome("skipped", "eager raises on every sample")


def pass_list() -> set[str]:
    if not PASS_LIST.exists():
        return set()
    return {line.strip() for line in PASS_LIST.read_text().splitlines() if line.strip()}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # importing op_db costs ~10 s of CPU: only when the slow tests are selected
    if "name" in metafunc.fixturenames:
        names = sorted(sweep_ops()) if _slow_selected(metafunc.config) else []
        metafunc.parametrize("name", names)
        metafunc.parametrize("target", TARGETS)


def _slow_selected(config: pytest.Config) -> bool:
    from _pytest.mark.expression import Expression

    expr = config.option.markexpr
    return not expr or Expression.compile(expr).evaluate(lambda mark, **_: mark == "slow")


@pytest.mark.slow
def test_opinfo(name: str, target: str) -> None:
    outcome = check(sweep_ops()[name], target)
    if outcome.kind == "finding":
        pytest.fail(f"{name}: {outcome.detail}")
    listed = name in pass_list()
    if listed and outcome.kind != "pass":
        pytest.fail(f"{name} regressed ({outcome.kind}: {outcome.detail}); it is in {PASS_LIST.name}")
    if not listed and outcome.kind == "pass":
        warnings.warn(
            f"{name} now passes: add it to {PASS_LIST.name} (python test_opinfo.py --update)", stacklevel=1
        )


def main(argv: list[str]) -> int:
    """``python test_opinfo.py [--update] [--target=cpu] [op ...]``: run the sweep on every
    target (or one), print every outcome that is not a pass; ``--update`` lists the ops
    that pass on every target."""
    import logging

    targets = [a.split("=", 1)[1] for a in argv if a.startswith("--target=")] or TARGETS
    if "--update" in argv and targets != TARGETS:
        raise SystemExit("the pass list holds the ops passing on every target: --update takes no --target")

    logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)
    names = [a for a in argv if not a.startswith("--")] or sorted(sweep_ops())
    counts: dict[str, int] = {}
    passing = []
    for name in names:
        outcomes = [(t, check(sweep_ops()[name], t)) for t in targets]
        for t, outcome in outcomes:
            counts[outcome.kind] = counts.get(outcome.kind, 0) + 1
            if outcome.kind != "pass":
                print(f"{outcome.kind:9} {name} ({t}): {outcome.detail}", flush=True)
        if all(o.kind == "pass" for _, o in outcomes):
            passing.append(name)
    print(counts)
    if "--update" in argv:
        PASS_LIST.write_text("".join(f"{n}\n" for n in sorted(passing)))
        print(f"wrote {len(passing)} ops to {PASS_LIST}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
