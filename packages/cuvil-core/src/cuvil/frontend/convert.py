"""Source-to-source conversion of user functions (the AutoGraph approach).

A user function is re-parsed from its source (``inspect.getsource`` + ``ast``),
rewritten so that every place where Python asks a value for its truth or
iterates over it goes through a helper in :mod:`cuvil.frontend.hooks`, and
every call goes through ``hooks.call`` (which converts user callees on the fly),
then recompiled with the original file name and line/column numbers. Tracing
then runs the converted function on proxies.

Today the hooks accept Python values, keep shape decisions as guards, and
reject tensor-valued control flow with the source location; structured
``If``/``While`` capture plugs into the same hooks.

Only code outside site-packages and the standard library is converted: library
code (``torch.nn`` modules, ...) runs as is and is captured at the torch-call level.
"""

from __future__ import annotations

import ast
import functools
import inspect
import os
import sys
import sysconfig
import textwrap
import types
import warnings
from dataclasses import dataclass
from typing import Any

from cuvil.errors import CompileError, SourceLoc
from cuvil.frontend.control_flow import ControlFlow
from cuvil.frontend.scopes import CELLS, rewrite_reads

HOOKS = "__cuvil_hooks__"
# Calls that inspect their caller's frame must not be wrapped.
_FRAME_SENSITIVE = frozenset({"super", "locals", "globals", "vars", "eval", "exec", "dir"})


#: the arguments of a thunk (``lambda: operand``)
_NO_ARGS = ast.arguments(
    posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[]
)


def _not_a_thunk(node: ast.AST) -> bool:
    """Would ``node`` mean something else inside a ``lambda``?"""
    if isinstance(node, (ast.NamedExpr, ast.Yield, ast.YieldFrom, ast.Await)):
        return True
    return isinstance(node, ast.Name) and node.id in _FRAME_SENSITIVE


@dataclass(frozen=True, slots=True)
class Site:
    """A rewritten construct: where it is and what it is (``if``, ``while`` ...)."""

    kind: str
    loc: SourceLoc


SITES: list[Site] = []


def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {
        paths.get("stdlib", ""),
        paths.get("platstdlib", ""),
        paths.get("purelib", ""),
        paths.get("platlib", ""),
    }
    import torch

    roots.add(os.path.dirname(torch.__file__))
    import cuvil_ir
    import cuvil_runtime

    # editable installs live outside site-packages; cuvil's own folder is two up from
    # here (not ``import cuvil``: this module is part of what cuvil/__init__ imports)
    roots.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for pkg in (cuvil_ir, cuvil_runtime):
        roots.add(os.path.dirname(pkg.__file__ or ""))
    return tuple(sorted(r for r in roots if r))


@functools.lru_cache(maxsize=4096)
def is_user_file(filename: str) -> bool:
    if not filename or filename.startswith("<"):
        return False
    if "site-packages" in filename or "dist-packages" in filename:
        return False
    return not any(filename.startswith(root + os.sep) for root in _library_roots())


def is_user_frame(frame: types.FrameType) -> bool:
    return frame.f_globals.get("__cuvil_convert__") is True or is_user_file(frame.f_code.co_filename)


def is_user_function(fn: Any) -> bool:
    """User code is converted; a module can opt in wherever it is installed by setting
    ``__cuvil_convert__ = True`` (the program corpus in ``cuvil.testing`` does)."""
    if not isinstance(fn, types.FunctionType):
        return False
    return fn.__globals__.get("__cuvil_convert__") is True or is_user_file(fn.__code__.co_filename)


class _Rewriter(ast.NodeTransformer):
    def __init__(self, filename: str, self_name: str | None) -> None:
        self.filename = filename
        self.self_name = self_name
        self.has_class_cell = False

    def _site(self, kind: str, node: ast.expr) -> ast.Constant:
        loc = SourceLoc(self.filename, node.lineno, node.col_offset, getattr(node, "end_col_offset", None))
        if getattr(node, "end_lineno", node.lineno) != node.lineno:
            loc = SourceLoc(self.filename, node.lineno, node.col_offset, None)
        SITES.append(Site(kind, loc))
        return ast.Constant(len(SITES) - 1)

    def _hook(self, name: str, *args: ast.expr) -> ast.Call:
        call = ast.Call(ast.Attribute(ast.Name(HOOKS, ast.Load()), name, ast.Load()), list(args), [])
        return ast.copy_location(call, args[0])

    def _test(self, kind: str, test: ast.expr) -> ast.expr:
        return self._hook("truth", test, self._site(kind, test))

    def _unsupported(self, node: ast.AST, what: str, hint: str) -> CompileError:
        loc = SourceLoc(self.filename, node.lineno, node.col_offset, getattr(node, "end_col_offset", None))  # type: ignore[attr-defined]
        if getattr(node, "end_lineno", None) != node.lineno:  # type: ignore[attr-defined]
            loc = SourceLoc(self.filename, node.lineno, node.col_offset, None)  # type: ignore[attr-defined]
        return CompileError(f"{what} is not supported in compiled code", loc, hint)

    def visit_Yield(self, node: ast.Yield) -> ast.AST:
        raise self._unsupported(node, "a generator (`yield`)", "return a tuple or list instead")

    def visit_YieldFrom(self, node: ast.YieldFrom) -> ast.AST:
        raise self._unsupported(node, "a generator (`yield from`)", "return a tuple or list instead")

    def visit_Try(self, node: ast.Try) -> ast.AST:
        if node.handlers:
            raise self._unsupported(
                node,
                "`try`/`except`",
                "errors of tensor operations happen when the compiled code runs and cannot be caught "
                "by code that ran at compile time; move the try outside the compiled function",
            )
        self.generic_visit(node)
        return node

    def visit_Global(self, node: ast.Global) -> ast.AST:
        raise self._unsupported(
            node,
            "writing a global variable",
            "Python side effects run once, at compile time; return the value instead",
        )

    # nested function definitions are converted as part of the enclosing one
    def visit_If(self, node: ast.If) -> ast.AST:
        self.generic_visit(node)
        node.test = self._test("if", node.test)
        return node

    def visit_While(self, node: ast.While) -> ast.AST:
        self.generic_visit(node)
        node.test = self._test("while", node.test)
        return node

    def visit_IfExp(self, node: ast.IfExp) -> ast.AST:
        self.generic_visit(node)
        node.test = self._test("conditional expression", node.test)
        return node

    def visit_Assert(self, node: ast.Assert) -> ast.AST:
        self.generic_visit(node)
        node.test = self._test("assert", node.test)
        return node

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.AST:
        self.generic_visit(node)
        kind = "and" if isinstance(node.op, ast.And) else "or"
        if any(_not_a_thunk(n) for v in node.values[1:] for n in ast.walk(v)):
            # a later operand binds a name or reads its frame: it cannot become a thunk
            node.values = [self._hook("boolop", v, self._site(kind, v)) for v in node.values[:-1]] + [
                node.values[-1]
            ]
            return node
        # hooks.and_/or_(site, first, lambda: second, ...): Python's short circuit for
        # Python values, a bool number for data-dependent ones (`not done and x.sum() > 0`)
        later = [ast.Lambda(_NO_ARGS, v) for v in node.values[1:]]
        call = self._hook(f"{kind}_", self._site(kind, node.values[0]), node.values[0], *later)
        return ast.copy_location(call, node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.op, ast.Not):
            return ast.copy_location(self._hook("not_", node.operand, self._site("not", node.operand)), node)
        return node

    def visit_For(self, node: ast.For) -> ast.AST:
        self.generic_visit(node)
        node.iter = self._hook("iterate", node.iter, self._site("for", node.iter))
        return node

    def visit_comprehension(self, node: ast.comprehension) -> ast.AST:
        self.generic_visit(node)
        node.iter = self._hook("iterate", node.iter, self._site("comprehension", node.iter))
        node.ifs = [self._test("comprehension condition", t) for t in node.ifs]
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == HOOKS:
            return node  # generated by control_flow.py
        if isinstance(node.func, ast.Name) and node.func.id in ("eval", "exec"):
            raise self._unsupported(
                node, f"`{node.func.id}`", "write the code out; compiled code is captured from its source"
            )
        if (
            isinstance(node.func, ast.Name)
            and node.func.id in _FRAME_SENSITIVE
            # vars(x) and dir(x) read x, not the frame: hooked, so that the read is guarded
            and not (node.func.id in ("vars", "dir") and node.args)
        ):
            if node.func.id == "super" and not node.args and self.has_class_cell and self.self_name:
                # zero-argument super() needs the compiler's implicit __class__ cell,
                # which a function compiled outside its class body does not get
                node.args = [ast.Name("__class__", ast.Load()), ast.Name(self.self_name, ast.Load())]
            return node
        site = self._site("call", node)
        new = ast.Call(
            ast.Attribute(ast.Name(HOOKS, ast.Load()), "call", ast.Load()),
            [site, node.func, *node.args],
            node.keywords,
        )
        return ast.copy_location(new, node)


def _place(node: ast.AST, line: int, end_line: int) -> None:
    for attr, value in (("lineno", line), ("end_lineno", end_line), ("col_offset", 0), ("end_col_offset", 0)):
        setattr(node, attr, value)


class ConversionError(Exception):
    pass


_CACHE: dict[types.CodeType, types.FunctionType] = {}
#: code of functions defined inside converted code: already converted, as part of the
#: enclosing function (their ``nonlocal`` names are locals of the compiled call)
_NESTED: set[types.CodeType] = set()


def _nested_codes(code: types.CodeType) -> None:
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _NESTED.add(const)
            _nested_codes(const)


def convert(fn: Any, hooks: Any) -> types.FunctionType:
    """The converted twin of ``fn`` (same globals, closure cells and defaults)."""
    code = fn.__code__
    if code in _NESTED:
        return fn  # type: ignore[no-any-return]
    cached = _CACHE.get(code)
    if cached is None:
        cached = _convert_code(fn)
        _CACHE[code] = cached
        _nested_codes(cached.__code__)
    cells = dict(zip(code.co_freevars, fn.__closure__ or ()))
    cells[CELLS] = types.CellType(dict(cells))  # outer reads go through hooks.free
    cells[HOOKS] = types.CellType(hooks)
    new_code = cached.__code__
    closure = tuple(cells[name] for name in new_code.co_freevars)
    out = types.FunctionType(new_code, fn.__globals__, fn.__name__, fn.__defaults__, closure)
    out.__kwdefaults__ = fn.__kwdefaults__
    out.__qualname__ = fn.__qualname__
    out.__dict__.update(fn.__dict__)
    out.__wrapped__ = fn  # type: ignore[attr-defined]
    return out


# [Note: source is verified]
# The text inspect/linecache return is the file as it is on disk now, which is not the
# code Python runs when the file was edited after import. Converting that text would
# compile the new text while eager runs the old code, so the text is first compiled as
# it stands (no rewriting) and compared with ``fn.__code__`` structurally: bytecode,
# constants (nested code objects alike), names, variables, argument counts, flags. Line
# numbers are not compared: an edit elsewhere that keeps the function where it was is
# harmless. A mismatch is a ConversionError, so the function runs unconverted, as one
# without source does (its globals and closure variables guarded whole).

#: CO_NESTED: set for a function compiled inside the check's factory, maybe not for the original
_CO_NESTED = 0x10
_FUTURE_FLAGS = 0
for _feature in __import__("__future__").all_feature_names:
    _FUTURE_FLAGS |= getattr(__import__("__future__"), _feature).compiler_flag


def same_code(a: types.CodeType, b: types.CodeType, *, name: bool = True) -> bool:
    """Do ``a`` and ``b`` do the same thing (see [Note: source is verified])?"""
    if (
        a.co_code != b.co_code
        or (name and a.co_name != b.co_name)
        or a.co_names != b.co_names
        or a.co_varnames != b.co_varnames
        or a.co_freevars != b.co_freevars
        or a.co_cellvars != b.co_cellvars
        or (a.co_argcount, a.co_posonlyargcount, a.co_kwonlyargcount)
        != (b.co_argcount, b.co_posonlyargcount, b.co_kwonlyargcount)
        or (a.co_flags & ~_CO_NESTED) != (b.co_flags & ~_CO_NESTED)
        or len(a.co_consts) != len(b.co_consts)
    ):
        return False
    for x, y in zip(a.co_consts, b.co_consts):
        if isinstance(x, types.CodeType) and isinstance(y, types.CodeType):
            if not same_code(x, y):
                return False
        elif type(x) is not type(y) or repr(x) != repr(y):  # repr: nan, -0.0, nested tuples
            return False
    return True


def _imported_names(filename: str) -> set[str]:
    """The names the module in ``filename`` binds by ``import`` in its own scope."""
    import linecache

    try:
        tree = ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return set()
    out: set[str] = set()
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in node.names if a.name != "*")
        todo.extend(ast.iter_child_nodes(node))
    return out


def _check_source(fn: Any, src: str, first: int) -> None:
    """Raise ConversionError when ``src`` (dedented, starting at line ``first``) does not
    compile to the code ``fn`` runs ([Note: source is verified])."""
    code = fn.__code__
    tree = ast.parse(src)
    fdef = tree.body[0]
    assert isinstance(fdef, (ast.FunctionDef, ast.AsyncFunctionDef))
    # renamed: inside the factory its own name would be a local, and a recursive call
    # would compile to a closure read instead of the global read the original does
    fdef.name = "__cuvil_checked__"
    # inside a factory whose locals are the free variables, so they stay free variables
    factory = ast.FunctionDef(
        name="__cuvil_check__",
        args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]),
        body=[*[ast.Assign([ast.Name(v, ast.Store())], ast.Constant(None)) for v in code.co_freevars], fdef],
        decorator_list=[],
        returns=None,
    )
    if sys.version_info >= (3, 12):
        factory.type_params = []
    # names the module binds by import: CPython compiles `F.relu(x)` differently for them
    imports = [ast.Import([ast.alias(n)]) for n in sorted(_imported_names(code.co_filename))]
    module = ast.Module([*imports, factory], type_ignores=[])
    ast.increment_lineno(tree, first - 1)
    ast.fix_missing_locations(module)
    try:
        compiled = compile(
            module, code.co_filename, "exec", flags=code.co_flags & _FUTURE_FLAGS, dont_inherit=True
        )
    except (SyntaxError, ValueError) as e:
        raise ConversionError(f"cannot compile the source of {fn.__qualname__}: {e}") from None
    outer = next(c for c in compiled.co_consts if isinstance(c, types.CodeType))
    found = [c for c in outer.co_consts if isinstance(c, types.CodeType) and c.co_name == fdef.name]
    if not any(same_code(c, code, name=False) for c in found):
        msg = (
            f"the source of {fn.__qualname__} in {code.co_filename} (line {code.co_firstlineno}) is not "
            "the code Python is running: the file changed after it was imported. Cuvil runs the "
            "function as it is in memory, unconverted (as a function without source: Python "
            "control flow on tensors is not captured); re-import the module to convert it again"
        )
        warnings.warn_explicit(msg, UserWarning, code.co_filename, code.co_firstlineno)
        raise ConversionError(msg)


def _convert_code(fn: Any) -> types.FunctionType:
    try:
        # the code object, not the function: inspect follows a decorator's __wrapped__
        # to the function it wraps, whose source is not this function's
        lines, first = inspect.getsourcelines(fn.__code__)
    except (OSError, TypeError) as e:
        raise ConversionError(f"source of {fn.__qualname__} is not available ({e})") from None
    raw = "".join(lines)
    src = textwrap.dedent(raw)
    indent = len(raw.splitlines()[0]) - len(src.splitlines()[0]) if raw.strip() else 0
    try:
        tree = ast.parse(src)
    except SyntaxError as e:
        raise ConversionError(f"cannot parse the source of {fn.__qualname__}: {e}") from None
    fdef = tree.body[0]
    if not isinstance(fdef, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise ConversionError(f"{fn.__qualname__} is not defined by a def statement (a lambda?)")
    if isinstance(fdef, ast.AsyncFunctionDef):
        raise ConversionError(f"{fn.__qualname__} is an async function")
    _check_source(fn, src, first)
    fdef.decorator_list = []
    # Default values come from the original function (``convert`` passes its
    # ``__defaults__``): their expressions may name locals of an enclosing function
    # that the factory below cannot see, so they are not evaluated again.
    fdef.args.defaults = [ast.copy_location(ast.Constant(None), d) for d in fdef.args.defaults]
    fdef.args.kw_defaults = [
        None if d is None else ast.copy_location(ast.Constant(None), d) for d in fdef.args.kw_defaults
    ]
    # Annotations are not evaluated again either: the factory's module is compiled without
    # the original's `from __future__ import annotations` and sees none of its globals,
    # so `x: torch.Tensor` would be a NameError there (the twin needs no annotations).
    fdef.returns = None
    a = fdef.args
    for arg in (
        *a.posonlyargs,
        *a.args,
        *a.kwonlyargs,
        *([a.vararg] if a.vararg else []),
        *([a.kwarg] if a.kwarg else []),
    ):
        arg.annotation = None
    for node in ast.walk(tree):  # undo the dedent in column numbers
        if isinstance(node, (ast.expr, ast.stmt, ast.arg, ast.keyword)):
            node.col_offset += indent
            if node.end_col_offset is not None:
                node.end_col_offset += indent
    ast.increment_lineno(tree, first - 1)
    filename = fn.__code__.co_filename
    first_param = fdef.args.posonlyargs[:1] or fdef.args.args[:1]
    rewriter = _Rewriter(filename, first_param[0].arg if first_param else None)
    rewriter.has_class_cell = "__class__" in fn.__code__.co_freevars
    ControlFlow(rewriter._site).function(fdef)
    ast.fix_missing_locations(fdef)
    rewrite_reads(fdef, fn.__code__.co_freevars, rewriter._site, rewriter._unsupported)  # type: ignore[arg-type]
    fdef = rewriter.visit(fdef)
    # The def gets a name no user code reads: inside the factory its own name would be
    # a local of the factory, and a recursive call would read that instead of the global.
    fdef.name = "__cuvil_fn__"
    # A factory whose locals are the original free variables (plus the hooks),
    # so the rewritten function closes over them as cells we supply.
    freevars = [*fn.__code__.co_freevars, HOOKS, CELLS]
    factory = ast.FunctionDef(
        name="__cuvil_factory__",
        args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]),
        body=[
            *[ast.Assign([ast.Name(v, ast.Store())], ast.Constant(None)) for v in freevars],
            fdef,
            ast.Return(ast.Name(fdef.name, ast.Load())),
        ],
        decorator_list=[],
        returns=None,
    )
    if sys.version_info >= (3, 12):
        factory.type_params = []
    # synthetic nodes sit on the def's first line; the rewritten def keeps its own
    _place(factory, first, getattr(fdef, "end_lineno", None) or first)
    for node in [*factory.body[:-2], factory.body[-1]]:
        for sub in ast.walk(node):
            _place(sub, first, first)
    module = ast.Module([factory], type_ignores=[])
    ast.fix_missing_locations(module)
    code = compile(module, filename, "exec", dont_inherit=True)
    namespace: dict[str, Any] = {}
    exec(code, {"__builtins__": __builtins__}, namespace)
    inner = namespace["__cuvil_factory__"]()
    inner.__code__ = inner.__code__.replace(co_name=fn.__name__, co_qualname=fn.__qualname__)
    return inner  # type: ignore[no-any-return]


__all__ = ["SITES", "ConversionError", "Site", "convert", "is_user_file", "is_user_frame", "is_user_function"]
