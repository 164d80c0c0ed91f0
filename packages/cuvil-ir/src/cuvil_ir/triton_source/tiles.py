"""How many tiles a generated kernel holds at once: the size of its working set.

A target whose programs keep every tile in a fixed on-chip buffer (Ascend's
unified buffer) must pick block sizes so that the kernel's live tiles fit it. The
generator knows which of its variables are tiles (``[XBLOCK]`` values of a
pointwise kernel, ``[XBLOCK, RBLOCK]`` values of a row kernel); this module counts
how many of them are live at once in the generated function, by a liveness scan
of its text (the text is Python: :mod:`ast` reads it).

A variable is live from its first assignment to its last read; one read or
assigned inside a ``for`` loop is live for the whole loop (a loop-carried
accumulator, or a value the next iteration reads again). The count is an upper
bound for a compiler that gives each live value its own buffer and reuses a dead
one's; values inside one expression (an address computation) are not variables
and are left to the target's margin.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable


def _positions(
    stmts: list[ast.stmt],
    tiles: frozenset[str],
    pos: list[int],
    out: dict[str, list[int]],
    loops: list[tuple[int, int]],
) -> None:
    for st in stmts:
        if isinstance(st, ast.For):
            start = pos[0]
            _names(st.iter, tiles, pos[0], out)
            pos[0] += 1
            _positions(st.body, tiles, pos, out, loops)
            loops.append((start, pos[0]))
            pos[0] += 1
            continue
        if isinstance(st, ast.If):
            # only the top level has an if (the ONE_TILE variants): callers split it
            _names(st.test, tiles, pos[0], out)
            pos[0] += 1
            _positions(st.body, tiles, pos, out, loops)
            _positions(st.orelse, tiles, pos, out, loops)
            continue
        _names(st, tiles, pos[0], out)
        pos[0] += 1


def _names(node: ast.AST, tiles: frozenset[str], at: int, out: dict[str, list[int]]) -> None:
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id in tiles:
            out.setdefault(n.id, []).append(at)


def _most_live(stmts: list[ast.stmt], tiles: frozenset[str]) -> int:
    out: dict[str, list[int]] = {}
    loops: list[tuple[int, int]] = []
    _positions(stmts, tiles, [0], out, loops)
    spans = []
    for at in out.values():
        lo, hi = min(at), max(at)
        for a, b in loops:
            if any(a <= p <= b for p in at):
                lo, hi = min(lo, a), max(hi, b)
        spans.append((lo, hi))
    if not spans:
        return 0
    points = sorted({p for span in spans for p in span})
    return max(sum(1 for lo, hi in spans if lo <= p <= hi) for p in points)


def live_tiles(source: str, name: str, tiles: Iterable[str]) -> tuple[int, ...]:
    """The most of ``tiles`` (variable names) live at once in function ``name`` of
    ``source``: ``(n,)`` for a body without variants, ``(one tile, looped)`` for one
    whose ``if ONE_TILE:`` splits it (the statements before the split count in both)."""
    tree = ast.parse(source)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    names = frozenset(tiles)
    body = fn.body
    split = next((k for k, st in enumerate(body) if _is_variant_split(st)), None)
    if split is None and len(body) == 1 and isinstance(body[0], ast.For):
        # a persistent kernel: the variants are inside the loop over blocks
        loop = body[0]
        inner = next((k for k, st in enumerate(loop.body) if _is_variant_split(st)), None)
        if inner is not None:
            head, node = loop.body[:inner], loop.body[inner]
            assert isinstance(node, ast.If)
            return (_most_live([*head, *node.body], names), _most_live([*head, *node.orelse], names))
    if split is None:
        return (_most_live(body, names),)
    node = body[split]
    assert isinstance(node, ast.If)
    head = body[:split]
    return (_most_live([*head, *node.body], names), _most_live([*head, *node.orelse], names))


def _is_variant_split(st: ast.stmt) -> bool:
    return isinstance(st, ast.If) and isinstance(st.test, ast.Name) and st.test.id == "ONE_TILE"


__all__ = ["live_tiles"]
