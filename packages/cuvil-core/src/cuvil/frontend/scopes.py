"""Which names a converted function reads from outside itself, and the rewrite of those reads.

A compiled function runs its Python once, at capture; every value it reads from
outside the call (a global, a closure variable, an attribute of a long-lived
object) is therefore either a graph input or guarded (see [Note: reads are
guarded] in :mod:`cuvil.guards`). This pass rewrites those reads so the hooks see
them::

    k                 ->  __cuvil_hooks__.glob("k", k)
    c   (a free var)  ->  __cuvil_hooks__.free(__cuvil_cells__, "c")
    obj.attr          ->  __cuvil_hooks__.attr(obj, "attr")
    f"{n}"            ->  f"{__cuvil_hooks__.shown(n)}"   (a size shows its example value)

and puts a ``__cuvil_hooks__.store(obj, site)`` check before every statement that
writes an attribute or item of an object named by a plain name/attribute chain,
so a write to a long-lived object (``f.calls += 1``, ``cfg.x = 1``, ``cache[k] =
v``) is a located error instead of a side effect that runs once. ``nonlocal`` of
a variable outside the compiled function is rejected for the same reason.

Scopes follow Python's rules: function and lambda parameters and assigned names
are local, comprehensions have their own targets, class bodies are skipped by
nested functions, and ``global``/``nonlocal`` declarations are honoured. Names
local to the converted function (or to a function nested in it) are not touched.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

HOOKS = "__cuvil_hooks__"
CELLS = "__cuvil_cells__"
# names that must stay plain loads: frame-sensitive builtins and the implicit class cell
_KEEP = frozenset({"super", "locals", "globals", "vars", "eval", "exec", "dir", "__class__"})

_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_COMPS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


class _Scope:
    def __init__(self, node: ast.AST, parent: _Scope | None) -> None:
        self.node = node
        self.parent = parent
        self.is_class = isinstance(node, ast.ClassDef)
        self.locals: set[str] = set()
        self.globals: set[str] = set()
        self.nonlocals: set[str] = set()


def _own_nodes(node: ast.AST) -> list[ast.AST]:
    """The nodes of ``node``'s own scope (not inside nested scopes, which are returned
    themselves but not entered); defaults/decorators of nested defs belong here."""
    out: list[ast.AST] = []
    if isinstance(node, _FUNCS):
        todo: list[ast.AST] = [node.body] if isinstance(node, ast.Lambda) else list(node.body)  # type: ignore[list-item]
    elif isinstance(node, ast.ClassDef):
        todo = list(node.body)
    elif isinstance(node, _COMPS):
        todo = [node.elt] if not isinstance(node, ast.DictComp) else [node.key, node.value]
        for i, gen in enumerate(node.generators):
            # the first iterable is evaluated in the enclosing scope
            todo += [gen.target, *gen.ifs] + ([gen.iter] if i else [])
    else:
        todo = [node]
    while todo:
        n = todo.pop()
        out.append(n)
        if isinstance(n, (*_FUNCS, ast.ClassDef)):
            args = n.args if isinstance(n, _FUNCS) else None
            if args is not None:
                todo += [d for d in (*args.defaults, *args.kw_defaults) if d is not None]
            if not isinstance(n, ast.Lambda):
                todo += list(n.decorator_list)  # type: ignore[union-attr]
            if isinstance(n, ast.ClassDef):
                todo += [*n.bases, *(k.value for k in n.keywords)]
            continue
        if isinstance(n, _COMPS):
            todo.append(n.generators[0].iter)
            continue
        todo.extend(ast.iter_child_nodes(n))
    return out


def _bind(scope: _Scope) -> None:
    node = scope.node
    if isinstance(node, _FUNCS):
        a = node.args
        for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg):
            if arg is not None:
                scope.locals.add(arg.arg)
    for n in _own_nodes(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            scope.locals.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n is not node:
            scope.locals.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            for alias in n.names:
                scope.locals.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(n, ast.ExceptHandler) and n.name:
            scope.locals.add(n.name)
        elif isinstance(n, (ast.MatchAs, ast.MatchStar)) and n.name:
            scope.locals.add(n.name)
        elif isinstance(n, ast.MatchMapping) and n.rest:
            scope.locals.add(n.rest)
        elif isinstance(n, ast.Global):
            scope.globals.update(n.names)
        elif isinstance(n, ast.Nonlocal):
            scope.nonlocals.update(n.names)
    if isinstance(node, _COMPS):
        # a walrus in a comprehension binds in the enclosing function
        for name in list(scope.locals):
            if not any(
                isinstance(t, ast.Name) and t.id == name for g in node.generators for t in ast.walk(g.target)
            ):
                scope.locals.discard(name)
                if scope.parent is not None:
                    scope.parent.locals.add(name)
    scope.locals -= scope.globals | scope.nonlocals


class OuterReads(ast.NodeTransformer):
    """Rewrites the outer reads of one converted function (see the module docstring).

    ``freevars`` are the original function's free variables (read through the cells
    the converted twin receives); ``site(kind, node)`` registers a source location;
    ``fail(node, what, hint)`` builds a located :class:`CompileError`.
    """

    def __init__(
        self,
        freevars: tuple[str, ...],
        site: Callable[[str, ast.AST], ast.expr],
        fail: Callable[[ast.AST, str, str], Exception],
    ) -> None:
        self.freevars = frozenset(freevars)
        self.site = site
        self.fail = fail
        self.scope: _Scope | None = None
        self.top: _Scope | None = None

    # -- scopes -----------------------------------------------------------------
    def _enter(self, node: ast.AST) -> _Scope:
        scope = _Scope(node, self.scope)
        if self.top is None:
            self.top = scope
        _bind(scope)
        return scope

    def _resolve(self, name: str) -> str:
        """``local`` (inside the compiled function), ``free`` or ``global``."""
        scope, first = self.scope, True
        while scope is not None:
            if first or not scope.is_class:  # class bodies do not enclose their methods
                if name in scope.globals:
                    return "global"
                if name in scope.locals:
                    return "local"
            # a ``nonlocal`` name is not in ``locals``: it lives further out
            scope, first = scope.parent, False
        return "free" if name in self.freevars else "global"

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        # defaults and decorators are evaluated in the enclosing scope
        args = node.args
        args.defaults = [self.visit(d) for d in args.defaults]
        args.kw_defaults = [None if d is None else self.visit(d) for d in args.kw_defaults]
        node.decorator_list = [self.visit(d) for d in node.decorator_list]
        return self._scoped_body(node)

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Lambda(self, node: ast.Lambda) -> ast.AST:
        args = node.args
        args.defaults = [self.visit(d) for d in args.defaults]
        args.kw_defaults = [None if d is None else self.visit(d) for d in args.kw_defaults]
        outer, self.scope = self.scope, self._enter(node)
        try:
            node.body = self.visit(node.body)
        finally:
            self.scope = outer
        return node

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        node.bases = [self.visit(b) for b in node.bases]
        node.decorator_list = [self.visit(d) for d in node.decorator_list]
        return self._scoped_body(node)

    def _scoped_body(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> ast.AST:
        outer, self.scope = self.scope, self._enter(node)
        try:
            node.body = [self.visit(s) for s in node.body]
            node.body = [s for item in node.body for s in (item if isinstance(item, list) else [item])]
        finally:
            self.scope = outer
        return node

    def _comp(self, node: ast.AST) -> ast.AST:
        gens = node.generators  # type: ignore[attr-defined]
        gens[0].iter = self.visit(gens[0].iter)
        outer, self.scope = self.scope, self._enter(node)
        try:
            for i, gen in enumerate(gens):
                if i:
                    gen.iter = self.visit(gen.iter)
                gen.ifs = [self.visit(t) for t in gen.ifs]
            if isinstance(node, ast.DictComp):
                node.key = self.visit(node.key)
                node.value = self.visit(node.value)
            else:
                node.elt = self.visit(node.elt)  # type: ignore[attr-defined]
        finally:
            self.scope = outer
        return node

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comp  # type: ignore[assignment]

    # -- reads --------------------------------------------------------------------
    def _hook(self, name: str, node: ast.AST, *args: ast.expr) -> ast.expr:
        call = ast.Call(ast.Attribute(ast.Name(HOOKS, ast.Load()), name, ast.Load()), list(args), [])
        return ast.copy_location(call, node)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if not isinstance(node.ctx, ast.Load) or node.id in _KEEP or node.id.startswith("__cuvil"):
            return node
        where = self._resolve(node.id)
        if where == "global":
            return self._hook("glob", node, ast.Constant(node.id), node)
        if where == "free":
            return self._hook("free", node, ast.Name(CELLS, ast.Load()), ast.Constant(node.id))
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if isinstance(node.value, ast.Name) and node.value.id == HOOKS:
            return node
        node.value = self.visit(node.value)
        if not isinstance(node.ctx, ast.Load):
            return node
        return self._hook("attr", node, node.value, ast.Constant(node.attr))

    def visit_FormattedValue(self, node: ast.FormattedValue) -> ast.AST:
        self.generic_visit(node)
        node.value = self._hook("shown", node.value, node.value)
        return node

    # -- writes -------------------------------------------------------------------
    def visit_Nonlocal(self, node: ast.Nonlocal) -> ast.AST:
        assert self.scope is not None
        for name in node.names:
            scope = self.scope.parent
            while scope is not None and (scope.is_class or name not in scope.locals):
                scope = scope.parent
            if scope is None:
                raise self.fail(
                    node,
                    f"writing the variable `{name}` of an enclosing function (`nonlocal`)",
                    "Python side effects would run once, at compile time, not on every call; "
                    "return the new value instead",
                )
        return node

    def _checks(self, targets: list[ast.expr], stmt: ast.stmt) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for target in targets:
            for t in _unpack(target):
                if isinstance(t, (ast.Attribute, ast.Subscript)) and _pure(t.value):
                    obj = _as_load(t.value)
                    kind = "attribute" if isinstance(t, ast.Attribute) else "item"
                    check = self._hook("store", t, self.visit(obj), self.site(kind, t))
                    out.append(ast.copy_location(ast.Expr(check), stmt))
        return out

    def _store(self, node: ast.stmt, targets: list[ast.expr]) -> ast.AST | list[ast.stmt]:
        checks = self._checks(targets, node)
        self.generic_visit(node)
        return [*checks, node] if checks else node

    def visit_Assign(self, node: ast.Assign) -> ast.AST | list[ast.stmt]:
        return self._store(node, node.targets)

    def visit_AugAssign(self, node: ast.AugAssign) -> ast.AST | list[ast.stmt]:
        return self._store(node, [node.target])

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST | list[ast.stmt]:
        return self._store(node, [node.target])

    def visit_Delete(self, node: ast.Delete) -> ast.AST | list[ast.stmt]:
        return self._store(node, node.targets)


def _unpack(target: ast.expr) -> list[ast.expr]:
    if isinstance(target, (ast.Tuple, ast.List)):
        return [t for e in target.elts for t in _unpack(e)]
    if isinstance(target, ast.Starred):
        return _unpack(target.value)
    return [target]


def _pure(node: ast.expr) -> bool:
    """A plain name or attribute chain: evaluating it twice is harmless."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and not node.id.startswith("__cuvil")


def _as_load(node: ast.expr) -> ast.expr:
    if isinstance(node, ast.Attribute):
        return ast.copy_location(ast.Attribute(_as_load(node.value), node.attr, ast.Load()), node)
    assert isinstance(node, ast.Name)
    return ast.copy_location(ast.Name(node.id, ast.Load()), node)


def rewrite_reads(
    fdef: ast.FunctionDef,
    freevars: tuple[str, ...],
    site: Callable[[str, ast.AST], ast.expr],
    fail: Callable[[ast.AST, str, str], Exception],
) -> None:
    """Rewrite ``fdef`` in place (see :class:`OuterReads`)."""
    OuterReads(freevars, site, fail).visit(fdef)
    ast.fix_missing_locations(fdef)


__all__ = ["CELLS", "OuterReads", "rewrite_reads"]
