"""What ``cu.compile`` is given, checked, and the names of a call's argument leaves.

:func:`check_dims` validates ``dims=`` (axis numbers to size names);
:func:`check_options` refuses a target option the target does not take
(:class:`OptionError`, never hidden by the eager fallback); :func:`leaf_name`
names an argument leaf from its pytree path (``x``, ``xs_0``), as graph inputs and
size symbols are named.
"""

from __future__ import annotations

from typing import Any

from cuvil_ir.symbolic import symbol


def leaf_name(path: tuple[Any, ...], names: list[str]) -> str:
    # path[0] selects args (0) or kwargs (1); path[1] the argument
    parts: list[str] = []
    top, key = path[0], path[1]
    if top.idx == 0:
        parts.append(names[key.idx] if key.idx < len(names) else f"arg{key.idx}")
    else:
        parts.append(str(key.key))
    for k in path[2:]:
        parts.append(str(getattr(k, "idx", getattr(k, "key", getattr(k, "name", "x")))))
    return "_".join(parts)


def check_dims(dims: Any) -> dict[str, dict[int, str | None]]:
    if dims is None:
        return {}
    if not isinstance(dims, dict):
        raise TypeError('dims must be a dict like {"x": {0: "B"}, "y": {0: "B"}}')
    out: dict[str, dict[int, str | None]] = {}
    for arg, axes in dims.items():
        if not isinstance(axes, dict) or not all(isinstance(a, int) for a in axes):
            raise TypeError(f"dims[{arg!r}] must map axis numbers to names, e.g. {{0: 'B'}}")
        for name in axes.values():
            if name is None:  # a static size: see the docstring of `compile`
                continue
            try:
                symbol(name)
            except ValueError:
                raise ValueError(
                    f"dims[{arg!r}]: {name!r} is not a valid size name (an identifier)"
                ) from None
        out[str(arg)] = dict(axes)
    return out


class OptionError(TypeError):
    """A ``cu.compile`` keyword the target does not take (never hidden by the eager fallback)."""


def check_options(options: dict[str, Any], capabilities: Any, target: str) -> None:
    """A keyword of ``cu.compile`` that ``target`` does not take is a TypeError (a typo
    must not be silently ignored)."""
    unknown = sorted(set(options) - set(capabilities.options))
    if unknown:
        takes = ", ".join(sorted(capabilities.options)) or "none"
        raise OptionError(
            f"cuvil.compile got option(s) {unknown} that target {target!r} does not take (it takes: {takes})"
        )
