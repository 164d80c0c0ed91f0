/* Flash attention in float32 for the cpu target (driven by cuvil_backend_cpu/attention.py).
 *
 *   out[b,h,i,:] = sum_j softmax_j(s[i,j]) v[b,g,j,:],  s[i,j] = scale q[b,h,i,:].k[b,g,j,:] + mask[b,h,i,j]
 *
 * with g = h / (Hq / Hk) (grouped-query attention), mask additive (float), boolean (false: -inf) or
 * causal (key j visible from query i when j <= i, torch's top-left alignment). A query that sees no
 * key gets zeros, as eager's scaled_dot_product_attention gives, or NaN (P_EMPTY_NAN), as the
 * composition softmax(s) @ v gives.
 *
 * One work item per (batch, head, block of BQ queries) runs on the OpenMP threads. It packs its
 * queries transposed (qt[e][i], scaled) and walks the keys in blocks of BK: the block's scores,
 * transposed (st[j][i] = k[j] . q[i]), the online softmax (running max and sum per query; the
 * accumulator is rescaled when the max grows), and the block's values added in. Scores are kept
 * transposed so that both products read k and v in place, rows along e (transformers passes them as
 * transposes of linear outputs: rows strided, e contiguous), and so that the softmax runs down the
 * columns with queries in the vector lanes: no horizontal reductions, no packing of k or v.
 * bfloat16 q, k, v and out (P_BF16) are widened as they are read: q into its transposed block, each
 * block of k and v into float rows of the thread's own (kf, vf), and the output rounded to nearest
 * even once, at its store; everything between is float32, as for float32 tensors.
 * Both products are register tiles of outer products (up to MR rows x NR columns) over GCC vector
 * types, so one source serves SSE, AVX2, AVX-512 and NEON; the multiply-adds are explicit FMAs
 * where the ISA has them, because kernels build with -std=c11, where the compiler does not
 * contract a*b+c.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuvil_vectors.h"

#define MR 6 /* rows per register tile (TILE_CASES spells out 1 .. MR) */
#define NR (2 * VW) /* columns per register tile: MR x 2 accumulators + 2 loads + 1 broadcast fit 16 registers */

static inline vf vload(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void vstore(float *p, vf v) { memcpy(p, &v, sizeof v); }


/* The tiles take their row count as a constant (TILE_CASES below), so each unrolls fully and keeps
 * its MR x 2 accumulators in registers. */

/* s[r][0:NR] = sum_e k[r][e] qt[e][0:NR], r < mr (keys in rows, queries across). */
static inline __attribute__((always_inline)) void tile_qk_n(const int mr, const float *restrict k,
                                                              int64_t ldk, int64_t E, const float *restrict qt,
                                                              int64_t ldq, float *restrict s, int64_t lds) {
    vf acc[MR][2];
    for (int r = 0; r < mr; ++r) acc[r][0] = acc[r][1] = splat(0.0f);
#pragma GCC unroll 4
    for (int64_t e = 0; e < E; ++e) {
        const vf b0 = vload(qt + e * ldq), b1 = vload(qt + e * ldq + VW);
        for (int r = 0; r < mr; ++r) {
            const vf a = splat(k[r * ldk + e]);
            acc[r][0] = FMA(a, b0, acc[r][0]);
            acc[r][1] = FMA(a, b1, acc[r][1]);
        }
    }
    for (int r = 0; r < mr; ++r) {
        vstore(s + r * lds, acc[r][0]);
        vstore(s + r * lds + VW, acc[r][1]);
    }
}

/* o[r][0:NR] = alpha[r] o[r][0:NR] + sum_j pt[j][r] v[j][0:NR], r < mr, j < w (queries in rows). */
static inline __attribute__((always_inline)) void tile_pv_n(const int mr, const float *restrict pt,
                                                              int64_t ldp, int64_t w, const float *restrict v,
                                                              int64_t ldv, float *restrict o, int64_t ldo,
                                                              const float *restrict alpha) {
    vf acc[MR][2];
    for (int r = 0; r < mr; ++r) {
        const vf a = splat(alpha[r]);
        acc[r][0] = vload(o + r * ldo) * a;
        acc[r][1] = vload(o + r * ldo + VW) * a;
    }
#pragma GCC unroll 4
    for (int64_t j = 0; j < w; ++j) {
        const vf b0 = vload(v + j * ldv), b1 = vload(v + j * ldv + VW);
        for (int r = 0; r < mr; ++r) {
            const vf a = splat(pt[j * ldp + r]);
            acc[r][0] = FMA(a, b0, acc[r][0]);
            acc[r][1] = FMA(a, b1, acc[r][1]);
        }
    }
    for (int r = 0; r < mr; ++r) {
        vstore(o + r * ldo, acc[r][0]);
        vstore(o + r * ldo + VW, acc[r][1]);
    }
}

#define TILE_CASES(f, ...)                                                                                   \
    switch (mr) {                                                                                            \
    case 1: f(1, __VA_ARGS__); break;                                                                        \
    case 2: f(2, __VA_ARGS__); break;                                                                        \
    case 3: f(3, __VA_ARGS__); break;                                                                        \
    case 4: f(4, __VA_ARGS__); break;                                                                        \
    case 5: f(5, __VA_ARGS__); break;                                                                        \
    default: f(MR, __VA_ARGS__); break;                                                                      \
    }

static void tile_qk(int mr, const float *k, int64_t ldk, int64_t E, const float *qt, int64_t ldq, float *s,
                    int64_t lds) {
    TILE_CASES(tile_qk_n, k, ldk, E, qt, ldq, s, lds)
}

static void tile_pv(int mr, const float *pt, int64_t ldp, int64_t w, const float *v, int64_t ldv, float *o,
                    int64_t ldo, const float *alpha) {
    TILE_CASES(tile_pv_n, pt, ldp, w, v, ldv, o, ldo, alpha)
}

static inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static float *alloc_floats(int64_t n) {
    /* aligned_alloc wants a multiple of the alignment; +1 so that n = 0 is not a NULL "failure" */
    return aligned_alloc(64, (size_t)round_up((n + 1) * (int64_t)sizeof(float), 64));
}

/* The tile sizes, so the caller can pick block sizes that are multiples of them. */
void cuvil_attention_tile(int64_t *mr, int64_t *nr) {
    *mr = MR;
    *nr = NR;
}

enum { P_B, P_HQ, P_HK, P_L, P_S, P_E, P_EV, P_QB, P_QH, P_QL, P_KB, P_KH, P_KL, P_VB, P_VH, P_VL,
       P_MB, P_MH, P_ML, P_MASK, P_CAUSAL, P_BQ, P_BK, P_THREADS, P_EMPTY_NAN, P_BF16,
       P_COUNT /* 26: attention.py packs that many */ };

/* What one thread works in: the block's queries transposed, its scores (then probabilities)
 * transposed, its output accumulator, the running max and sum per query, and the last columns of v
 * padded to a whole tile when Ev is not a multiple of NR. */
typedef struct {
    float *qt, *st, *o, *m, *l, *alpha, *vtail, *kf, *vf; /* kf, vf: a bfloat16 block widened */
} Scratch;

/* Queries i0 .. i0+bq (bqp of them with the padding to NR) against keys j0 .. j0+w. */
static void attend_block(const int64_t *P, const void *kp, const void *vp, const void *mask, int64_t i0,
                         int64_t bq, int64_t bqp, int64_t j0, int64_t w, const Scratch *t) {
    const int64_t E = P[P_E], Ev = P[P_EV], evp = round_up(Ev, NR);
    const float *k = kp, *v = vp;
    int64_t ldk = P[P_KL], ldv = P[P_VL];
    if (P[P_BF16]) { /* the block's k and v widened into rows of their own (v's padded to whole tiles) */
        const uint16_t *kh = kp, *vh = vp;
        for (int64_t j = 0; j < w; ++j) {
#pragma omp simd
            for (int64_t e = 0; e < E; ++e) t->kf[j * E + e] = bf16_to_f32(kh[j * P[P_KL] + e]);
#pragma omp simd
            for (int64_t c = 0; c < evp; ++c) t->vf[j * evp + c] = c < Ev ? bf16_to_f32(vh[j * P[P_VL] + c]) : 0.0f;
        }
        k = t->kf, v = t->vf, ldk = E, ldv = evp;
    }
    float *restrict st = t->st;
    for (int64_t j = 0; j < w; j += MR)
        for (int64_t i = 0; i < bqp; i += NR)
            tile_qk((int)min64(MR, w - j), k + j * ldk, ldk, E, t->qt + i, bqp, st + j * bqp + i, bqp);
    if (P[P_MASK]) {
        const int64_t ml = P[P_ML];
        for (int64_t j = 0; j < w; ++j) {
            float *restrict row = st + j * bqp;
            if (ml == 0) { /* one mask row for all queries (a padding mask, (B, 1, 1, S)) */
                const float add = P[P_MASK] == 1 ? ((const float *)mask)[j0 + j]
                                                 : (((const uint8_t *)mask)[j0 + j] ? 0.0f : -INFINITY);
#pragma omp simd
                for (int64_t i = 0; i < bq; ++i) row[i] += add;
            } else if (P[P_MASK] == 1) {
                const float *restrict mj = (const float *)mask + i0 * ml + j0 + j;
#pragma omp simd
                for (int64_t i = 0; i < bq; ++i) row[i] += mj[i * ml];
            } else {
                const uint8_t *restrict mj = (const uint8_t *)mask + i0 * ml + j0 + j;
#pragma omp simd
                for (int64_t i = 0; i < bq; ++i) row[i] = mj[i * ml] ? row[i] : -INFINITY;
            }
        }
    }
    if (P[P_CAUSAL]) /* key j0 + j is hidden from the queries before it */
        for (int64_t j = 0; j < w; ++j)
            for (int64_t i = 0; i < min64(bq, j0 + j - i0); ++i) st[j * bqp + i] = -INFINITY;
    for (int64_t i = 0; i < bqp; i += VW) {
        vf mx = splat(-INFINITY);
        for (int64_t j = 0; j < w; ++j) {
            const vf x = vload(st + j * bqp + i);
            mx = select(x > mx, x, mx);
        }
        const vf mold = vload(t->m + i), mnew = select(mx > mold, mx, mold);
        /* a query that has seen no key yet (max -inf) subtracts 0: its p are exp(-inf) = 0, and its
         * alpha does not matter (its sum and accumulator are still 0) */
        const vf base = select(mnew == splat(-INFINITY), splat(0.0f), mnew);
        vf sum = splat(0.0f);
        for (int64_t j = 0; j < w; ++j) {
            const vf p = vexp(vload(st + j * bqp + i) - base);
            vstore(st + j * bqp + i, p);
            sum += p;
        }
        const vf alpha = vexp(mold - base);
        vstore(t->alpha + i, alpha);
        vstore(t->l + i, vload(t->l + i) * alpha + sum);
        vstore(t->m + i, mnew);
    }
    /* value columns read in place; the rest from vtail (a widened block is padded already) */
    const int64_t whole = P[P_BF16] ? evp : Ev / NR * NR;
    if (whole < evp)
        for (int64_t j = 0; j < w; ++j)
            for (int64_t c = 0; c < NR; ++c)
                t->vtail[j * NR + c] = whole + c < Ev ? v[j * ldv + whole + c] : 0.0f;
    for (int64_t i = 0; i < bq; i += MR)
        for (int64_t c = 0; c < evp; c += NR) {
            const float *vc = c < whole ? v + c : t->vtail;
            tile_pv((int)min64(MR, bq - i), st + i, bqp, w, vc, c < whole ? ldv : NR, t->o + i * evp + c, evp,
                    t->alpha + i);
        }
}

/* Attention over q (B,Hq,L,E), k (B,Hk,S,E), v (B,Hk,S,Ev), each with its last stride 1 and the
 * others in P, into the contiguous out (B,Hq,L,Ev); all four float32, or all four bfloat16 with
 * P_BF16. P is laid out as the enum above; P_MASK is 0 (none), 1 (float32, additive) or 2 (bool as
 * bytes), its strides P_MB.. for (B,Hq,L,S) with S's 1. Returns 0, or 1 when memory ran out. */
int cuvil_attention(const void *q, const void *k, const void *v, const void *mask, void *out,
                    const int64_t *P, float scale) {
    const int64_t Hq = P[P_HQ], L = P[P_L], S = P[P_S], E = P[P_E], Ev = P[P_EV], BQ = P[P_BQ],
                  BK = P[P_BK];
    const int64_t evp = round_up(Ev, NR), nqb = (L + BQ - 1) / BQ, group = Hq / P[P_HK];
    const int64_t bqmax = round_up(BQ, NR), items = P[P_B] * Hq * nqb;
    const float empty = P[P_EMPTY_NAN] ? NAN : 0.0f; /* what a query that sees no key gets */
    int failed = 0;
#pragma omp parallel num_threads(P[P_THREADS])
    {
        const int half = P[P_BF16] != 0;
        Scratch t = {alloc_floats(E * bqmax), alloc_floats(BK * bqmax), alloc_floats(bqmax * evp),
                     alloc_floats(3 * bqmax), NULL, NULL, alloc_floats(BK * NR),
                     half ? alloc_floats(BK * E) : NULL, half ? alloc_floats(BK * evp) : NULL};
        const int ok = t.qt && t.st && t.o && t.m && t.vtail && (!half || (t.kf && t.vf));
        if (!ok) {
#pragma omp atomic write
            failed = 1;
        }
        /* dynamic: causal items differ in work; the last query blocks (the longest) go first */
#pragma omp for schedule(dynamic, 1)
        for (int64_t u = 0; u < items; ++u) {
            if (!ok)
                continue;
            const int64_t bh = u / nqb, b = bh / Hq, h = bh % Hq, i0 = (nqb - 1 - u % nqb) * BQ;
            const int64_t bq = min64(BQ, L - i0), bqp = round_up(bq, NR), g = h / group;
            t.l = t.m + bqp;
            t.alpha = t.m + 2 * bqp;
            const int64_t qo = b * P[P_QB] + h * P[P_QH] + i0 * P[P_QL];
            if (half) {
                const uint16_t *qb = (const uint16_t *)q + qo;
                for (int64_t e = 0; e < E; ++e)
                    for (int64_t i = 0; i < bqp; ++i)
                        t.qt[e * bqp + i] = i < bq ? bf16_to_f32(qb[i * P[P_QL] + e]) * scale : 0.0f;
            } else {
                const float *qb = (const float *)q + qo;
                for (int64_t e = 0; e < E; ++e)
                    for (int64_t i = 0; i < bqp; ++i)
                        t.qt[e * bqp + i] = i < bq ? qb[i * P[P_QL] + e] * scale : 0.0f;
            }
            for (int64_t i = 0; i < bqp; ++i) {
                t.m[i] = -INFINITY;
                t.l[i] = 0.0f;
            }
            memset(t.o, 0, (size_t)(bqp * evp) * sizeof(float));
            const int64_t size = half ? 2 : 4, ko = b * P[P_KB] + g * P[P_KH], vo = b * P[P_VB] + g * P[P_VH];
            const char *kb = (const char *)k + ko * size, *vb = (const char *)v + vo * size;
            const void *mb = NULL;
            if (P[P_MASK] == 1) mb = (const float *)mask + b * P[P_MB] + h * P[P_MH];
            if (P[P_MASK] == 2) mb = (const uint8_t *)mask + b * P[P_MB] + h * P[P_MH];
            const int64_t kend = P[P_CAUSAL] ? min64(S, i0 + bq) : S;
            for (int64_t j0 = 0; j0 < kend; j0 += BK)
                attend_block(P, kb + j0 * P[P_KL] * size, vb + j0 * P[P_VL] * size, mb, i0, bq, bqp, j0,
                             min64(BK, kend - j0), &t);
            for (int64_t i = 0; i < bq; ++i) {
                const float inv = t.l[i] == 0.0f ? empty : 1.0f / t.l[i]; /* (NaN stays NaN) */
                const int64_t row = (bh * L + i0 + i) * Ev;
                if (half) {
                    uint16_t *ob = (uint16_t *)out + row;
#pragma omp simd
                    for (int64_t c = 0; c < Ev; ++c) ob[c] = f32_to_bf16(t.o[i * evp + c] * inv);
                } else {
                    float *ob = (float *)out + row;
                    for (int64_t c = 0; c < Ev; ++c) ob[c] = t.o[i * evp + c] * inv;
                }
            }
        }
        free(t.qt);
        free(t.st);
        free(t.o);
        free(t.m);
        free(t.vtail);
        free(t.kf);
        free(t.vf);
    }
    return failed;
}
