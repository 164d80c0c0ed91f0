"""Ahead-of-time artifacts: ``cu.save(f, path, *example_args)`` and ``cu.load(path)``.

An artifact is one zip file that runs without the source code that defined the
function and without the target's compiler (see docs/runtime.md, "Ahead-of-time
artifacts", for the format and its versioning). Its members:

* ``manifest.json``: the format version, the function's name, the target with its
  options and the host requirements of its binaries (the ISA on ``cpu``), the
  versions that wrote it, the audit hashes (graph, Tensor IR, kernels), where the
  parameters are, and the sha256 of every other member;
* ``graph.json`` (the Graph IR as plain data, :mod:`cuvil_ir.serial`) and
  ``graph.txt`` (its text, for people; its hash is the graph hash);
* ``call.json``: how a call becomes graph inputs: the signature, the argument
  tree, what each argument leaf must be (dtype, device, rank; a Python value),
  the size symbols with the size assumptions, which graph input is a parameter
  or a frozen constant, and how the outputs are rebuilt;
* ``target.json`` and ``files/*``: the target's :class:`~cuvil_runtime.target.Exported`
  (on ``cpu``: the Tensor IR and kernel code, one shared object per kernel);
* ``tensors/*.bin``: raw bytes of the module's parameters and buffers (unless
  bound at load) and of the tensors the function read from globals or closures.

Loading reads the file once, from a place only its owner (or root) can write,
checks the manifest (format, torch version, the target's loader, this host
against the binaries' requirements), verifies every member's sha256, and only
then decodes anything or loads a binary. Nothing is unpickled and nothing is
evaluated: plain JSON, raw tensor bytes, and shared objects that are verified.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import struct
import tempfile
import threading
import zipfile
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from cuvil.arguments import PLAIN_TENSORS
from cuvil.call_plan import (
    VALUE_TYPES,
    PlanError,
    decode_check,
    decode_outputs,
    decode_spec,
    dtype_name,
    dtype_of,
    encode_call,
    output_leaf,
    rebuild_signature,
    state_slot,
    validate_call,
)
from cuvil.errors import CompileError
from cuvil.results import unflatten
from cuvil.submit import SerialQueue
from cuvil_runtime.grad import without_grad

FORMAT = "cuvil-aot"
#: bumped whenever a member's layout changes; an artifact of another version is refused
VERSION = 1


class ArtifactError(ValueError):
    """An artifact that cannot be loaded here: damaged, foreign, or for another host;
    the message says which and what to do."""


# -- saving -------------------------------------------------------------------------------


def save(
    f: Any, path: str | os.PathLike[str], *example_args: Any, weights: bool = True, **example_kwargs: Any
) -> Path:
    """Compile ``f`` (a ``cu.compile`` result, a function or an ``nn.Module``) for
    these example arguments and write the artifact to ``path`` (one file; written
    to a temporary name and renamed, so a reader never sees half a file).

    The artifact serves every call the compiled variant serves: every size the
    symbolic shapes and size assumptions admit, the same dtypes, devices, ranks and
    Python argument values. ``weights=False`` leaves a module's parameters and
    buffers out (``cu.load(path, module=m)`` binds them). Values the function read
    from globals, closures and attributes are frozen in: the artifact is a
    snapshot (``cuvil aot inspect`` lists them). Returns the path written.
    """
    from cuvil.api import CompiledFunction
    from cuvil.api import compile as cu_compile
    from cuvil.artifacts import graph_inputs

    cf = f if isinstance(f, CompiledFunction) else cu_compile(f, fallback="error")
    with torch.no_grad():  # an artifact is for inference: no grad-mode warning, no autograd key
        art, leaves, _ = cf._prepare(example_args, example_kwargs)
    if art.captured is None:
        raise CompileError(f"cannot save {cf.__qualname__}: it does not compile: {art.reason}")
    c = art.captured
    assert art.target is not None
    from cuvil_runtime.registry import get_target
    from cuvil_runtime.target import CompileOptions

    target = get_target(art.target)
    if not hasattr(target, "export"):
        raise CompileError(f"target {art.target!r} cannot write ahead-of-time artifacts (it has no export)")
    if not weights and cf.module is None:
        raise ValueError("weights=False is for modules: a function has no parameters to bind at load")
    options = CompileOptions(opt_level=cf.opt_level, extra=cf.options)
    exported = target.export(c.graph, options)

    from cuvil_ir.serial import Codec

    members: dict[str, bytes] = {}
    members["graph.json"] = Codec().dumps(c.graph)
    members["graph.txt"] = c.graph.text.encode()
    members["target.json"] = bytes(exported.data)
    for name, blob in exported.files.items():
        members[f"files/{name}"] = bytes(blob)

    inputs_now = graph_inputs(c, leaves)
    names = [v.name for v in c.graph.inputs]
    inputs: list[dict[str, Any]] = []
    tensors: dict[str, Any] = {}
    for j, (kind, where) in enumerate(c.inputs):
        if kind == "leaf":
            inputs.append({"kind": "leaf", "leaf": where})
            continue
        t = inputs_now[j]
        meta = _tensor_meta(t, names[j])
        if kind == "state" and not weights:
            inputs.append({"kind": "parameter", "name": names[j].removeprefix("self."), **meta})
            continue
        file = f"tensors/{len(tensors)}.bin"
        tensors[file] = t
        inputs.append(
            {"kind": "parameter" if kind == "state" else "constant", "name": names[j], "file": file, **meta}
        )
    for file, t in tensors.items():
        members[file] = _tensor_bytes(t)

    bargs, bkwargs = cf._check_call(example_args, example_kwargs)
    call = encode_call(cf, c, art.key, bargs, bkwargs)
    call["inputs"] = inputs
    members["call.json"] = _json(call)
    # the graph's hash (checked at load) and the exporting target's (its code, compiler, flags)
    audit = {"graph_ir": c.graph.hash, "target": target.hash()}
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "name": cf.__qualname__,
        "target": art.target,
        "options": {"opt_level": options.opt_level, "extra": [list(kv) for kv in options.extra]},
        "requires": dict(exported.requires),
        "versions": _versions(),
        "host": {"machine": platform.machine().lower(), "python": platform.python_version()},
        "weights": "saved" if weights or cf.module is None else "bound at load",
        "audit": audit,
        "hashes": {name: _sha(data) for name, data in sorted(members.items())},
    }
    try:
        _json(manifest)
    except (TypeError, ValueError) as e:  # an option value JSON cannot hold
        raise CompileError(f"cannot save {cf.__qualname__}: {e}") from e
    return _write(Path(path), manifest, members)


def _json(obj: Any) -> bytes:
    return (json.dumps(obj, indent=1, sort_keys=True, allow_nan=True) + "\n").encode()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str] = {"torch": str(torch.__version__)}
    for dist in ("cuvil", "cuvil-ir", "cuvil-runtime"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "unknown"
    return out


def _write(path: Path, manifest: dict[str, Any], members: dict[str, bytes]) -> Path:
    path = path.absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as raw, zipfile.ZipFile(raw, "w", zipfile.ZIP_STORED) as z:
            z.writestr(_info("manifest.json", raw.tell()), _json(manifest))
            for name in sorted(members):
                z.writestr(_info(name, raw.tell()), members[name])
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


#: members' data starts at a multiple of this in the file, so tensors are used in place
ALIGN = 64
_PAD_ID = 0xD935  # the extra-field id zipalign uses for padding


def _info(name: str, offset: int) -> zipfile.ZipInfo:
    # a fixed timestamp: the same program saves the same bytes (determinism)
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.external_attr = 0o644 << 16
    # padding in the local header's extra field puts the data at a multiple of ALIGN
    start = offset + _LOCAL_HEADER + len(name.encode()) + 4
    pad = -start % ALIGN
    info.extra = struct.pack("<HH", _PAD_ID, pad) + bytes(pad)
    return info


def _tensor_meta(t: Any, name: str) -> dict[str, Any]:
    if not isinstance(t, torch.Tensor) or t.layout is not torch.strided:
        raise CompileError(f"cannot save: {name} is not a dense tensor")
    return {"dtype": dtype_name(t.dtype), "shape": list(t.shape), "device": str(t.device)}


def _tensor_bytes(t: torch.Tensor) -> bytes:
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


# -- loading -------------------------------------------------------------------------------


def load(path: str | os.PathLike[str], *, module: torch.nn.Module | None = None) -> LoadedFunction:
    """The function saved at ``path`` by :func:`save`, ready to call (see the module doc).

    ``module`` binds a module's parameters and buffers by name instead of the saved
    ones (required when the artifact was saved with ``weights=False``); they are
    read on every call, so in-place updates are seen. Raises :class:`ArtifactError`
    for a damaged or foreign artifact, or one this host cannot run.
    """
    from cuvil_runtime import gc_pause

    path = Path(path)
    with gc_pause.paused():  # decoding makes many lasting objects: [Note: warm starts pause the collector]
        manifest, members, tensors_verified = _open_deferred(path)
        try:
            loaded = LoadedFunction(path, manifest, members, module)
        finally:
            tensors_verified()  # raises for a damaged tensor: nothing returned reads one unverified
        return loaded


def _open(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The manifest, checked, and every member, verified against its sha256: small
    members as bytes, tensors as views of the file's bytes (read once, used in place)."""
    manifest, members, tensors_verified = _open_deferred(path)
    tensors_verified()
    return manifest, members


def _open_deferred(path: Path) -> tuple[dict[str, Any], dict[str, Any], Callable[[], None]]:
    """As :func:`_open`, except that the ``tensors/`` members' sha256 (most of the file's
    bytes: 47 MB for a ResNet-18) are computed on another thread (hashlib releases the GIL)
    while the caller decodes the rest and loads the kernels; the third result waits for
    them and raises :class:`ArtifactError` for one that does not match. Every other member
    (the kernels' binaries among them) is verified before this returns. The caller must
    call it before any tensor member's bytes are read."""
    blob = _read_trusted(path)
    try:
        z = zipfile.ZipFile(_Reader(blob))  # the central directory: names and offsets
        infos = {i.filename: i for i in z.infolist()}
    except zipfile.BadZipFile as e:
        raise ArtifactError(
            f"{path} is not a cuvil artifact (not a zip file: {e}); write one with cu.save"
        ) from None
    if "manifest.json" not in infos:
        raise ArtifactError(f"{path} is not a cuvil artifact: it has no manifest.json")
    view = memoryview(blob)
    manifest = _parse_json(bytes(_member(view, infos["manifest.json"], path)), path, "manifest.json")
    _check_manifest(manifest, path)
    hashes = manifest["hashes"]
    members: dict[str, Any] = {}
    later: list[tuple[str, Any, str]] = []
    for name, digest in hashes.items():
        if name not in infos:
            raise ArtifactError(f"{path} is damaged: the manifest lists {name}, which is missing")
        data = _member(view, infos[name], path)
        if name.startswith("tensors/"):
            later.append((name, data, digest))
            members[name] = data
            continue
        if hashlib.sha256(data).hexdigest() != digest:
            raise _damaged(path, name)
        members[name] = bytes(data)
    extra = sorted(set(infos) - set(hashes) - {"manifest.json"})
    if extra:
        raise ArtifactError(f"{path} is damaged: members not in the manifest: {extra}")
    for needed in ("graph.json", "graph.txt", "call.json", "target.json"):
        if needed not in members:
            raise ArtifactError(f"{path} is damaged: it has no {needed}")
    bad: list[str] = []

    def verify() -> None:
        bad.extend(name for name, data, digest in later if hashlib.sha256(data).hexdigest() != digest)

    worker = threading.Thread(target=verify, name="cuvil-verify-tensors", daemon=True)
    worker.start()

    def verified() -> None:
        worker.join()
        if bad:
            raise _damaged(path, bad[0])

    return manifest, members, verified


def _damaged(path: Path, name: str) -> ArtifactError:
    return ArtifactError(
        f"{path} is damaged: {name} does not match its sha256 in the manifest; "
        "nothing was loaded. Copy or save it again"
    )


class _Reader(io.RawIOBase):
    """The file's bytes as a read-only file for ``zipfile``, without the copy ``io.BytesIO``
    makes of a bytearray (47 MB for a ResNet-18 artifact: 40 ms here)."""

    def __init__(self, data: bytearray) -> None:
        self._view = memoryview(data)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        chunk = self._view[self._pos : self._pos + len(b)]
        n = len(chunk)
        b[:n] = chunk
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos


#: a zip local file header's fixed part; the name and extra field follow
_LOCAL_HEADER = 30


def _member(view: memoryview, info: zipfile.ZipInfo, path: Path) -> memoryview:
    """A stored member's bytes, in place (their sha256 is checked by the caller)."""
    off = info.header_offset
    if info.compress_type != zipfile.ZIP_STORED:
        raise ArtifactError(f"{path}: {info.filename} is compressed; cu.save stores members uncompressed")
    head = view[off : off + _LOCAL_HEADER]
    if len(head) < _LOCAL_HEADER or bytes(head[:4]) != b"PK\x03\x04":
        raise ArtifactError(f"{path} is damaged: no local header for {info.filename}")
    name_len, extra_len = struct.unpack("<HH", head[26:30])
    start = off + _LOCAL_HEADER + name_len + extra_len
    data = view[start : start + info.compress_size]
    if len(data) != info.compress_size:
        raise ArtifactError(f"{path} is damaged: {info.filename} is cut short")
    return data


def _read_trusted(path: Path) -> bytearray:
    """The file's bytes, read once, if no one but its owner (you or root) can change it."""
    from cuvil_runtime import trust

    problem = trust.check_file(path)
    if problem is not None:
        raise ArtifactError(f"not loading {path}: {problem}. An artifact runs code (its kernels)")
    try:
        with open(path, "rb") as f:
            blob = bytearray(os.fstat(f.fileno()).st_size)  # writable: tensors view it in place
            if f.readinto(blob) != len(blob):
                raise OSError("the file changed size while it was read")
        return blob
    except OSError as e:
        raise ArtifactError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None


def _parse_json(data: bytes, path: Path, what: str) -> Any:
    try:
        return json.loads(data)
    except ValueError as e:
        raise ArtifactError(f"{path} is damaged: {what} is not valid JSON ({e})") from None


def _check_manifest(m: Any, path: Path) -> None:
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise ArtifactError(f"{path} is not a cuvil artifact (its manifest names no {FORMAT!r} format)")
    if m.get("version") != VERSION:
        raise ArtifactError(
            f"{path} is a version {m.get('version')} cuvil artifact; this cuvil reads version {VERSION}: "
            "save it again with this version"
        )
    for key, kind in (
        ("target", str),
        ("requires", dict),
        ("versions", dict),
        ("hashes", dict),
        ("name", str),
    ):
        if not isinstance(m.get(key), kind):
            raise ArtifactError(f"{path} is damaged: its manifest has no {key!r} {kind.__name__}")
    saved = str(m["versions"].get("torch", "?"))
    if _torch_release(saved) != _torch_release(torch.__version__):
        raise ArtifactError(
            f"{path} was saved with torch {saved}, and this process runs torch {torch.__version__}: "
            "its extern calls and tensor layouts are torch's, so save it again under this torch"
        )


def _torch_release(v: str) -> str:
    return ".".join(v.split("+")[0].split(".")[:2])


class LoadedFunction:
    """A loaded artifact: call it as the saved function (``f(*args)``, ``f.submit(...)``)."""

    def __init__(
        self, path: Path, manifest: dict[str, Any], members: dict[str, bytes], module: torch.nn.Module | None
    ) -> None:
        self.path = path
        self.manifest = manifest
        self.__name__ = self.__qualname__ = str(manifest["name"])
        target = str(manifest["target"])
        from cuvil_runtime.registry import REGISTRY, TargetUnavailableError, UnknownTargetError
        from cuvil_runtime.target import Exported

        try:
            loader = REGISTRY.loader(target)
        except (TargetUnavailableError, UnknownTargetError) as e:
            raise ArtifactError(f"{path} is for target {target!r}, which cannot load it here: {e}") from None
        problem = loader.check(manifest["requires"])
        if problem is not None:
            raise ArtifactError(f"{path} cannot run on this host: {problem}")
        call = _parse_json(members["call.json"], path, "call.json")
        graph = self._graph(members)
        if graph.hash != manifest.get("audit", {}).get("graph_ir"):
            raise ArtifactError(f"{path} is damaged: its graph does not match the graph hash of its manifest")
        try:  # every field's type, and inputs/outputs against the program, before any is read
            validate_call(call, graph, members)
        except PlanError as e:
            raise ArtifactError(
                f"{path} is damaged: call.json does not fit its schema or its program, at {e}; "
                "it was edited after cu.save wrote it: save it again"
            ) from None
        files = {n.removeprefix("files/"): b for n, b in members.items() if n.startswith("files/")}
        exported = Exported(members["target.json"], files, manifest["requires"])
        try:
            self.executable = loader.load(graph, exported)
        except ArtifactError:
            raise
        except Exception as e:
            raise ArtifactError(
                f"{path}: target {target!r} could not load its program ({type(e).__name__}: {e}); "
                "it may have been written by another cuvil build: save it again"
            ) from e
        self.graph = graph
        try:
            self._call = _CallPlan(call, members, module, path, graph)
        except (PlanError, KeyError, ValueError) as e:
            if isinstance(e, ArtifactError):
                raise
            raise ArtifactError(f"{path} is damaged: its call.json cannot be read ({e})") from None
        self._queue = SerialQueue()

    @staticmethod
    def _graph(members: Mapping[str, bytes]) -> Any:
        from cuvil_ir.serial import Codec, SerialError

        try:
            return Codec().loads(members["graph.json"])
        except (SerialError, TypeError, ValueError, KeyError) as e:
            raise ArtifactError(
                f"its graph cannot be read by this cuvil ({e}): a custom op whose plugin is not installed, "
                "or an artifact of another cuvil build (save it again)"
            ) from None

    def __repr__(self) -> str:
        return f"<cuvil artifact {self.__qualname__} target={self.manifest['target']} from {self.path}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._run(self._call.inputs(args, kwargs))

    def submit(self, *args: Any, **kwargs: Any) -> Future[Any]:
        """As ``CompiledFunction.submit``: arguments checked here, the run on the runtime's
        pool, in submission order (see :mod:`cuvil.submit`)."""
        inputs = self._call.inputs(args, kwargs)
        return self._queue.submit(lambda: self._run(inputs))

    def _run(self, inputs: list[Any]) -> Any:
        # an artifact is for inference: grad mode off around the run, as under no_grad
        return self._call.result(without_grad(self.executable, inputs))


class _CallPlan:
    """``call.json``: arguments -> graph inputs, graph outputs -> the result."""

    def __init__(
        self,
        call: dict[str, Any],
        members: Mapping[str, bytes],
        module: torch.nn.Module | None,
        path: Path,
        graph: Any,
    ) -> None:
        self.path = path
        params = call["signature"]
        self.sig = None if params is None else rebuild_signature(params)
        self.spec = decode_spec(call["arguments"])
        self.result_spec = decode_spec(call["result"])
        self.leaves = call["leaves"]
        self.outputs = decode_outputs(call)
        self.check = decode_check(call, graph)
        #: the number of positional tensors when the saved call was exactly that (no
        #: keywords, no containers, no values): such a call needs no binding or flattening
        n = len(self.leaves)
        flat = all(w["kind"] == "tensor" for w in self.leaves) and self.spec == pytree.tree_structure(
            ((0,) * n, {})
        )
        self._flat: int | None = n if flat else None
        self._getters: list[Callable[[list[Any]], Any]] = []
        for entry in call["inputs"]:
            self._getters.append(self._getter(entry, members, module))
        if module is not None and not any(e["kind"] == "parameter" for e in call["inputs"]):
            raise TypeError(f"{path}: the artifact has no module parameters to bind (module= is for modules)")

    def _getter(
        self, entry: dict[str, Any], members: Mapping[str, bytes], module: torch.nn.Module | None
    ) -> Callable[[list[Any]], Any]:
        if entry["kind"] == "leaf":
            i = int(entry["leaf"])
            return lambda leaves: leaves[i]
        dtype = dtype_of(entry["dtype"])
        shape = tuple(entry["shape"])
        name = str(entry["name"])
        if entry["kind"] == "parameter" and module is not None:
            owner, key = state_slot(module, name.removeprefix("self."), self.path)
            t = owner[key]
            if t.dtype != dtype or tuple(t.shape) != shape:
                raise TypeError(
                    f"{self.path}: module tensor {name} is {dtype_name(t.dtype)}{list(t.shape)}, and the "
                    f"artifact was saved for {dtype_name(dtype)}{list(shape)}"
                )
            return lambda leaves: owner[key]
        if "file" not in entry:
            raise TypeError(
                f"{self.path} was saved without its weights (weights=False): pass the module, "
                "cu.load(path, module=m)"
            )
        data = members[entry["file"]]
        t = _tensor_from(data, dtype, shape, self.path, name)
        return lambda leaves: t

    def inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        if not kwargs and len(args) == self._flat and all(type(a) in PLAIN_TENSORS for a in args):
            # the saved call's own structure: it bound then, so it binds now; every
            # argument and size check below still runs
            return self._checked(list(args))
        if self.sig is not None:
            try:
                self.sig.bind(*args, **kwargs)
            except TypeError as e:
                raise TypeError(f"{self.path.name}: {e}") from None
        # the call as made, as when it was saved ([Note: calls are replayed as made])
        leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
        if spec != self.spec:
            raise TypeError(
                f"{self.path.name}: the arguments' structure differs from the saved call's "
                f"({len(leaves)} leaves, {len(self.leaves)} saved; positional and keyword arguments "
                "count as saved): an artifact serves the call it was saved for"
            )
        return self._checked(leaves)

    def _checked(self, leaves: list[Any]) -> list[Any]:
        """The graph inputs of a call whose leaves match the saved structure, after every
        leaf's and the sizes' checks."""
        for leaf, want in zip(leaves, self.leaves):
            problem = _leaf_problem(leaf, want)
            if problem is not None:
                raise TypeError(f"{self.path.name}: argument {want['name']}: {problem}")
        if not self.check.holds(leaves):
            raise ValueError(
                f"{self.path.name}: {self.check.explain(leaves)}; the artifact serves only sizes it was compiled for"
            )
        return [g(leaves) for g in self._getters]

    def result(self, results: tuple[Any, ...]) -> Any:
        out = [output_leaf(kind, v, results) for kind, v in self.outputs]
        return unflatten(out, self.result_spec)


def _leaf_problem(leaf: Any, want: dict[str, Any]) -> str | None:
    kind = want["kind"]
    if kind == "tensor":
        if not isinstance(leaf, torch.Tensor):
            return f"expected a tensor, got {type(leaf).__name__}"
        dtype = dtype_name(leaf.dtype)
        if dtype != want["dtype"] or str(leaf.device) != want["device"] or leaf.dim() != want["rank"]:
            return (
                f"expected a {want['dtype']} tensor of rank {want['rank']} on {want['device']}, got a {dtype} "
                f"tensor of rank {leaf.dim()} on {leaf.device}"
            )
        if leaf.layout is not torch.strided or leaf.is_nested:
            return "expected a dense (strided) tensor"
        if want["shape"] is not None and list(leaf.shape) != want["shape"]:
            return f"expected shape {want['shape']} (saved with dynamic=False), got {list(leaf.shape)}"
        if leaf.requires_grad and torch.is_grad_enabled():
            return "requires grad with grad mode on: an artifact runs inference only (use torch.no_grad())"
        return None
    if kind == "value":
        t = VALUE_TYPES[want["type"]]
        if type(leaf) is not t or leaf != want["value"]:
            return f"the artifact was saved for {want['type']} {want['value']!r}, got {leaf!r}; save one per value"
        return None
    expected = want["value"]
    if str(leaf) != expected or type(leaf).__name__ != kind:
        return f"the artifact was saved for {kind} {expected}, got {leaf!r}"
    return None


def _tensor_from(
    data: Any, dtype: torch.dtype, shape: tuple[int, ...], path: Path, name: str
) -> torch.Tensor:
    numel = 1
    for d in shape:
        numel *= int(d)
    itemsize = torch.empty((), dtype=dtype).element_size()
    if len(data) != numel * itemsize:
        raise ArtifactError(
            f"{path} is damaged: tensor {name} has {len(data)} bytes, expected {numel * itemsize}"
        )
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    raw = torch.frombuffer(data, dtype=torch.uint8)  # a view of the file's bytes: no copy
    if raw.data_ptr() % itemsize:  # not written by cu.save (which aligns): copy to align
        raw = raw.clone()
    return raw.view(dtype).reshape(shape)


# -- inspecting ------------------------------------------------------------------------


def inspect_artifact(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What ``cuvil aot inspect`` shows: the manifest and the saved call (every member
    verified first), member sizes, and whether this host can run it (and if not, why)."""
    path = Path(path)
    manifest, members = _open(path)
    from cuvil_runtime.registry import REGISTRY, TargetUnavailableError, UnknownTargetError

    try:
        why_not = REGISTRY.loader(str(manifest["target"])).check(manifest["requires"])
    except (TargetUnavailableError, UnknownTargetError) as e:
        why_not = str(e)
    return {
        "manifest": manifest,
        "call": _parse_json(members["call.json"], path, "call.json"),
        "graph": members["graph.txt"].decode(),
        "sizes": {name: len(data) for name, data in sorted(members.items())},
        "runs_here": why_not is None,
        "why_not": why_not,
    }


__all__ = ["ArtifactError", "LoadedFunction", "inspect_artifact", "load", "save"]
