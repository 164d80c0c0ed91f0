"""The per-call path of every Tensor IR target: a generated Python function per
program that binds sizes, takes arena slices, launches the backend's kernels, makes
extern torch calls and runs ``if``/``for``/``while`` regions.

The backend supplies only how to launch each kernel (a :class:`~cuvil_runtime.target.Launch`:
a callable and the order of its arguments) and which function runs an extern call;
the arena from the memory plan, size binding, RNG seeds, results that must not
alias the arena and control flow are the same for every target.

Everything that depends only on the sizes (arena views and their addresses,
derived kernel arguments, extern attributes) is computed once per size binding
and kept in a small per-thread table, so two threads never share an arena. The
generated source is kept on the runner (``ProgramRunner.source``) and is the
``wrapper`` stage.

This module generates the wrapper; what one size binding fixes is made by
:mod:`cuvil_runtime.size_plan`, and the helpers the generated code calls (owned
extern results, seeds, the region runners of ``if``/``for``/``while``) are in
:mod:`cuvil_runtime.wrapper_calls`.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

import sympy
import torch

from cuvil_ir.graph_ir import in_place
from cuvil_ir.graph_ir.aliases import output_aliases
from cuvil_ir.graph_ir.registry import REGISTRY
from cuvil_ir.graph_ir.types import DType, TensorType
from cuvil_ir.symbolic import EXACT_NAMESPACE, exact_code, symbol
from cuvil_ir.tensor_ir import expr as E
from cuvil_ir.tensor_ir.memory import data_sizes
from cuvil_ir.tensor_ir.program import Control, Extern, Kernel, ScalarRef, TensorProgram, View
from cuvil_runtime import native_runs
from cuvil_runtime.executor import evaluate_attr
from cuvil_runtime.size_plan import PlanMaker, SizePlan, add_symbols, is_late, kernel_value, program_symbols
from cuvil_runtime.target import Launch, ProgramHooks
from cuvil_runtime.wrapper_calls import (
    draw_seed,
    expanded,
    late_attr,
    late_attrs,
    one,
    own,
    region_call,
    zero_division,
)

#: size bindings whose plans are kept per thread and program
_PLANS_KEPT = 32


class ProgramRunner:
    """A compiled :class:`TensorProgram`: call it with the graph inputs (and, for a loop
    body, the loop index binding) to get the flat outputs."""

    def __init__(
        self,
        program: TensorProgram,
        launches: dict[str, Launch],
        backend: ProgramHooks,
        strided: Callable[[], ProgramRunner] | None = None,
    ) -> None:
        """``launches`` holds every kernel of ``program`` and of its regions, by name.

        ``strided``: makes the runner of the same graph lowered with strided inputs,
        which a call with a non-contiguous tensor input runs instead (see [Note: strided
        inputs]); ``None``: such an input is copied to a contiguous tensor."""
        self.program = program
        self.backend = backend
        self._strided_factory = strided
        self._strided: ProgramRunner | None = None
        self._strided_lock = threading.Lock()
        self.kernels = {s.name: launches[s.name] for s in program.steps if isinstance(s, Kernel)}
        self.regions = {
            s.name: [ProgramRunner(r, launches, backend) for r in s.regions]
            for s in program.steps
            if isinstance(s, Control)
        }
        self._local = threading.local()
        #: sizes computed from tensor data, per step that binds them (see [Note: sizes
        #: from data] below); the plan of a call is keyed by the other symbols
        self.data_sizes = data_sizes(program)
        self.late = {b.symbol for binds in self.data_sizes.values() for b in binds}
        self.symbols = tuple(s for s in program_symbols(program) if s not in self.late)
        #: outputs allocated with sizes the plan computes (see ``_generate``)
        self._alloc_in_plan: list[str] = []
        #: whether the generated code reads the bindings passed in (``_b``): a symbol no
        #: input's shape binds, or a region that does
        self.reads_bindings = False
        #: per graph output, the view it is of an input or another output (see [Note:
        #: output aliasing] in cuvil_ir.graph_ir.aliases); None: all are computed
        self.aliases = _aliases(program)
        #: the plans' numbers from one generated function ([Note: compiled size plans])
        self._plans = PlanMaker(program, self.kernels, self.late, self._alloc_in_plan, self.symbols)
        #: the wrapper's native runs ([Note: native runs] in cuvil_runtime.native_runs)
        self.runs: list[native_runs.Run] = []
        self.source, self._run = self._generate()

    def __call__(self, *inputs: Any) -> tuple[Any, ...]:
        return self._run({}, *inputs)  # type: ignore[no-any-return]

    def run(self, bindings: dict[str, int], *inputs: Any) -> tuple[Any, ...]:
        return self._run(bindings, *inputs)  # type: ignore[no-any-return]

    def run_strided(self, bindings: dict[str, int], *inputs: Any) -> tuple[Any, ...]:
        """The call, by the runner whose kernels read the inputs by their strides (made,
        lowered and built on the first call that needs it)."""
        runner = self._strided
        if runner is None:
            assert self._strided_factory is not None
            with self._strided_lock:
                if self._strided is None:
                    self._strided = self._strided_factory()
                runner = self._strided
        return runner._run(bindings, *inputs)  # type: ignore[no-any-return]

    # -- per binding ------------------------------------------------------------------
    def plan(self, key: tuple[int, ...]) -> SizePlan:
        # the hit is one attribute read and one dict lookup (try costs nothing in 3.11)
        try:
            return self._local.plans[key]  # type: ignore[no-any-return]
        except (AttributeError, KeyError):
            pass
        plans: dict[tuple[int, ...], SizePlan] = self._local.__dict__.setdefault("plans", {})
        if len(plans) >= _PLANS_KEPT:
            plans.pop(next(iter(plans)))
        p = plans[key] = self._make_plan(dict(zip(self.symbols, key)))
        return p

    def _make_plan(self, b: dict[sympy.Symbol, int]) -> SizePlan:
        return self._plans(b)

    def _is_late(self, x: Any) -> bool:
        """``x`` (an expression or attribute tree) uses a size computed from tensor data."""
        return is_late(x, self.late)

    def native_plan(self, p: SizePlan, key: tuple[int, ...]) -> list[Any]:
        """The native runs' tables for the plan ``p`` of the binding ``key``: none at its first
        call (each step from Python), made at its second and kept ([Note: native runs])."""
        if not p.native_seen:
            p.native_seen = True
            return [None] * len(self.runs)
        made = [native_runs.make_tables(run, self.program, p, self.symbols, key) for run in self.runs]
        p.native = made
        return made

    @staticmethod
    def native_failed(tables: native_runs.Tables, failed: int) -> None:
        native_runs.failure(tables, failed, zero_division)

    def _native_steps(self) -> dict[int, native_runs.Step]:
        """The steps that may be in a native run, by index ([Note: native runs])."""
        prog = self.program
        native_extern = getattr(self.backend, "native_extern", None)
        found: dict[int, native_runs.Step] = {}
        planned = prog.plan.slot_of

        def placed(name: str) -> bool:  # (an input, an output or an arena buffer: not sized by data)
            kind = prog.buffers[name].kind
            return kind in ("input", "output") or name in planned

        for i, step in enumerate(prog.steps):
            if isinstance(step, Kernel):
                launch = self.kernels[step.name]
                late = self._is_late((*launch.sizes, *(e for e, _ in launch.derived)))
                late = late or self._is_late(tuple(prog.buffers[step.buf].shape))
                if placed(step.buf) and native_runs.kernel_native(launch, late):
                    found[i] = native_runs.Step(step.name, launch=launch)
            elif isinstance(step, Extern) and step.into and native_extern is not None:
                ne = native_extern(step.node.op)
                if (
                    ne is None
                    # (an input may be any earlier result: each is bound in its buffer's layout)
                    or not all(isinstance(o, View) for o in step.inputs)
                    or not all(placed(o) for o in step.outputs)
                    or self._is_late(step.node.attrs)
                    or self._is_late(tuple((*o.shape, *o.strides, o.offset) for o in step.inputs))  # type: ignore[union-attr]
                    or self._is_late(tuple(tuple(prog.buffers[o].shape) for o in step.outputs))
                ):
                    continue
                found[i] = native_runs.Step(step.name, extern=step, native=ne)
            elif isinstance(step, Extern) and native_extern is not None and self._writes_input(step):
                # an overwrite of an argument in place: its result is that argument
                ne = native_extern(step.node.op)
                if ne is not None and not self._is_late(step.node.attrs):
                    found[i] = native_runs.Step(step.name, extern=step, native=ne, in_place=True)
        return found

    def _writes_input(self, step: Extern) -> bool:
        """Whether ``step`` is a functional extern call marked to overwrite a whole input of the
        program in place ([Note: updates in place]), its other operands views of sizes known
        before it runs: the one kind of functional extern a native run may hold."""
        prog = self.program
        attrs = dict(step.node.attrs)
        i = attrs.get("mutates")
        if attrs.get("in_place") is not True or type(i) is not int or len(step.outputs) != 1:
            return False
        if not all(isinstance(o, View) for o in step.inputs) or not 0 <= i < len(step.inputs):
            return False
        target = step.inputs[i]
        assert isinstance(target, View)
        buf = prog.buffers[target.buf]
        whole = (
            buf.kind == "input"
            and tuple(target.shape) == tuple(buf.shape)
            and tuple(target.strides) == tuple(buf.strides)
            and target.offset == 0
        )
        sizes = tuple((*o.shape, *o.strides, o.offset) for o in step.inputs)  # type: ignore[union-attr]
        return (
            whole
            and not self._is_late(sizes)
            and not self._is_late(tuple(prog.buffers[step.outputs[0]].shape))
        )

    def _native_runs(self) -> list[list[tuple[int, native_runs.Step]]]:
        """Consecutive steps of :meth:`_native_steps`, with their indices (runs of two steps
        or more, or with an extern: a run of one kernel is one call either way)."""
        runner = getattr(self.backend, "step_runner", None)
        if runner is None or not native_runs.enabled():
            return []
        steps = self._native_steps()
        runs: list[list[int]] = []
        for i in range(len(self.program.steps)):
            if i not in steps:
                continue
            if runs and runs[-1][-1] == i - 1:
                runs[-1].append(i)
            else:
                runs.append([i])
        kept = [[(i, steps[i]) for i in r] for r in runs if len(r) >= 2 or steps[r[0]].extern is not None]
        # (the step runner is built, once per kernel cache, only for a program that has a run)
        return kept if kept and runner() is not None else []

    # -- code generation ----------------------------------------------------------------
    def _generate(self) -> tuple[str, Callable[..., Any]]:
        prog = self.program
        ns: dict[str, Any] = {
            "torch": torch,
            "_own": own,
            "_draw_seed": draw_seed,
            **EXACT_NAMESPACE,  # math, Fraction: what exact_code's sizes use
            "_self": self,
            "_as_strided": torch.as_strided,
            "_value": kernel_value,
            "_late_attrs": late_attrs,
            "_late_attr": late_attr,
            "_sym": symbol,
            "_empty_cpu": _empty_cpu,
        }
        # (cpu is torch's default: no device argument on the per-call path)
        dev = "" if prog.device == "cpu" else f", device={prog.device!r}"
        lines: list[str] = []
        args = ", ".join(f"v_{i.name}" for i in prog.inputs)
        lines.append(f"def run(_b, {args}):" if args else "def run(_b):")
        body: list[str] = []
        bound: set[sympy.Symbol] = set()
        dense = [i.name for i in prog.inputs if i.is_tensor and prog.buffers[i.name].given is None]
        if dense and self._strided_factory is not None:
            # see [Note: strided inputs]: an expanded input runs the strided program,
            # another non-contiguous one is copied for the dense kernels
            ns["_expanded"] = expanded
            test = " and ".join(f"v_{n}.is_contiguous()" for n in dense)
            body.append(f"if not ({test}):")
            either = " or ".join(f"_expanded(v_{n})" for n in dense)
            body.append(f"    if {either}: return _self.run_strided(_b, {args})")
            for n in dense:
                body.append(f"    if not v_{n}.is_contiguous(): v_{n} = v_{n}.contiguous()")
        for i in prog.inputs:
            if not i.is_tensor:
                continue
            buf = prog.buffers[i.name]
            if buf.given is not None:
                st = {k: f"s_{d.name}" for k, d in enumerate(buf.given) if isinstance(d, sympy.Symbol)}
                bound.update(d for d in buf.given if isinstance(d, sympy.Symbol))
                if st:
                    names = ", ".join(st.get(k, "_") for k in range(len(buf.given)))
                    body.append(f"{names}, = v_{i.name}.stride()")
            elif self._strided_factory is None:
                body.append(f"if not v_{i.name}.is_contiguous(): v_{i.name} = v_{i.name}.contiguous()")
            binds = {}
            for k, d in enumerate(buf.shape):
                if isinstance(d, sympy.Symbol) and d not in bound:
                    binds[k] = f"s_{d.name}"
                    bound.add(d)
            if len(binds) == 1:
                ((k, var),) = binds.items()
                body.append(f"{var} = v_{i.name}.shape[{k}]")
            elif binds:  # one torch.Size for all (its rank is the buffer's: the guards checked)
                names = ", ".join(binds.get(k, "_") for k in range(len(buf.shape)))
                body.append(f"{names}, = v_{i.name}.shape")
        for s in self.symbols:
            if s not in bound:
                body.append(f"s_{s.name} = _b[{s.name!r}]")
                self.reads_bindings = True
        for seed in prog.seeds:  # one draw per call from torch's generator (torch.manual_seed)
            body.append(f"v_{seed} = _draw_seed()")
        key = ", ".join(f"s_{s.name}" for s in self.symbols)
        plan_at = len(body)
        body.append(f"_p = _self.plan(({key}{',' if len(self.symbols) == 1 else ''}))")
        known = list(self.symbols)  # symbols with a value at this point of the call
        ptr: dict[str, str] = {}
        tensor: dict[str, str] = {}
        for i in prog.inputs:
            if i.is_tensor:
                tensor[i.name] = f"v_{i.name}"
                ptr[i.name] = f"v_{i.name}.data_ptr()"
        for name in prog.plan.slot_of:
            tensor[name] = f"_p.temps[{name!r}]"
            ptr[name] = f"_p.ptrs[{name!r}]"

        def tuple_code(dims: Any) -> str:
            return "(" + "".join(f"{self._size_code(d)}, " for d in dims) + ")"

        def empty_code(buf_name: str, dev: str) -> str:
            # An output is allocated on every call. On cpu: torch's own allocation
            # without the argument parsing (``_empty_cpu``, about 0.9 us less than
            # torch.empty); sizes that are expressions (``floor(x_2/2)``, exact
            # arithmetic) come from the plan, computed once per size binding.
            b = prog.buffers[buf_name]
            if dev or b.order is not None:
                # sizes as separate arguments: torch.empty parses them about 0.7 us
                # faster than one tuple
                sizes = ", ".join(self._size_code(d) for d in b.shape) if b.shape else "()"
                return f"torch.empty({sizes}, dtype=torch.{_tname(b.dtype)}{dev})"
            dtype = f"torch.{_tname(b.dtype)}"
            dims = [sympy.sympify(d) for d in (*b.shape, *b.strides)]
            if self._is_late(tuple(b.shape)) or all(d.is_Integer or d.is_Symbol for d in dims):
                return f"_empty_cpu({tuple_code(b.shape)}, {tuple_code(b.strides)}, {dtype})"
            if buf_name not in self._alloc_in_plan:
                self._alloc_in_plan.append(buf_name)
            return f"_empty_cpu(*_p.alloc[{buf_name!r}], {dtype})"

        def attrs_code(step: Extern) -> str:
            if not self._is_late(step.node.attrs):
                return f"_p.attrs[{step.name!r}]"
            ns[f"_a_{step.name}"] = step.node.attrs
            items = ", ".join(f"_sym({s.name!r}): s_{s.name}" for s in known)
            return f"_late_attrs(_a_{step.name}, {{{items}}})"

        def operand(o: Any) -> str:
            if isinstance(o, ScalarRef):
                return self._scalar_code(o.value)
            assert isinstance(o, View)
            base = tensor[o.buf]
            b = prog.buffers[o.buf]
            if (
                tuple(o.shape) == tuple(b.shape)
                and o.offset == 0
                and all(
                    # (equal as written first: expand is most of a warm start's wrapper generation)
                    d == 1 or s == c or sympy.expand(sympy.sympify(s) - c) == 0
                    for d, s, c in zip(o.shape, o.strides, b.strides)
                )
            ):
                return base
            shp = "(" + "".join(f"{self._size_code(d)}, " for d in o.shape) + ")"
            st = "(" + "".join(f"{self._size_code(d)}, " for d in o.strides) + ")"
            return f"_as_strided({base}, {shp}, {st}, {base}.storage_offset() + {self._size_code(o.offset)})"

        run_of = {r[0][0]: r for r in self._native_runs()}
        hoisted: set[str] = set()  # outputs a native run allocated before its steps
        run_end = -1
        run_code: int | None = None  # where the run's Python steps start in body
        for at, step in enumerate(prog.steps):
            if at in run_of:
                members = run_of[at]
                self._native_run_head(members, body, ns, tensor, ptr, hoisted, empty_code, dev, key)
                run_end = members[-1][0]
                run_code = len(body)
            if isinstance(step, Kernel):
                launch = self.kernels[step.name]
                ns[f"_k_{step.name}"] = launch.fn
                buf = prog.buffers[step.buf]
                if step.buf in hoisted:
                    pass
                elif buf.kind == "output":
                    body.append(f"v_{step.buf} = {empty_code(step.buf, dev)}")
                    tensor[step.buf] = f"v_{step.buf}"
                    ptr[step.buf] = f"v_{step.buf}.data_ptr()"
                elif step.buf not in tensor:  # sized by data: see [Note: sizes from data]
                    body.append(f"v_{step.buf} = {empty_code(step.buf, dev)}")
                    tensor[step.buf] = f"v_{step.buf}"
                    ptr[step.buf] = f"v_{step.buf}.data_ptr()"
                # the launch's order: buffers, sizes, derived sizes, scalars
                call_args = [(tensor if launch.tensors else ptr)[b] for b in launch.buffers]
                call_args += [f"s_{s.name}" for s in launch.sizes]
                if launch.derived and self._is_late(tuple(e for e, _ in launch.derived)):
                    call_args += [
                        f"_value({exact_code(sympy.sympify(e), _names(e))}, {t!r})" for e, t in launch.derived
                    ]
                elif launch.derived:
                    call_args.append(f"*_p.derived[{step.name!r}]")
                call_args += [self._scalar_code(E.Arg(n, d)) for n, d in launch.scalars]
                call = f"_k_{step.name}({', '.join(call_args)})"
                if launch.may_fail:
                    ns["_zero_division"] = zero_division
                    body.append(f"if {call}: _zero_division()")
                else:
                    body.append(call)
            elif isinstance(step, Extern) and step.into:
                ns[f"_x_{step.name}"] = self.backend.out_variant(step.node.op)
                outs_code = []
                for o in step.outputs:
                    buf = prog.buffers[o]
                    if o not in hoisted and (buf.kind == "output" or o not in tensor):
                        body.append(f"v_{o} = {empty_code(o, dev)}")
                        tensor[o] = f"v_{o}"
                        ptr[o] = f"v_{o}.data_ptr()"
                    outs_code.append(tensor[o])
                ops = ", ".join([*outs_code, *(operand(o) for o in step.inputs)])
                body.append(f"_x_{step.name}({ops}, **{attrs_code(step)})")
            elif isinstance(step, Extern):
                op = REGISTRY.get(step.node.op)
                first = step.inputs[0] if step.inputs else None
                channels_last = isinstance(first, View) and prog.buffers[first.buf].order is not None
                ns[f"_x_{step.name}"] = self.backend.extern(step.node.op, op.reference, channels_last)
                ops = ", ".join(operand(o) for o in step.inputs)
                body.append(f"_r = _x_{step.name}({ops}{',' if step.inputs else ''} **{attrs_code(step)})")
                self._bind_results(body, step.outputs, step.node.outputs, tensor, ptr, "_r")
                for b in self.data_sizes.get(step.name, ()):
                    out = f"v_{step.outputs[b.output]}"
                    body.append(f"s_{b.symbol.name} = {out if b.dim is None else f'{out}.shape[{b.dim}]'}")
                    known.append(b.symbol)
            else:
                assert isinstance(step, Control)
                ns[f"_c_{step.name}"] = region_call(step, self.regions[step.name])
                ops = ", ".join(operand(o) for o in step.inputs)
                if any(r.reads_bindings for r in self.regions[step.name]) or step.node.op == "for":
                    # the regions read sizes (or the loop index) from the bindings
                    items = ", ".join(f"{s.name!r}: s_{s.name}" for s in known)
                    body.append(f"_nb = {{**_b, {items}}}")
                    body.append(f"_r = _c_{step.name}(_nb, {ops}{',' if step.inputs else ''})")
                    self.reads_bindings = True
                else:  # every region binds its sizes from its inputs' shapes: no dict per call
                    body.append(f"_r = _c_{step.name}(_b, {ops}{',' if step.inputs else ''})")
                self._bind_results(
                    body, step.outputs, step.node.outputs, tensor, ptr, "_r", tuple_result=True
                )
            if at == run_end and run_code is not None:  # the run's steps from Python: the else branch
                python = body[run_code:]
                del body[run_code:]
                body.extend("    " + line for line in python)
                run_code = None
        outs: list[str] = []
        for ref in prog.outputs:
            if isinstance(ref, str):
                outs.append(tensor.get(ref, f"v_{ref}"))
            else:
                outs.append(self._scalar_code(ref))
        originals: list[str] = []
        if self.aliases is not None:
            outs = self._alias_outputs(body, ns, outs, originals, known)
        body.append(f"return ({''.join(x + ', ' for x in outs)})")
        if not any(_USES_PLAN.search(line) for line in body[plan_at + 1 :]):
            del body[plan_at]  # nothing reads the plan: no lookup per call
        body[:0] = originals  # the caller's tensors, before any copy to row-major
        lines += ["    " + line for line in body]
        source = "\n".join(lines) + "\n"
        exec(compile(source, f"<cuvil {self.backend.name} wrapper {prog.name}>", "exec"), ns)
        return source, ns["run"]

    def _native_run_head(
        self,
        members: list[tuple[int, native_runs.Step]],
        body: list[str],
        ns: dict[str, Any],
        tensor: dict[str, str],
        ptr: dict[str, str],
        hoisted: set[str],
        empty_code: Callable[[str, str], str],
        dev: str,
        key: str,
    ) -> None:
        """The code before a native run's steps: their outputs allocated, then the run's call
        where this binding has tables, else (the caller indents the steps' Python code under
        the ``else``) each step from Python ([Note: native runs])."""
        prog = self.program
        for i, m in members:
            step = prog.steps[i]
            outs = [step.buf] if isinstance(step, Kernel) else list(step.outputs)  # type: ignore[union-attr]
            if m.in_place:  # its result is the input it overwrites: no buffer of its own
                assert isinstance(step, Extern)
                which = step.node.attr("mutates")
                assert isinstance(which, int)
                target = step.inputs[which]
                assert isinstance(target, View)
                body.append(f"v_{outs[0]} = {tensor[target.buf]}")
                tensor[outs[0]] = f"v_{outs[0]}"
                ptr[outs[0]] = ptr[target.buf]
                continue
            for o in outs:
                if o in hoisted or (prog.buffers[o].kind != "output" and o in tensor):
                    continue
                body.append(f"v_{o} = {empty_code(o, dev)}")
                tensor[o] = f"v_{o}"
                ptr[o] = f"v_{o}.data_ptr()"
                hoisted.add(o)
        run = native_runs.Run(len(self.runs), [m for _, m in members], [], {})
        for m in run.steps:
            names = list(m.launch.buffers) if m.launch is not None else []
            if m.extern is not None:
                names += [*m.extern.outputs, *(o.buf for o in m.extern.inputs)]  # type: ignore[union-attr]
                if run.threads is None:
                    run.threads = run.call_slot("_threads()").index
            for n in names:
                if n not in run.bases:
                    run.bases[n] = (
                        native_runs.Source("ptr", n) if n in prog.plan.slot_of else run.call_slot(ptr[n])
                    )
        self.runs.append(run)
        j = run.index
        ns["_step_runner"] = self.backend.step_runner()  # type: ignore[attr-defined]
        ns["_threads"] = torch.get_num_threads
        ns[f"_pk{j}"] = native_runs.packer(run)
        if j == 0:  # (the runs are straight-line code: the first one's tables are every run's)
            tup = f"({key}{',' if len(self.symbols) == 1 else ''})"
            body.append("_n = _p.native")
            body.append(f"if _n is None: _n = _self.native_plan(_p, {tup})")
        if any(m.in_place for m in run.steps):
            # it writes an argument: only in a call that may ([Note: updates in place]), else the
            # steps from Python, whose extern clones it
            ns["_in_place"] = in_place.allowed
            body.append(f"_t = _n[{j}] if _in_place() else None")
        else:
            body.append(f"_t = _n[{j}]")
        body.append("if _t is not None:")
        if run.calls:
            body.append(f"    _pk{j}(_t.slots, 0, {', '.join(run.calls)})")
        body.append("    _f = _step_runner(_t.address)")
        body.append("    if _f: _self.native_failed(_t, _f)")
        body.append("else:")

    def _alias_outputs(
        self, body: list[str], ns: dict[str, Any], computed: list[str], originals: list[str], known: list[Any]
    ) -> list[str]:
        """Every graph output: the computed ones in order, and each alias rebuilt by its
        view chain's references on the caller's input or on an output (eager's sizes,
        strides and storage; see [Note: output aliasing] in cuvil_ir.graph_ir.aliases)."""
        assert self.aliases is not None
        prog = self.program
        self._bind_view_sizes(body, known)
        rest = iter(computed)
        outs = [next(rest) if a is None else "" for a in self.aliases]
        for i, a in enumerate(self.aliases):
            if a is None:
                continue
            if a.base == "input":
                name = prog.inputs[a.index].name
                code = f"_o_{name}"
                if f"_o_{name} = v_{name}" not in originals:
                    originals.append(f"_o_{name} = v_{name}")
            else:
                code = outs[a.index]
            for k, (node, which) in enumerate(a.chain):
                fn = f"_view_{i}_{k}"
                ns[fn] = REGISTRY.get(node.op).reference
                kwargs = ", ".join(
                    f"{name}={self._attr_code(v, ns, known, f'{fn}_{name}')}" for name, v in node.attrs
                )
                code = f"{fn}({code}{', ' if kwargs else ''}{kwargs})"
                if len(node.outputs) > 1:
                    code = f"{code}[{which}]"
                else:  # a one-piece split (``chunk(2)`` of a size-1 dim) is still a tuple
                    ns["_one"] = one
                    code = f"_one({code})"
            body.append(f"_v{i} = {code}")
            outs[i] = f"_v{i}"
        return outs

    def _bind_view_sizes(self, body: list[str], known: list[Any]) -> None:
        """Bind the sizes the view chains' attributes name that the computed program does
        not (``x.expand_as(y)`` returns a view of ``x`` sized by ``y``, whose shape no
        computed step reads): each from the first graph input with it as a dim."""
        assert self.aliases is not None
        needed: set[sympy.Symbol] = set()
        for a in self.aliases:
            for node, _ in () if a is None else a.chain:
                for _, v in node.attrs:
                    add_symbols(needed, v)
        missing = sorted(needed - set(known), key=lambda s: s.name)
        graph = self.program.graph
        for sym in missing:
            for inp, value in zip(self.program.inputs, graph.inputs):
                shape = getattr(value.type, "shape", ())
                if inp.is_tensor and sym in shape:
                    body.append(f"s_{sym.name} = v_{inp.name}.shape[{list(shape).index(sym)}]")
                    known.append(sym)
                    break

    def _attr_code(self, v: Any, ns: dict[str, Any], known: list[Any], const: str) -> str:
        """An attribute of a view replayed per call, its sizes from the call's symbols."""
        if isinstance(v, sympy.Basic) and not isinstance(v, (sympy.Rel, sympy.logic.boolalg.Boolean)):
            return self._size_code(v)
        if isinstance(v, tuple):
            return (
                "("
                + "".join(f"{self._attr_code(x, ns, known, f'{const}_{j}')}, " for j, x in enumerate(v))
                + ")"
            )
        if v is None or isinstance(v, (bool, int, float, str)):
            return repr(v)
        if isinstance(v, sympy.Basic) or (
            hasattr(v, "items") and not isinstance(v, dict) and self._uses_symbols(v)
        ):
            ns[const] = v
            items = ", ".join(f"_sym({s.name!r}): s_{s.name}" for s in known)
            return f"_late_attr({const}, {{{items}}})"
        ns[const] = evaluate_attr(v, {})
        return const

    @staticmethod
    def _uses_symbols(x: Any) -> bool:
        syms: set[sympy.Symbol] = set()
        add_symbols(syms, x)
        return bool(syms)

    def _bind_results(
        self,
        body: list[str],
        names: tuple[str, ...],
        values: tuple[Any, ...],
        tensor: dict[str, str],
        ptr: dict[str, str],
        var: str,
        tuple_result: bool = False,
    ) -> None:
        if len(names) == 1 and not tuple_result:
            # as the reference executor: a one-output op may still return a 1-tuple
            # (``split`` into one chunk)
            body.append(f"{var} = {var} if type({var}) is tuple else ({var},)")
        for k, (name, v) in enumerate(zip(names, values)):
            if isinstance(v.type, TensorType):
                # a result that is a view of the arena (torch.real, a reshape ...) would be
                # overwritten when its slot is reused, or by the next call: copy it out
                cl = ", True" if self.program.buffers[name].order is not None else ""
                body.append(f"v_{name} = _own({var}[{k}], _p.arena{cl})")
                tensor[name] = f"v_{name}"
                ptr[name] = f"v_{name}.data_ptr()"
            else:
                body.append(f"v_{name} = {var}[{k}]")

    def _size_code(self, d: Any) -> str:
        e = sympy.sympify(d)
        if e.is_Integer:
            return str(int(e))
        if isinstance(e, sympy.Symbol):
            return f"s_{e.name}"
        # exact, not float arithmetic: see [Note: exact size arithmetic] in cuvil_ir.symbolic
        return f"int({exact_code(e, {s: f's_{s.name}' for s in e.free_symbols})})"

    def _scalar_code(self, e: E.Expr) -> str:
        if isinstance(e, E.Const):
            return repr(e.value)
        if isinstance(e, E.Arg):
            return f"v_{e.name}"
        if isinstance(e, E.Index):
            return self._size_code(e.expr)
        raise TypeError(f"scalar operand {e}")


#: generated code that reads the call's plan
_USES_PLAN = re.compile(r"\b_p\.")


def _empty_cpu_fallback(size: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty_strided(size, stride, dtype=dtype, device="cpu")


#: an uninitialised cpu tensor of these sizes and strides: inductor's allocation entry
#: (no argument parsing, always on cpu whatever ``torch.set_default_device`` says),
#: torch.empty_strided where this torch lacks it
_empty_cpu: Callable[[tuple[int, ...], tuple[int, ...], torch.dtype], torch.Tensor] = getattr(
    getattr(getattr(torch._C, "_dynamo", None), "guards", None), "_empty_strided_cpu", _empty_cpu_fallback
)


# [Note: sizes from data]
# A size computed from tensor data (`u0`: the rows `nonzero` found, `int(t)`) is bound
# by the extern step that produces it (`s_u0 = v_e0.shape[0]` right after the call):
# the plan of a call (arena, derived kernel arguments, extern attributes) is made per
# binding of the other symbols, before the first step; buffers sized by `u0` are
# allocated when written (the memory plan leaves them out), and kernel arguments and
# attributes that use it are evaluated where they are used.


# [Note: strided inputs]
# A program reads its tensor inputs as row-major arrays, so a non-contiguous input (an
# expand, a transpose, a strided slice) used to be copied first: an expanded
# (1, 4096) -> (65536, 4096) input cost 1 GiB and the copy's time where eager
# allocates nothing. On a target whose kernels can take strides
# (``Capabilities.strided_inputs``: cpu), the pipeline gives the runner a factory for
# the same graph lowered with ``strided_inputs=True``: each input dim's stride is a size
# symbol (``stride_in0_1``; 0 for a dim of literal size 1), bound per call from
# ``v.stride()`` and passed to the kernels like any size, so a zero stride reads one
# row for all. A call with an expanded tensor input (a zero stride on a dim of size
# > 1: its copy would be larger than its storage) runs that program instead
# (``run_strided``, made, and its kernels built, on the first such call; the program
# cache keeps it too). Contiguous calls keep the dense kernels, which collapse and
# vectorise on their known strides; other non-contiguous layouts (a transpose, a
# strided slice) are still copied for them, because reading a
# 2048x2048 transpose by its strides measured 2-3x slower than torch's copy plus the
# dense kernels (``x * 2 + 1``: 28 vs 9-25 ms, softmax 53 vs 26 ms, one thread), while
# the copy is no larger than the tensor. Lowering copies such an input where a rule needs a
# row-major buffer (a reshape that merges strided dims, as eager copies), and regions
# (if/for/while bodies) still copy what they get non-contiguous. A target without the
# capability, and a loaded ``cu.save`` artifact, copy as before.


def _aliases(program: TensorProgram) -> tuple[Any, ...] | None:
    """The output aliases of a top-level program lowered from its graph's computed
    outputs (``cuvil_runtime.pipeline``); None for a region, a program that computes
    every output, or one lowered before aliases existed (a ``cu.save`` artifact)."""
    graph = program.graph
    if graph is None or len(graph.outputs) == len(program.outputs):
        return None
    aliases = output_aliases(graph)
    if sum(a is None for a in aliases) != len(program.outputs):
        raise ValueError(
            f"program @{program.name} has {len(program.outputs)} outputs, but its graph computes "
            f"{sum(a is None for a in aliases)} of {len(aliases)}: the program was not lowered from this graph"
        )
    return aliases


def _names(e: Any) -> dict[sympy.Symbol, str]:
    return {s: f"s_{s.name}" for s in sympy.sympify(e).free_symbols}


def _tname(d: DType) -> str:
    return str(d.torch).removeprefix("torch.")


def wrappers(runner: ProgramRunner) -> str:
    """The generated source of ``runner`` and of its regions' runners (the ``wrapper`` stage)."""
    parts = [runner.source]
    for subs in runner.regions.values():
        parts.extend(wrappers(s) for s in subs)
    return "\n".join(parts)


__all__ = ["ProgramRunner", "wrappers"]
