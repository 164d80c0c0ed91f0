"""Which GEMM runs a linear or a half-precision matrix product: measured on this host,
per shape, and remembered.

[Note: GEMM choice] The cpu target has three GEMMs for ``F.linear``: oneDNN's
(``torch.ops.mkldnn._linear_pointwise`` on a weight packed once per version), torch's
default (MKL's ``sgemm`` through ``F.linear``) and our own on a weight packed once per
version (``packed``: ``packed_gemm.c``, register tiles of rows by panels of the packed
weight), and for a few rows (decode steps, at most ``quant_linear.F32_GEMV_ROWS``) a
fourth, our own GEMV (``gemv``: ``quant_linear.c`` on float32 weights, which streams each
weight row once). Which is
faster depends on the host and the shape: on an AVX-512 EPYC oneDNN was 2.5x MKL on
transformer-sized linears, while each oneDNN call costs about 10 us of setup that small
products never win back; on AVX2 hosts the two are closer and the order changes with
the shape. So the first call of a shape times the candidates, on the call's own
operands, interleaved, and keeps the fastest; later calls of that shape look the
answer up.

The key is ``(rows bucket, in features, out features, bias, threads)``: the number of
rows is a symbolic size (batch x sequence) that changes between calls, so rows are
bucketed by powers of two and a bucket is measured once, at the first row count that
falls in it. Answers are kept in memory and in a JSON record in the kernel cache's
private folder (``gemm-<host, ISA, torch, threads>.json``, written atomically, read
only when private: docs/security.md), so a warm start measures nothing. The record
is data, never code: a bad entry can only pick the slower of two correct GEMMs. The
record's name covers the candidates too, so a new candidate is measured, not skipped
for an answer given before it existed. ``CUVIL_CPU_GEMM=onednn|mkl|packed|gemv`` forces
one where it applies (benchmarks, bisecting a numerical difference: they round
differently, within float32 GEMM tolerance).

Float16 and bfloat16 products choose among other candidates, under keys that name the
dtype (``eager``, ``onednn``, ``f32``: [Note: half-precision GEMMs] in
:mod:`cuvil_backend_cpu.half_gemm`); ``CUVIL_CPU_GEMM=eager|f32`` forces those.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from cuvil_runtime import trust

#: forces a GEMM: "onednn", "mkl", "packed" or "gemv" (anything else, or unset: measure)
GEMM_ENV = "CUVIL_CPU_GEMM"
#: timed calls of each candidate, interleaved, at the first call of a shape: at least
#: REPEATS rounds, more until each candidate has run for MEASURE_SECONDS, at most MAX_REPEATS
#: (a small product's five calls are a fraction of a millisecond, where one preemption on a
#: busy host decides the median; measured on the AVX2 host, five rounds picked a GEMM 10-20%
#: slower than the best one for several of the zoo's shapes)
REPEATS = 5
MAX_REPEATS = 41
MEASURE_SECONDS = 0.004
CANDIDATES = ("onednn", "mkl", "packed", "gemv", "eager", "f32", "grouped", "members", "sdpa", "flash")

_lock = threading.Lock()
_choices: dict[str, str] | None = None


def _bucket(rows: int) -> int:
    return 1 << max(rows - 1, 0).bit_length()


def key(
    rows: int,
    k: int,
    n: int,
    has_bias: bool,
    *,
    dtype: torch.dtype | None = None,
    batch: int | None = None,
    epilogue: str | None = None,
) -> str:
    """The shape key: rows by power-of-two buckets; a batched product (``batch``), a
    dtype other than float32 and a fused epilogue (``relu``, ``none+r`` ...) are part of it."""
    text = f"{_bucket(rows)}x{k}x{n}{'+b' if has_bias else ''}@{torch.get_num_threads()}"
    if epilogue is not None:
        text = f"{text}:{epilogue}"
    if batch is not None:
        text = f"b{_bucket(batch)}:{text}"
    if dtype is not None and dtype != torch.float32:
        text = f"{text}:{str(dtype).removeprefix('torch.')}"
    return text


def _record_path() -> Path:
    from cuvil_backend_cpu.toolchain import cpuinfo, default_kernel_cache_dir, requested_isa

    info = cpuinfo()
    ident = "\n".join(
        [torch.__version__, requested_isa(), info.get("model name", ""), info.get("flags", ""), *CANDIDATES]
    )
    folder = trust.trusted_dir(default_kernel_cache_dir(), "kernel cache")
    return folder / f"gemm-{hashlib.sha256(ident.encode()).hexdigest()[:24]}.json"


def _load() -> dict[str, str]:
    global _choices
    if _choices is None:
        loaded: dict[str, str] = {}
        try:
            data = trust.read_private_file(_record_path())
            record = json.loads(data) if data is not None else {}
        except (OSError, ValueError):
            record = {}
        if isinstance(record, dict):
            loaded = {k: v for k, v in record.items() if isinstance(k, str) and v in CANDIDATES}
        _choices = loaded
    return _choices


def _save(choices: dict[str, str]) -> None:
    """Atomically (temp file + ``os.replace``); a read-only cache only costs a re-measure."""
    try:
        path = _record_path()
        trust.make_dirs(path.parent)
    except OSError:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        tmp.write_text(json.dumps(dict(sorted(choices.items())), indent=1) + "\n")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def _measure(run: dict[str, Callable[[], Any]]) -> str:
    times: dict[str, list[float]] = {name: [] for name in run}
    for fn in run.values():  # warm: first calls build primitives and pack weights
        fn()
    for rounds in range(MAX_REPEATS):
        for name, fn in run.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
        if rounds + 1 >= REPEATS and all(sum(t) >= MEASURE_SECONDS for t in times.values()):
            break
    return min(run, key=lambda name: (statistics.median(times[name]), CANDIDATES.index(name)))


#: (rows bucket, in, out, bias, threads, $CUVIL_CPU_GEMM, candidates) -> the answer: what
#: a call after the first of its shape asks, without building the record's key
_fast: dict[tuple[Any, ...], str] = {}


def known(rows: int, k: int, n: int, has_bias: bool, candidates: Any) -> tuple[tuple[Any, ...], str | None]:
    """The answer already given for this shape (``candidates``: which were offered, and for
    an epilogue which one), and the key :func:`choose` remembers it under when there is none yet."""
    fast = (_bucket(rows), k, n, has_bias, torch.get_num_threads(), os.environ.get(GEMM_ENV), candidates)
    return fast, _fast.get(fast)


def choose(shape_key: str, run: dict[str, Callable[[], Any]], fast: tuple[Any, ...] | None = None) -> str:
    """The GEMM for ``shape_key``: forced by ``$CUVIL_CPU_GEMM``, remembered, or measured
    now by calling each of ``run`` (name -> a call of that GEMM on this call's operands);
    remembered under ``fast`` too (:func:`known`)."""
    forced = os.environ.get(GEMM_ENV, "").strip().lower()
    if forced in run:
        found: str = forced
    else:
        known_choice = _choices.get(shape_key) if _choices is not None else None
        if known_choice in run:  # a shape's later calls: no lock
            found = known_choice  # type: ignore[assignment]
        else:
            with _lock:
                choices = _load()
                found = choices.get(shape_key)  # type: ignore[assignment]
                if found not in run:
                    found = _measure(run)
                    choices[shape_key] = found
                    _save(choices)
    if fast is not None:
        _fast[fast] = found
    return found


def forget() -> None:
    """Drop what this process remembers (tests); the record on disk stays."""
    global _choices
    with _lock:
        _choices = None
        _fast.clear()


__all__ = ["CANDIDATES", "GEMM_ENV", "choose", "forget", "key", "known"]
