/* Weight-only low-precision matrix products for the cpu target (driven by
 * cuvil_backend_cpu/quant_linear.py; the formats are docs/quantization.md's):
 *
 *   y[m,n] = sum_k x[m,k] * W[n,k] (+ bias[n]),   x, y, accumulation in float32
 *
 * with W stored as
 *   QL_BF16  uint16 bf16 bits [N][K]                    W = f32(bits << 16)
 *   QL_INT8  int8 [N][K], scale[N]                      W = q * scale[n]
 *   QL_F32   float32 [N][K]                            W itself (plain float32 linears of few rows:
 *                                                       the same GEMV, chosen against oneDNN and MKL)
 *   QL_INT4  uint8 [N][K/2], scale[N][K/G], zero[N][K/G] W = (q - 8) * scale[n,g] + zero[n,g],
 *            q in 0..15; in each run of 32 values of a row, byte i holds value i in its low nibble
 *            and value i + 16 in its high nibble, so a load of VW bytes unpacks into two vectors of
 *            consecutive k (no shuffles, whatever VW is up to 16).
 *
 * Decode (M small) reads every weight once per token, so the kernel is a GEMV that streams W: the
 * OpenMP threads split the rows of W (N) into contiguous ranges; each block of NR rows is dequantized
 * in registers (bf16 by a 16-bit shift, int8/int4 by widening and converting) and multiplied into
 * MR rows of x at a time, accumulators MR x NR vectors along k, reduced across lanes once per row.
 * Rows of x past MR re-read the block's weights from L1 (NR rows of K/2 bytes for int4).
 * cuvil_ql_dequant writes W as float32 (the larger-M path: a GEMM library call then multiplies).
 *
 * One source for every ISA: GCC vector types of VW lanes and __builtin_convertvector (the compiler
 * picks vpmovzxbd/vpmovsxbd/vcvtdq2ps for the -march it is given); explicit FMA intrinsics where the
 * ISA has them because kernels build with -std=c11, where GCC does not contract a*b+c. Nothing here
 * needs AVX512-BF16 or VNNI (their dot products take bf16/int8 activations, which is not this
 * contract: activations stay float32), nor the compiler runtime's __truncsfbf2 (no float -> bf16
 * conversion happens in C).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuvil_vectors.h"

#if VW != 4 && VW != 8 && VW != 16
#error "CUVIL_VW must be 4, 8 or 16 (an int4 run of 32 values is two halves of 16)"
#endif
typedef uint32_t vu __attribute__((vector_size(VW * 4)));
typedef uint16_t vu16 __attribute__((vector_size(VW * 2)));
typedef int8_t vi8 __attribute__((vector_size(VW)));
typedef uint8_t vu8 __attribute__((vector_size(VW)));

#define NR 4 /* rows of W per block */
/* rows of x per tile: MR x NR accumulators + MR x loads + the NR dequantized rows fit the register file
   (32 vector registers with AVX-512, 16 otherwise) */
#if VW >= 16
#define MR 4
#else
#define MR 2
#endif

enum { QL_BF16 = 0, QL_INT8 = 1, QL_INT4 = 2, QL_F32 = 3, QL_INT4A8 = 4 };

/* params: M, N, K, ldx (x's row stride), ldy, group (int4), threads, has_bias */
enum { P_M, P_N, P_K, P_LDX, P_LDY, P_GROUP, P_THREADS, P_BIAS, P_COUNT };

/* below this many weight elements the work stays on one thread (a parallel region costs a few us) */
#define PARALLEL_MIN (1 << 15)

#define INLINE static inline __attribute__((always_inline))
/* before a loop over a tile's rows (m < mr, n < nr: constants where a tile is inlined): unrolled,
   so its accumulators live in registers (GCC -O2 leaves such a loop rolled, the accumulators on
   the stack: the int4 GEMV ran 1.3-1.7x slower so) */
#define UNROLL _Pragma("GCC unroll 8")

/* Each row of W is a stream of its own, and a row of 4096 int8 values is one 4 KiB page, the span a
   hardware prefetcher follows: so the tile prefetches the next block's rows (NR rows on) at the offset
   it reads, one block ahead, each row from its first line. */
#define PREFETCH(p) __builtin_prefetch((const void *)(p), 0, 3)

INLINE vf vload(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

INLINE float hsum(vf v) {
    float s = 0.0f;
    for (int i = 0; i < VW; i++) s += v[i];
    return s;
}

/* Widening loads. GCC 12 widens a vector of bytes to 32-bit lanes in one __builtin_convertvector by
   extracting lanes one by one, so x86 builds use the one-instruction widening intrinsics
   (vpmovsxbd, vpmovzxbd, vpmovzxwd); the generic path widens in two steps (8 -> 16 -> 32 bits), which
   GCC does vectorize, and serves forced widths, SSE2 and NEON. */
#if !defined(CUVIL_VW) && defined(__AVX512F__)
INLINE vi widen_i8(const void *p) { return (vi)_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)); }
INLINE vi widen_u8(const void *p) { return (vi)_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)); }
INLINE vu widen_u16(const void *p) { return (vu)_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)); }
#elif !defined(CUVIL_VW) && defined(__AVX2__)
INLINE vi widen_i8(const void *p) { return (vi)_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
INLINE vi widen_u8(const void *p) { return (vi)_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
INLINE vu widen_u16(const void *p) { return (vu)_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)); }
#else
typedef int16_t vi16 __attribute__((vector_size(VW * 2)));
INLINE vi widen_i8(const void *p) {
    vi8 b;
    memcpy(&b, p, sizeof b);
    return __builtin_convertvector(__builtin_convertvector(b, vi16), vi);
}
INLINE vi widen_u8(const void *p) {
    vu8 b;
    memcpy(&b, p, sizeof b);
    return (vi)__builtin_convertvector(__builtin_convertvector(b, vu16), vu);
}
INLINE vu widen_u16(const void *p) {
    vu16 h;
    memcpy(&h, p, sizeof h);
    return __builtin_convertvector(h, vu);
}
#endif

INLINE vf bf16_load(const uint16_t *p) { return (vf)(widen_u16(p) << 16); }

INLINE vf int8_load(const int8_t *p) { return __builtin_convertvector(widen_i8(p), vf); }

/* VW bytes of an int4 run: the low nibbles (values j.. of the run) and the high ones (j+16..) */
INLINE void int4_load(const uint8_t *p, vf *lo, vf *hi) {
    vi q = widen_u8(p);
    *lo = __builtin_convertvector(q & 15, vf);
    *hi = __builtin_convertvector(q >> 4, vf);
}

INLINE vf f32_load(const float *p) { return vload(p); }

INLINE float f32_scalar(float v) { return v; }

INLINE float int8_scalar(int8_t v) { return (float)v; }

/* One tile: out[m*NR + n] = sum_k x[m,k] W[n,k] for m < mr, n < nr, W of element type T read VW at a
   time by LOAD (widened to float in registers) and one at a time by SCALAR (the tail of K), unscaled
   for int8 (its scale is a factor of the whole row: applied once, by the caller). mr and nr are
   constants at every call site (always_inline), so the loops over them unroll and the accumulators
   live in registers. float32, bf16 and int8 weights differ only in T, LOAD and SCALAR. */
#define DENSE_TILE(NAME, T, LOAD, SCALAR)                                                                   \
    INLINE void NAME(const float *x, int64_t ldx, const T *w, int64_t K, float *out, int mr, int nr) {      \
        vf acc[MR][NR];                                                                                     \
        UNROLL                                                                                              \
        for (int m = 0; m < mr; m++)                                                                        \
            UNROLL                                                                                          \
            for (int n = 0; n < nr; n++) acc[m][n] = (vf){0};                                               \
        int64_t k = 0;                                                                                      \
        const int64_t step = 64 / (int64_t)sizeof(T); /* values in a cache line of W */                     \
        for (; k + step <= K; k += step) {                                                                  \
            UNROLL                                                                                          \
            for (int n = 0; n < nr; n++) PREFETCH(w + (n + NR) * K + k);                                    \
            for (int64_t kk = k; kk < k + step; kk += VW) {                                                 \
                vf xv[MR];                                                                                  \
                UNROLL                                                                                      \
                for (int m = 0; m < mr; m++) xv[m] = vload(x + m * ldx + kk);                               \
                UNROLL                                                                                      \
                for (int n = 0; n < nr; n++) {                                                              \
                    vf wv = LOAD(w + n * K + kk);                                                           \
                    UNROLL                                                                                  \
                    for (int m = 0; m < mr; m++) acc[m][n] = FMA(xv[m], wv, acc[m][n]);                     \
                }                                                                                           \
            }                                                                                               \
        }                                                                                                   \
        for (; k + VW <= K; k += VW) {                                                                      \
            vf xv[MR];                                                                                      \
            UNROLL                                                                                          \
            for (int m = 0; m < mr; m++) xv[m] = vload(x + m * ldx + k);                                    \
            UNROLL                                                                                          \
            for (int n = 0; n < nr; n++) {                                                                  \
                vf wv = LOAD(w + n * K + k);                                                                \
                UNROLL                                                                                      \
                for (int m = 0; m < mr; m++) acc[m][n] = FMA(xv[m], wv, acc[m][n]);                         \
            }                                                                                               \
        }                                                                                                   \
        UNROLL                                                                                              \
        for (int m = 0; m < mr; m++)                                                                        \
            UNROLL                                                                                          \
            for (int n = 0; n < nr; n++) {                                                                  \
                float s = hsum(acc[m][n]);                                                                  \
                for (int64_t t = k; t < K; t++) s += x[m * ldx + t] * SCALAR(w[n * K + t]);                 \
                out[m * NR + n] = s;                                                                        \
            }                                                                                               \
    }

DENSE_TILE(tile_f32, float, f32_load, f32_scalar)
DENSE_TILE(tile_bf16, uint16_t, bf16_load, bf16_to_f32)
DENSE_TILE(tile_int8, int8_t, int8_load, int8_scalar)

#if !defined(CUVIL_VW) && !defined(CUVIL_QL_NO_TABLE) && defined(__AVX512F__)
#define QL_INT4_TABLE 1
/* int4 with AVX-512: a vector of 16 floats is a table of the 16 values a group's codes stand for,
 * (i - 8) s + zero, built once per group and row, and vpermps looks the codes up in it (it reads the
 * low 4 bits of each lane: no masking). A value costs a lookup (a shuffle, not a floating-point
 * operation) and one multiply-add. */
INLINE void tile_int4(const float *x, int64_t ldx, const float *xs, const uint8_t *w, const float *scale,
                      const float *zero, int64_t K, int64_t G, float *out, int mr, int nr) {
    (void)xs;
    const int64_t ng = K / G, row = K / 2;
    const vf codes = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};
    vf acc[MR][NR];
    UNROLL
    for (int m = 0; m < mr; m++)
        UNROLL
        for (int n = 0; n < nr; n++) acc[m][n] = (vf){0};
    for (int64_t g = 0; g < ng; g++) {
        vf table[NR];
        UNROLL
        for (int n = 0; n < nr; n++) table[n] = FMA(codes, splat(scale[n * ng + g]), splat(zero[n * ng + g]));
        const float *xg = x + g * G;
        const uint8_t *wg = w + g * (G / 2);
        for (int64_t c = 0; c < G; c += 32) {
            if ((c & 127) == 0) /* (once a cache line of each row, or more often for groups under 128) */
                UNROLL
                for (int n = 0; n < nr; n++) PREFETCH(wg + (n + NR) * row + c / 2);
            vf xl[MR], xh[MR];
            UNROLL
            for (int m = 0; m < mr; m++) {
                xl[m] = vload(xg + m * ldx + c);
                xh[m] = vload(xg + m * ldx + c + 16);
            }
            UNROLL
            for (int n = 0; n < nr; n++) {
                const __m512i q = (__m512i)widen_u8(wg + n * row + c / 2);
                const vf lo = (vf)_mm512_permutexvar_ps(q, (__m512)table[n]);
                const vf hi = (vf)_mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), (__m512)table[n]);
                UNROLL
                for (int m = 0; m < mr; m++) acc[m][n] = FMA(xh[m], hi, FMA(xl[m], lo, acc[m][n]));
            }
        }
    }
    UNROLL
    for (int m = 0; m < mr; m++)
        UNROLL
        for (int n = 0; n < nr; n++) out[m * NR + n] = hsum(acc[m][n]);
}
#else
/* int4: per group g, W = q * s + mz with mz = zero - 8 s, so
 *   sum_k x[k] W[k] = sum_g ( s[g] * sum_{k in g} x[k] q[k]  +  mz[g] * sum_{k in g} x[k] ).
 * The inner loop is only widen, convert and one multiply-add per value (the dequantizing
 * multiply-add moves to once per group), and the sums of x per group (xs[m][g], shared by every row
 * of W) are computed once per call. K is a whole number of groups, a group of runs of 32. */
INLINE void tile_int4(const float *x, int64_t ldx, const float *xs, const uint8_t *w, const float *scale,
                      const float *zero, int64_t K, int64_t G, float *out, int mr, int nr) {
    const int64_t ng = K / G, row = K / 2;
    vf acc[MR][NR];
    float zacc[MR][NR];
    UNROLL
    for (int m = 0; m < mr; m++)
        UNROLL
        for (int n = 0; n < nr; n++) {
            acc[m][n] = (vf){0};
            zacc[m][n] = 0.0f;
        }
    for (int64_t g = 0; g < ng; g++) {
        vf p[MR][NR];
        UNROLL
        for (int m = 0; m < mr; m++)
            UNROLL
            for (int n = 0; n < nr; n++) p[m][n] = (vf){0};
        const float *xg = x + g * G;
        const uint8_t *wg = w + g * (G / 2);
        for (int64_t c = 0; c < G; c += 32) {
            if ((c & 127) == 0) /* (once a cache line of each row, or more often for groups under 128) */
                UNROLL
                for (int n = 0; n < nr; n++) PREFETCH(wg + (n + NR) * row + c / 2);
            for (int j = 0; j < 16; j += VW) {
                vf xl[MR], xh[MR];
                UNROLL
                for (int m = 0; m < mr; m++) {
                    xl[m] = vload(xg + m * ldx + c + j);
                    xh[m] = vload(xg + m * ldx + c + 16 + j);
                }
                UNROLL
                for (int n = 0; n < nr; n++) {
                    vf lo, hi;
                    int4_load(wg + n * row + c / 2 + j, &lo, &hi);
                    UNROLL
                    for (int m = 0; m < mr; m++) p[m][n] = FMA(xh[m], hi, FMA(xl[m], lo, p[m][n]));
                }
            }
        }
        UNROLL
        for (int n = 0; n < nr; n++) {
            const float sn = scale[n * ng + g], mz = zero[n * ng + g] - 8.0f * sn;
            UNROLL
            for (int m = 0; m < mr; m++) {
                acc[m][n] = FMA(p[m][n], splat(sn), acc[m][n]);
                zacc[m][n] += mz * xs[m * ng + g];
            }
        }
    }
    UNROLL
    for (int m = 0; m < mr; m++)
        UNROLL
        for (int n = 0; n < nr; n++) out[m * NR + n] = hsum(acc[m][n]) + zacc[m][n];
}

#endif

/* int4-a8: rows of x rounded to int8 (xq [M][K], a scale per block of 32 values, xd [M][K / 32], the
 * rounded values' sums per group, xs [M][K / G]). Per block b of a group g and row n of W:
 *   sum_{k in b} x[k] W[n,k] = d_b ( s[g] sum q[k] xq[k] ) + mz[g] sum x[k],   mz = zero - 8 s,
 * the first sum exact in 32-bit integers (|q xq| <= 15 * 127), scaled once per block. */
#if !defined(CUVIL_VW) && defined(__AVX2__)
/* x's codes for groups of a multiple of 64 values: per 64, values 0-15, 32-47, 16-31, 48-63 (the
   two-run loop's halves); other builds and groups of 32 keep the natural order */
#define A8_PAIRS(G) ((G) % 64 == 0)
#if defined(__FMA__)
#define FMA8(a, b, c) _mm256_fmadd_ps(a, b, c)
#else
#define FMA8(a, b, c) _mm256_add_ps(_mm256_mul_ps(a, b), c)
#endif
/* 32 codes (0..15) times 32 signed bytes of x, in 8 lanes of 32-bit sums, as floats */
INLINE __m256 dot32(__m256i q, __m256i x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), q, x));
#else
    /* (pairs of unsigned x signed bytes into 16 bits: at most 2 * 15 * 127, no saturation) */
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(q, x), _mm256_set1_epi16(1)));
#endif
}

/* 64 codes times 64 bytes of x as two 32-byte halves (lo with xl, hi with xh), pair sums added in 16
   bits (at most 4 * 15 * 127), in 8 lanes of 32-bit sums, as floats */
INLINE __m256 dot64(__m256i lo, __m256i xl, __m256i hi, __m256i xh) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, xl), hi, xh));
#else
    const __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xl), _mm256_maddubs_epi16(hi, xh));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(s, _mm256_set1_epi16(1)));
#endif
}

INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

INLINE void tile_int4a8(const int8_t *xq, const float *xd, const float *xs, const uint8_t *w, const float *scale,
                        const float *zero, int64_t K, int64_t G, float *out, int mr, int nr) {
    const int64_t ng = K / G, row = K / 2, nb = K / 32;
    const __m128i low4 = _mm_set1_epi8(15);
    __m256 acc[MR][NR];
    float zacc[MR][NR];
    UNROLL
    for (int m = 0; m < mr; m++)
        UNROLL
        for (int n = 0; n < nr; n++) {
            acc[m][n] = _mm256_setzero_ps();
            zacc[m][n] = 0.0f;
        }
    for (int64_t g = 0; g < ng; g++) {
        __m256 p[MR][NR];
        UNROLL
        for (int m = 0; m < mr; m++)
            UNROLL
            for (int n = 0; n < nr; n++) p[m][n] = _mm256_setzero_ps();
        const uint8_t *wg = w + g * (G / 2);
        const int8_t *xg = xq + g * G;
        const float *dg = xd + g * (G / 32);
        if (G % 64 == 0) {
            /* two runs at a time, x in the A8_PAIRS layout: the 32 bytes of codes of runs r, r+1 split
               into low nibbles (values 0-15 of each run, one per 128-bit half) and high (16-31), which
               multiply x's [r 0-15 | r+1 0-15] and [r 16-31 | r+1 16-31]; each half's sums belong to
               one run, scaled by its d: one madd and one convert per 64 values */
            const __m256i low4x2 = _mm256_set1_epi8(15);
            for (int64_t c = 0; c < G; c += 64) {
                if ((c & 127) == 0)
                    UNROLL
                    for (int n = 0; n < nr; n++) PREFETCH(wg + (n + NR) * row + c / 2);
                __m256i xl[MR], xh[MR];
                __m256 dv[MR];
                UNROLL
                for (int m = 0; m < mr; m++) {
                    xl[m] = _mm256_loadu_si256((const __m256i *)(xg + m * K + c));
                    xh[m] = _mm256_loadu_si256((const __m256i *)(xg + m * K + c + 32));
                    const float *d = dg + m * nb + c / 32;
                    dv[m] = _mm256_set_m128(_mm_broadcast_ss(d + 1), _mm_broadcast_ss(d));
                }
                UNROLL
                for (int n = 0; n < nr; n++) {
                    const __m256i b = _mm256_loadu_si256((const __m256i *)(wg + n * row + c / 2));
                    const __m256i lo = _mm256_and_si256(b, low4x2);
                    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), low4x2);
                    UNROLL
                    for (int m = 0; m < mr; m++) p[m][n] = FMA8(dot64(lo, xl[m], hi, xh[m]), dv[m], p[m][n]);
                }
            }
        } else {
            for (int64_t c = 0; c < G; c += 32) {
                if ((c & 127) == 0)
                    UNROLL
                    for (int n = 0; n < nr; n++) PREFETCH(wg + (n + NR) * row + c / 2);
                __m256i xv[MR];
                __m256 dv[MR];
                UNROLL
                for (int m = 0; m < mr; m++) {
                    xv[m] = _mm256_loadu_si256((const __m256i *)(xg + m * K + c));
                    dv[m] = _mm256_broadcast_ss(dg + m * nb + c / 32);
                }
                UNROLL
                for (int n = 0; n < nr; n++) {
                    const __m128i b = _mm_loadu_si128((const __m128i *)(wg + n * row + c / 2));
                    /* low nibbles: values c..c+15, high: c+16..c+31 ([Note: int4 packing]) */
                    const __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), low4), _mm_and_si128(b, low4));
                    UNROLL
                    for (int m = 0; m < mr; m++) p[m][n] = FMA8(dot32(q, xv[m]), dv[m], p[m][n]);
                }
            }
        }
        UNROLL
        for (int n = 0; n < nr; n++) {
            const float sn = scale[n * ng + g], mz = zero[n * ng + g] - 8.0f * sn;
            UNROLL
            for (int m = 0; m < mr; m++) {
                acc[m][n] = FMA8(p[m][n], _mm256_set1_ps(sn), acc[m][n]);
                zacc[m][n] += mz * xs[m * ng + g];
            }
        }
    }
    UNROLL
    for (int m = 0; m < mr; m++)
        UNROLL
        for (int n = 0; n < nr; n++) out[m * NR + n] = hsum8(acc[m][n]) + zacc[m][n];
}
#else
#define A8_PAIRS(G) 0
/* the portable form (SSE2, NEON, forced widths): the same sums, a byte at a time */
INLINE void tile_int4a8(const int8_t *xq, const float *xd, const float *xs, const uint8_t *w, const float *scale,
                        const float *zero, int64_t K, int64_t G, float *out, int mr, int nr) {
    const int64_t ng = K / G, row = K / 2, nb = K / 32;
    UNROLL
    for (int m = 0; m < mr; m++)
        UNROLL
        for (int n = 0; n < nr; n++) {
            float acc = 0.0f, zacc = 0.0f;
            for (int64_t g = 0; g < ng; g++) {
                float pg = 0.0f;
                for (int64_t c = g * G; c < (g + 1) * G; c += 32) {
                    const uint8_t *wb = w + n * row + c / 2;
                    const int8_t *xb = xq + m * K + c;
                    int32_t s = 0;
                    for (int i = 0; i < 16; i++) s += (int32_t)(wb[i] & 15) * xb[i] + (int32_t)(wb[i] >> 4) * xb[i + 16];
                    pg += (float)s * xd[m * nb + c / 32];
                }
                const float sn = scale[n * ng + g], mz = zero[n * ng + g] - 8.0f * sn;
                acc += pg * sn;
                zacc += mz * xs[m * ng + g];
            }
            out[m * NR + n] = acc + zacc;
        }
}
#endif

typedef struct {
    int fmt;
    const float *x;
    const void *w;
    const float *scale, *zero, *bias;
    const float *xs; /* int4: sums of x per group, [M][K / G] */
    float *y;
    int64_t M, N, K, ldx, ldy, G;
    const int8_t *xq; /* int4-a8: x rounded, [M][K], */
    const float *xd;  /* and its scales, [M][K / 32] */
} job;

/* the tile of rows ROW.. of W for (MR_, NR_) known at compile time: every case spelled out so each
   gets its own unrolled code */
#define TILE(MR_, NR_, ROW)                                                                                 \
    do {                                                                                                    \
        const int64_t r_ = (ROW);                                                                           \
        if (j->fmt == QL_F32)                                                                               \
            tile_f32(x, j->ldx, (const float *)j->w + r_ * K, K, out, MR_, NR_);                            \
        else if (j->fmt == QL_BF16)                                                                         \
            tile_bf16(x, j->ldx, (const uint16_t *)j->w + r_ * K, K, out, MR_, NR_);                        \
        else if (j->fmt == QL_INT8)                                                                         \
            tile_int8(x, j->ldx, (const int8_t *)j->w + r_ * K, K, out, MR_, NR_);                          \
        else if (j->fmt == QL_INT4A8)                                                                       \
            tile_int4a8(j->xq + m0 * K, j->xd + m0 * (K / 32), j->xs + m0 * (K / j->G),                     \
                        (const uint8_t *)j->w + r_ * (K / 2), j->scale + r_ * (K / j->G),                   \
                        j->zero + r_ * (K / j->G), K, j->G, out, MR_, NR_);                                 \
        else                                                                                                \
            tile_int4(x, j->ldx, j->xs + m0 * (K / j->G), (const uint8_t *)j->w + r_ * (K / 2),              \
                      j->scale + r_ * (K / j->G), j->zero + r_ * (K / j->G), K, j->G, out, MR_, NR_);       \
    } while (0)

#if MR >= 4
#define TILE_CASES(NR_, ROW)                                                                                \
    case 1: TILE(1, NR_, ROW); break;                                                                       \
    case 2: TILE(2, NR_, ROW); break;                                                                       \
    case 3: TILE(3, NR_, ROW); break;                                                                       \
    case 4: TILE(4, NR_, ROW); break;
#else
#define TILE_CASES(NR_, ROW)                                                                                \
    case 1: TILE(1, NR_, ROW); break;                                                                       \
    case 2: TILE(2, NR_, ROW); break;
#endif

static void tile(const job *j, int64_t m0, int mr, int64_t n0, int nr, float *out) {
    const int64_t K = j->K;
    const float *x = j->x + m0 * j->ldx;
    if (nr == NR) {
        switch (mr) { TILE_CASES(NR, n0) }
        return;
    }
    /* the last rows of W, fewer than NR: nr is not a constant here, so one row at a time */
    float rows[MR * NR];
    for (int n = 0; n < nr; n++) {
        switch (mr) { TILE_CASES(1, n0 + n) }
        for (int m = 0; m < mr; m++) rows[m * NR + n] = out[m * NR];
    }
    memcpy(out, rows, sizeof rows);
}

static void block(const job *j, int64_t n0) {
    const int nr = (int)(j->N - n0 < NR ? j->N - n0 : NR);
    for (int64_t m0 = 0; m0 < j->M; m0 += MR) {
        const int mr = (int)(j->M - m0 < MR ? j->M - m0 : MR);
        float out[MR * NR];
        tile(j, m0, mr, n0, nr, out);
        for (int m = 0; m < mr; m++) {
            float *yr = j->y + (m0 + m) * j->ldy + n0;
            for (int n = 0; n < nr; n++) {
                float v = out[m * NR + n];
                if (j->fmt == QL_INT8) v *= j->scale[n0 + n];
                yr[n] = j->bias ? v + j->bias[n0 + n] : v;
            }
        }
    }
}

/* One block of 32 values of x rounded to int8 (QL_INT4A8): d = max|x| / 127, q = x * (1 / d) rounded to
   nearest even (adding and subtracting 1.5 * 2^23 rounds a float under 2^22 so, in the default rounding
   mode, with no libm call), clamped to +-127. A block whose d is 0 or subnormal (max|x| under 127
   times float32's smallest normal: 1 / d could overflow) gets codes 0. A NaN or an infinity makes d NaN
   (codes 0), so the products it enters are NaN, as eager's are. Returns d and the codes' sum. The
   AVX2 form computes the same operations on 8 lanes (llama.cpp's quantize_row_q8_0 packing). */
#define ROUND_MAGIC 12582912.0f
#define SMALLEST_NORMAL 1.17549435e-38f
#if !defined(CUVIL_VW) && defined(__AVX2__)
static float round_block(const float *x, int8_t *q, int32_t *sum) {
    const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(3.40282347e38f);
    __m256 v[4], amax = _mm256_setzero_ps();
    int finite = 1;
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        const __m256 a = _mm256_andnot_ps(sign, v[i]);
        finite &= _mm256_movemask_ps(_mm256_cmp_ps(a, big, _CMP_LE_OQ)) == 0xff; /* (false for NaN) */
        amax = _mm256_max_ps(amax, a);
    }
    *sum = 0;
    if (!finite) {
        memset(q, 0, 32);
        return __builtin_nanf("");
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float d = _mm_cvtss_f32(m) / 127.0f, id = d >= SMALLEST_NORMAL ? 1.0f / d : 0.0f;
    const __m256 vid = _mm256_set1_ps(id), magic = _mm256_set1_ps(ROUND_MAGIC);
    const __m256 top = _mm256_set1_ps(127.0f), bottom = _mm256_set1_ps(-127.0f);
    __m256i c[4];
    for (int i = 0; i < 4; i++) {
        const __m256 r = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(v[i], vid), magic), magic);
        c[i] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, bottom), top)); /* (whole numbers: exact) */
    }
    __m256i t = _mm256_add_epi32(_mm256_add_epi32(c[0], c[1]), _mm256_add_epi32(c[2], c[3]));
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
    *sum = _mm_cvtsi128_si32(h);
    /* 32 -> 16 -> 8 bits within each 128-bit half, then the 4-byte groups back in order */
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
    _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    return d;
}
#else
static float round_block(const float *x, int8_t *q, int32_t *sum) {
    float amax = 0.0f;
    int finite = 1;
    for (int i = 0; i < 32; i++) {
        const float a = x[i] < 0.0f ? -x[i] : x[i];
        finite &= a <= 3.40282347e38f; /* (false for NaN) */
        amax = a > amax ? a : amax;
    }
    *sum = 0;
    if (!finite) {
        memset(q, 0, 32);
        return __builtin_nanf("");
    }
    const float d = amax / 127.0f, id = d >= SMALLEST_NORMAL ? 1.0f / d : 0.0f;
    int32_t s = 0;
    for (int i = 0; i < 32; i++) {
        float r = (x[i] * id + ROUND_MAGIC) - ROUND_MAGIC;
        r = r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r);
        q[i] = (int8_t)r;
        s += q[i];
    }
    *sum = s;
    return d;
}
#endif

/* What the tiles read besides x: for int4 without the vpermps table, the sums of x per group,
   [M][K / G], shared by every weight a call multiplies x by; for int4-a8, x rounded (codes and block
   scales) and the rounded values' sums per group. One allocation, *mem (0 where nothing is needed).
   Returns 0, 1 for a group size the kernel does not take, 2 when out of memory. */
static int prepare_x(job *j, void **mem) {
    *mem = 0;
    const int fmt = j->fmt;
    const int64_t M = j->M, K = j->K, G = j->G, ldx = j->ldx;
    if (fmt != QL_INT4 && fmt != QL_INT4A8)
        return 0;
    if (G < 32 || G % 32 || K % G)
        return 1;
    const int64_t ng = K / G, nb = K / 32;
#if defined(QL_INT4_TABLE)
    if (fmt == QL_INT4)
        return 0;
#endif
    const size_t sums = (size_t)(M * ng + 1) * sizeof(float);
    const size_t scales = fmt == QL_INT4A8 ? (size_t)(M * nb) * sizeof(float) : 0;
    const size_t codes = fmt == QL_INT4A8 ? (size_t)(M * K) : 0;
    char *buf = malloc(sums + scales + codes);
    if (!buf)
        return 2;
    float *xs = (float *)buf, *xd = (float *)(buf + sums);
    int8_t *xq = (int8_t *)(buf + sums + scales);
    for (int64_t m = 0; m < M; m++)
        for (int64_t g = 0; g < ng; g++) {
            float s = 0.0f;
            if (fmt == QL_INT4A8) {
                for (int64_t b = g * G / 32; b < (g + 1) * G / 32; b++) {
                    int32_t isum;
                    int8_t *q = xq + m * K + b * 32;
                    const float d = round_block(j->x + m * ldx + b * 32, q, &isum);
                    xd[m * nb + b] = d;
                    s += d * (float)isum;
                    if (A8_PAIRS(G) && b % 2 == 1) { /* the pair b-1, b as [b-1 0-15 | b 0-15 | b-1 16-31 | b 16-31] */
                        int8_t t[64];
                        memcpy(t, q - 32, 64);
                        memcpy(q - 32, t, 16);
                        memcpy(q - 16, t + 32, 16);
                        memcpy(q, t + 16, 16);
                        memcpy(q + 16, t + 48, 16);
                    }
                }
            } else {
                for (int64_t k = g * G; k < (g + 1) * G; k++) s += j->x[m * ldx + k];
            }
            xs[m * ng + g] = s;
        }
    j->xs = xs;
    j->xd = xd;
    j->xq = xq;
    *mem = buf;
    return 0;
}

/* y = x @ W^T (+ bias). Returns 0; 1 for parameters it does not take (the caller checks them first:
   this only keeps a bad call from reading out of bounds); 2 when out of memory. */
int cuvil_ql_linear(int fmt, const float *x, const void *w, const float *scale, const float *zero,
                    const float *bias, float *y, const int64_t *p) {
    job j = {fmt, x, w, scale, zero, p[P_BIAS] ? bias : 0, 0, y, p[P_M], p[P_N], p[P_K], p[P_LDX], p[P_LDY],
             p[P_GROUP]};
    if (fmt < QL_BF16 || fmt > QL_INT4A8 || j.M < 0 || j.N < 0 || j.K < 0)
        return 1;
    void *xs = 0;
    const int rc = prepare_x(&j, &xs);
    if (rc)
        return rc;
    const int64_t blocks = (j.N + NR - 1) / NR;
    const int threads = (int)(p[P_THREADS] > 0 ? p[P_THREADS] : 1);
    /* contiguous ranges of rows per thread (static schedule): each thread streams its part of W once */
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && j.N * j.K >= PARALLEL_MIN)
    for (int64_t b = 0; b < blocks; b++) block(&j, b * NR);
    free(xs);
    return 0;
}

/* The most weights one grouped call takes (a layer's query, key and value projections, or its gate
   and up projections, are 3 and 2). */
#define QL_GROUP_MAX 8
/* per weight of a group, in `addr`: its W, scale, zero and bias addresses (0 where absent), y's
   address, its N and y's row stride */
enum { G_W, G_SCALE, G_ZERO, G_BIAS, G_Y, G_N, G_LDY, G_COUNT };

/* what a group does with its results after the products (p[P_BIAS] of cuvil_ql_linear_group) */
enum { QL_EPI_NONE = 0, QL_EPI_SILU_MUL = 1 };

/* y0 = silu(y0) * y1 over a and b's M x N results, silu(v) = v sigmoid(v) with e = exp(-|v|):
   sigmoid is 1 / (1 + e) for v >= 0, e / (1 + e) below (packed_gemm.c's ACT_SILU); the last
   partial vector of a row through a padded copy, so every element is computed alike */
static void silu_mul(const job *a, const job *b) {
    for (int64_t m = 0; m < a->M; m++) {
        float *y = a->y + m * a->ldy;
        const float *u = b->y + m * b->ldy;
        int64_t n = 0;
        for (; n + VW <= a->N; n += VW) {
            vf v, w;
            memcpy(&v, y + n, sizeof v);
            memcpy(&w, u + n, sizeof w);
            v = vsilu(v) * w;
            memcpy(y + n, &v, sizeof v);
        }
        if (n < a->N) {
            float tv[VW] = {0}, tw[VW] = {0};
            memcpy(tv, y + n, (size_t)(a->N - n) * sizeof *tv);
            memcpy(tw, u + n, (size_t)(a->N - n) * sizeof *tw);
            vf v, w;
            memcpy(&v, tv, sizeof v);
            memcpy(&w, tw, sizeof w);
            v = vsilu(v) * w;
            memcpy(tv, &v, sizeof v);
            memcpy(y + n, tv, (size_t)(a->N - n) * sizeof *tv);
        }
    }
}

/* y_i = x @ W_i^T (+ bias_i) for `count` weights of one format and K that share x (M, K, ldx, group
   and threads from p; P_N and P_LDY unused): one parallel loop over all their blocks of rows, so
   threads split the group's rows as they would one weight's, and x's int4 sums are made once.
   p[P_BIAS] is the epilogue: QL_EPI_SILU_MUL takes two weights of one N and leaves
   silu(y_0) * y_1 in y_0 (y_1's address 0: a buffer of the kernel's own; a decoder's gate and up
   projections, whose products are needed only so). Returns as cuvil_ql_linear. */
int cuvil_ql_linear_group(int fmt, const float *x, int64_t count, const int64_t *addr, const int64_t *p) {
    const int64_t epilogue = p[P_BIAS];
    if (fmt < QL_BF16 || fmt > QL_INT4A8 || count < 1 || count > QL_GROUP_MAX || p[P_M] < 0 || p[P_K] < 0)
        return 1;
    if (epilogue < QL_EPI_NONE || epilogue > QL_EPI_SILU_MUL ||
        (epilogue == QL_EPI_SILU_MUL && (count != 2 || addr[G_N] != addr[G_COUNT + G_N])))
        return 1;
    job jobs[QL_GROUP_MAX];
    int64_t first[QL_GROUP_MAX + 1] = {0}, elements = 0;
    for (int64_t i = 0; i < count; i++) {
        const int64_t *a = addr + i * G_COUNT;
        if (a[G_N] < 0)
            return 1;
        job j = {fmt, x, (const void *)(intptr_t)a[G_W], (const float *)(intptr_t)a[G_SCALE],
                 (const float *)(intptr_t)a[G_ZERO], (const float *)(intptr_t)a[G_BIAS], 0,
                 (float *)(intptr_t)a[G_Y], p[P_M], a[G_N], p[P_K], p[P_LDX], a[G_LDY], p[P_GROUP]};
        jobs[i] = j;
        first[i + 1] = first[i] + (j.N + NR - 1) / NR;
        elements += j.N * j.K;
    }
    float *own = 0; /* the second result of a fused pair, when the caller gives no buffer */
    if (epilogue == QL_EPI_SILU_MUL && !jobs[1].y) {
        own = (float *)malloc((size_t)(jobs[1].M * jobs[1].N > 0 ? jobs[1].M * jobs[1].N : 1) * sizeof *own);
        if (!own)
            return 2;
        jobs[1].y = own;
        jobs[1].ldy = jobs[1].N;
    }
    void *xs = 0;
    const int rc = prepare_x(&jobs[0], &xs);
    if (rc) {
        free(own);
        return rc;
    }
    for (int64_t i = 1; i < count; i++) {
        jobs[i].xs = jobs[0].xs;
        jobs[i].xq = jobs[0].xq;
        jobs[i].xd = jobs[0].xd;
    }
    const int64_t blocks = first[count];
    const int threads = (int)(p[P_THREADS] > 0 ? p[P_THREADS] : 1);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && elements >= PARALLEL_MIN)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t i = 0;
        while (b >= first[i + 1]) i++;
        block(&jobs[i], (b - first[i]) * NR);
    }
    free(xs);
    if (epilogue == QL_EPI_SILU_MUL)
        silu_mul(&jobs[0], &jobs[1]);
    free(own);
    return 0;
}

/* W as float32 [N][K] (row stride K) */
int cuvil_ql_dequant(int fmt, const void *w, const float *scale, const float *zero, float *out, const int64_t *p) {
    const int64_t N = p[P_N], K = p[P_K], G = p[P_GROUP];
    if (fmt < QL_BF16 || fmt > QL_INT4A8 || ((fmt == QL_INT4 || fmt == QL_INT4A8) && (G < 32 || G % 32 || K % G)))
        return 1;
    const int threads = (int)(p[P_THREADS] > 0 ? p[P_THREADS] : 1);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && N * K >= PARALLEL_MIN)
    for (int64_t n = 0; n < N; n++) {
        float *o = out + n * K;
        if (fmt == QL_F32) {
            memcpy(o, (const float *)w + n * K, (size_t)K * sizeof *o);
        } else if (fmt == QL_BF16) {
            const uint16_t *r = (const uint16_t *)w + n * K;
            for (int64_t k = 0; k < K; k++) o[k] = bf16_to_f32(r[k]);
        } else if (fmt == QL_INT8) {
            const int8_t *r = (const int8_t *)w + n * K;
            const float s = scale[n];
            for (int64_t k = 0; k < K; k++) o[k] = (float)r[k] * s;
        } else {
            const uint8_t *r = (const uint8_t *)w + n * (K / 2);
            const int64_t ng = K / G;
            for (int64_t g = 0; g < ng; g++) {
                const float s = scale[n * ng + g], z = zero[n * ng + g] - 8.0f * s;
                for (int64_t c = g * G; c < (g + 1) * G; c += 32)
                    for (int i = 0; i < 16; i++) {
                        const uint8_t b = r[c / 2 + i];
                        o[c + i] = (float)(b & 15) * s + z;
                        o[c + 16 + i] = (float)(b >> 4) * s + z;
                    }
            }
        }
    }
    return 0;
}

/* x [M][K] (row stride ldx) rounded as QL_INT4A8 rounds it, as floats, into y (row stride ldy):
   y = q * d, what the kernel's integer products stand for (the larger-M path multiplies these by
   dequantized weights). Returns 1 for K not a multiple of 32. */
int cuvil_ql_round_x(const float *x, float *y, const int64_t *p) {
    const int64_t M = p[P_M], K = p[P_K], ldx = p[P_LDX], ldy = p[P_LDY];
    if (K % 32 || M < 0)
        return 1;
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < K / 32; b++) {
            int8_t q[32];
            int32_t isum;
            const float d = round_block(x + m * ldx + b * 32, q, &isum);
            for (int i = 0; i < 32; i++) y[m * ldy + b * 32 + i] = (float)q[i] * d;
        }
    return 0;
}

/* what this build is: its vector width and rows of x per tile (tests and benchmarks print it) */
void cuvil_ql_info(int64_t *vw, int64_t *mr, int64_t *nr) {
    *vw = VW;
    *mr = MR;
    *nr = NR;
}
