"""Float16 and bfloat16 in the generated C: storage as bits, values as float.

[Note: half precision in C] A kernel holds a float16 or bfloat16 element in a
``uint16_t`` in memory and as a ``float`` in registers. The ``float`` of a half
value is always exactly representable in its type: a load widens the bits
(exact), a cast to the type rounds (:data:`HELPERS`' ``cu_round_*``), a store packs
the bits and rounds on the way (``cu_st_*``; a value already rounded packs
exactly), constants are rounded as torch rounds them. Lowering has made
every half op compute in float32 and cast its result back ([Note: opmath] in
:mod:`cuvil_ir.tensor_ir.rules.helpers`), so what the C does is torch's: widen,
compute in float, round once per op.

The conversions are plain integer and float arithmetic, not ``_Float16``/``__bf16``,
F16C or AVX512-BF16 instructions:

* they vectorize on every ISA (``omp simd`` loops; gcc 12 turns a scalar
  ``_Float16`` conversion or ``_cvtss_sh`` into one ``vcvtps2ph`` per element and
  does not vectorize the loop: a float16 multiply-add kernel took 1.9 ms per 2^20
  elements with F16C against 1.0-1.4 ms with these helpers; bfloat16 0.23-0.30 ms,
  float32 0.18, measured on an AVX-512 EPYC, one thread);
* ``vcvtneps2bf16`` (AVX512-BF16) treats subnormal inputs as zero, where torch
  rounds them: rounding with integers is what torch's own vectorized code does;
* nothing depends on the compiler runtime (libgcc 12 has no ``__truncsfbf2``, and
  without F16C gcc calls ``__truncsfhf2``) or on compiler support for the types.

Rounding is to nearest, ties to even; NaN stays NaN (a quiet NaN; torch stores
``0x7FC0`` for bfloat16 and the sign with ``0x7E00`` for float16); float16
overflow is infinity, subnormals are exact. Constants are rounded as torch
rounds them (:func:`cuvil_ir.graph_ir.types.stored_float`); the toolchain's probe (:mod:`cuvil_backend_cpu.toolchain`) compiles
:data:`HELPERS` with the kernels' flags and checks them against torch's bits
before any kernel holds a half type.
"""

from __future__ import annotations

import math

from cuvil_ir.graph_ir.types import DType

#: the half types kernels hold (as ``uint16_t`` bits in memory, ``float`` in registers)
HALF = frozenset({DType.f16, DType.bf16})

#: C helpers a kernel with a half type includes (``cu_ld_*``, ``cu_st_*``, ``cu_round_*``)
HELPERS = r"""
#include <string.h>
static inline uint32_t cu_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static inline float cu_float(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }
/* bfloat16 is the top half of a float: widening is a shift; rounding adds 0x7FFF
   plus the lowest kept bit (ties to even) and drops the low half. */
static inline float cu_ld_bf16(uint16_t h) { return cu_float((uint32_t)h << 16); }
static inline float cu_round_bf16(float x) {
  const uint32_t u = cu_bits(x);
  const float r = cu_float((u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u);
  return x != x ? x : r;  /* NaN: the rounding could make it inf (or -0.0) */
}
static inline uint16_t cu_st_bf16(float x) {
  const uint32_t u = cu_bits(x);
  const uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return (uint16_t)(x != x ? 0x7FC0u : r);
}
/* float16: 5 exponent bits (bias 15), 10 mantissa bits. A normal value moves its
   exponent from bias 15 to 127; the bits of a subnormal one, read as a float's
   subnormal and scaled by 2^112, are its value; all-ones exponents are inf/NaN. */
static inline float cu_ld_f16(uint16_t h) {
  const uint32_t em = (uint32_t)h & 0x7FFFu;
  const uint32_t finite = cu_bits(cu_float(em << 13) * 0x1p112f);
  const uint32_t m = em >= 0x7C00u ? 0x7F800000u | (em << 13) : finite;
  return cu_float(m | (((uint32_t)h & 0x8000u) << 16));
}
/* From 2^-14 up the 23-bit mantissa rounds to 10 bits with integers (a carry moves
   the exponent); below, float16's step is 2^-24 and adding 0.5f (whose ulp is
   2^-24) rounds to it; from 65520 up the result is inf. */
static inline float cu_round_f16(float x) {
  const uint32_t u = cu_bits(x), a = u & 0x7FFFFFFFu;
  float r = cu_float((a + 0xFFFu + ((a >> 13) & 1u)) & 0xFFFFE000u);
  r = a >= 0x477FF000u ? INFINITY : r;
  const float s = (cu_float(a) + 0.5f) - 0.5f;
  r = a < 0x38800000u ? s : r;
  r = cu_float(cu_bits(r) | (u & 0x80000000u));
  return x != x ? x : r;
}
static inline uint16_t cu_st_f16(float x) {
  const uint32_t u = cu_bits(x), a = u & 0x7FFFFFFFu;
  const uint32_t normal = (a + 0xFFFu + ((a >> 13) & 1u) - 0x38000000u) >> 13;
  const uint32_t small = cu_bits(cu_float(a) + 0.5f) - 0x3F000000u;  /* multiples of 2^-24 */
  uint32_t m = a < 0x38800000u ? small : normal;
  m = a >= 0x477FF000u ? 0x7C00u : m;
  m = x != x ? 0x7E00u : m;
  return (uint16_t)(m | ((u >> 16) & 0x8000u));
}
"""


_PROBE = (
    "#include <math.h>\n#include <stdint.h>\n"
    + HELPERS
    + r"""
void cuvil_half_probe(const float* x, int64_t n, uint16_t* st_bf, uint16_t* st_f, float* r_bf,
                      float* r_f, const uint16_t* h, int64_t m, float* ld_bf, float* ld_f) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    st_bf[i] = cu_st_bf16(x[i]); st_f[i] = cu_st_f16(x[i]);
    r_bf[i] = cu_round_bf16(x[i]); r_f[i] = cu_round_f16(x[i]);
  }
#pragma omp simd
  for (int64_t i = 0; i < m; ++i) { ld_bf[i] = cu_ld_bf16(h[i]); ld_f[i] = cu_ld_f16(h[i]); }
}
"""
)


def _probe_values() -> list[float]:
    """Float32 values whose rounding tells a wrong helper apart: signed zeros, ties to
    even in both types, float16's subnormal steps and overflow edge, float32 subnormals,
    infinities, NaN, and a spread of ordinary values."""
    ties = [1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-11, 1 + 3 * 2**-11, 2**-24 * 1.5, 2**-25, 3 * 2**-25]
    edges = [65504.0, 65519.99609375, 65520.0, 65536.0, 1e5, 2**-14, 2**-14 * (1 - 2**-11), 2**-24, 1e-8]
    tiny = [1.401298464324817e-45, 1e-40, 1.1754942106924411e-38, 3.4028234663852886e38]
    spread = [(-1) ** k * 1.37**k * 1e-3 for k in range(64)]
    values = [0.0, 1.0, 0.1, 1 / 3, math.inf, math.nan, *ties, *edges, *tiny, *spread]
    return values + [-v for v in values]


def probe(cc: str, flags: tuple[str, ...], workdir: str) -> str | None:
    """Build :data:`HELPERS` with ``cc`` and the kernels' ``flags`` and check every
    conversion against torch's (all 65536 bit patterns widened, :func:`_probe_values`
    rounded and stored; vectorized loops, as in kernels). ``None`` when they agree, else
    what went wrong: the ``cpu`` target then keeps half types out of its kernels."""
    import ctypes
    import hashlib
    import os
    import subprocess

    import torch

    # named by the source: dlopen hands back a library already loaded from the same path
    tag = hashlib.sha256(f"{_PROBE}{cc}{flags}".encode()).hexdigest()[:16]
    source = os.path.join(workdir, f"half_probe_{tag}.c")
    output = os.path.join(workdir, f"half_probe_{tag}.so")
    with open(source, "w") as f:
        f.write(_PROBE)
    cmd = [cc, *flags, "-o", output, source, "-lm"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            return f"{' '.join(cmd)} failed:\n" + "\n".join(proc.stderr.strip().splitlines()[:20])
        fn = ctypes.CDLL(output).cuvil_half_probe
    except (OSError, AttributeError, subprocess.TimeoutExpired) as e:
        return f"building the half-precision probe ({' '.join(cmd)}) failed: {e}"
    x = torch.tensor(_probe_values(), dtype=torch.float32)
    h = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    n, m = x.numel(), h.numel()
    st = {d: torch.empty(n, dtype=torch.int16) for d in HALF}
    rd = {d: torch.empty(n, dtype=torch.float32) for d in HALF}
    ld = {d: torch.empty(m, dtype=torch.float32) for d in HALF}
    bf, f16 = DType.bf16, DType.f16
    ptrs = [x, n, st[bf], st[f16], rd[bf], rd[f16], h, m, ld[bf], ld[f16]]
    fn(*(ctypes.c_int64(p) if isinstance(p, int) else ctypes.c_void_p(p.data_ptr()) for p in ptrs))
    for d in sorted(HALF, key=lambda d: d.value):
        want = x.to(d.torch)
        checks = {
            "stores": (st[d].view(d.torch), want),
            "rounds": (rd[d], want.float()),
            "loads": (ld[d], h.view(d.torch).float()),
        }
        for what, (got, ref) in checks.items():
            source_values = h if what == "loads" else x
            g, r = got.float(), ref.float()
            bad = ~((g.view(torch.int32) == r.view(torch.int32)) | (g.isnan() & r.isnan()))
            if bad.any():
                k = int(bad.nonzero()[0])
                return (
                    f"the C helpers for {d.value} disagree with torch ({what} {source_values[k].item()!r}: "
                    f"{g[k].item()!r}, torch {r[k].item()!r}) with {' '.join(cmd)}"
                )
    return None


__all__ = ["HALF", "HELPERS", "probe"]
