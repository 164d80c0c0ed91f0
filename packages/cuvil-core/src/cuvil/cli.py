"""The ``cuvil`` command line.

``cuvil backends`` lists every installed target: available or not, and why.
``cuvil ops`` lists the ops plugins and ``cu.custom_op`` declared (``--all``: the
built-in ones too), where each comes from and how Tensor IR targets lower it, and
every op plugin that failed to load.
``cuvil audit module:function --args-spec "f32[8,16], f32[16,4]"`` compiles the
function for those arguments and prints every stage's hash (``--out DIR`` writes
the stage texts); see :mod:`cuvil.audit`.
``cuvil cache info|clear|verify`` shows the on-disk caches (stores, entries,
sizes), empties them, or checks every entry's signature
(:mod:`cuvil_runtime.cache_admin`).
``cuvil aot save module:function --args-spec ... --out path`` writes an
ahead-of-time artifact; ``cuvil aot inspect path`` verifies one and prints its
manifest, saved call and graph (:mod:`cuvil.aot`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any


def _backends(args: argparse.Namespace) -> int:
    from cuvil_runtime.registry import DuplicateTargetError, discover

    try:
        infos = discover()
    except DuplicateTargetError as e:
        print(f"cuvil: {e}", file=sys.stderr)
        return 1
    header = ("TARGET", "AVAILABLE", "DISTRIBUTION", "INSTALL", "REASON")
    rows = [
        (
            i.name,
            "yes" if i.available else "no",
            i.distribution,
            i.install or ("built in" if i.available else "-"),
            i.reason or "",
        )
        for i in infos
    ]
    _table(header, rows)
    if not rows:
        print("(no targets are installed: the 'cuvil-runtime' distribution registers 'reference')")
    if args.verbose:
        for i in infos:
            caps = i.capabilities
            print(f"\n{i.name}: {i.description}")
            print(f"  stages: {' -> '.join(i.stages) or '-'}")
            if caps is not None:
                print(
                    f"  devices: {', '.join(sorted(caps.devices))}; control flow: "
                    f"{'yes' if caps.control_flow else 'no'}; extern calls: {'yes' if caps.extern_calls else 'no'}"
                )
                if caps.options:
                    print(f"  options of cu.compile: {', '.join(sorted(caps.options))}")
    return 0


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> None:
    """Columns padded to their widest cell; the last one as is."""
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header) - 1)]
    for r in [header, *rows]:
        cells = [cell.ljust(w) for cell, w in zip(r, widths)]
        print("  ".join([*cells, r[-1]]).rstrip())


def _ops(args: argparse.Namespace) -> int:
    from cuvil.plugins import op_infos, plugin_errors

    infos = [i for i in op_infos() if args.all or i.kind != "built-in"]
    _table(("OP", "KIND", "LOWERED AS", "FROM"), [(i.name, i.kind, i.lowering, i.origin) for i in infos])
    if not args.all:
        print(
            f"({sum(1 for i in op_infos() if i.kind == 'built-in')} built-in ops not shown: cuvil ops --all)"
        )
    errors = plugin_errors()
    for name, (dist, err) in sorted(errors.items()):
        print(f"plugin {name!r} of distribution {dist!r} failed to load: {err}")
    return 1 if errors else 0


def _split_top(spec: str) -> list[str]:
    """Split on commas outside brackets: ``"f32[2,3], 4"`` -> ``["f32[2,3]", "4"]``."""
    parts, depth, cur = [], 0, ""
    for ch in spec:
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
            continue
        depth += ch == "["
        depth -= ch == "]"
        cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def parse_args_spec(spec: str, seed: int = 0) -> list[Any]:
    """Example arguments from a spec: ``dtype[d0,d1,...]`` is a seeded random tensor
    (``f32[4,3,64,64]``, ``i64[8]``, ``bool[2,2]``, ``f32[]`` for a 0-d tensor), a
    number or ``True``/``False`` is itself."""
    import torch

    from cuvil_ir.graph_ir.types import DType

    gen = torch.Generator().manual_seed(seed)
    out: list[Any] = []
    for item in _split_top(spec):
        if "[" in item:
            name, _, dims = item.partition("[")
            if not dims.endswith("]"):
                raise ValueError(f"bad tensor spec {item!r}: expected dtype[d0,d1,...]")
            try:
                dtype = DType(name.strip()).torch
            except ValueError:
                known = ", ".join(d.value for d in DType)
                raise ValueError(f"unknown dtype {name.strip()!r} in {item!r} (known: {known})") from None
            shape = [int(d) for d in dims[:-1].split(",") if d.strip()]
            if dtype.is_floating_point:
                out.append(torch.randn(shape, generator=gen).to(dtype))
            elif dtype == torch.bool:
                out.append(torch.randint(0, 2, shape, generator=gen).bool())
            else:
                out.append(torch.randint(0, 10, shape, generator=gen).to(dtype))
        elif item in ("True", "False"):
            out.append(item == "True")
        else:
            try:
                out.append(int(item))
            except ValueError:
                try:
                    out.append(float(item))
                except ValueError:
                    raise ValueError(
                        f"bad argument spec {item!r}: a tensor dtype[dims], a number or a bool"
                    ) from None
    return out


def load_callable(ref: str) -> Any:
    """``module:attr`` (a dotted module or a ``.py`` path): a function, a module
    instance (put in eval mode), or an ``nn.Module`` class (built with no arguments)."""
    import importlib
    import importlib.util
    from pathlib import Path

    import torch

    if ":" not in ref:
        raise ValueError(f"expected module:function, got {ref!r}")
    mod_name, _, attr = ref.rpartition(":")
    if mod_name.endswith(".py") or "/" in mod_name:
        path = Path(mod_name).resolve()
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise ValueError(f"cannot import {mod_name}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(mod_name)
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    if isinstance(obj, type) and issubclass(obj, torch.nn.Module):
        obj = obj()
    if isinstance(obj, torch.nn.Module):
        obj.eval()
    return obj


def _function_and_example(args: argparse.Namespace, command: str) -> tuple[Any, list[Any]] | None:
    """``args.function`` loaded and ``args.args_spec`` built, or ``None`` after saying why."""
    try:
        return load_callable(args.function), parse_args_spec(args.args_spec, seed=args.seed)
    except (ValueError, ImportError, AttributeError) as e:
        print(f"cuvil {command}: {e}", file=sys.stderr)
        return None


def _audit(args: argparse.Namespace) -> int:
    from cuvil.audit import audit

    loaded = _function_and_example(args, "audit")
    if loaded is None:
        return 2
    fn, example = loaded
    hashes = audit(fn, *example, target=args.target, out_dir=args.out)
    width = max(len(k) for k in hashes)
    for name, h in hashes.items():
        print(f"{name.ljust(width)}  {h}")
    if args.out:
        print(f"(stage texts and hashes.json written to {args.out})")
    return 0


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    raise AssertionError


def _cache(args: argparse.Namespace) -> int:
    from cuvil_runtime import cache_admin
    from cuvil_runtime.cache import default_cache_dir

    root = default_cache_dir()
    if args.action == "clear":
        freed = cache_admin.clear(root)
        print(f"cleared {root} ({_size(freed)} freed)")
        return 0
    infos = (
        cache_admin.verify(root, delete=args.delete) if args.action == "verify" else cache_admin.stores(root)
    )
    print(f"cache: {root}" + ("" if root.is_dir() else " (empty: not created yet)"))
    verifying = args.action == "verify"
    rows: list[tuple[str, ...]] = [
        (i.path.name, str(i.entries), _size(i.bytes), *([str(len(i.damaged))] if verifying else []))
        for i in infos
    ]
    header: tuple[str, ...] = ("STORE", "ENTRIES", "SIZE", *(["DAMAGED"] if verifying else []))
    total = (str(sum(i.entries for i in infos)), _size(sum(i.bytes for i in infos)))
    rows.append(("total", *total, *([""] if verifying else [])))
    _table(header, rows)
    damaged = [d for i in infos for d in i.damaged]
    for d in damaged:
        print(f"damaged{' (deleted)' if args.delete else ''}: {d}")
    if damaged and not args.delete:
        print("(run `cuvil cache verify --delete` to remove them; they are rebuilt when next needed)")
    return 1 if damaged and not args.delete else 0


def _aot(args: argparse.Namespace) -> int:
    import json

    from cuvil.aot import ArtifactError, inspect_artifact, save

    if args.action == "inspect":
        try:
            info = inspect_artifact(args.path)
        except ArtifactError as e:
            print(f"cuvil aot inspect: {e}", file=sys.stderr)
            return 1
        if args.json:
            print(json.dumps(info, indent=1, sort_keys=True))
            return 0
        m = info["manifest"]
        print(f"{args.path}: {m['name']}, target {m['target']}, format {m['format']} v{m['version']}")
        print(f"  runs here: {'yes' if info['runs_here'] else 'no: ' + str(info['why_not'])}")
        print(f"  requires:  {json.dumps(m['requires'], sort_keys=True)}")
        print(f"  versions:  {', '.join(f'{k} {v}' for k, v in sorted(m['versions'].items()))}")
        print(f"  weights:   {m['weights']}")
        for stage, h in m.get("audit", {}).items():
            print(f"  {stage}: {h}")
        call = info["call"]
        for leaf in call["leaves"]:
            print(f"  argument {leaf['name']}: {_leaf_text(leaf)}")
        for fact in call["reasons"]:
            print(f"  size guard {fact[0]}    <- {fact[1]}")
        for frozen in call["frozen"]:
            print(f"  frozen read: {frozen}")
        total = sum(info["sizes"].values())
        print(f"  members: {len(info['sizes'])}, {_size(total)} (every sha256 verified)")
        print("graph:")
        print("  " + info["graph"].rstrip("\n").replace("\n", "\n  "))
        return 0
    loaded = _function_and_example(args, "aot save")
    if loaded is None:
        return 2
    fn, example = loaded
    import cuvil

    if args.target is not None:
        fn = cuvil.compile(fn, target=args.target, fallback="error")
    path = save(fn, args.out, *example, weights=not args.no_weights)
    print(f"wrote {path} ({_size(path.stat().st_size)})")
    return 0


def _leaf_text(leaf: dict[str, Any]) -> str:
    if leaf["kind"] == "tensor":
        shape = "any sizes" if leaf["shape"] is None else f"shape {leaf['shape']}"
        return f"{leaf['dtype']} tensor of rank {leaf['rank']} on {leaf['device']} ({shape})"
    return f"{leaf.get('type', leaf['kind'])} {leaf['value']!r}"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cuvil", description="Cuvil: a Python-native compiler for PyTorch inference"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    backends = sub.add_parser("backends", help="list installed targets and whether each can be used here")
    backends.add_argument(
        "-v", "--verbose", action="store_true", help="also each target's stages and capabilities"
    )
    backends.set_defaults(run=_backends)
    ops = sub.add_parser("ops", help="list registered ops: where each comes from and how targets lower it")
    ops.add_argument("-a", "--all", action="store_true", help="the built-in ops too")
    ops.set_defaults(run=_ops)
    aud = sub.add_parser(
        "audit", help="compile a function and print the hash of every stage (Graph IR ... generated code)"
    )
    aud.add_argument("function", help="module:function (a dotted module or a path to a .py file)")
    aud.add_argument(
        "--args-spec",
        required=True,
        help='example arguments, e.g. "f32[8,16], f32[16,4], 3" (seeded random tensors)',
    )
    aud.add_argument("--target", default=None, help="the target to compile for (default: the best available)")
    aud.add_argument("--out", default=None, help="write each stage's text and hashes.json to this folder")
    aud.add_argument("--seed", type=int, default=0, help="seed of the example tensors")
    aud.set_defaults(run=_audit)
    cache = sub.add_parser("cache", help="show, verify or clear the on-disk compile caches")
    cache.add_argument("action", choices=("info", "clear", "verify"))
    cache.add_argument("--delete", action="store_true", help="verify: remove the damaged entries")
    cache.set_defaults(run=_cache)
    aot = sub.add_parser("aot", help="write (save) or inspect an ahead-of-time artifact")
    aot_sub = aot.add_subparsers(dest="action", metavar="ACTION", required=True)
    aot_save = aot_sub.add_parser("save", help="compile a function for example arguments into an artifact")
    aot_save.add_argument("function", help="module:function (a dotted module or a path to a .py file)")
    aot_save.add_argument("--args-spec", required=True, help='example arguments, e.g. "f32[8,16], f32[16,4]"')
    aot_save.add_argument("--out", required=True, help="the artifact file to write")
    aot_save.add_argument("--target", default=None, help="the target (default: the best available)")
    aot_save.add_argument("--no-weights", action="store_true", help="leave a module's parameters out")
    aot_save.add_argument("--seed", type=int, default=0, help="seed of the example tensors")
    aot_save.set_defaults(run=_aot)
    aot_inspect = aot_sub.add_parser("inspect", help="verify an artifact and print what it holds")
    aot_inspect.add_argument("path")
    aot_inspect.add_argument("--json", action="store_true", help="everything, as JSON")
    aot_inspect.set_defaults(run=_aot)
    return parser


def _setup_errors() -> tuple[type[BaseException], ...]:
    """Errors that mean "this host or its settings cannot do that" (no target, a bad
    ``$CUVIL_CPU_ISA``, no C compiler): reported in one line, not as a traceback."""
    from cuvil_runtime.registry import (
        DuplicateTargetError,
        TargetConfigError,
        TargetUnavailableError,
        UnknownTargetError,
    )

    errors: list[type[BaseException]] = [
        DuplicateTargetError,
        TargetConfigError,
        TargetUnavailableError,
        UnknownTargetError,
    ]
    try:  # the cpu target's toolchain errors, when that target is installed
        from cuvil_backend_cpu.toolchain import ToolchainError
    except ImportError:
        pass
    else:
        errors.append(ToolchainError)
    return tuple(errors)


def _one_line(e: BaseException) -> str:
    return " ".join(line.strip() for line in str(e).splitlines() if line.strip())


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from cuvil.errors import CompileError

    setup = _setup_errors()
    name = " ".join(p for p in (args.command, getattr(args, "action", None)) if p)
    try:
        return int(args.run(args))
    except setup as e:
        print(f"cuvil {name}: {_one_line(e)}", file=sys.stderr)
        return 1
    except CompileError as e:
        cause = e.__cause__
        shown = cause if isinstance(cause, setup) else e  # "internal error: TargetUnavailableError: ..."
        print(f"cuvil {name}: {_one_line(shown)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
