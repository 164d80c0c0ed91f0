"""``torch.compile(model, backend="cuvil")``: Cuvil as a Dynamo backend.

Dynamo hands a backend an FX ``GraphModule`` whose nodes call torch-level functions
(``torch._C._nn.linear``, ``operator.add``, ``x.view``) and the example inputs. Those
are exactly the calls Cuvil's tracer records, so the graph module is not converted op
by op: it is compiled like any other function, by ``cu.compile`` on a small function
that calls it. Running ``gm``'s generated code under the tracer yields Graph IR; guards,
the compile cache, targets and stats are ``cu.compile``'s own.

[Note: Dynamo's SymInt inputs] With ``dynamic=True`` Dynamo passes each symbolic size
as a graph input of its own (``s77: Sym(s77)``) besides the tensor it was read from
(``x: f32[s77, 4]``). Passed to Cuvil as a Python int, it would be a constant guarded
by value: a recompile for every batch size. So the compiled function takes only the
other inputs, and reads each such size back from a tensor dimension Dynamo's example
values say it equals (``x.shape[0]``): under the tracer that is a size symbol, so the
graph stays symbolic. Tensor dimensions carry Dynamo's symbol names (``dims``), so
sizes Dynamo knows equal are one Cuvil symbol. A SymInt no tensor dimension equals
(an ``int`` argument or attribute Dynamo made dynamic: a static cache's
``max_cache_len``) stays an argument, passed as a size symbol
(``arg_objects.SizeArg``, [Note: int attributes are sizes]), so a new value that
passes Cuvil's guards is no recompile on either side.

[Note: Dynamo's static sizes] With dynamic shapes Dynamo still keeps some sizes
static: parameters' and buffers' sizes, and sizes it specialized (an input's feature
dim that must equal a weight's). Its example values say which: a plain ``int`` there is
static. Cuvil keeps exactly those static too (``dims`` maps them to ``None``: a constant
in the graph, guarded per call) and the others symbolic, not all or nothing: static
weight and hidden sizes let Cuvil's rules decide (``Ne(hidden, 1)``) without guards and
its code generators see constants.

[Note: Dynamo's unspecialized scalars] A Python float Dynamo chose not to specialize
(an ``eps`` attribute, a float argument) reaches the graph as a 0-d float64 tensor
input whose value the graph reads with ``.item()``. Cuvil cannot know a float
tensor's value while tracing, so such an input is passed to the compiled function as
the Python number (read with ``.item()`` per call: specialized and guarded by value)
and the graph is rewritten to use it directly, one rule for every such input.

[Note: global state in Dynamo's graphs] Dynamo records some context managers as calls
that take no graph value and return nothing: ``torch.amp.autocast_mode._enter_autocast``
around an autocast block, ``torch._C._set_grad_enabled`` around ``no_grad``. Under
the tracer such a call would just run once, at capture, and its effect on the ops
between would be lost (autocast's dtypes: a wrong result). Grad and inference mode
change no value Cuvil computes (it computes without autograd), nor does API-usage
logging, so those run once at capture and no more; any other such call is refused,
with the user's line.

Nothing here imports ``torch._dynamo``: Dynamo calls this module, never the reverse.
"""

from __future__ import annotations

import inspect
import itertools
import linecache
import re
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cuvil.api import CompiledFunction, CuvilFallbackWarning
from cuvil.api import compile as cu_compile
from cuvil.errors import CompileError, SourceLoc
from cuvil.frontend.arg_objects import size_arg
from cuvil.frontend.tracer import Tracer

#: the ``options`` keys this backend reads itself; any other key is a target option
#: (``cuda_graphs`` on ``cuda``), checked by ``cu.compile`` like its own keywords
_OWN_OPTIONS = ("target", "opt_level", "fallback")

#: Dynamo's runtime assertion of a size fact (``torch._check(x.shape[0] > 1)``)
_ASSERT_SCALAR = torch.ops.aten._assert_scalar.default

#: calls that only set state no value Cuvil computes depends on: [Note: global state in
#: Dynamo's graphs]
_VALUE_NEUTRAL = frozenset(
    {
        torch._C._set_grad_enabled,
        torch._C._log_api_usage_once,
        torch.autograd.grad_mode._enter_inference_mode,
        torch.autograd.grad_mode._exit_inference_mode,
    }
)

#: the runners of the graphs Dynamo handed us that are still alive (Dynamo holds them
#: in its code cache), oldest first: what ``compiled_graphs()`` shows
_LIVE: weakref.WeakValueDictionary[int, _GraphRunner] = weakref.WeakValueDictionary()
_COUNT = itertools.count()


@dataclass(frozen=True, slots=True)
class _SizeFromDim:
    """A SymInt graph input read back from ``inputs[input_index].shape[axis]``."""

    input_index: int
    axis: int


@dataclass(frozen=True, slots=True)
class _Inputs:
    """How the graph's inputs are rebuilt from the compiled function's: per graph input,
    the dimension it is read from, or ``None`` for the next compiled-function input."""

    sources: tuple[_SizeFromDim | None, ...]

    def rebuild(self, inputs: Sequence[Any]) -> list[Any]:
        it = iter(inputs)
        return [next(it) if d is None else inputs[d.input_index].shape[d.axis] for d in self.sources]


class _GraphRunner:
    """What Dynamo calls with the graph's full input list: drops the SymInts that
    tensor dimensions carry and calls the compiled function with the rest."""

    __slots__ = ("__weakref__", "compiled", "ints", "keep", "numbers")

    def __init__(
        self, compiled: CompiledFunction, keep: tuple[int, ...], numbers: frozenset[int], ints: frozenset[int]
    ) -> None:
        self.compiled = compiled
        self.keep = keep
        #: inputs Dynamo passes as 0-d tensors that Cuvil takes as Python numbers
        self.numbers = numbers
        #: symbolic int inputs no tensor dimension carries: sizes for Cuvil too
        self.ints = ints

    def __call__(self, *args: Any) -> Any:
        if self.numbers or self.ints:
            return self.compiled(*_passed(args, self.keep, self.numbers, self.ints))
        return self.compiled(*[args[i] for i in self.keep])


def _passed(
    args: Sequence[Any], keep: Sequence[int], numbers: frozenset[int], ints: frozenset[int]
) -> list[Any]:
    """The compiled function's arguments from Dynamo's: 0-d tensors of unspecialized
    scalars as numbers, symbolic ints as sizes ([Note: Dynamo's SymInt inputs])."""
    return [args[i].item() if i in numbers else size_arg(args[i]) if i in ints else args[i] for i in keep]


def backend(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    options: dict[str, Any] | None = None,
    mode: str | None = None,
) -> Callable[..., Any]:
    """Compile a Dynamo graph with Cuvil (the ``cuvil`` entry of ``torch_dynamo_backends``).

    ``options``: ``target`` (default: the best available for the inputs' device),
    ``opt_level`` (0..3, default 2), ``fallback`` (``"error"``, the default: a graph
    Cuvil cannot compile fails Dynamo's compile with the reason; ``"eager"``: it runs
    as Dynamo captured it, with a ``CuvilFallbackWarning``), and the target's own
    options.
    """
    if mode is not None:
        raise TypeError(
            f"torch.compile(mode={mode!r}) is an Inductor setting; the cuvil backend takes "
            'options={"target": ..., "opt_level": ...} instead'
        )
    opts = dict(options or {})
    own = {k: opts.pop(k) for k in _OWN_OPTIONS if k in opts}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise CompileError(
            f"the graph has {len(placeholders)} inputs but Dynamo passed {len(example_inputs)} examples"
        )
    refused = _refused_call(gm)
    if refused is not None:
        if own.get("fallback", "error") != "eager":
            raise refused
        warnings.warn(
            f"cuvil: running a torch.compile graph eagerly: {refused.reason}",
            CuvilFallbackWarning,
            stacklevel=2,
        )
        return gm
    examples = [n.meta.get("example_value", ex) for n, ex in zip(placeholders, example_inputs)]
    numbers = _unspecialized_scalars(placeholders)
    if numbers or _ASSERT_SCALAR in {n.target for n in gm.graph.nodes}:
        gm = _for_the_tracer(gm, numbers)
    names = [n.name for n in placeholders]
    sizes = _sizes_from_dims(examples)
    keep = tuple(i for i in range(len(placeholders)) if i not in sizes)
    kept_at = {i: k for k, i in enumerate(keep)}
    plan = _Inputs(
        tuple(
            _SizeFromDim(kept_at[sizes[i].input_index], sizes[i].axis) if i in sizes else None
            for i in range(len(placeholders))
        )
    )

    # not converted (it is library code): its closure cells, ``gm`` and ``plan``, are
    # guarded by identity, which never changes
    def dynamo_graph(*inputs: Any) -> Any:
        tracer = Tracer.current()
        if tracer is not None:
            # every Dynamo graph runs this same code: the cache of captured variants
            # (cuvil/warm.py) must never serve one graph's capture for another's
            tracer.reads.storable = False
        return gm(*plan.rebuild(inputs))

    # what stats, warnings and Graph IR call it
    dynamo_graph.__name__ = dynamo_graph.__qualname__ = "torch_compile_graph"

    dynamo_graph.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(names[i], inspect.Parameter.POSITIONAL_ONLY) for i in keep]
    )
    dims = _dim_names(examples, names, keep)
    # static shapes from Dynamo (dynamic=False, or before automatic dynamic kicks in) are
    # static here too: Dynamo recompiles on a new size anyway; with dynamic shapes, each
    # size Dynamo keeps static (a plain int in its example: weight dims, the hidden size)
    # stays static too ([Note: Dynamo's static sizes])
    dynamic = bool(sizes) or any(any(isinstance(n, str) for n in d.values()) for d in dims.values())
    compiled = cu_compile(
        dynamo_graph,
        target=own.get("target"),
        opt_level=own.get("opt_level", 2),
        dynamic=dynamic,
        fallback=own.get("fallback", "error"),
        dims={k: v for k, v in dims.items() if v} if dynamic else None,
        **opts,
    )
    ints = frozenset(
        i for i in keep if dynamic and isinstance(examples[i], torch.SymInt) and not _static_size(examples[i])
    )
    concrete = _concrete(list(example_inputs), [i in numbers for i in range(len(example_inputs))])
    if concrete is not None:
        # compile now, so a graph Cuvil cannot run fails Dynamo's compile (a
        # BackendCompilerFailed naming the reason) instead of its first call
        compiled._prepare(tuple(_passed(concrete, keep, frozenset(), ints)), {})
    runner = _GraphRunner(compiled, keep, frozenset(numbers), ints)
    _LIVE[next(_COUNT)] = runner
    return runner


def compiled_graphs() -> list[CompiledFunction]:
    """The ``cu.compile`` results of the Dynamo graphs compiled so far that Dynamo still
    holds, oldest first: their ``stats`` (compiles, cache hits, recompile reasons) and
    ``graphs``."""
    return [r.compiled for r in list(_LIVE.values())]


def _refused_call(gm: torch.fx.GraphModule) -> CompileError | None:
    """The error for the first call in ``gm`` Cuvil must not trace, if any: a higher-order
    op (``torch.cond``, checkpoint's ``wrap``: its subgraphs are Dynamo's, not Python the
    tracer can run), or a call that only changes global state Cuvil does not model
    ([Note: global state in Dynamo's graphs]). Dynamo records such a call without an
    example value (it records one for every op it traces); a graph without example
    values (not from Dynamo) cannot be judged that way and is not."""
    nodes = list(gm.graph.nodes)
    from_dynamo = any("example_value" in n.meta for n in nodes)
    for i, node in enumerate(nodes):
        if node.op not in ("call_function", "call_method") or node.target in _VALUE_NEUTRAL:
            continue
        name = str(getattr(node.target, "__name__", node.target))
        # a call Dynamo inserted has no stack trace: the first op after it, inside its block
        loc = next((_user_loc(n) for n in nodes[i:] if n.meta.get("stack_trace")), None)
        fallback = 'options={"fallback": "eager"} runs such graphs as Dynamo captured them'
        if isinstance(node.target, torch._ops.HigherOrderOperator):
            return CompileError(
                f"torch.compile recorded the higher-order op `{name}`, which the cuvil backend does not run",
                loc,
                f"keep the condition or checkpointed code out of the compiled region; or {fallback}",
            )
        if from_dynamo and not node.all_input_nodes and "example_value" not in node.meta:
            cast = "autocast is not supported by Cuvil: cast explicitly (`x.to(torch.bfloat16)`); or "
            return CompileError(
                f"torch.compile recorded `{name}` in the graph; Cuvil does not model the state it "
                "sets for the ops that follow (near here)",
                loc,
                (cast if "autocast" in name else "") + fallback,
            )
    return None


def _user_loc(node: torch.fx.Node) -> SourceLoc | None:
    """The user's line a node was traced from (the innermost frame of Dynamo's stack trace)."""
    frames = re.findall(r'File "([^"]+)", line (\d+)', node.meta.get("stack_trace") or "")
    if not frames:
        return None
    file, line = frames[-1][0], int(frames[-1][1])
    text = linecache.getline(file, line)
    return SourceLoc(file, line, len(text) - len(text.lstrip()))


def _symbol_of(size: Any) -> Any:
    """The sympy symbol a ``torch.SymInt`` stands for, or ``None`` (an int, an expression)."""
    if not isinstance(size, torch.SymInt):
        return None
    expr = size.node.expr
    return expr if getattr(expr, "is_Symbol", False) else None


def _static_size(size: Any) -> bool:
    """Whether Dynamo's example size is a constant: an int, or a SymInt its ShapeEnv
    has since specialized (a guard ``Eq(s1, 4)`` made ``s1`` 4)."""
    if isinstance(size, int):
        return True
    if not isinstance(size, torch.SymInt):
        return False
    env = getattr(size.node, "shape_env", None)
    expr = env.replace(size.node.expr) if env is not None else size.node.expr
    return bool(getattr(expr, "is_number", False))


def _sizes_from_dims(examples: Sequence[Any]) -> dict[int, _SizeFromDim]:
    """The SymInt inputs a tensor input's dimension equals: [Note: Dynamo's SymInt inputs]."""
    where: dict[Any, _SizeFromDim] = {}
    for i, ex in enumerate(examples):
        if isinstance(ex, torch.Tensor):
            for axis, size in enumerate(ex.shape):
                sym = _symbol_of(size)
                if sym is not None:
                    where.setdefault(sym, _SizeFromDim(i, axis))
    out = {}
    for i, ex in enumerate(examples):
        sym = _symbol_of(ex)
        if sym is not None and sym in where:
            out[i] = where[sym]
    return out


def _dim_names(
    examples: Sequence[Any], names: Sequence[str], keep: Sequence[int]
) -> dict[str, dict[int, str | None]]:
    """Per kept tensor input, its dimensions: Dynamo's symbol name where it made the size
    symbolic, ``None`` (static) where its example holds a plain int. A size that is an
    expression of symbols (``2*s0``) is neither: Cuvil gives it a symbol of its own."""
    out: dict[str, dict[int, str | None]] = {}
    for i in keep:
        ex = examples[i]
        if isinstance(ex, torch.Tensor):
            axes: dict[int, str | None] = {}
            for axis, size in enumerate(ex.shape):
                sym = _symbol_of(size)
                if _static_size(size):
                    axes[axis] = None
                elif sym is not None:
                    axes[axis] = str(sym)
            out[names[i]] = axes
    return out


def _unspecialized_scalars(placeholders: Sequence[torch.fx.Node]) -> list[int]:
    """The inputs that are Python numbers Dynamo passes as 0-d tensors (its ``GraphArg``
    says so): [Note: Dynamo's unspecialized scalars]."""
    return [
        i for i, n in enumerate(placeholders) if getattr(n.meta.get("grapharg"), "pass_arg_as_tensor", False)
    ]


def _check_size_fact(cond: Any, message: str = "") -> None:
    """What ``aten._assert_scalar`` (Dynamo's ``torch._check``) becomes: under the tracer,
    deciding a size condition makes it an assumption of the graph, checked on every call
    (a call breaking it recompiles, and fails here like eager)."""
    if not cond:
        raise RuntimeError(message or "torch._check failed")


def _for_the_tracer(gm: torch.fx.GraphModule, numbers: Sequence[int]) -> torch.fx.GraphModule:
    """A copy of ``gm`` (Dynamo's own is left as it was: it may run it again to debug)
    taking those inputs as numbers, each ``.item()`` of one being the number itself and
    any other use a 0-d tensor made from it ([Note: Dynamo's unspecialized scalars]),
    and with Dynamo's runtime size assertions as ``_check_size_fact``."""
    graph = torch.fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    for node in graph.nodes:
        if node.target is _ASSERT_SCALAR:
            node.target = _check_size_fact
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for i in numbers:
        ph = placeholders[i]
        dtype = ph.meta["example_value"].dtype
        users = list(ph.users)
        tensor_uses = [u for u in users if not (u.op == "call_method" and u.target == "item")]
        if tensor_uses:
            with graph.inserting_after(ph):
                t = graph.call_function(torch.scalar_tensor, (ph,), {"dtype": dtype})
            for user in tensor_uses:
                user.replace_input_with(ph, t)
        for user in users:
            if user not in tensor_uses:
                user.replace_all_uses_with(ph)
                graph.erase_node(user)
    graph.lint()
    return torch.fx.GraphModule(gm, graph)


def _concrete(examples: Sequence[Any], as_number: Sequence[bool]) -> list[Any] | None:
    """Real values for the example inputs (a Python number where ``as_number``), or
    ``None`` when one has none (a fake tensor, a SymInt without a hint): then the first
    call compiles."""
    from torch._subclasses.fake_tensor import is_fake

    out = []
    for ex, number in zip(examples, as_number):
        if isinstance(ex, torch.Tensor):
            if is_fake(ex):
                return None
            out.append(ex.item() if number else ex)
        elif isinstance(ex, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            # the hint, not int(ex): that would add a guard to Dynamo's shape env
            hint = ex.node.hint
            if hint is None:
                return None
            out.append(hint)
        else:
            out.append(ex)
    return out
