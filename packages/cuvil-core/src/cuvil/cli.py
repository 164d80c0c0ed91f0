"""The ``cuvil`` command line.

``cuvil backends`` lists every installed target: available or not, and why.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


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
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header) - 1)]
    for r in [header, *rows]:
        cells = [cell.ljust(w) for cell, w in zip(r, widths)]
        print("  ".join([*cells, r[-1]]).rstrip())
    if not rows:
        print("(no targets are installed: the 'cuvil-runtime' distribution registers 'reference')")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cuvil", description="Cuvil: a Python-native compiler for PyTorch inference"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    backends = sub.add_parser("backends", help="list installed targets and whether each can be used here")
    backends.set_defaults(run=_backends)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
