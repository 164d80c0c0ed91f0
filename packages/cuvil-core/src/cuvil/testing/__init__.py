"""Cuvil's test kit, for Cuvil itself and for every backend package.

:mod:`cuvil.testing.corpus` is a corpus of plain PyTorch inference programs
(functions and ``nn.Module`` factories) with example inputs in several shape
variants; the programs use torch only.

:mod:`cuvil.testing.conformance` runs that corpus on one target and compares with
eager: a backend package's conformance tests are three lines using it. Its
:func:`~cuvil.testing.conformance.conformance_params` builds ``pytest.param`` s and
imports pytest when called; nothing else in the kit needs pytest (docs/testing.md).
"""

from cuvil.testing.corpus import PROGRAMS, Program, get_program, instantiate

__all__ = ["PROGRAMS", "Program", "get_program", "instantiate"]
