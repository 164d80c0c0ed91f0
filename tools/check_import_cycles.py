"""Fail when modules of ``packages/*/src`` and ``examples/*/src`` import each other, directly
or indirectly.

    python tools/check_import_cycles.py [SRC_DIR ...]     (default: packages/*/src examples/*/src)

Each SRC_DIR must be a folder of top-level packages; a project folder (the
repository's root, a distribution's) or one without a package is refused (exit 2).

Run by ``nox -s lint``. Every top-level package found in the source folders is put
in one import graph (so a cycle that crosses packages, ``cuvil_runtime -> cuvil ->
cuvil_runtime``, counts too), built by grimp, the engine of import-linter.

What counts as an import:

* every ``import``/``from ... import`` statement, at module level **or inside a
  function**: a lazy import written to dodge a cycle is still a cycle (the modules
  still cannot be understood, tested or layered apart);
* the imports under ``if TYPE_CHECKING:`` too: an annotation that names a module
  above still ties the two together (neither can be read or type-checked without the
  other); what the lower module needs of the upper one belongs in a module below both
  (a ``typing.Protocol``, as ``cuvil.frontend.tracer_view`` is for the tracer);
* not the implicit import of a parent package (``import a.b.c`` runs ``a/__init__``
  and ``a/b/__init__``): an edge to a package's ``__init__`` is counted only when the
  code names the package itself (``from a.b import name``).

Each strongly connected group of modules is reported as a few shortest cycles that
together cover it, ``a -> b -> a``, with the file:line of each import on the way.
Exit status 1 when there is a cycle, 0 when there is none.
"""

from __future__ import annotations

import argparse
import sys
from collections import deque
from collections.abc import Iterable, Mapping
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
#: the source folders checked when none is given: the packages and the example plugins
DEFAULT_SRC = sorted(ROOT.glob("packages/*/src")) + sorted(ROOT.glob("examples/*/src"))


def top_level_packages(src_dirs: Iterable[Path]) -> dict[str, Path]:
    """Package name -> the source folder holding it."""
    found: dict[str, Path] = {}
    for src in src_dirs:
        for init in sorted(src.glob("*/__init__.py")):
            found[init.parent.name] = src
    return found


def not_a_source_folder(src: Path) -> str | None:
    """Why ``src`` is not a folder of top-level packages (``packages/cuvil-ir/src``), or
    None. A project folder (one with a ``pyproject.toml``, the repository's root or a
    distribution's) is refused: its packages are not the code it ships (``.`` would
    check ``benchmarks/``), so a check of it would pass without looking."""
    if not src.is_dir():
        return "no such folder"
    if (src / "pyproject.toml").exists() or (src / "setup.py").exists():
        hint = (
            "packages/*/src"
            if any(src.glob("packages/*/src"))
            else "src"
            if (src / "src").is_dir()
            else "a src folder"
        )
        return f"a project folder, not a source folder: give its source folders ({hint})"
    if not any(src.glob("*/__init__.py")):
        return "holds no package (a folder with an __init__.py)"
    return None


def module_file(module: str, packages: Mapping[str, Path]) -> Path:
    src = packages[module.split(".")[0]]
    path = src.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def import_graph(packages: Mapping[str, Path]) -> grimp.ImportGraph:
    """The imports among the modules of ``packages``, TYPE_CHECKING imports included."""
    for src in dict.fromkeys(packages.values()):
        sys.path.insert(0, str(src))
    return grimp.build_graph(*packages, exclude_type_checking_imports=False, cache_dir=None)


def strongly_connected(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative), those of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(edges.get(succ, ())))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))
    return sorted(groups)


def shortest_cycle(start: str, edges: Mapping[str, set[str]], within: set[str]) -> list[str]:
    """The shortest cycle through ``start`` inside ``within``: [start, ..., start]."""
    previous: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for succ in sorted(edges[node] & within):
            if succ == start:
                path = [node]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                return [*reversed(path), start]
            if succ not in previous:
                previous[succ] = node
                queue.append(succ)
    raise AssertionError(f"{start} is on no cycle")  # pragma: no cover: it is in a component


def cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """A few shortest cycles per strongly connected group, covering every module of it."""
    found = []
    for group in strongly_connected(edges):
        members, covered = set(group), set()
        for module in group:
            if module not in covered:
                cycle = shortest_cycle(module, edges, members)
                covered.update(cycle)
                found.append(cycle)
    return found


def describe(cycle: list[str], packages: Mapping[str, Path], graph: grimp.ImportGraph) -> list[str]:
    lines = [" -> ".join(cycle)]
    for importer, imported in zip(cycle, cycle[1:]):
        path = module_file(importer, packages)
        try:
            shown = path.relative_to(ROOT)
        except ValueError:
            shown = path
        for d in graph.get_import_details(importer=importer, imported=imported):
            lines.append(f"    {shown}:{d['line_number']}: {d['line_contents']}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "src", nargs="*", type=Path, help="source folders (default: packages/*/src examples/*/src)"
    )
    args = parser.parse_args(argv)
    src_dirs = [p.resolve() for p in args.src] or DEFAULT_SRC
    for src in src_dirs:
        problem = not_a_source_folder(src)
        if problem:
            print(f"{src}: {problem}", file=sys.stderr)
            return 2
    packages = top_level_packages(src_dirs)
    if not packages:
        print(f"no packages found in {', '.join(map(str, src_dirs))}", file=sys.stderr)
        return 2
    graph = import_graph(packages)
    # A module importing itself (``import a.b as me`` inside a.b) is no cycle between two.
    edges = {m: set(graph.find_modules_directly_imported_by(m)) - {m} for m in graph.modules}
    found = cycles(edges)
    for cycle in found:
        print("\n".join(describe(cycle, packages, graph)))
    modules = {m for cycle in found for m in cycle}
    if found:
        print(f"\n{len(found)} import cycle(s) through {len(modules)} modules", file=sys.stderr)
        return 1
    print(f"no import cycles among {len(edges)} modules of {', '.join(sorted(packages))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
