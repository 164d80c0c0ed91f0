"""The corpus's machinery: the :class:`Program` record, the :data:`PROGRAMS` list, the
registration decorators (:func:`program`, :func:`module`) and the seeded input helpers.

:mod:`.functions` and :mod:`.modules` register their programs with these on import;
:mod:`cuvil.testing.corpus` imports both (functions first: the order of
:data:`PROGRAMS`) and re-exports the public names. See there for the rules.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

# --------------------------------------------------------------------------------------
# The data structure
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Program:
    """One corpus entry.

    ``fn`` is the function itself, or (``is_module``) a zero-argument factory
    returning an eval-mode module; :func:`instantiate` gives the callable.
    ``make_kwargs(i)``, when set, gives keyword arguments for variant ``i``.
    ``atol``/``rtol`` (both or neither) override ``torch.testing.assert_close``'s
    dtype-based defaults.
    """

    name: str
    fn: Callable[..., Any]
    make_inputs: Callable[[int], tuple[Any, ...]]
    is_module: bool = False
    num_variants: int = 2
    make_kwargs: Callable[[int], dict[str, Any]] | None = None
    atol: float | None = None
    rtol: float | None = None

    def __post_init__(self) -> None:
        if (self.atol is None) != (self.rtol is None):
            raise ValueError(f"{self.name}: give both atol and rtol, or neither")
        if self.num_variants < 2:
            raise ValueError(f"{self.name}: a program needs at least two shape variants")

    @property
    def tolerance(self) -> dict[str, float]:
        """Keyword arguments for ``torch.testing.assert_close`` (empty: its defaults)."""
        if self.atol is None or self.rtol is None:
            return {}
        return {"atol": self.atol, "rtol": self.rtol}

    def call_args(self, variant: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``(args, kwargs)`` of shape variant ``variant``."""
        if not 0 <= variant < self.num_variants:
            raise IndexError(f"{self.name} has {self.num_variants} variants, not {variant}")
        args = self.make_inputs(variant)
        kwargs = self.make_kwargs(variant) if self.make_kwargs is not None else {}
        return args, kwargs


PROGRAMS: list[Program] = []


def instantiate(program: Program) -> Callable[..., Any]:
    """The callable to run: the function, or a freshly built module (same weights every time)."""
    if program.is_module:
        module = program.fn()
        if not isinstance(module, nn.Module) or module.training:
            raise TypeError(f"{program.name}: the factory must return an nn.Module in eval mode")
        return module  # type: ignore[no-any-return]
    return program.fn


def get_program(name: str) -> Program:
    for p in PROGRAMS:
        if p.name == name:
            return p
    raise KeyError(name)


def _register(p: Program) -> None:
    if any(q.name == p.name for q in PROGRAMS):
        raise ValueError(f"duplicate corpus program {p.name}")
    PROGRAMS.append(p)


Sizes = Sequence["int | tuple[int, ...]"]


@dataclass(frozen=True)
class _Inputs:
    """``make_inputs`` of a registered program: ``build(generator, *sizes[i])`` for variant ``i``.

    Each variant draws from its own seeded generator, so its tensors never depend
    on which other variants (or programs) were built before.
    """

    build: Callable[..., tuple[Any, ...]]
    sizes: tuple[tuple[int, ...], ...]

    def __call__(self, variant: int) -> tuple[Any, ...]:
        return self.build(_gen(variant), *self.sizes[variant])


def _variants(
    inputs: Callable[..., tuple[Any, ...]], sizes: Sizes, kwargs: Sequence[dict[str, Any]] | None
) -> tuple[_Inputs, int, Callable[[int], dict[str, Any]] | None]:
    norm = tuple(s if isinstance(s, tuple) else (s,) for s in sizes)
    if kwargs is not None and len(kwargs) != len(norm):
        raise ValueError("one kwargs dict per shape variant")
    make_kwargs = None if kwargs is None else (lambda i, kw=tuple(kwargs): dict(kw[i]))
    return _Inputs(inputs, norm), len(norm), make_kwargs


def program(
    inputs: Callable[..., tuple[Any, ...]],
    *,
    sizes: Sizes,
    name: str | None = None,
    kwargs: Sequence[dict[str, Any]] | None = None,
    atol: float | None = None,
    rtol: float | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a function (a decorator; the function is returned unchanged).

    ``inputs(generator, *sizes[i])`` builds the positional arguments of variant
    ``i``; ``kwargs[i]``, when given, its keyword arguments.
    """

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        make, n, make_kwargs = _variants(inputs, sizes, kwargs)
        _register(Program(name or fn.__name__, fn, make, False, n, make_kwargs, atol, rtol))
        return fn

    return deco


def module(
    name: str,
    inputs: Callable[..., tuple[Any, ...]],
    *,
    sizes: Sizes,
    kwargs: Sequence[dict[str, Any]] | None = None,
    atol: float | None = None,
    rtol: float | None = None,
) -> Callable[[Callable[[], nn.Module]], Callable[[], nn.Module]]:
    """Register a module factory (a decorator); ``inputs`` and ``sizes`` as for :func:`program`."""

    def deco(factory: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
        make, n, make_kwargs = _variants(inputs, sizes, kwargs)
        _register(Program(name, factory, make, True, n, make_kwargs, atol, rtol))
        return factory

    return deco


# --------------------------------------------------------------------------------------
# Deterministic data
# --------------------------------------------------------------------------------------


def _gen(variant: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 * variant + 17)


def _randn(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g)


def _rand(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.rand(*shape, generator=g)


def _randint(g: torch.Generator, low: int, high: int, *shape: int) -> torch.Tensor:
    return torch.randint(low, high, shape, generator=g)


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Module weights from a fixed seed, without disturbing the caller's RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _ready(m: nn.Module) -> nn.Module:
    return m.eval().requires_grad_(False)
