"""Where in user code the call being traced is: the source location of nodes and errors.

The innermost frame of user code (:func:`cuvil.frontend.convert.is_user_frame`) below
the trace entry point is the location; frames above a trace entry
(:func:`cuvil.frontend.capture.capture`, registered with :func:`trace_entry`) are not
part of the program.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any, TypeVar

from cuvil.errors import SourceLoc
from cuvil.frontend.convert import is_user_frame

#: The code of the trace entry points: registered by :func:`trace_entry`, not imported
#: (capture imports the tracer).
_ENTRY_CODES: set[types.CodeType] = set()
_F = TypeVar("_F", bound=Callable[..., Any])


def trace_entry(fn: _F) -> _F:
    """Decorator: ``fn`` starts a trace, so :func:`source_loc` stops at its frame."""
    _ENTRY_CODES.add(fn.__code__)
    return fn


def source_loc(positions: dict[types.CodeType, list[Any]]) -> SourceLoc | None:
    """The location of the innermost user frame of the trace, or None; ``positions``
    caches each code object's instruction positions (one cache per trace)."""
    f = sys._getframe(1)
    while f is not None:
        code = f.f_code
        if code in _ENTRY_CODES:
            return None  # frames above the trace entry are not part of the program
        if is_user_frame(f):
            pos = positions.get(code)
            if pos is None:
                pos = positions[code] = list(code.co_positions())
            i = f.f_lasti // 2
            line, _, col, end_col = pos[i] if i < len(pos) else (f.f_lineno, None, 0, None)
            return SourceLoc(code.co_filename, line or f.f_lineno, col or 0, end_col)
        f = f.f_back  # type: ignore[assignment]
    return None


__all__ = ["source_loc", "trace_entry"]
