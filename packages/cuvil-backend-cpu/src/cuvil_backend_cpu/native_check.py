"""A custom op's C lowering (``cu.custom_op(..., lower={"cpu": "..."})``) compiled alone
before a kernel calls it, so a text the compiler rejects is the user's error, named
and located, not a failed kernel build with a compiler dump (or, for an unknown
function, a kernel that builds and then cannot be loaded).

Each distinct helper (op, C type, text) is checked once per process, the first time
code generation defines it: ``cc -fsyntax-only`` on the kernel prelude and the helper,
with the user's text on lines of its own (so the compiler's line:column are the text's)
and implicit function declarations as errors. Kernels that reuse it (and every warm
start, which generates no code) pay nothing.
"""

from __future__ import annotations

import subprocess
import threading

from cuvil_runtime.target import TargetError

#: diagnostics shown (the first errors are the useful ones)
SHOWN = 3

_OK: set[tuple[str, str, str, str]] = set()
_LOCK = threading.Lock()


class NativeLoweringError(TargetError):
    """A custom op's C lowering that the C compiler rejects."""


def check_native(name: str, ctype: str, params: tuple[str, ...], body: str, prelude: str) -> None:
    """Raise :class:`NativeLoweringError` when ``body`` (the lowering of the op whose
    helper is ``cu_native_<name>``, over ``params`` of type ``ctype``) does not compile."""
    key = (name, ctype, ",".join(params), body)
    with _LOCK:
        if key in _OK:
            return
    from cuvil_backend_cpu.toolchain import find_toolchain

    args = ", ".join(f"{ctype} {p}" for p in params) or "void"
    head = f"{prelude}\nstatic inline {ctype} cu_native_{name}({args}) {{ return (\n"
    first = head.count("\n") + 1  # the line the user's text starts on
    source = f"{head}{body}\n); }}\n"
    tc = find_toolchain()
    command = [tc.cc, *tc.flags, "-fsyntax-only", "-Werror=implicit-function-declaration", "-x", "c", "-"]
    proc = subprocess.run(command, input=source, capture_output=True, text=True, timeout=120)
    if proc.returncode == 0:
        with _LOCK:
            _OK.add(key)
        return
    raise NativeLoweringError(_message(name, ctype, body, first, proc.stderr))


def _message(name: str, ctype: str, body: str, first: int, output: str) -> str:
    lines = body.split("\n")
    shown: list[str] = []
    for line in output.splitlines():
        parts = line.split(":", 4)
        if len(parts) < 5 or parts[0] != "<stdin>" or "error" not in parts[3]:
            continue
        try:
            row, col = int(parts[1]) - first, int(parts[2])
        except ValueError:
            continue
        message = f"{parts[3].strip()}:{parts[4]}"
        if 0 <= row < len(lines):
            where = f"line {row + 1}, column {col}" if len(lines) > 1 else f"column {col}"
            shown.append(f"  {where}: {message}\n    {lines[row]}\n    {' ' * max(col - 1, 0)}^")
        elif row == len(lines):
            shown.append(f"  at the end of the text: {message}")
        else:
            shown.append(f"  {message}")
        if len(shown) == SHOWN:
            break
    if not shown:  # nothing located: the compiler's own first lines
        shown = [f"  {line}" for line in output.strip().splitlines()[:SHOWN]]
    op, declared = _op_of(name)
    at = f" (declared at {declared})" if declared else ""
    return (
        f"custom op {op}{at}: its cpu lowering {body!r} does not compile as C for {ctype}:\n"
        + "\n".join(shown)
        + "\n  hint: the lowering is one C expression over the operands and attributes, named as in "
        "the signature, in the result's C type; it may call what <math.h> and <stdint.h> declare "
        "(prefer type-generic names such as exp, fabs); fix the text given in lower={'cpu': ...}"
    )


def _op_of(name: str) -> tuple[str, str]:
    """The op whose helper is ``cu_native_<name>`` (``<ns>__<op>__<dtype>``), and where
    it was declared (file:line, ``""`` when not known)."""
    from cuvil_ir.graph_ir.registry import REGISTRY

    for op in REGISTRY.names():
        if "::" in op and name.startswith(op.replace("::", "__") + "__"):
            return op, str(getattr(REGISTRY.get(op), "declared_at", ""))
    return name.rsplit("__", 1)[0].replace("__", "::", 1), ""


__all__ = ["NativeLoweringError", "check_native"]
