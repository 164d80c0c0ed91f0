/* The vector prelude of the hand-written kernels (attention.c, paged_attention.c, quant_linear.c),
 * pasted in place of their `#include "cuvil_vectors.h"` line by cuvil_backend_cpu.c_prelude, so a
 * built source is one self-contained text (what the kernel cache hashes and signs).
 *
 * VW float lanes of a GCC vector type `vf` (the compiler picks the instructions for the -march it is
 * given); FMA(a, b, c) = a * b + c as one instruction where the ISA has it, because kernels build
 * with -std=c11, where GCC does not contract a*b+c.
 */
#include <stdint.h>
#include <string.h>

#if defined(CUVIL_VW)
/* a forced width in plain vector arithmetic: tests run the AVX-512 (16) and SSE/NEON (4) widths on
   any host, so a host without AVX-512 still checks that path's logic */
#define VW CUVIL_VW
#elif defined(__AVX512F__)
#include <immintrin.h>
#define VW 16
#define FMA(a, b, c) ((vf)_mm512_fmadd_ps((__m512)(a), (__m512)(b), (__m512)(c)))
#elif defined(__AVX2__)
#include <immintrin.h>
#define VW 8
#if defined(__FMA__)
#define FMA(a, b, c) ((vf)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#endif
#elif defined(__ARM_NEON)
#include <arm_neon.h>
#define VW 4
#define FMA(a, b, c) ((vf)vfmaq_f32((float32x4_t)(c), (float32x4_t)(a), (float32x4_t)(b)))
#else
#define VW 4
#endif
#ifndef FMA
#define FMA(a, b, c) ((a) * (b) + (c))
#endif

typedef float vf __attribute__((vector_size(VW * 4)));
typedef int32_t vi __attribute__((vector_size(VW * 4)));

/* (the scalar operand of a vector operation is broadcast: one vbroadcastss, where a loop over lanes
 * compiles to a chain of inserts) */
static inline __attribute__((always_inline)) vf splat(float x) { return x - (vf){0}; /* x - 0 is x for every x, -0 included */ }

static inline __attribute__((always_inline)) vf select(vi mask, vf yes, vf no) { return (vf)(((vi)yes & mask) | ((vi)no & ~mask)); }

/* exp(x) for x <= 0 (all the attention kernels ask): 2^n e^r with |r| <= ln2/2, Cephes' degree-6
 * polynomial (within 2 ulp of expf); x below -87.3 (e^x under the smallest normal, and -inf) gives
 * 0, NaN NaN. */
static inline __attribute__((always_inline)) vf vexp(vf x) {
    const vf nan_in = x;
    const vi nan = x != x; /* NaN stays NaN (scores of NaN inputs), as in eager */
    const vi under = x < splat(-87.33654f);
    x = select(x > splat(88.0f), splat(88.0f), select(under, splat(-87.0f), x));
    const vf magic = splat(12582912.0f); /* 1.5 * 2^23: adding it rounds to an integer */
    const vf n = (x * splat(1.44269504088896341f) + magic) - magic;
    const vf r = (x - n * splat(0.693359375f)) + n * splat(2.12194440e-4f);
    vf p = splat(1.9875691500e-4f);
    p = FMA(p, r, splat(1.3981999507e-3f));
    p = FMA(p, r, splat(8.3334519073e-3f));
    p = FMA(p, r, splat(4.1665795894e-2f));
    p = FMA(p, r, splat(1.6666665459e-1f));
    p = FMA(p, r, splat(5.0000001201e-1f));
    const vf y = FMA(p, r * r, r + splat(1.0f));
    const vi scaled = (vi)y + (__builtin_convertvector(n, vi) << 23);
    return select(nan, nan_in, (vf)(scaled & ~under));
}

static inline __attribute__((always_inline)) vf vabs(vf v) { return (vf)((vi)v & 0x7fffffff); }

/* silu(v) = v sigmoid(v), e = exp(-|v|): sigmoid is 1 / (1 + e) for v >= 0, e / (1 + e) below */
static inline __attribute__((always_inline)) vf vsilu(vf v) {
    const vf e = vexp(-vabs(v));
    return v * select(v < splat(0.0f), e, splat(1.0f)) / (splat(1.0f) + e);
}

/* bfloat16 is the top half of a float: widening is a shift; rounding to nearest even adds 0x7FFF
 * plus the lowest kept bit, and NaN stays a quiet NaN (no __truncsfbf2: not in every libgcc) */
static inline __attribute__((always_inline)) float bf16_to_f32(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline __attribute__((always_inline)) uint16_t f32_to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (uint16_t)(x != x ? 0x7FC0u : (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
