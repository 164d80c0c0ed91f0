"""Shape and data-movement ops: ``Constant``, ``Shape``, ``Size``, ``Gather``, (un)squeeze,
``Concat``, ``Reshape``, ``Flatten``, ``Transpose``, ``Expand``, ``Tile``, ``Slice``,
``Split``, ``ConstantOfShape``, ``Range``, ``Trilu``, ``Pad``. Each folds when its data
input is known (shape computations stay :class:`~cuvil.onnx.import_.folding.Known`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from cuvil.onnx.export.exporter import python_value
from cuvil.onnx.import_.folding import Known, to_dim
from cuvil.onnx.import_.loader import (
    Importer,
    OnnxImportError,
    attribute_text,
    dtype_of,
    norm_axis,
    rank,
    register,
    to_dtype,
)
from cuvil_ir.graph_ir.types import DType


@register("Constant")
def _constant(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    from onnx import numpy_helper

    for a in node.attribute:
        if a.name == "value":
            return Known(numpy_helper.to_array(a.t), to_dtype(a.t.data_type))
        if a.name in ("value_int", "value_float"):
            return Known(
                np.array(a.i if a.name == "value_int" else a.f),
                DType.i64 if a.name == "value_int" else DType.f32,
            )
        if a.name in ("value_ints", "value_floats"):
            vals = list(a.ints) if a.name == "value_ints" else list(a.floats)
            return Known(np.array(vals), DType.i64 if a.name == "value_ints" else DType.f32)
    raise OnnxImportError("Constant without a supported value attribute")


@register("Shape")
def _shape(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    v = im.env[ins[0]]
    shape = list(v.array.shape) if isinstance(v, Known) else list(v.type.shape)  # type: ignore[union-attr]
    r = len(shape)
    start = attrs.get("start", 0)
    end = attrs.get("end", r)
    start = max(0, min(r, start + r if start < 0 else start))
    end = max(0, min(r, end + r if end < 0 else end))
    return Known(np.array(shape[start:end], dtype=object), DType.i64)


@register("Size")
def _size(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    v = im.tensor(ins[0])
    n: Any = 1
    for d in v.type.shape:  # type: ignore[union-attr]
        n = n * d
    return Known(np.array(n, dtype=object), DType.i64)


@register("Gather")
def _gather(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    axis = attrs.get("axis", 0)
    kd, ki = im.maybe_known(ins[0]), im.maybe_known(ins[1])
    if kd is not None and ki is not None and kd.array.size <= 64:
        idx = ki.array.astype(np.int64)
        return Known(np.take(kd.array, idx, axis=axis), kd.dtype)
    if ki is not None and ki.array.ndim == 0:
        x = im.tensor(ins[0])
        return im.emit("select", [x], dim=norm_axis(axis, rank(x)), index=to_dim(ki.array.reshape(-1)[0]))
    x, i = im.tensor(ins[0]), im.tensor(ins[1])
    if norm_axis(axis, rank(x)) == 0 and rank(x) == 2:
        if dtype_of(i) not in (DType.i32, DType.i64):
            i = im.emit("cast", [i], dtype=DType.i64)
        return im.emit("embedding", [i, x])
    raise OnnxImportError("Gather of tensor indices along an axis other than 0 of a 2-D tensor")


@register("Unsqueeze")
def _unsqueeze(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    axes = attrs.get("axes")
    if axes is None:
        axes = im.known(ins[1], "Unsqueeze axes").ints()
    k = im.maybe_known(ins[0])
    if k is not None:
        r = k.array.ndim + len(axes)
        arr = k.array
        for a in sorted(norm_axis(a, r) for a in axes):
            arr = np.expand_dims(arr, a)
        return Known(arr, k.dtype)
    x = im.tensor(ins[0])
    r = rank(x) + len(axes)
    for a in sorted(norm_axis(a, r) for a in axes):
        x = im.emit("unsqueeze", [x], dim=a)
    return x


@register("Squeeze")
def _squeeze(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    axes = attrs.get("axes")
    if axes is None and len(ins) > 1 and ins[1]:
        axes = im.known(ins[1], "Squeeze axes").ints()
    k = im.maybe_known(ins[0])
    if k is not None:
        return Known(np.squeeze(k.array, axis=None if axes is None else tuple(axes)), k.dtype)
    x = im.tensor(ins[0])
    r = rank(x)
    if axes is None:
        axes = [i for i, d in enumerate(x.type.shape) if d == 1]  # type: ignore[union-attr]
    return im.emit("squeeze", [x], dims=tuple(sorted(norm_axis(a, r) for a in axes)))


@register("Concat")
def _concat(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    axis = attrs["axis"]
    ks = [im.maybe_known(i) for i in ins]
    if all(k is not None for k in ks):
        return Known(np.concatenate([k.array for k in ks if k is not None], axis=axis), ks[0].dtype)  # type: ignore[union-attr]
    vals = [im.tensor(i) for i in ins]
    return im.emit("cat", vals, dim=norm_axis(axis, rank(vals[0])))


@register("Reshape")
def _reshape(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    shape = im.known(ins[1], "Reshape shape").ints()
    k = im.maybe_known(ins[0])
    x_shape = list(k.array.shape) if k is not None else list(im.tensor(ins[0]).type.shape)  # type: ignore[union-attr]
    if not attrs.get("allowzero", 0):
        shape = [x_shape[i] if (isinstance(d, int) and d == 0) else d for i, d in enumerate(shape)]
    if k is not None and all(isinstance(d, int) for d in shape):
        return Known(k.array.reshape(shape), k.dtype)
    return im.emit("reshape", [im.tensor(ins[0])], shape=tuple(shape))


@register("Flatten")
def _flatten(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    x = im.tensor(ins[0])
    axis = norm_axis(attrs.get("axis", 1), rank(x))
    shape = list(x.type.shape)  # type: ignore[union-attr]
    a: Any = 1
    for d in shape[:axis]:
        a = a * d
    return im.emit("reshape", [x], shape=(to_dim(a), -1))


@register("Transpose")
def _transpose(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    x = im.tensor(ins[0])
    perm = attrs.get("perm") or list(reversed(range(rank(x))))
    return im.emit("permute", [x], perm=tuple(perm))


@register("Expand")
def _expand(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    shape = im.known(ins[1], "Expand shape").ints()
    x = im.tensor(ins[0])
    xs = list(x.type.shape)  # type: ignore[union-attr]
    r = max(len(xs), len(shape))
    xs = [1] * (r - len(xs)) + xs
    shape = [1] * (r - len(shape)) + shape
    out = tuple(b if (isinstance(a, int) and a == 1) else a for a, b in zip(xs, shape))
    return im.emit("expand", [x], shape=out)


@register("Tile")
def _tile(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    return im.emit("repeat", [im.tensor(ins[0])], repeats=tuple(im.known(ins[1], "Tile repeats").ints()))


@register("Slice")
def _slice(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    starts = im.known(ins[1], "Slice starts").ints()
    ends = im.known(ins[2], "Slice ends").ints()
    axes = im.known(ins[3], "Slice axes").ints() if len(ins) > 3 and ins[3] else list(range(len(starts)))
    steps = im.known(ins[4], "Slice steps").ints() if len(ins) > 4 and ins[4] else [1] * len(starts)
    k = im.maybe_known(ins[0])
    if k is not None and all(isinstance(v, int) for v in starts + ends):
        idx = [slice(None)] * k.array.ndim
        for s, e, a, st in zip(starts, ends, axes, steps):
            idx[a] = slice(s, e, st)
        return Known(k.array[tuple(idx)], k.dtype)
    x = im.tensor(ins[0])
    r = rank(x)
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = norm_axis(a, r)
        if st < 0:
            if s == -1 and isinstance(e, int) and e <= -(2**62) and st == -1:
                x = im.emit("flip", [x], dims=(a,))
                continue
            raise OnnxImportError("Slice with a negative step (other than a full reversal)")
        end = None if isinstance(e, int) and e >= 2**62 else e
        start = None if (isinstance(s, int) and s == 0) else s
        if start is None and end is None and st == 1:
            continue
        x = im.emit("slice", [x], dim=a, start=start, end=end, step=st)
    return x


@register("Split")
def _split(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    x = im.tensor(ins[0])
    axis = norm_axis(attrs.get("axis", 0), rank(x))
    sizes = attrs.get("split")
    if sizes is None and len(ins) > 1 and ins[1]:
        sizes = im.known(ins[1], "Split sizes").ints()
    if sizes is None:
        n = len(node.output)
        d = x.type.shape[axis]  # type: ignore[union-attr]
        if not isinstance(d, int):
            raise OnnxImportError("Split into equal parts of a symbolic dim")
        size = -(-d // n)
        sizes = [size] * (n - 1) + [d - size * (n - 1)]
    out = im.emit("split", [x], dim=axis, sizes=tuple(sizes))
    return list(out) if isinstance(out, tuple) else [out]


@register("ConstantOfShape")
def _constant_of_shape(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    from onnx import numpy_helper

    shape = tuple(im.known(ins[0], "ConstantOfShape shape").ints())
    t = attrs.get("value")
    if t is not None:
        arr = numpy_helper.to_array(t)
        dt, value = to_dtype(t.data_type), arr.reshape(-1)[0].item()
    else:
        dt, value = DType.f32, 0.0
    if all(isinstance(d, int) for d in shape) and int(np.prod(shape)) <= 64:
        return Known(np.full(shape, value, dtype=object), dt)
    return im.emit("full", [], shape=shape, value=python_value(value, dt), dtype=dt, device=im.device)


@register("Range")
def _range(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    ks = [im.known(i, "Range bound") for i in ins]
    start, end, step = (to_dim(k.array.reshape(-1)[0]) for k in ks)
    dt = ks[0].dtype
    if all(isinstance(v, (int, float)) for v in (start, end, step)) and abs((end - start) / step) <= 64:
        return Known(np.arange(start, end, step).astype(object), dt)
    return im.emit("arange", [], start=start, end=end, step=step, dtype=dt, device=im.device)


@register("Trilu")
def _trilu(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    k = int(im.known(ins[1], "Trilu k").array.reshape(-1)[0]) if len(ins) > 1 and ins[1] else 0
    return im.emit("triu" if attrs.get("upper", 1) else "tril", [im.tensor(ins[0])], diagonal=k)


@register("Pad")
def _pad(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    x = im.tensor(ins[0])
    r = rank(x)
    pads = im.known(ins[1], "Pad pads").ints() if len(ins) > 1 and ins[1] else list(attrs.get("pads", []))
    if len(ins) > 3 and ins[3]:
        raise OnnxImportError("Pad with axes")
    value: Any = 0.0
    if len(ins) > 2 and ins[2]:
        value = to_dim(im.known(ins[2], "Pad value").array.reshape(-1)[0])
    mode = {"constant": "constant", "reflect": "reflect", "edge": "replicate", "wrap": "circular"}[
        attribute_text(attrs.get("mode", "constant"))
    ]
    torch_pad: list[Any] = []
    for i in reversed(range(r)):
        torch_pad += [pads[i], pads[r + i]]
    while len(torch_pad) > 2 and torch_pad[-2:] == [0, 0]:
        torch_pad = torch_pad[:-2]
    return im.emit("pad", [x], pad=tuple(torch_pad), mode=mode, value=value if mode == "constant" else None)


__all__: list[str] = []
