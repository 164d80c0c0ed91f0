"""The ``cpu`` target's emulation mode: kernels built for an AArch64 level on another machine,
run under ``qemu-aarch64`` (``CUVIL_CPU_ISA=<level> CUVIL_CPU_EMULATE=qemu``; docs/cpu-backend.md).

Everything else stays as it is on the host: capture, lowering, code generation, the kernel
cache (its sources, keys and signed entries; the cross compiler builds them), extern calls
(torch, on the host) and the program runner. Only loading a kernel differs: where
:meth:`KernelCache.load <cuvil_backend_cpu.kernel_cache.KernelCache.load>` would ``dlopen``
the shared object into this process, it hands the verified bytes to a server process
(``emulation_server.c``, built by the cross compiler) running under qemu, which ``dlopen`` s
them there. What comes back is an :class:`EmulatedLibrary`, whose functions take the same
arguments as the ctypes ones except that buffers are **tensors**, not addresses
(:class:`~cuvil_runtime.target.Launch` ``tensors=True``), since memory must be copied across:

* each call copies the storages of its tensor arguments (whole storages, merged where they
  overlap, so in-place kernels and views alias there as they do here), runs the kernel, and
  copies back the bytes that changed;
* the call goes through a trampoline, one small C function per kernel signature, built and
  cached like any kernel, which calls the kernel with its arguments in its own types.

So the code that runs is the code the target generated, built by a real compiler for the level,
on an emulated CPU of that level (see :data:`cuvil_backend_cpu.aarch64.LEVELS`): an instruction
beyond the level dies with SIGILL, reported here with the kernel's name. Speed means nothing.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import select
import signal
import struct
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from cuvil_backend_cpu.toolchain import Toolchain
from cuvil_runtime import trust

SERVER_SOURCE = (Path(__file__).parent / "emulation_server.c").read_text()

#: seconds one request may take before the server is taken for hung (a kernel under qemu is
#: 10-100x slower than native; the corpus's take milliseconds)
TIMEOUT = 900.0


class EmulationError(OSError):
    """The emulated server could not be built or started, could not load a kernel, or died while
    running one (a crash, an illegal instruction); the message names the kernel and the CPU."""


# -- the C side of a call ---------------------------------------------------------------------------------

_POINTER = "p"
#: ctypes argument type -> (C type, which array the server passes it in)
_C_TYPES: dict[Any, tuple[str, str]] = {
    ctypes.c_void_p: ("void *", _POINTER),
    ctypes.c_char_p: ("void *", _POINTER),
    ctypes.c_int64: ("int64_t", "i"),
    ctypes.c_int32: ("int32_t", "i"),
    ctypes.c_int16: ("int16_t", "i"),
    ctypes.c_int8: ("int8_t", "i"),
    ctypes.c_uint8: ("uint8_t", "i"),
    ctypes.c_bool: ("_Bool", "i"),
    ctypes.c_float: ("float", "d"),
    ctypes.c_double: ("double", "d"),
}


def _c_type(t: Any) -> tuple[str, str]:
    if isinstance(t, type) and issubclass(t, ctypes._Pointer):  # POINTER(c_int64) & co.
        return "void *", _POINTER
    if t not in _C_TYPES:
        raise EmulationError(f"emulated kernels take no argument of type {getattr(t, '__name__', t)}")
    return _C_TYPES[t]


def trampoline_source(argtypes: Sequence[Any], restype: Any) -> str:
    """C for ``cuvil_emu_call(fn, p, i, d)``: calls ``fn`` with pointers from ``p``, integers
    from ``i`` and floats from ``d``, in the order and types of ``argtypes``; returns its int
    result (0 for a void function)."""
    params, args, used = [], [], {_POINTER: 0, "i": 0, "d": 0}
    for t in argtypes:
        ctype, kind = _c_type(t)
        params.append(ctype)
        args.append(f"({ctype}){kind}[{used[kind]}]")
        used[kind] += 1
    ret = "void" if restype is None else _c_type(restype)[0]
    call = f"((cuvil_fn)fn)({', '.join(args)})"
    body = f"{call};\n  return 0;" if restype is None else f"return (int){call};"
    return (
        "#include <stdint.h>\n"
        f"typedef {ret} (*cuvil_fn)({', '.join(params) or 'void'});\n"
        "int cuvil_emu_call(void *fn, void *const *p, const int64_t *i, const double *d) {\n"
        f"  {body}\n}}\n"
    )


# -- the server ----------------------------------------------------------------------------------------


class Server:
    """One ``emulation_server`` under qemu for one toolchain; requests are serialized. When it
    dies (a kernel crashed) the next request starts a fresh one, whose :attr:`generation`
    tells libraries to load themselves again."""

    def __init__(self, toolchain: Toolchain) -> None:
        self.toolchain = toolchain
        self.generation = 0
        self._lock = threading.RLock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._folder = trust.private_dir("emulation")
        self._program = self._build()
        self._stderr = self._folder / "server.stderr"

    def _build(self) -> Path:
        source = self._folder / "emulation_server.c"
        source.write_text(SERVER_SOURCE)
        program = self._folder / "emulation_server"
        cmd = [self.toolchain.cc, "-O2", "-std=c11", "-D_GNU_SOURCE", "-o", str(program), str(source), "-ldl"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise EmulationError(
                f"building the emulation server failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}"
            )
        return program

    def _started(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        if self._proc is not None:  # died between requests
            self._forget()
        with open(self._stderr, "wb") as err:
            self._proc = subprocess.Popen(
                [*self.toolchain.emulator, str(self._program)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
            )
        return self._proc

    def _forget(self) -> None:
        """A dead server's handles mean nothing to the next one: libraries load themselves again."""
        self._proc = None
        self.generation += 1

    def _died(self, what: str) -> EmulationError:
        proc = self._proc
        assert proc is not None
        if proc.poll() is None:
            proc.kill()
        code = proc.wait()
        self._forget()
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        try:
            err = self._stderr.read_text(errors="replace").strip()[-2000:]
        except OSError:
            err = ""
        cpu = " ".join(self.toolchain.emulator[:3])
        return EmulationError(
            f"{what} under `{cpu}` ended the emulated process ({how})"
            + (f": {err}" if err else "")
            + (
                "; an illegal instruction means the code uses a feature the "
                f"{self.toolchain.isa} level does not have"
                if "SIGILL" in how or "Illegal" in err
                else ""
            )
        )

    def request(self, data: bytes, reply: Callable[[Callable[[int], bytes]], Any], what: str) -> Any:
        """Send ``data``; ``reply(read)`` reads the answer with ``read(n)`` (exactly ``n`` bytes)."""
        with self._lock:
            proc = self._started()
            assert proc.stdin is not None and proc.stdout is not None
            out = proc.stdout.fileno()

            def read(n: int) -> bytes:
                parts, left = [], n
                while left:
                    ready, _, _ = select.select([out], [], [], TIMEOUT)
                    if not ready:
                        raise self._died(f"{what} took over {TIMEOUT:.0f} s and")
                    chunk = os.read(out, min(left, 1 << 20))
                    if not chunk:
                        raise self._died(what)
                    parts.append(chunk)
                    left -= len(chunk)
                return b"".join(parts)

            try:
                proc.stdin.write(data)
                proc.stdin.flush()
            except BrokenPipeError:
                raise self._died(what) from None
            return reply(read)

    def load(self, path: Path, what: str) -> int:
        encoded = os.fsencode(path)
        return self._named(b"L" + struct.pack("<I", len(encoded)) + encoded, f"loading {what}")

    def symbol(self, handle: int, name: str, what: str) -> int:
        encoded = name.encode()
        data = b"S" + struct.pack("<QI", handle, len(encoded)) + encoded
        return self._named(data, f"looking up {name!r} in {what}")

    def _named(self, data: bytes, what: str) -> int:
        def reply(read: Callable[[int], bytes]) -> tuple[int, str]:
            value, n = struct.unpack("<QI", read(12))
            return value, read(n).decode(errors="replace")

        value, error = self.request(data, reply, what)
        if not value:
            raise EmulationError(f"{what} under qemu-aarch64 failed: {error}")
        return int(value)

    def close(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            try:
                assert proc.stdin is not None
                proc.stdin.write(b"Q")
                proc.stdin.close()
                proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()


_servers: dict[str, Server] = {}
_servers_lock = threading.Lock()


def server(toolchain: Toolchain) -> Server:
    """The server for ``toolchain`` (one per process and toolchain)."""
    with _servers_lock:
        found = _servers.get(toolchain.identity)
        if found is None:
            if not _servers:
                atexit.register(_close_all)
            found = _servers[toolchain.identity] = Server(toolchain)
        return found


def _close_all() -> None:
    for s in list(_servers.values()):
        s.close()


# -- libraries and functions -------------------------------------------------------------------------------


class EmulatedLibrary:
    """A kernel's shared object loaded in the server: ``lib[name]`` / ``lib.name`` are its
    functions (:class:`EmulatedFunction`), as with ``ctypes.CDLL``."""

    def __init__(
        self, server: Server, data: bytes, folder: Path, stem: str, what: str, trampolines: Trampolines
    ) -> None:
        self._server, self._data, self._folder, self._stem = server, data, folder, stem
        self.what = what
        self._trampolines = trampolines
        self._loaded = (-1, 0)  # (server generation, handle)
        self._functions: dict[str, EmulatedFunction] = {}
        self.handle()

    def handle(self) -> int:
        """The server's handle, loading the bytes (again, after the server was restarted)."""
        generation = self._server.generation
        if self._loaded[0] != generation:
            # as kernel_cache.load_library does: a private copy of the verified bytes, removed once loaded
            fd, name = tempfile.mkstemp(prefix=f"{self._stem}-", suffix=".so", dir=self._folder)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(self._data)
                handle = self._server.load(Path(name), self.what)
            finally:
                os.unlink(name)
            self._loaded = (self._server.generation, handle)
        return self._loaded[1]

    def __getitem__(self, name: str) -> EmulatedFunction:
        fn = self._functions.get(name)
        if fn is None:
            self._server.symbol(self.handle(), name, self.what)  # a missing symbol fails here, as ctypes does
            fn = self._functions[name] = EmulatedFunction(self, name)
        return fn

    def __getattr__(self, name: str) -> EmulatedFunction:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self[name]
        except EmulationError as e:
            raise AttributeError(str(e)) from None

    def address(self, name: str) -> int:
        return self._server.symbol(self.handle(), name, self.what)


#: builds (once) and loads the trampoline for a C source: the kernel cache's build and load
Trampolines = Callable[[str], EmulatedLibrary]


class EmulatedFunction:
    """A function of an :class:`EmulatedLibrary`. Set ``argtypes`` and ``restype`` as for
    ctypes; pointer arguments are tensors (their storage is copied there and back), ``bytes``
    (copied there), ctypes objects or ``byref`` of them (copied there and back) or ``None``."""

    def __init__(self, library: EmulatedLibrary, name: str) -> None:
        self.library, self.name = library, name
        self.argtypes: Sequence[Any] | None = None
        self.restype: Any = ctypes.c_int
        self._trampoline: tuple[tuple[Any, ...], Any, EmulatedLibrary] | None = None
        #: (server generation, trampoline, the function's address, the trampoline's) of the last call
        self._addresses: tuple[int, EmulatedLibrary, int, int] | None = None

    def _trampoline_library(self) -> EmulatedLibrary:
        if self.argtypes is None:
            raise EmulationError(
                f"{self.name} of {self.library.what}: set argtypes before calling it emulated"
            )
        key = (tuple(self.argtypes), self.restype)
        if self._trampoline is None or self._trampoline[:2] != key:
            lib = self.library._trampolines(trampoline_source(self.argtypes, self.restype))
            self._trampoline = (*key, lib)
        return self._trampoline[2]

    def __call__(self, *args: Any) -> Any:
        trampoline = self._trampoline_library()
        assert self.argtypes is not None
        if len(args) != len(self.argtypes):
            raise TypeError(f"{self.name} takes {len(self.argtypes)} arguments ({len(args)} given)")
        call = _Call()
        for t, value in zip(self.argtypes, args):
            kind = _c_type(t)[1]
            if kind == _POINTER:
                call.pointer(value, self.name)
            elif kind == "i":
                call.ints.append(int(value))
            else:
                call.floats.append(float(value))
        server = self.library._server
        with server._lock:  # the addresses and the call against one server
            known = self._addresses
            if known is None or known[0] != server.generation or known[1] is not trampoline:
                fn, tramp = self.library.address(self.name), trampoline.address("cuvil_emu_call")
                known = self._addresses = (server.generation, trampoline, fn, tramp)
            what = f"kernel {self.name!r} ({self.library.what})"
            result = server.request(call.encode(known[3], known[2]), call.reply, what)
        call.copy_back()
        return None if self.restype is None else result


class _Call:
    """One call's memory: regions of host memory (copied over and back) and the arguments."""

    def __init__(self) -> None:
        #: (host address or None for bytes, the bytes now)
        self.regions: list[tuple[int | None, bytes]] = []
        self.ranges: list[tuple[int, int]] = []  # host [start, end) of each tensor/ctypes object
        self.pointers: list[tuple[str, Any]] = []  # ("null",), ("bytes", i) or ("host", address)
        self.ints: list[int] = []
        self.floats: list[float] = []
        self.results: list[bytes] = []

    def pointer(self, value: Any, name: str) -> None:
        if value is None:
            self.pointers.append(("null", None))
        elif isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            start = storage.data_ptr()
            self.ranges.append((start, start + storage.nbytes()))
            self.pointers.append(("host", value.data_ptr()))
        elif isinstance(value, (bytes, bytearray)):
            self.pointers.append(("bytes", len(self.regions)))
            self.regions.append((None, bytes(value)))
        elif hasattr(value, "_obj") or isinstance(
            value, ctypes._SimpleCData | ctypes.Array | ctypes.Structure
        ):
            obj = getattr(value, "_obj", value)  # ctypes.byref(obj) keeps obj in _obj
            start = ctypes.addressof(obj)
            self.ranges.append((start, start + ctypes.sizeof(obj)))
            self.pointers.append(("host", start))
        else:
            raise EmulationError(
                f"{name}: an emulated kernel takes tensors, bytes or ctypes objects for its pointers, "
                f"not {type(value).__name__} (an address means nothing in the emulated process)"
            )

    def encode(self, trampoline: int, fn: int) -> bytes:
        merged: list[list[int]] = []
        for start, end in sorted(self.ranges):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        base = len(self.regions)
        for start, end in merged:
            self.regions.append((start, ctypes.string_at(start, end - start) if end > start else b""))
        parts = [b"C", struct.pack("<QQI", trampoline, fn, len(self.regions))]
        for address, data in self.regions:
            parts.append(struct.pack("<QI", len(data), (address or 0) % 64))
            parts.append(data)
        parts.append(struct.pack("<I", len(self.pointers)))
        for kind, value in self.pointers:
            if kind == "null":
                parts.append(struct.pack("<iQ", -1, 0))
            elif kind == "bytes":
                parts.append(struct.pack("<iQ", value, 0))
            else:
                r = next(i for i, (s, e) in enumerate(merged) if s <= value <= e)
                parts.append(struct.pack("<iQ", base + r, value - merged[r][0]))
        parts.append(struct.pack(f"<I{len(self.ints)}q", len(self.ints), *self.ints))
        parts.append(struct.pack(f"<I{len(self.floats)}d", len(self.floats), *self.floats))
        return b"".join(parts)

    def reply(self, read: Callable[[int], bytes]) -> int:
        (result,) = struct.unpack("<i", read(4))
        self.results = [read(len(data)) for _, data in self.regions]
        return int(result)

    def copy_back(self) -> None:
        """Write back what the kernel changed (only that: an input's memory is never written)."""
        for (address, before), after in zip(self.regions, self.results):
            if address is not None and after != before:
                ctypes.memmove(address, after, len(after))


def load_library(
    toolchain: Toolchain, data: bytes, folder: Path, stem: str, what: str, trampolines: Trampolines
) -> EmulatedLibrary:
    """The verified shared object ``data`` loaded in ``toolchain``'s server (a copy written into
    ``folder``, a folder only this process uses, and removed once loaded)."""
    return EmulatedLibrary(server(toolchain), data, folder, stem, what, trampolines)


__all__ = [
    "EmulatedFunction",
    "EmulatedLibrary",
    "EmulationError",
    "Server",
    "load_library",
    "server",
    "trampoline_source",
]
