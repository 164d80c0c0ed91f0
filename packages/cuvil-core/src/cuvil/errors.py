"""User-facing errors: what went wrong, where in the user's source, how to fix it."""

from __future__ import annotations

import linecache
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SourceLoc:
    file: str
    line: int
    col: int  # 0-based, as in ast and co_positions
    end_col: int | None = None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col + 1}"

    def excerpt(self) -> str:
        """The source line with a caret under the offending expression."""
        text = linecache.getline(self.file, self.line).rstrip("\n")
        if not text:
            return ""
        width = 1
        if self.end_col is not None and self.end_col > self.col:
            width = self.end_col - self.col
        return f"    {text}\n    {' ' * self.col}{'^' * width}"


class CompileError(Exception):
    """Cuvil could not compile a program.

    The message names the source location (file:line:col), shows the offending
    line with a caret, and says what to do instead.
    """

    def __init__(self, message: str, loc: SourceLoc | None = None, hint: str | None = None) -> None:
        self.message = message
        self.loc = loc
        self.hint = hint
        super().__init__(self._format())

    def _format(self) -> str:
        parts = [f"{self.loc}: {self.message}" if self.loc else self.message]
        if self.loc is not None:
            ex = self.loc.excerpt()
            if ex:
                parts.append(ex)
        if self.hint:
            parts.append(f"hint: {self.hint}")
        return "\n".join(parts)

    @property
    def reason(self) -> str:
        """One line: location and message (what stats and warnings show)."""
        return f"{self.loc}: {self.message}" if self.loc else self.message
