"""The hand-written C kernels' shared vector prelude (``vectors.h``: the lane count ``VW``, the
vector type ``vf``, ``FMA``), pasted into each kernel's source in place of its
``#include "cuvil_vectors.h"`` line: a built source stays one self-contained text, which is what
the kernel cache hashes, builds and signs (no header is read from anywhere at build time)."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

_HERE = Path(__file__).parent
#: the line a kernel's source names the prelude with
INCLUDE = '#include "cuvil_vectors.h"\n'
PRELUDE = (_HERE / "vectors.h").read_text()


def kernel_source(name: str, lanes: int | None = None) -> str:
    """The source of the kernel file ``name`` with the prelude in place; ``lanes`` forces the
    vector width (4, 8 or 16: tests run every width's logic on any host), None lets the ISA
    choose."""
    text = (_HERE / name).read_text()
    if text.count(INCLUDE) != 1:
        raise ValueError(f"{name} must include the vector prelude once ({INCLUDE.strip()})")
    text = text.replace(INCLUDE, PRELUDE)
    return text if lanes is None else f"#define CUVIL_VW {lanes}\n{text}"


def build_facts(lib: Any, symbol: str, count: int) -> tuple[int, ...]:
    """What a built kernel says about itself (its vector width, tile sizes): ``symbol`` is a
    ``void f(int64_t *, ...)`` writing ``count`` numbers (a loaded or an emulated library)."""
    values = [ctypes.c_int64() for _ in range(count)]
    fn = getattr(lib, symbol)
    fn.argtypes = [ctypes.POINTER(ctypes.c_int64)] * count
    fn.restype = None
    fn(*(ctypes.byref(v) for v in values))
    return tuple(v.value for v in values)


__all__ = ["INCLUDE", "PRELUDE", "build_facts", "kernel_source"]
