"""Test helpers shared by every Cuvil package and backend.

:mod:`cuvil_runtime.testing.corpus` is a corpus of plain PyTorch inference
programs (functions and ``nn.Module`` factories) with example inputs in several
shape variants. It depends on torch only (never on ``cuvil``), so backend
packages and the conformance suite can import it without the frontend.

:mod:`cuvil_runtime.testing.conformance` runs that corpus on one target and
compares with eager: a backend package's conformance tests are three lines
using it (it imports ``cuvil`` only when a check runs).
"""

from cuvil_runtime.testing.corpus import PROGRAMS, Program, get_program, instantiate

__all__ = ["PROGRAMS", "Program", "get_program", "instantiate"]
