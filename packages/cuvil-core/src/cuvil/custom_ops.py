"""``cu.custom_op("namespace::name")``: an operator declared once, from a torch reference.

::

    @cu.custom_op("mylib::scaled_gelu")
    def scaled_gelu(x: torch.Tensor, *, alpha: float = 1.0) -> torch.Tensor:
        return torch.nn.functional.gelu(x) * alpha

One declaration gives the op

* its Graph IR node, ``mylib::scaled_gelu``, whose region is its decomposition
  captured from the reference at each call's symbolic input types, so every target
  fuses it with its neighbours (:mod:`cuvil_ir.graph_ir.ops.composite`);
* its output types: those the captured region yields;
* an eager implementation (the reference), registered with torch
  (``torch.library``, ``CompositeImplicitAutograd``) as ``torch.ops.mylib.scaled_gelu``,
  so the same op runs in eager code and under ``torch.compile`` (which decomposes it
  into the reference's aten ops).

The signature is the op's schema: positional parameters are tensor operands,
keyword-only parameters with defaults are attributes (``bool``, ``int``,
``float``, ``str``), fixed per compiled artifact. The return annotation says
how many tensors it returns (``tuple[Tensor, Tensor]``; one by default).

Declaring a name again from the same module and function (a module or notebook
cell run again) replaces the definition; the captured region changes with it, so
every artifact compiled from the old one is recompiled (the region is in the
graph's text, which keys the caches). From anywhere else it is an error naming
both places.
"""

from __future__ import annotations

import functools
import inspect
import threading
import typing
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.overrides import handle_torch_function, has_torch_function

from cuvil.errors import CompileError, SourceLoc
from cuvil.frontend.composite import ATTR_TYPES, capture_rule, operands
from cuvil_ir.graph_ir.ops.composite import declare_custom_op
from cuvil_ir.graph_ir.registry import describe_origin

#: torch.library fragments, one per namespace (kept alive: dropping one unregisters it)
_LIBRARIES: dict[str, torch.library.Library] = {}
#: "ns::name" -> the op's current declaration (what the registered torch kernel calls)
_CURRENT: dict[str, CustomOp] = {}
_LOCK = threading.Lock()

_SCHEMA_TYPES = {bool: "bool", int: "int", float: "float", str: "str"}
#: the targets of Cuvil's own distributions: a lowering may name them where they are not installed
CUVIL_TARGETS = ("ascend", "cpu", "cuda")


def _where(fn: Callable[..., Any]) -> SourceLoc | None:
    code = getattr(fn, "__code__", None)
    return SourceLoc(code.co_filename, code.co_firstlineno, 0) if code is not None else None


class CustomOp:
    """A declared custom op; call it like the reference (eagerly, or in compiled code)."""

    def __init__(
        self,
        name: str,
        reference: Callable[..., Any],
        lower: Mapping[str, str],
        shape: Callable[..., Any] | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.name = name
        self.reference = reference
        #: ``shape(*operand_shapes, **attrs)``: the result's shape (a tuple of them for
        #: several results), for a reference Cuvil does not capture (``None``: captured)
        self.shape = shape
        self.dtype = dtype
        #: a capture has recorded the op (lowerings can no longer be added)
        self.compiled = False
        #: target name -> the op's native lowering there (an expression in its kernel language)
        self.lowerings = dict(sorted(lower.items()))
        self.__name__ = getattr(reference, "__name__", name.split("::")[-1])
        self.__qualname__ = getattr(reference, "__qualname__", self.__name__)
        self.__doc__ = reference.__doc__
        self.__wrapped__ = reference
        self.signature, self.tensors, self.attrs, self.returns = _schema_of(name, reference)
        self.schema = _schema_text(name, self)
        _check_lowerings(self)
        if shape is None:
            _check_convertible(self)

    # -- calls -------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tensors = operands(args)
        if tensors and has_torch_function(tensors):  # a capture (or another torch mode) is active
            return handle_torch_function(self, tensors, *args, **kwargs)
        ns, op = self.name.split("::")
        return getattr(getattr(torch.ops, ns), op)(*args, **kwargs)

    def lower(self, target: str, body: str | None = None) -> Any:
        """Add the native lowering of ``target`` (as ``lower=`` does): ``op.lower("cpu",
        "x * k")``, or ``@op.lower("cpu")`` on a function returning the text. Only before
        the op is first compiled: a function compiled earlier could not see it."""
        if body is None:

            def decorate(fn: Callable[[], str]) -> Callable[[], str]:
                self.lower(target, fn())
                return fn

            return decorate
        with _LOCK:
            if self.compiled:
                raise CompileError(
                    f"custom op {self.name}: a lowering for {target!r} added after the op was compiled; "
                    "what was compiled before would keep its old code",
                    _where(self.reference),
                    "declare lowerings with the op (cu.custom_op(..., lower={...})) or right after it",
                )
            previous = self.lowerings
            self.lowerings = dict(sorted({**previous, target: body}.items()))
            try:
                _check_lowerings(self)
            except CompileError:
                self.lowerings = previous
                raise
            _declare(self, replace=True)
        return self

    def bind(self, *args: Any, **kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
        """Split a call into its tensor operands and its attributes (defaults filled)."""
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return [bound.arguments[p] for p in self.tensors], {a: bound.arguments[a] for a in self.attrs}

    def __repr__(self) -> str:
        return f"<cuvil custom op {self.name}: {self.schema}>"


def _schema_of(
    name: str, fn: Callable[..., Any]
) -> tuple[inspect.Signature, tuple[str, ...], tuple[str, ...], int]:
    loc = _where(fn)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise CompileError(f"custom op {name}: cannot read the reference's signature: {e}", loc) from None
    tensors: list[str] = []
    attrs: list[str] = []
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty:
            tensors.append(p.name)
        elif p.kind is p.KEYWORD_ONLY and p.default is not p.empty and isinstance(p.default, ATTR_TYPES):
            attrs.append(p.name)
        else:
            raise CompileError(
                f"custom op {name}: parameter {p.name!r} is neither a tensor operand (positional, no "
                "default) nor an attribute (keyword-only, with a bool, int, float or str default)",
                loc,
                f"write the reference as `def {getattr(fn, '__name__', 'f')}(x, y, *, alpha=1.0)`",
            )
    if not tensors:
        raise CompileError(f"custom op {name}: the reference takes no tensor operand", loc)
    returns = 1
    try:
        hint = typing.get_type_hints(fn).get("return")
    except Exception:  # unresolvable annotations: one tensor, the default
        hint = None
    if typing.get_origin(hint) is tuple:
        returns = len(typing.get_args(hint))
    return sig, tuple(tensors), tuple(attrs), returns


def _check_convertible(op: CustomOp) -> None:
    """What the capture could never trace is an error at the declaration, located: the
    reference's source is converted now (as it will be at each call), and a construct
    compiled code cannot hold (``try``, a generator, a ``global`` write ...) raises here.
    A reference without source (a builtin) is captured as it runs, which is fine."""
    from cuvil.frontend import hooks
    from cuvil.frontend.convert import ConversionError, convert, is_user_function

    if not is_user_function(op.reference):
        return
    try:
        convert(op.reference, hooks)
    except ConversionError:
        pass
    except CompileError as e:
        raise CompileError(
            f"custom op {op.name}: its reference cannot be captured: {e.message}", e.loc, e.hint
        ) from None


def _check_lowerings(op: CustomOp) -> None:
    if not op.lowerings:
        return
    from cuvil_runtime.registry import REGISTRY as TARGETS

    loc = _where(op.reference)
    # an op library ships lowerings for Cuvil's own targets whether or not they are installed
    known = sorted(set(TARGETS.names()) | set(CUVIL_TARGETS))
    for target, body in op.lowerings.items():
        if target not in known:
            raise CompileError(
                f"custom op {op.name}: a lowering for target {target!r}, which no installed distribution "
                f"registers; the targets are {', '.join(known)}",
                loc,
            )
        if not target.isidentifier() or not isinstance(body, str) or not body.strip():
            raise CompileError(
                f"custom op {op.name}: the lowering for {target!r} must be expression text", loc
            )
    if op.returns != 1:
        raise CompileError(
            f"custom op {op.name}: a native lowering makes one result, the op makes {op.returns}", loc
        )
    for a in op.attrs:
        default = op.signature.parameters[a].default
        if isinstance(default, (bool, str)):
            raise CompileError(
                f"custom op {op.name}: a native lowering takes numeric attributes; {a!r} is a "
                f"{type(default).__name__}",
                loc,
            )


def _schema_text(name: str, op: CustomOp) -> str:
    params = [f"Tensor {t}" for t in op.tensors]
    if op.attrs:
        params.append("*")
        for a in op.attrs:
            default = op.signature.parameters[a].default
            params.append(f"{_SCHEMA_TYPES[type(default)]} {a}={default!r}")
    out = "Tensor" if op.returns == 1 else "(" + ", ".join(["Tensor"] * op.returns) + ")"
    return f"{name.split('::')[1]}({', '.join(params)}) -> {out}"


class ContractError(CompileError):
    """A custom op declared with ``shape=`` (and ``dtype=``) whose reference returned
    something else: raised where the reference ran, before anything reads the result
    (a kernel sized by the declaration would read past the real buffer)."""


def _kernel(name: str) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        current = _CURRENT[name]
        out = current.reference(*args, **kwargs)
        if current.shape is not None:
            tensors, attrs = current.bind(*args, **kwargs)
            _check_result(current, tensors, attrs, out)
        return out

    return run


def _checked_reference(op: CustomOp) -> Callable[..., Any]:
    """What compiled code runs for ``op`` (the reference target, an extern call where a
    target has no native lowering): its reference, whose result an op declared with
    ``shape=`` checks against the declaration (the declared shapes for the operands'
    sizes, dtype and device: tuple comparisons) before any kernel reads it."""
    reference, shape, dtype = op.reference, op.shape, op.dtype
    if shape is None:  # the result types are the captured region's
        return reference
    if op.returns > 1:

        @functools.wraps(reference)
        def run_several(*tensors: Any, **attrs: Any) -> Any:
            out = reference(*tensors, **attrs)
            _check_result(op, tensors, attrs, out)
            return out

        return run_several

    @functools.wraps(reference)
    def run(*tensors: Any, **attrs: Any) -> Any:
        out = reference(*tensors, **attrs)
        first = tensors[0]
        if not (
            isinstance(out, torch.Tensor)
            and out.shape == tuple(shape(*[tuple(t.shape) for t in tensors], **attrs))
            and out.dtype == (dtype or first.dtype)
            and out.device == first.device
        ):
            _check_result(op, tensors, attrs, out)  # raises, unless a 1-tuple that is right
        return out

    return run


def _check_result(op: CustomOp, tensors: Any, attrs: dict[str, Any], out: Any) -> None:
    expected = _shapes(op, [tuple(t.shape) for t in tensors], attrs)
    first = tensors[0]
    dtype, device = op.dtype or first.dtype, first.device
    results = out if op.returns > 1 and type(out) is tuple else (out,)
    if op.returns == 1 and type(out) is tuple and len(out) == 1:
        results = out  # a 1-tuple, as an op with one result may return
    if len(results) == len(expected) and all(
        isinstance(r, torch.Tensor) and r.shape == s and r.dtype == dtype and r.device == device
        for r, s in zip(results, expected)
    ):
        return
    raise _contract_error(op, tensors, results, expected, dtype, device)


def _contract_error(
    op: CustomOp,
    tensors: Any,
    results: Any,
    expected: list[tuple[Any, ...]],
    dtype: torch.dtype,
    device: torch.device,
) -> ContractError:
    def desc(shape: Any, dt: Any, dev: Any) -> str:
        return f"shape {tuple(shape)}, dtype {dt}, device {dev}"

    ins = ", ".join(f"{n} {tuple(t.shape)}" for n, t in zip(op.tensors, tensors))
    declared = "shape=, " + ("dtype=" if op.dtype is not None else "the first operand's dtype")
    if len(results) != len(expected):
        got = ", ".join(type(r).__name__ for r in results)
        what = f"the declaration says {len(expected)} results, the reference returned {len(results)} ({got})"
    else:
        wrong = []
        for k, (r, s) in enumerate(zip(results, expected)):
            name = "the result" if len(expected) == 1 else f"result {k}"
            if not isinstance(r, torch.Tensor):
                wrong.append(f"{name}: expected a tensor of {desc(s, dtype, device)}, got {type(r).__name__}")
            elif (r.shape, r.dtype, r.device) != (s, dtype, device):
                wrong.append(
                    f"{name}: expected {desc(s, dtype, device)} (from {declared}), "
                    f"got {desc(r.shape, r.dtype, r.device)}"
                )
        what = "; ".join(wrong)
    return ContractError(
        f"custom op {op.name}: its reference's result disagrees with the declaration "
        f"for operands {ins}: {what}",
        _where(op.reference),
        "make shape= return the reference's result shape(s) for the operands' shapes, and dtype= its dtype "
        "(default: the first operand's); compiled code sizes its buffers from the declaration",
    )


def _register_with_torch(op: CustomOp) -> None:
    """A captured reference is torch code: ``CompositeImplicitAutograd`` (torch.compile
    traces it). One declared with a shape function may be anything: an opaque kernel
    (``CompositeExplicitAutograd``) whose fake implementation is the shape function."""
    ns, short = op.name.split("::")
    lib = _LIBRARIES.get(ns)
    if lib is None:
        lib = _LIBRARIES[ns] = torch.library.Library(ns, "FRAGMENT")
    lib.define(op.schema)
    if op.shape is None:
        lib.impl(short, _kernel(op.name), "CompositeImplicitAutograd")
        return
    lib.impl(short, _kernel(op.name), "CompositeExplicitAutograd")

    def fake(*args: Any, **kwargs: Any) -> Any:
        current = _CURRENT[op.name]
        tensors, attrs = current.bind(*args, **kwargs)
        shapes = _shapes(current, [tuple(t.shape) for t in tensors], attrs)
        dt = current.dtype or tensors[0].dtype
        outs = tuple(tensors[0].new_empty(s, dtype=dt) for s in shapes)
        return outs[0] if current.returns == 1 else outs

    torch.library.register_fake(op.name, fake, lib=lib)


def _shapes(op: CustomOp, shapes: list[tuple[Any, ...]], attrs: dict[str, Any]) -> list[tuple[Any, ...]]:
    """The shape function's answer as one shape per result."""
    assert op.shape is not None
    out = op.shape(*shapes, **attrs)
    return [tuple(s) for s in out] if op.returns > 1 else [tuple(out)]


def _infer(op: CustomOp) -> Callable[..., Any]:
    """The Graph IR shape rule of an op declared with a shape function."""

    def infer(ctx: Any, *inputs: Any, **attrs: Any) -> Any:
        from cuvil_ir.graph_ir.types import DType, TensorType

        first = inputs[0]
        dt = DType.from_torch(op.dtype) if op.dtype is not None else first.dtype
        types = tuple(TensorType(dt, s, first.device) for s in _shapes(op, [t.shape for t in inputs], attrs))
        return types[0] if op.returns == 1 else types

    return infer


def custom_op(
    name: str,
    *,
    lower: Mapping[str, str] | None = None,
    shape: Callable[..., Any] | None = None,
    dtype: torch.dtype | None = None,
) -> Callable[[Callable[..., Any]], CustomOp]:
    """Declare the operator ``name`` (``"namespace::name"``) from the decorated torch
    reference; ``lower`` maps target names to native lowerings that replace the
    decomposition there (elementwise ops: an expression of the operands and attributes
    in the target's kernel language). With ``shape`` (and ``dtype``, default the first
    operand's) the reference is not captured: the op runs it as a call (or a native
    lowering), its result shape from ``shape(*operand_shapes, **attrs)``. See the module
    documentation."""
    if (
        not isinstance(name, str)
        or name.count("::") != 1
        or not all(p.isidentifier() for p in name.split("::"))
    ):
        raise ValueError(f"cu.custom_op: the name is 'namespace::name' (identifiers), got {name!r}")

    def decorate(fn: Callable[..., Any]) -> CustomOp:
        op = CustomOp(name, fn, lower or {}, shape, dtype)
        with _LOCK:
            old = _CURRENT.get(name)
            again = old is not None and _same_definer(old.reference, fn)
            if old is not None and not again:
                raise CompileError(
                    f"custom op {name} is declared twice: by {describe_origin(old.reference.__module__)} "
                    f"at {_where(old.reference)} and by {describe_origin(fn.__module__)}; one name, one "
                    "declaration",
                    _where(fn),
                    "rename one of them (the namespace keeps libraries apart)",
                )
            if again and old is not None and (old.schema, old.shape is None) != (op.schema, shape is None):
                raise CompileError(
                    f"custom op {name}: its signature changed ({old.schema} -> {op.schema}); "
                    "torch keeps the first registration for the life of the process",
                    _where(fn),
                    "restart the process to change an op's signature",
                )
            if not again:
                _register_with_torch(op)
            _declare(op, replace=again)
            _CURRENT[name] = op
        return op

    return decorate


def _declare(op: CustomOp, *, replace: bool) -> None:
    """Register (or register again) ``op``'s Graph IR declaration and capture rule."""
    ns, short = op.name.split("::")
    packet = getattr(getattr(torch.ops, ns), short)
    # calls of the op object and of torch.ops.<ns>.<name> are captured alike
    callables = (op, packet, packet.default)

    def used() -> None:
        op.compiled = True

    rule = capture_rule(
        op.name,
        op.reference,
        op.bind,
        dict(op.lowerings),
        captured=op.shape is None,
        used=used,
        current=functools.partial(_CURRENT.get, op.name),
    )
    declare_custom_op(
        op.name,
        _checked_reference(op),
        op.attrs,
        operands=op.tensors,
        lowerings=tuple(op.lowerings),
        infer=None if op.shape is None else _infer(op),
        results=op.returns,
        torch_callables=callables,
        capture=rule,
        replace=replace,
    )


def _same_definer(a: Callable[..., Any], b: Callable[..., Any]) -> bool:
    return (getattr(a, "__module__", None), getattr(a, "__qualname__", None)) == (
        getattr(b, "__module__", None),
        getattr(b, "__qualname__", None),
    )


def custom_ops() -> dict[str, CustomOp]:
    """Every op declared with :func:`custom_op` in this process, by name."""
    return dict(_CURRENT)


__all__ = ["ContractError", "CustomOp", "custom_op", "custom_ops"]
