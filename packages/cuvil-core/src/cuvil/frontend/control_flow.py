"""Statement-level rewrite of ``if``/``while``/``for`` into calls of structured hooks.

    if c:                          def __cuvil_then_1(y):
        y = f(x)                       y = f(x)
    else:               ==>            return (y,)
        y = g(x)                   def __cuvil_else_1(y): ...
                                   (y,) = __cuvil_hooks__.if_(c, __cuvil_then_1, __cuvil_else_1,
                                                               site, (load(locals(), "y"),))

The variables a statement assigns become the parameters and results of its
branch/body functions, so the hooks can run them as plain Python (a Python
condition) or trace each once into a region (a size or tensor condition; see
:mod:`cuvil.frontend.regions`). Early ``return`` is handled by copying the code
that follows an ``if`` into each branch that can fall through, so that both
branches end in ``return`` and the whole ``if`` becomes ``return hooks.if_(...)``.

Statements that cannot be rewritten this way (``break``/``continue`` to an
enclosing loop, ``yield``, ``global``/``nonlocal``, a ``return`` on only some
paths of a loop) stay Python statements; their conditions still go through the
``truth`` hook, which rejects tensor values with the source location.
"""

from __future__ import annotations

import ast
import copy
import sys
from collections.abc import Callable
from itertools import count

HOOKS = "__cuvil_hooks__"


def _hook(name: str, *args: ast.expr) -> ast.Call:
    return ast.Call(ast.Attribute(ast.Name(HOOKS, ast.Load()), name, ast.Load()), list(args), [])


def _scope_nodes(stmts: list[ast.stmt], loop_level: bool = False) -> list[ast.AST]:
    """Every node of ``stmts`` in the same function scope (not inside nested
    defs/lambdas/classes); with ``loop_level``, not inside nested loop bodies either
    (a ``break`` found then would leave the loop that encloses ``stmts``)."""
    out: list[ast.AST] = []
    todo: list[ast.AST] = list(stmts)
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if loop_level and isinstance(node, (ast.For, ast.While)):
            todo.extend(node.orelse)  # the loop's own body has its own break level
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


def assigned_names(stmts: list[ast.stmt]) -> list[str]:
    """Names a block binds in its own scope, sorted (deterministic parameter order)."""
    names: set[str] = set()
    for node in _scope_nodes(stmts):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    # comprehension variables live in their own scope
    for node in _scope_nodes(stmts):
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            for gen in node.generators:
                for n in ast.walk(gen.target):
                    if isinstance(n, ast.Name):
                        names.discard(n.id)
    return sorted(n for n in names if not n.startswith("__cuvil"))


def _has(stmts: list[ast.stmt], kinds: tuple[type, ...], loop_level: bool = False) -> bool:
    nodes = _scope_nodes(stmts, loop_level)
    return any(isinstance(n, kinds) for n in nodes)


_NEVER = (ast.Yield, ast.YieldFrom, ast.Await, ast.Global, ast.Nonlocal, ast.Delete)


def always_returns(stmts: list[ast.stmt]) -> bool:
    if not stmts:
        return False
    last = stmts[-1]
    if isinstance(last, (ast.Return, ast.Raise)):
        return True
    if isinstance(last, ast.If):
        return always_returns(last.body) and always_returns(last.orelse)
    return False


class ControlFlow:
    """Rewrites one function body; ``site`` registers a construct's source location."""

    def __init__(self, site: Callable[[str, ast.expr], ast.expr]) -> None:
        self.site = site
        self.ids = count(1)

    def function(self, fdef: ast.FunctionDef) -> None:
        fdef.body = self.block(fdef.body, at_end=True)

    def block(self, stmts: list[ast.stmt], at_end: bool) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for i, st in enumerate(stmts):
            rest = stmts[i + 1 :]
            if isinstance(st, ast.If):
                converted = self._if(st, rest, at_end)
                if converted is not None:
                    out += converted[0]
                    if converted[1]:  # the rest of the block moved into the if
                        return out
                    continue
                st.body = self.block(st.body, False)
                st.orelse = self.block(st.orelse, False)
            elif isinstance(st, ast.While) and self._loop_ok(st):
                out += self._while(st)
                continue
            elif isinstance(st, ast.For) and self._loop_ok(st):
                out += self._for(st)
                continue
            elif isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
                st.body = self.block(st.body, at_end=True)
            else:
                for field in ("body", "orelse", "finalbody"):
                    inner = getattr(st, field, None)
                    if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                        setattr(st, field, self.block(inner, False))
                for handler in getattr(st, "handlers", []):
                    handler.body = self.block(handler.body, False)
            out.append(st)
        return out

    # -- if ------------------------------------------------------------------
    def _if(self, st: ast.If, rest: list[ast.stmt], at_end: bool) -> tuple[list[ast.stmt], bool] | None:
        body, orelse = list(st.body), list(st.orelse)
        both = body + orelse
        if _has(both, _NEVER) or _has(both, (ast.Break, ast.Continue), loop_level=True):
            return None
        if not _has(both, (ast.Return,)):
            return self._make_if(st, body, orelse, tail=False), False
        # Early return: the code after the if runs only on paths that fall through,
        # so it is copied to the end of each branch that can fall through; then both
        # branches end in return and the if becomes `return hooks.if_(...)`.
        if not always_returns(body):
            body = body + copy.deepcopy(rest)
        if not always_returns(orelse):
            orelse = orelse + copy.deepcopy(rest)
        if at_end:  # falling off the end of the function returns None
            body = body if always_returns(body) else body + [ast.Return(ast.Constant(None))]
            orelse = orelse if always_returns(orelse) else orelse + [ast.Return(ast.Constant(None))]
        if not (always_returns(body) and always_returns(orelse)):
            return None  # a return on only some paths inside a loop body: stays Python
        return self._make_if(st, body, orelse, tail=True), True

    def _make_if(
        self, st: ast.If, body: list[ast.stmt], orelse: list[ast.stmt], tail: bool
    ) -> list[ast.stmt]:
        k = next(self.ids)
        names = sorted(set(assigned_names(body)) | set(assigned_names(orelse)))
        site = self.site("if", st.test)
        then_fn = self._fn(f"__cuvil_then_{k}", [], names, body, tail, st)
        else_fn = self._fn(f"__cuvil_else_{k}", [], names, orelse, tail, st)
        call = _hook(
            "if_",
            st.test,
            ast.Name(then_fn.name, ast.Load()),
            ast.Name(else_fn.name, ast.Load()),
            site,
            self._loads(names, site),
        )
        return [then_fn, else_fn, self._bind(names, call, tail, st)]

    # -- loops ---------------------------------------------------------------
    def _loop_ok(self, st: ast.While | ast.For) -> bool:
        if st.orelse or _has(st.body, _NEVER) or _has(st.body, (ast.Return,)):
            return False
        return not _has(st.body, (ast.Break, ast.Continue), loop_level=True)

    def _while(self, st: ast.While) -> list[ast.stmt]:
        k = next(self.ids)
        names = assigned_names(st.body)
        site = self.site("while", st.test)
        cond_fn = self._fn(f"__cuvil_cond_{k}", [], names, [ast.Return(st.test)], True, st)
        body_fn = self._fn(f"__cuvil_body_{k}", [], names, st.body, False, st)
        call = _hook(
            "while_",
            ast.Name(cond_fn.name, ast.Load()),
            ast.Name(body_fn.name, ast.Load()),
            site,
            ast.Tuple([ast.Constant(n) for n in names], ast.Load()),
            self._loads(names, site),
        )
        return [cond_fn, body_fn, self._bind(names, call, False, st)]

    def _for(self, st: ast.For) -> list[ast.stmt]:
        k = next(self.ids)
        target_names = {n.id for n in ast.walk(st.target) if isinstance(n, ast.Name)}
        names = [n for n in assigned_names(st.body) if n not in target_names]
        site = self.site("for", st.iter)
        item = f"__cuvil_item_{k}"
        unpack = ast.Assign([st.target], ast.Name(item, ast.Load()))
        ast.copy_location(unpack, st)
        body_fn = self._fn(f"__cuvil_body_{k}", [item], names, [unpack, *st.body], False, st)
        call = _hook(
            "for_",
            st.iter,
            ast.Name(body_fn.name, ast.Load()),
            site,
            ast.Tuple([ast.Constant(n) for n in names], ast.Load()),
            self._loads(names, site),
        )
        return [body_fn, self._bind(names, call, False, st)]

    # -- pieces ----------------------------------------------------------------
    def _fn(
        self, name: str, lead: list[str], names: list[str], body: list[ast.stmt], tail: bool, at: ast.stmt
    ) -> ast.FunctionDef:
        inner = self.block(body, at_end=tail)
        if not tail:
            inner = inner + [ast.Return(ast.Tuple([ast.Name(n, ast.Load()) for n in names], ast.Load()))]
        args = ast.arguments(
            posonlyargs=[],
            args=[ast.arg(n) for n in [*lead, *names]],
            kwonlyargs=[],
            kw_defaults=[],
            defaults=[],
        )
        fn = ast.FunctionDef(
            name=name, args=args, body=inner or [ast.Pass()], decorator_list=[], returns=None
        )
        if sys.version_info >= (3, 12):
            fn.type_params = []
        return ast.copy_location(fn, at)

    def _loads(self, names: list[str], site: ast.expr) -> ast.Tuple:
        scope = ast.Call(ast.Name("locals", ast.Load()), [], [])
        return ast.Tuple([_hook("load", scope, ast.Constant(n), site) for n in names], ast.Load())

    def _bind(self, names: list[str], call: ast.Call, tail: bool, at: ast.stmt) -> ast.stmt:
        stmt: ast.stmt
        if tail:
            stmt = ast.Return(call)
        elif names:
            target = ast.Tuple([ast.Name(n, ast.Store()) for n in names], ast.Store())
            stmt = ast.Assign([target], call)
        else:
            stmt = ast.Expr(call)
        return ast.copy_location(stmt, at)
