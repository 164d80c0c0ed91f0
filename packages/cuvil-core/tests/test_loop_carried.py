"""Python numbers changed by captured loops and `if`s travel as 0-d tensors (issue 13).

Every case runs against eager on both targets at two sizes with one compile, and
checks that the numbers come back as the Python types eager returns.
"""

from __future__ import annotations

import pytest
import torch

import cuvil as cu

TARGETS = ["reference", "cpu"]


def same(got, want):
    """Equal values and equal types: tensors by dtype, Python numbers by type."""
    assert type(got) is type(want), (got, want)
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            same(g, w)
    elif isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-12)
    else:
        assert got == want


def check(fn, target, *calls):
    """``fn`` compiled once matches eager on every call (tuples of arguments)."""
    compiled = cu.compile(fn, target=target, fallback="error")
    for args in calls:
        same(compiled(*args), fn(*args))
    assert compiled.stats.compiles == 1, compiled.stats.recompile_reasons
    return compiled


def ops_of(graph):
    return [n.op for n in graph.walk()]


@pytest.mark.parametrize("target", TARGETS)
def test_issue_example_counts_halvings(target):
    def f(x):
        i = 0
        while x.norm() > 1:
            x = x * 0.5
            i += 1
        return x, i

    c = check(f, target, (torch.full((3,), 5.0),), (torch.full((5,), 0.1),), (torch.full((4,), 100.0),))
    assert "while" in ops_of(c.graphs[0])


@pytest.mark.parametrize("target", TARGETS)
def test_float_accumulator_and_use_after_the_loop(target):
    def f(x):
        s = 0.0
        k = 3  # read in the body, never changed: stays a constant
        while x.sum() < 10:
            x = x + 1
            s += 0.1 * k
        return x * s, s, s + 1, s > 1.0

    check(f, target, (torch.zeros(2),), (torch.ones(5) * 4,))


@pytest.mark.parametrize("target", TARGETS)
def test_bool_flag_set_in_body_and_in_one_branch(target):
    def f(x):
        done = False
        negative = False
        while x.max() > 1:
            x = x - 1
            done = True
            if x.min() < 0:
                negative = True
        return x, done, negative

    check(f, target, (torch.tensor([0.5, 3.0]),), (torch.tensor([0.5, 0.25, 0.75]),))
    check(f, target, (torch.tensor([2.5, 3.0, 2.0]),), (torch.tensor([0.1, 1.5]),))


@pytest.mark.parametrize("target", TARGETS)
def test_counter_in_one_branch_of_a_data_dependent_if(target):
    def f(x):
        pos = 0
        for i in range(x.shape[0]):
            if x[i].sum() > 0:
                pos += 1
        return pos

    check(f, target, (torch.tensor([[1.0], [-1.0], [2.0]]),), (torch.tensor([[-1.0], [-2.0]]),))


@pytest.mark.parametrize("target", TARGETS)
def test_for_over_symbolic_range_carries_int_and_size(target):
    def f(x):
        n = 0
        total = 0
        for i in range(x.shape[0]):
            n += 2
            total = total + i  # the loop index is a size
        return x * n, n, total

    check(f, target, (torch.randn(3, 2),), (torch.randn(6, 2),))


@pytest.mark.parametrize("target", TARGETS)
def test_nested_loops_carry_through_both(target):
    def f(x):
        steps = 0
        for i in range(x.shape[0]):
            row = x[i]
            while row.sum() > 1:
                row = row / 2
                steps += 1
        return steps, steps / 2

    check(f, target, (torch.tensor([[4.0, 4.0], [0.1, 0.1]]),), (torch.tensor([[1.0, 1.0]] * 3),))


@pytest.mark.parametrize("target", TARGETS)
def test_carried_value_in_a_condition_after_the_loop(target):
    def f(x):
        i = 0
        while x.sum() > 1:
            x = x / 2
            i += 1
        if i > 3:
            x = x * 10
        return x, i

    check(f, target, (torch.ones(2) * 100,), (torch.ones(3),))


@pytest.mark.parametrize("target", TARGETS)
def test_python_number_that_becomes_a_tensor(target):
    def f(x):
        s = 0
        while x.sum() > 1:
            x = x / 2
            s = s + x.sum()  # a tensor after the first iteration, as in eager
        return s

    check(f, target, (torch.ones(3) * 4,), (torch.ones(5) * 2,))


@pytest.mark.parametrize("target", TARGETS)
def test_python_arithmetic_on_carried_numbers(target):
    def f(x):
        i = 0
        flag = False
        while x.sum() > 1:
            x = x / 2
            i += 1
            flag = True
        return i + 1, 2 * i, -i, i // 2, i / 2, i + 0.5, i > 3, flag + flag, x * i

    check(f, target, (torch.ones(3) * 4,), (torch.ones(2) * 0.25,))


@pytest.mark.parametrize("target", TARGETS)
def test_int_widened_to_float_by_the_body(target):
    def f(x):
        t = 0
        while x.sum() > 1:
            x = x / 2
            t += 0.5
        return t

    c = check(f, target, (torch.ones(3) * 4,), (torch.ones(4) * 16,))
    assert "f64" in c.graphs[0].text


@pytest.mark.parametrize("target", TARGETS)
def test_documented_example(target):
    def f(x):
        i, done = 0, False
        while x.norm() > 1:
            x = x * 0.5
            i += 1
            if x.min() < 0:
                done = True
        return x * i, i, done

    check(f, target, (torch.tensor([-4.0, 3.0]),), (torch.tensor([0.1, 0.2, 0.3]),))


@pytest.mark.parametrize("target", TARGETS)
def test_python_loop_whose_condition_becomes_data_dependent(target):
    def f(x):
        i = 0
        while i < 5:  # a Python condition until a tensor `if` sets i
            if x.sum() > 0:
                i += 1
            else:
                i += 2
            x = x - 1
        return x, i

    c = check(f, target, (torch.ones(3) * 2,), (torch.zeros(2),))
    assert "while" in ops_of(c.graphs[0])


@pytest.mark.parametrize("target", TARGETS)
def test_branches_widen_a_carried_number(target):
    def f(x):
        t = 0
        while x.sum() > 1:
            x = x / 2
            if x.sum() > 3:
                t = t + 1
            else:
                t = 0.5
        return t

    check(f, target, (torch.ones(3) * 4,), (torch.ones(2) * 1.5,))


def test_float_assigned_to_an_int_tensor_is_a_located_error():
    def f(x):
        n = torch.zeros((), dtype=torch.int64)
        while x.sum() > 1:
            x = x / 2
            n = 0.5
        return n

    with pytest.raises(cu.CompileError, match="turns the tensor 'n' into a float"):
        cu.compile(f, target="reference", fallback="error")(torch.ones(3))


def test_alias_keeps_the_old_value():
    def f(x):
        i = 0
        j = 0
        while x.sum() > 1:
            x = x / 2
            j = i
            i += 1
        return i, j

    check(f, "reference", (torch.ones(3) * 4,), (torch.ones(2) * 16,))


@pytest.mark.parametrize(
    "use, message",
    [
        (lambda x, i: x.view(i, -1), "needs the value of a tensor"),
        (lambda x, i: [1, 2, 3][i], "`__index__` needs the value of a tensor"),
        (lambda x, i: list(range(i)), "`__index__` needs the value of a tensor"),
    ],
)
def test_uses_that_need_a_python_value_are_located_errors(use, message):
    def f(x):
        i = 0
        while x.sum() > 1:
            x = x / 2
            i += 1
        return use(x, i)

    with pytest.raises(cu.CompileError, match=message) as info:
        cu.compile(f, target="reference", fallback="error")(torch.ones(3))
    assert "test_loop_carried.py" in str(info.value)


def halvings(x):
    i = 0
    while x.sum() > 1:
        x = x / 2
        i += 1
    return x, i


@torch.no_grad()
def test_saved_artifact_returns_the_carried_number(tmp_path):
    f = cu.compile(halvings, target="reference", fallback="error")
    g = cu.load(cu.save(f, tmp_path / "halvings.cuvil", torch.ones(3)))
    for x in (torch.ones(2) * 8, torch.ones(5) * 0.1):
        same(g(x), halvings(x))


@pytest.mark.parametrize("target", TARGETS)
def test_carried_float_is_weak_with_integer_tensors(target):
    # a Python float times an int tensor is the default dtype in eager, not float64
    def f(x, n):
        s = 0.0
        while x.sum() < 10:
            x = x + 1
            s += 0.25
        return n * s, s * n, n + s, (n > s), torch.mul(n, s), x

    n = torch.arange(4)
    check(f, target, (torch.zeros(3), n), (torch.zeros(5), n[:3]))


@pytest.mark.parametrize("target", TARGETS)
def test_not_and_or_on_carried_bools(target):
    def f(x):
        done = False
        n = 0
        while x.sum() < 20 and not done:
            x = x + 1
            n += 1
            if n > 3 or x.sum() > 15:
                done = True
        if not done:
            x = x * 2
        return x, not done, done or n > 2, n

    check(f, target, (torch.zeros(3),), (torch.zeros(5),), (torch.full((2,), 9.0),))


@pytest.mark.parametrize("target", TARGETS)
def test_and_or_keep_python_semantics_for_python_values(target):
    def f(x, y=None, flag=True):
        if y is not None and y.shape[0] > 1:  # short circuit: y.shape is never read for None
            x = x + y
        z = flag and x  # the last operand is returned as it is, a tensor
        w = (x.shape[0] > 100) or x * 2
        return z, w, 0 or 3, None and x

    check(f, target, (torch.ones(3),), (torch.ones(4),))


def test_and_of_a_non_bool_tensor_is_a_located_error():
    def f(x):
        return (x.sum() and x.mean()) + 1

    with pytest.raises(cu.CompileError, match="not a bool") as e:
        cu.compile(f, target="reference", fallback="error")(torch.ones(3))
    assert "test_loop_carried.py" in str(e.value)
