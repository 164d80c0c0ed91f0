/* Paged attention for the cpu target (driven by cuvil_backend_cpu/paged_attention.py; the layout and
 * the varlen batch convention are cuvil_ir/graph_ir/ops/paged.py's, docs/paged-attention.md):
 *
 *   out[t,h,:] = sum_p softmax_p(scale q[t,h,:].K[b,p,g,:]) V[b,p,g,:],   p <= pos(t),  g = h / G
 *
 * for query token t of sequence b (rows starts[b] .. starts[b+1]), at position
 * pos(t) = seq_lens[b] - q_len_b + (t - starts[b]); cache position p of sequence b lives in block
 * tables[b, p / BS] at offset p % BS. K and V are float32, bfloat16 or float16 (the cache's dtype),
 * every sum and the softmax in float32; q and out are float32 (the driver widens and rounds).
 *
 * Work: one item per (tile of up to QT query tokens of one sequence, kv head, split). An item holds
 * the tile's tokens x the G query heads of the kv head as rows, and reads each K and V row of the
 * positions it covers once for all of them (no repeat of K/V per query head), position sub-tiles of
 * PT at a time: the sub-tile's scores, an online softmax per row (running max and sum; the
 * accumulator rescaled when the max grows), the sub-tile's values added in. Causality: a row stops
 * at its own position, so the later rows of a prefill chunk see more of the last block.
 *
 * No scalar dot products: the scores and the softmax keep the rows across the vector lanes, in one
 * of two layouts chosen per item.
 *  - Columns (more than VW / 2 rows: prefill tiles): q transposed once per item, qt[d][r]; a
 *    sub-tile's scores st[x][r] are register tiles of 8 keys x 1 row vector (or 4 x 2), each K
 *    element broadcast once (read in place from a float32 cache) against the row vectors; the
 *    softmax runs down the columns, one vector exp (vexp: Cephes, within 2 ulp of expf) per key
 *    and row vector, no horizontal step.
 *  - Packed (up to VW / 2 rows: a decode step's group, RS rows rounded up to a power of two):
 *    VW / RS keys x RS rows to a vector. The scores are VW partial dot products along the head
 *    (each K vector loaded once for the rows, each q vector once for the keys) and one transposing
 *    sum (pairwise folds of even and odd lanes, in-chunk then of whole 128-bit chunks) that leaves
 *    them packed; the softmax then runs on whole vectors and folds each row's max and sum across
 *    its lanes at the end, so a 4-head group on 8 lanes takes half the exps of the columns layout.
 * The values in both: register tiles of MR rows x 2 vectors along the head (the rescale folded
 * into the accumulators' load), each V vector loaded once for the MR rows. Half caches and head
 * sizes that are no whole number of vectors go through a widened, zero-padded row buffer; the
 * scratch is one allocation per call.
 *
 * Splits (flash-decoding): when the tiles x kv heads are fewer than the threads, a tile whose
 * context is long (at least two chunks of P_SPLIT_MIN positions) is split along the sequence into
 * chunks of whole blocks (of whole PT sub-tiles where a block is longer); each chunk is an item
 * that leaves its rows' (max, sum, accumulator) in a scratch buffer, and one reduction per
 * (tile, kv head) merges them:
 *   M = max_c m_c,  out = sum_c e^(m_c - M) acc_c / sum_c e^(m_c - M) l_c.
 *
 * Nothing here depends on the cache being paged beyond the block-table lookup: a contiguous cache
 * [batch, S, kv_heads, D] (or [batch, kv_heads, S, D]: the cache strides are parameters) is one block
 * of S positions per sequence with the identity table [[0], [1], ...] (issue 29's decode attention).
 *
 * One source for every ISA: GCC vector types of VW lanes (the compiler picks the instructions for the
 * -march it is given); explicit FMA intrinsics where the ISA has them, because kernels build with
 * -std=c11, where GCC does not contract a*b+c.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "cuvil_vectors.h"

#define PT 32 /* positions per sub-tile: the scores of one sub-tile, PT x rows, stay in L1 */
#define MR 4  /* rows per register tile of the values' product */
#define XB 8  /* positions per register tile of the scores (4 where it spans two row vectors) */

/* params, int64 each, in this order (paged_attention.py packs them) */
enum {
    P_TOKENS, P_HEADS, P_KV_HEADS, P_DIM, P_BATCH, P_MAX_BLOCKS, P_BLOCK_SIZE, P_NUM_BLOCKS,
    P_Q_T, P_Q_H,          /* the query's strides (token, head); its last is 1 */
    P_K_B, P_K_P, P_K_H,   /* the key cache's strides (block, offset, head); its last is 1 */
    P_V_B, P_V_P, P_V_H,   /* the value cache's */
    P_DTYPE,               /* the caches' dtype: 0 float32, 1 bfloat16, 2 float16 */
    P_THREADS, P_SPLIT_MIN, P_QT,
    P_COUNT
};

/* what cuvil_paged_attention returns (info[0]: the sequence, info[1]: its value) */
enum { PA_OK = 0, PA_NOMEM = 1, PA_STARTS = 2, PA_LENS = 3, PA_TABLE = 4, PA_SHAPE = 6 };

#define INLINE static inline __attribute__((always_inline))

INLINE vf vload(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

INLINE void vstore(float *p, vf v) { memcpy(p, &v, sizeof v); }

INLINE vi splati(int32_t x) { return x - (vi){0}; }

INLINE vf vmax(vf a, vf b) { return select(a > b, a, b); }

/* keeps v in a register: GCC otherwise folds a vector load used by several FMAs into each of them as
 * a memory operand, and the tiles become bound by loads (x86 at the ISA's own width only) */
#if (defined(__x86_64__) || defined(__i386__)) && !defined(CUVIL_VW)
#define IN_REGISTER(v) __asm__("" : "+x"(v))
#else
#define IN_REGISTER(v) (void)(v)
#endif

INLINE int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
INLINE int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
INLINE int64_t up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

/* acc = acc * alpha + p * v over D (the reduction of split tiles) */
static void scale_add(float *restrict acc, float alpha, float p, const float *restrict v, int64_t D) {
    const vf va = splat(alpha), vp = splat(p);
    int64_t d = 0;
    for (; d + VW <= D; d += VW) vstore(acc + d, FMA(vp, vload(v + d), vload(acc + d) * va));
    for (; d < D; ++d) acc[d] = acc[d] * alpha + p * v[d];
}

INLINE float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    uint32_t u;
    if (e == 0) { /* zero or subnormal: m * 2^-24 */
        const float f = (float)m * 0x1p-24f;
        memcpy(&u, &f, sizeof u);
        u |= sign;
    } else if (e == 31) {
        u = sign | 0x7f800000u | (m << 13);
    } else {
        u = sign | ((e + 112u) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* n cache rows of D elements (row stride ld, element offset at) as float32 rows in buf (row stride
 * ldb, zeros from D to ldb) */
static void widen(const void *cache, int64_t at, int64_t ld, int64_t n, int64_t D, int64_t dtype, float *buf,
                  int64_t ldb) {
    for (int64_t x = 0; x < n; ++x) {
        const uint16_t *h = (const uint16_t *)cache + at + x * ld;
        float *o = buf + x * ldb;
        if (dtype == 0)
            memcpy(o, (const float *)cache + at + x * ld, (size_t)D * sizeof(float));
        else if (dtype == 1)
            for (int64_t d = 0; d < D; ++d) o[d] = bf16_to_f32(h[d]);
        else
            for (int64_t d = 0; d < D; ++d) o[d] = f16_to_f32(h[d]);
        for (int64_t d = D; d < ldb; ++d) o[d] = 0.0f;
    }
}

/* st[x][0 : rb VW] = sum_d k[x][d] qt[d][0 : rb VW] for x < xb: keys down, rows across (xb and rb
 * are constants where it is inlined, so the xb x rb accumulators stay in registers) */
INLINE void qk_tile(const int xb, const int rb, const float *restrict k, int64_t ldk, const float *restrict qt,
                    int64_t RP, int64_t D, float *st, int64_t RS) {
    vf acc[XB][2];
    for (int x = 0; x < xb; ++x) acc[x][0] = acc[x][1] = splat(0.0f);
    for (int64_t d = 0; d < D; ++d) {
        vf q0 = vload(qt + d * RP), q1 = rb > 1 ? vload(qt + d * RP + VW) : q0;
        IN_REGISTER(q0);
        if (rb > 1) IN_REGISTER(q1);
        for (int x = 0; x < xb; ++x) {
            const vf a = splat(k[x * ldk + d]);
            acc[x][0] = FMA(a, q0, acc[x][0]);
            if (rb > 1) acc[x][1] = FMA(a, q1, acc[x][1]);
        }
    }
    for (int x = 0; x < xb; ++x) { /* (in order: RS < VW overlaps the next key's lanes) */
        vstore(st + x * RS, acc[x][0]);
        if (rb > 1) vstore(st + x * RS + VW, acc[x][1]);
    }
}

/* the scores of n keys (rows of k, stride ldk) for the RP rows of qt, transposed: st[x * RS + r]
 * (RS = RP, or, for few rows, RS < VW: the rows' lanes only, the stores in key order) */
static void scores(const float *restrict k, int64_t ldk, int64_t n, const float *restrict qt, int64_t RP,
                   int64_t D, float *st, int64_t RS) {
    for (int64_t c = 0; c < RP; c += 2 * VW) {
        if (c + VW < RP) { /* two row vectors: tiles of 4 keys x 2 */
            for (int64_t x = 0; x < n; x += XB / 2) {
                const float *kx = k + x * ldk, *qc = qt + c;
                float *sx = st + x * RS + c;
                switch (min64(XB / 2, n - x)) {
                case 1: qk_tile(1, 2, kx, ldk, qc, RP, D, sx, RS); break;
                case 2: qk_tile(2, 2, kx, ldk, qc, RP, D, sx, RS); break;
                case 3: qk_tile(3, 2, kx, ldk, qc, RP, D, sx, RS); break;
                default: qk_tile(4, 2, kx, ldk, qc, RP, D, sx, RS); break;
                }
            }
        } else { /* one row vector (a decode step's group): tiles of 8 keys */
            for (int64_t x = 0; x < n; x += XB) {
                const float *kx = k + x * ldk, *qc = qt + c;
                float *sx = st + x * RS + c;
                switch (min64(XB, n - x)) {
                case 1: qk_tile(1, 1, kx, ldk, qc, RP, D, sx, RS); break;
                case 2: qk_tile(2, 1, kx, ldk, qc, RP, D, sx, RS); break;
                case 3: qk_tile(3, 1, kx, ldk, qc, RP, D, sx, RS); break;
                case 4: qk_tile(4, 1, kx, ldk, qc, RP, D, sx, RS); break;
                case 5: qk_tile(5, 1, kx, ldk, qc, RP, D, sx, RS); break;
                case 6: qk_tile(6, 1, kx, ldk, qc, RP, D, sx, RS); break;
                case 7: qk_tile(7, 1, kx, ldk, qc, RP, D, sx, RS); break;
                default: qk_tile(8, 1, kx, ldk, qc, RP, D, sx, RS); break;
                }
            }
        }
    }
}

/* The transposing sum: VW vectors a[0 .. VW) to one whose lane l is the sum of a[l]'s lanes, in
 * log2(VW) levels of pairwise folds (a pair's even lanes plus its odd lanes): within each 4-lane
 * (128-bit) chunk while more than VW / 4 vectors are left (one shufps each on SSE, AVX2 and
 * AVX-512; uzp on NEON), then of whole chunks (one vperm2f128 / vshuff32x4 each). */
#if VW == 4
#define IN_EVEN 0, 2, 4, 6
#define IN_ODD 1, 3, 5, 7
#define BLOCK_EVEN IN_EVEN /* (never used: 4 lanes are one chunk) */
#define BLOCK_ODD IN_ODD
#elif VW == 8
#define IN_EVEN 0, 2, 8, 10, 4, 6, 12, 14
#define IN_ODD 1, 3, 9, 11, 5, 7, 13, 15
#define BLOCK_EVEN 0, 1, 2, 3, 8, 9, 10, 11
#define BLOCK_ODD 4, 5, 6, 7, 12, 13, 14, 15
#elif VW == 16
#define IN_EVEN 0, 2, 16, 18, 4, 6, 20, 22, 8, 10, 24, 26, 12, 14, 28, 30
#define IN_ODD 1, 3, 17, 19, 5, 7, 21, 23, 9, 11, 25, 27, 13, 15, 29, 31
#define BLOCK_EVEN 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27
#define BLOCK_ODD 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31
#else
#error "paged_attention.c: VW must be 4, 8 or 16"
#endif

INLINE vf fold(vf a, vf b, int block) {
    if (block) return __builtin_shuffle(a, b, (vi){BLOCK_EVEN}) + __builtin_shuffle(a, b, (vi){BLOCK_ODD});
    return __builtin_shuffle(a, b, (vi){IN_EVEN}) + __builtin_shuffle(a, b, (vi){IN_ODD});
}

INLINE vf transpose_sum(vf *a) {
#pragma GCC unroll 16
    for (int w = VW; w > 1; w /= 2)
#pragma GCC unroll 16
        for (int k = 0; k < w / 2; ++k) a[k] = fold(a[2 * k], a[2 * k + 1], w <= VW / 4);
    return a[0];
}

/* The partial scores of keys x .. x + VW / rs of few rows (rs: a power of two <= VW / 2, a
 * constant where inlined): part[j * rs + i] = qs[i] * k[x + j] lane by lane, summed along the head
 * (each K vector loaded once for the rs rows, each q vector once for the keys). qs and k rows are
 * Dp long (zeros past D); keys past n repeat key n - 1 (their lanes are masked). */
INLINE void flat_group(const int rs, const float *restrict k, int64_t ldk, int64_t x, int64_t n,
                       const float *restrict qs, int64_t Dp, vf *part) {
    const int keys = VW / rs;
    const float *kr[VW];
    vf acc[VW];
    for (int j = 0; j < keys; ++j) kr[j] = k + min64(x + j, n - 1) * ldk;
    for (int l = 0; l < VW; ++l) acc[l] = splat(0.0f);
    for (int64_t d = 0; d < Dp; d += VW) {
        vf qv[VW], kv[VW];
        for (int i = 0; i < rs; ++i) {
            qv[i] = vload(qs + i * Dp + d);
            if (keys > 1) IN_REGISTER(qv[i]);
        }
        for (int j = 0; j < keys; ++j) {
            kv[j] = vload(kr[j] + d);
            if (rs > 1) IN_REGISTER(kv[j]);
        }
        for (int l = 0; l < VW; ++l) acc[l] = FMA(qv[l % rs], kv[l / rs], acc[l]);
    }
    for (int l = 0; l < VW; ++l) part[l] = acc[l];
}

/* The packed scores of a sub-tile's n keys for RS rows: st[x * RS + r] = qs[r] . k[x], VW / RS
 * keys to a vector: the partial products of every group of keys first, then one transposing sum
 * per group (two passes, so neither waits on the other's latency). */
static void flat_scores(const float *k, int64_t ldk, int64_t n, const float *qs, int64_t RS, int64_t Dp,
                        float *st) {
    vf part[PT * VW / 2 + VW]; /* (n RS / VW groups of VW vectors at most) */
    int64_t groups = 0;
    for (int64_t x = 0; x < n; x += VW / RS, ++groups) {
        vf *pg = part + groups * VW;
        switch (RS) {
        case 1: flat_group(1, k, ldk, x, n, qs, Dp, pg); break;
#if VW == 4
        default: flat_group(2, k, ldk, x, n, qs, Dp, pg); break;
#else
        case 2: flat_group(2, k, ldk, x, n, qs, Dp, pg); break;
#if VW == 8
        default: flat_group(4, k, ldk, x, n, qs, Dp, pg); break;
#else
        case 4: flat_group(4, k, ldk, x, n, qs, Dp, pg); break;
        default: flat_group(8, k, ldk, x, n, qs, Dp, pg); break;
#endif
#endif
        }
    }
    for (int64_t i = 0; i < groups; ++i) vstore(st + i * VW, transpose_sum(part + i * VW));
}

/* acc[i][0 : nc VW] = alpha[i] acc[i][..] + sum_x p[x][i] v[x][0 : nc VW] for i < mr: each V vector
 * loaded once for the mr rows (mr, nc constants where inlined) */
INLINE void pv_tile(const int mr, const int nc, const float *restrict p, int64_t RP, int64_t n,
                    const float *restrict v, int64_t ldv, float *restrict acc, int64_t Dp,
                    const float *restrict alpha) {
    vf o[MR][2];
    for (int i = 0; i < mr; ++i) {
        const vf a = splat(alpha[i]);
        o[i][0] = vload(acc + i * Dp) * a;
        o[i][1] = nc > 1 ? vload(acc + i * Dp + VW) * a : o[i][0];
    }
    for (int64_t x = 0; x < n; ++x) {
        vf v0 = vload(v + x * ldv), v1 = nc > 1 ? vload(v + x * ldv + VW) : v0;
        IN_REGISTER(v0);
        if (nc > 1) IN_REGISTER(v1);
        for (int i = 0; i < mr; ++i) {
            const vf pi = splat(p[x * RP + i]);
            o[i][0] = FMA(pi, v0, o[i][0]);
            if (nc > 1) o[i][1] = FMA(pi, v1, o[i][1]);
        }
    }
    for (int i = 0; i < mr; ++i) {
        vstore(acc + i * Dp, o[i][0]);
        if (nc > 1) vstore(acc + i * Dp + VW, o[i][1]);
    }
}

#define PV_ROWS(NC)                                                                                          \
    switch (min64(MR, R - r)) {                                                                              \
    case 1: pv_tile(1, NC, p + r, RP, n, v + c, ldv, acc + r * Dp + c, Dp, alpha + r); break;                \
    case 2: pv_tile(2, NC, p + r, RP, n, v + c, ldv, acc + r * Dp + c, Dp, alpha + r); break;                \
    case 3: pv_tile(3, NC, p + r, RP, n, v + c, ldv, acc + r * Dp + c, Dp, alpha + r); break;                \
    default: pv_tile(4, NC, p + r, RP, n, v + c, ldv, acc + r * Dp + c, Dp, alpha + r); break;               \
    }

/* acc (R rows of Dp) rescaled by alpha and the n values (rows of v, stride ldv, Dp columns) added */
static void values(const float *restrict p, int64_t RP, int64_t R, int64_t n, const float *restrict v,
                   int64_t ldv, float *restrict acc, int64_t Dp, const float *restrict alpha) {
    for (int64_t r = 0; r < R; r += MR) {
        int64_t c = 0;
        for (; c + 2 * VW <= Dp; c += 2 * VW) PV_ROWS(2)
        if (c < Dp) PV_ROWS(1)
    }
}

typedef struct {
    int64_t b, t0, nt, nsplit, chunk, part; /* part: the first partial row of its splits, or -1 */
} Tile;

/* one thread's scratch (RP: the rows rounded up to whole vectors, Dp: D to whole vectors) */
typedef struct {
    float *qt, *st, *acc, *m, *l, *alpha, *kbuf, *vbuf;
    int32_t *lim, *lane; /* the last position each lane's row sees; the lane's key (packed rows) */
} Scratch;

static float *alloc_floats(int64_t n) { return malloc((size_t)max64(n, 1) * sizeof(float)); }

/* floats of one thread's scratch, each part a whole number of 64-byte lines */
static int64_t scratch_floats(int64_t RP, int64_t Dp) {
    return up(RP * Dp, 16) + up(PT * RP, 16) + up(RP * Dp, 16) + 5 * up(RP, 16) + 2 * up(PT * Dp, 16);
}

static Scratch scratch_at(float *f, int64_t RP, int64_t Dp) {
    Scratch t;
    t.qt = f, f += up(RP * Dp, 16); /* (also qs: rows along the head, for few rows) */
    t.st = f, f += up(PT * RP, 16);
    t.acc = f, f += up(RP * Dp, 16);
    t.m = f, f += up(RP, 16);
    t.l = f, f += up(RP, 16);
    t.alpha = f, f += up(RP, 16);
    t.lim = (int32_t *)f, f += up(RP, 16);
    t.lane = (int32_t *)f, f += up(RP, 16);
    t.kbuf = f, f += up(PT * Dp, 16);
    t.vbuf = f;
    return t;
}

/* rotate v by k lanes (lane l takes lane (l + k) mod VW) */
INLINE vf rotate(vf v, int k) {
    vi idx;
    for (int l = 0; l < VW; ++l) idx[l] = (l + k) & (VW - 1);
    return __builtin_shuffle(v, idx);
}

/* The online softmax of a sub-tile's scores st (n keys from position p), probabilities in place:
 * a lane past its row's position (or past the sub-tile) gets -inf, the new max, the rescale factor
 * alpha, the new sum. Rows across the lanes: RS = RP, columns of VW rows down the keys; or RS < VW
 * (few rows: a decode step's group), VW / RS keys per vector, lane l row l % RS, key l / RS, and
 * each row's max and sum folded across its lanes (m, l and alpha then hold each row VW / RS times,
 * row r at lane r among them). */
static void softmax(Scratch *t, int64_t RS, int64_t RP, int64_t n, int64_t p, int64_t pos0) {
    if (RS < VW) {
        const int64_t nv = (n * RS + VW - 1) / VW, keys = VW / RS;
        vi lim, lane;
        memcpy(&lim, t->lim, sizeof lim);
        memcpy(&lane, t->lane, sizeof lane);
        vf mx = splat(-INFINITY);
        if (p + n - 1 > pos0 || n * RS % VW) /* (else every lane's row sees the lane's key) */
            for (int64_t v = 0; v < nv; ++v) {
                const vi pos = lane + splati((int32_t)(v * keys)); /* the lane's key in the sub-tile */
                const vi out = (pos + splati((int32_t)p) > lim) | (pos >= splati((int32_t)n));
                const vf s = select(out, splat(-INFINITY), vload(t->st + v * VW));
                vstore(t->st + v * VW, s);
                mx = vmax(s, mx);
            }
        else
            for (int64_t v = 0; v < nv; ++v) mx = vmax(vload(t->st + v * VW), mx);
        for (int k = (int)RS; k < VW; k *= 2) mx = vmax(rotate(mx, k), mx);
        const vf mold = vload(t->m), mnew = vmax(mx, mold);
        const vf base = select(mnew == splat(-INFINITY), splat(0.0f), mnew);
        vf sum = splat(0.0f);
        for (int64_t v = 0; v < nv; ++v) {
            const vf e = vexp(vload(t->st + v * VW) - base);
            vstore(t->st + v * VW, e);
            sum += e;
        }
        for (int k = (int)RS; k < VW; k *= 2) sum += rotate(sum, k);
        const vf alpha = vexp(mold - base);
        vstore(t->alpha, alpha);
        vstore(t->l, vload(t->l) * alpha + sum);
        vstore(t->m, mnew);
        return;
    }
    const int mask = p + n - 1 > pos0; /* (otherwise every row sees the whole sub-tile) */
    for (int64_t c = 0; c < RP; c += VW) {
        float *sc = t->st + c;
        vf mx = splat(-INFINITY);
        if (mask) {
            vi lim;
            memcpy(&lim, t->lim + c, sizeof lim);
            for (int64_t x = 0; x < n; ++x) {
                const vf s = select(splati((int32_t)(p + x)) > lim, splat(-INFINITY), vload(sc + x * RP));
                vstore(sc + x * RP, s);
                mx = vmax(s, mx);
            }
        } else {
            for (int64_t x = 0; x < n; ++x) mx = vmax(vload(sc + x * RP), mx);
        }
        const vf mold = vload(t->m + c), mnew = vmax(mx, mold);
        /* (a row that has seen nothing yet keeps max -inf: base 0 keeps its terms 0, not NaN) */
        const vf base = select(mnew == splat(-INFINITY), splat(0.0f), mnew);
        vf sum = splat(0.0f);
        for (int64_t x = 0; x < n; ++x) {
            const vf e = vexp(vload(sc + x * RP) - base);
            vstore(sc + x * RP, e);
            sum += e;
        }
        const vf alpha = vexp(mold - base); /* (0 for a row's first scores: m = -inf) */
        vstore(t->alpha + c, alpha);
        vstore(t->l + c, vload(t->l + c) * alpha + sum);
        vstore(t->m + c, mnew);
    }
}

/* One item: tile `tl`, kv head g, positions [p0, p1) of the sequence; rows r = i * G + j (token
 * t0 + i, head g * G + j), held transposed (rows across the vector lanes) for the scores and the
 * softmax. Leaves each row's running max, sum and accumulator (row stride Dp) in t. */
static void attend(const int64_t *P, const float *q, const void *kc, const void *vc, const int32_t *tables,
                   const Tile *tl, int64_t pos0, int64_t g, int64_t p0, int64_t p1, float scale, Scratch *t) {
    const int64_t G = P[P_HEADS] / P[P_KV_HEADS], D = P[P_DIM], BS = P[P_BLOCK_SIZE], R = tl->nt * G;
    const int64_t dt = P[P_DTYPE], RP = up(R, VW), Dp = up(D, VW);
    int64_t RS = 1; /* the scores' row stride: RP, or the rows rounded up to a power of two <= VW / 2 */
    while (RS < R) RS *= 2;
    if (2 * RS > VW) RS = RP;
    const int flat = RS < VW;
    /* the queries, scaled: flat, qs[r][d] (RS rows of Dp, zeros past R and D); else qt[d][r] (D
     * rows of RP, zeros past R); and the last position each row sees (lim; rows of one token) */
    if (flat) memset(t->qt, 0, (size_t)(RS * Dp) * sizeof(float));
    else
        for (int64_t d = 0; d < D; ++d)
            for (int64_t r = R; r < RP; ++r) t->qt[d * RP + r] = 0.0f;
    for (int64_t i = 0, r = 0; i < tl->nt; ++i)
        for (int64_t j = 0; j < G; ++j, ++r) {
            const float *qr = q + (tl->t0 + i) * P[P_Q_T] + (g * G + j) * P[P_Q_H];
            if (flat)
                for (int64_t d = 0; d < D; ++d) t->qt[r * Dp + d] = qr[d] * scale;
            else
                for (int64_t d = 0; d < D; ++d) t->qt[d * RP + r] = qr[d] * scale;
            t->lim[r] = (int32_t)(pos0 + i);
        }
    /* lanes past R repeat the last row; packed lanes: lane l is row l % RS of key l / RS */
    for (int64_t r = R; r < RP; ++r) t->lim[r] = t->lim[R - 1];
    if (flat)
        for (int64_t r = RP - 1; r >= 0; --r) t->lim[r] = t->lim[min64(r & (RS - 1), R - 1)];
    for (int64_t r = 0, k = 0; r < RP; ++r) {
        t->m[r] = -INFINITY;
        t->l[r] = 0.0f;
        t->lane[r] = (int32_t)k;
        if (flat && (r & (RS - 1)) == RS - 1) ++k;
    }
    memset(t->acc, 0, (size_t)(R * Dp) * sizeof(float));
    /* the tile's last row sees up to pos0 + nt - 1 */
    const int64_t end = min64(p1, pos0 + tl->nt);
    const int32_t *table = tables + tl->b * P[P_MAX_BLOCKS];
    const int in_place_v = dt == 0 && D == Dp;
    for (int64_t p = p0; p < end;) {
        const int64_t blk = table[p / BS], off = p % BS, n = min64(min64(PT, BS - off), end - p);
        const int64_t kat = blk * P[P_K_B] + off * P[P_K_P] + g * P[P_K_H];
        const int64_t vat = blk * P[P_V_B] + off * P[P_V_P] + g * P[P_V_H];
        /* the sub-tile's scores, st[x * RS + r] */
        const float *k = (const float *)kc + kat;
        int64_t ldk = P[P_K_P];
        if (dt != 0 || (flat && D != Dp)) { /* (flat reads whole vectors of a row) */
            widen(kc, kat, P[P_K_P], n, D, dt, t->kbuf, flat ? Dp : D);
            k = t->kbuf, ldk = flat ? Dp : D;
        }
        if (flat)
            flat_scores(k, ldk, n, t->qt, RS, Dp, t->st);
        else
            scores(k, ldk, n, t->qt, RP, D, t->st, RS);
        softmax(t, RS, RP, n, p, pos0);
        /* the values: each V vector loaded once for MR rows, the rescale folded in */
        const float *v = (const float *)vc + vat;
        int64_t ldv = P[P_V_P];
        if (!in_place_v) {
            widen(vc, vat, P[P_V_P], n, D, dt, t->vbuf, Dp);
            v = t->vbuf, ldv = Dp;
        }
        values(t->st, RS, R, n, v, ldv, t->acc, Dp, t->alpha);
        p += n;
    }
}

/* Checks the batch (info: the sequence and the bad value), then the tiles and splits. */
static int plan(const int64_t *P, const int32_t *tables, const int32_t *seq_lens, const int32_t *starts,
                int64_t *info, Tile **tiles_out, int64_t *ntiles_out, int64_t *parts_out) {
    const int64_t B = P[P_BATCH], BS = P[P_BLOCK_SIZE], QT = P[P_QT], KVH = P[P_KV_HEADS];
    const int64_t span = P[P_MAX_BLOCKS] * BS, G = P[P_HEADS] / KVH;
    if (B >= 0 && (starts[0] != 0 || starts[B] != P[P_TOKENS])) {
        info[0] = starts[0] != 0 ? 0 : B;
        info[1] = starts[0] != 0 ? starts[0] : starts[B];
        return PA_STARTS;
    }
    int64_t ntiles = 0;
    for (int64_t b = 0; b < B; ++b) {
        const int64_t ql = (int64_t)starts[b + 1] - starts[b], len = seq_lens[b];
        if (ql < 0) {
            info[0] = b, info[1] = starts[b + 1];
            return PA_STARTS;
        }
        if (len < ql || len > span) {
            info[0] = b, info[1] = len;
            return PA_LENS;
        }
        for (int64_t i = 0; i < (len > 0 ? (len - 1) / BS + 1 : 0); ++i) { /* (len > 0: BS > 0) */
            const int32_t blk = tables[b * P[P_MAX_BLOCKS] + i];
            if (blk < 0 || blk >= P[P_NUM_BLOCKS]) {
                info[0] = b, info[1] = blk;
                return PA_TABLE;
            }
        }
        ntiles += (ql + QT - 1) / QT;
    }
    Tile *tiles = malloc((size_t)max64(ntiles, 1) * sizeof *tiles);
    if (!tiles) return PA_NOMEM;
    /* split only where the tiles x kv heads leave threads idle (decode steps of few sequences) */
    const int64_t threads = P[P_THREADS], base = ntiles * KVH;
    const int64_t want = base >= threads || base == 0 ? 1 : (2 * threads + base - 1) / base;
    int64_t k = 0, parts = 0;
    for (int64_t b = 0; b < B; ++b) {
        const int64_t ql = (int64_t)starts[b + 1] - starts[b], len = seq_lens[b];
        for (int64_t t0 = 0; t0 < ql; t0 += QT) {
            Tile *tl = &tiles[k++];
            tl->b = b, tl->t0 = starts[b] + t0, tl->nt = min64(QT, ql - t0);
            const int64_t ctx = len - ql + t0 + tl->nt; /* positions the tile sees */
            int64_t ns = want <= 1 || ctx < 2 * P[P_SPLIT_MIN] ? 1 : min64(want, ctx / P[P_SPLIT_MIN]);
            int64_t chunk = ctx;
            if (ns > 1) {
                /* whole blocks (whole sub-tiles of a block longer than one: a contiguous cache) */
                const int64_t unit = BS < PT ? BS : PT;
                chunk = ((ctx + ns - 1) / ns + unit - 1) / unit * unit;
                ns = (ctx + chunk - 1) / chunk;
            }
            tl->nsplit = ns, tl->chunk = chunk, tl->part = -1;
            if (ns > 1) {
                tl->part = parts;
                parts += ns * KVH * tl->nt * G;
            }
        }
    }
    *tiles_out = tiles, *ntiles_out = ntiles, *parts_out = parts;
    return PA_OK;
}

/* Attention of the batch into out ([tokens, heads, D], contiguous). info[0..1]: what a failure was
 * about (the sequence, the value); on success info[1] is the number of split items (tests). */
int cuvil_paged_attention(const float *q, const void *kc, const void *vc, const int32_t *tables,
                          const int32_t *seq_lens, const int32_t *starts, float *out, const int64_t *P,
                          float scale, int64_t *info) {
    const int64_t H = P[P_HEADS], KVH = P[P_KV_HEADS], G = H / KVH, D = P[P_DIM], QT = P[P_QT];
    Tile *tiles = NULL;
    int64_t ntiles = 0, parts = 0;
    info[0] = info[1] = 0;
    const int rc = plan(P, tables, seq_lens, starts, info, &tiles, &ntiles, &parts);
    if (rc) return rc;
    const int64_t stride = D + 2; /* a partial row: max, sum, accumulator */
    float *part = parts ? alloc_floats(parts * stride) : NULL;
    /* the items: per tile, kv head and split */
    int64_t items = 0;
    for (int64_t i = 0; i < ntiles; ++i) items += tiles[i].nsplit * KVH;
    int64_t *first = malloc((size_t)(ntiles + 1) * sizeof *first);
    if ((parts && !part) || !first) {
        free(tiles), free(part), free(first);
        return PA_NOMEM;
    }
    first[0] = 0;
    int64_t split_items = 0;
    for (int64_t i = 0; i < ntiles; ++i) {
        first[i + 1] = first[i] + tiles[i].nsplit * KVH;
        if (tiles[i].nsplit > 1) split_items += tiles[i].nsplit * KVH;
    }
    const int64_t threads = P[P_THREADS], rmax = QT * G, RP = up(rmax, VW), Dp = up(D, VW);
    const int64_t team = min64(threads, max64(items, 1)), per = scratch_floats(RP, Dp);
    float *scratch = aligned_alloc(64, (size_t)(team * per) * sizeof(float)); /* (per: whole 64 B lines) */
    if (!scratch) {
        free(tiles), free(part), free(first);
        return PA_NOMEM;
    }
#pragma omp parallel num_threads(team) if (team > 1)
    {
#ifdef _OPENMP
        Scratch t = scratch_at(scratch + omp_get_thread_num() * per, RP, Dp);
#else
        Scratch t = scratch_at(scratch, RP, Dp);
#endif
#pragma omp for schedule(dynamic, 1)
        for (int64_t u = 0; u < items; ++u) {
            int64_t lo = 0, hi = ntiles; /* the tile of item u: first[lo] <= u < first[lo + 1] */
            while (hi - lo > 1) {
                const int64_t mid = (lo + hi) / 2;
                if (first[mid] <= u) lo = mid;
                else hi = mid;
            }
            const Tile *tl = &tiles[lo];
            const int64_t w = u - first[lo], g = w / tl->nsplit, c = w % tl->nsplit;
            const int64_t ql = (int64_t)starts[tl->b + 1] - starts[tl->b];
            const int64_t pos0 = seq_lens[tl->b] - ql + (tl->t0 - starts[tl->b]);
            const int64_t p0 = c * tl->chunk, p1 = min64(p0 + tl->chunk, pos0 + tl->nt);
            attend(P, q, kc, vc, tables, tl, pos0, g, p0, p1, scale, &t);
            const int64_t R = tl->nt * G;
            if (tl->nsplit == 1) {
                for (int64_t r = 0; r < R; ++r) {
                    float *o = out + ((tl->t0 + r / G) * H + g * G + r % G) * D;
                    const float *a = t.acc + r * Dp;
                    const vf inv = splat(1.0f / t.l[r]);
                    int64_t d = 0;
                    for (; d + VW <= D; d += VW) vstore(o + d, vload(a + d) * inv);
                    for (; d < D; ++d) o[d] = a[d] * inv[0];
                }
            } else {
                float *pr = part + (tl->part + (g * tl->nsplit + c) * R) * stride;
                for (int64_t r = 0; r < R; ++r) {
                    pr[r * stride] = t.m[r];
                    pr[r * stride + 1] = t.l[r];
                    memcpy(pr + r * stride + 2, t.acc + r * Dp, (size_t)D * sizeof(float));
                }
            }
        }
    }
    free(scratch);
    /* the reduction of split tiles: one item per (tile, kv head) */
    if (parts) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
        for (int64_t u = 0; u < ntiles * KVH; ++u) {
            const Tile *tl = &tiles[u / KVH];
            if (tl->nsplit == 1) continue;
            const int64_t g = u % KVH, R = tl->nt * G, ns = tl->nsplit;
            for (int64_t r = 0; r < R; ++r) {
                const float *p = part + (tl->part + g * ns * R + r) * stride; /* split c: + c R stride */
                float M = -INFINITY, L = 0.0f;
                for (int64_t c = 0; c < ns; ++c) M = p[c * R * stride] > M ? p[c * R * stride] : M;
                float *o = out + ((tl->t0 + r / G) * H + g * G + r % G) * D;
                for (int64_t d = 0; d < D; ++d) o[d] = 0.0f;
                for (int64_t c = 0; c < ns; ++c) {
                    const float *pc = p + c * R * stride;
                    if (pc[0] == -INFINITY) continue; /* a chunk this row does not reach */
                    const float wgt = expf(pc[0] - M);
                    L += wgt * pc[1];
                    scale_add(o, 1.0f, wgt, pc + 2, D);
                }
                const float inv = 1.0f / L;
                for (int64_t d = 0; d < D; ++d) o[d] *= inv;
            }
        }
    }
    free(tiles), free(part), free(first);
    info[1] = split_items;
    return PA_OK;
}

/* the build's vector width (tests) */
/* Per row of a decode step's mask (rows x positions, row stride ld elements, unit stride along
 * positions; bool bytes, or float32 when is_float), the length n of the row's allowed prefix, into
 * lens, when the row allows exactly positions 0 .. n-1 with n >= 1: bool 1 there and 0 after; float 0
 * there and at most `drop` after (exp of which is 0). Returns 0, or 1 when some row is not such a
 * prefix. */
static int prefix_lengths(const void *mask, int64_t is_float, int64_t rows, int64_t positions, int64_t ld,
                          float drop, int32_t *lens) {
    for (int64_t r = 0; r < rows; ++r) {
        int64_t n = 0;
        if (is_float) {
            const float *m = (const float *)mask + r * ld;
            while (n < positions && m[n] == 0.0f) ++n;
            for (int64_t p = n; p < positions; ++p)
                if (!(m[p] <= drop)) return 1;
        } else {
            const uint8_t *m = (const uint8_t *)mask + r * ld;
            while (n < positions && m[n]) ++n;
            for (int64_t p = n; p < positions; ++p)
                if (m[p]) return 1;
        }
        if (n < 1 || n > INT32_MAX) return 1;
        lens[r] = (int32_t)n;
    }
    return 0;
}

/* params of cuvil_decode_attention, int64 each, in this order (decode_attention.py packs them) */
enum {
    D_BATCH, D_HEADS, D_KV_HEADS, D_DIM, D_POSITIONS,
    D_Q_B, D_Q_H,          /* q [B, H, 1, D]: its strides (batch, head); its last is 1 */
    D_K_B, D_K_H, D_K_P,   /* k [B, KVH, S, D]: (batch, head, position) */
    D_V_B, D_V_H, D_V_P,
    D_MASK,                /* 0 none, 1 bool, 2 float32: [B or 1, 1, 1, S], unit stride along S */
    D_MASK_B,              /* the mask's batch stride in elements (0: one row for all) */
    D_THREADS, D_SPLIT_MIN, D_QT,
    D_COUNT
};

/* A decode step whose mask is not a prefix of allowed positions per sequence (a padded batch's
 * holes, a window, biases; a sequence that sees no position): per sequence and query head directly,
 * scores = scale q.k + the mask's value (bool: the position dropped where 0; float: added, dropped
 * where -inf), a softmax over the positions not dropped, out = their weighted sum of v. As torch's
 * CPU attention: a row with no position left is zeros, a NaN score makes the row NaN. */
static int decode_any_mask(const float *q, const float *kc, const float *vc, const void *mask, float *out,
                           const int64_t *d, float scale) {
    const int64_t B = d[D_BATCH], H = d[D_HEADS], KVH = d[D_KV_HEADS], D = d[D_DIM], S = d[D_POSITIONS];
    const int64_t G = H / KVH, threads = max64(1, min64(d[D_THREADS], B * H));
    int failed = 0;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        float *sc = malloc((size_t)max64(S, 1) * sizeof *sc);
        if (!sc) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t bh = 0; bh < B * H; ++bh) {
            if (!sc) continue;
            const int64_t b = bh / H, h = bh % H, kh = h / G;
            const float *qv = q + b * d[D_Q_B] + h * d[D_Q_H];
            const float *kb = kc + b * d[D_K_B] + kh * d[D_K_H], *vb = vc + b * d[D_V_B] + kh * d[D_V_H];
            const uint8_t *mb = d[D_MASK] == 1 ? (const uint8_t *)mask + b * d[D_MASK_B] : NULL;
            const float *mf = d[D_MASK] == 2 ? (const float *)mask + b * d[D_MASK_B] : NULL;
            float M = -INFINITY;
            int nan = 0;
            for (int64_t p = 0; p < S; ++p) {
                if ((mb && !mb[p]) || (mf && mf[p] == -INFINITY)) {
                    sc[p] = -INFINITY;
                    continue;
                }
                float dot = 0.0f;
                for (int64_t e = 0; e < D; ++e) dot += qv[e] * kb[p * d[D_K_P] + e];
                sc[p] = dot * scale + (mf ? mf[p] : 0.0f);
                if (sc[p] != sc[p]) nan = 1;
                else if (sc[p] > M) M = sc[p];
            }
            float *o = out + (b * H + h) * D;
            for (int64_t e = 0; e < D; ++e) o[e] = nan ? NAN : 0.0f;
            if (nan || M == -INFINITY) continue;
            float L = 0.0f;
            for (int64_t p = 0; p < S; ++p) {
                if (sc[p] == -INFINITY) continue;
                const float w = expf(sc[p] - M);
                L += w;
                for (int64_t e = 0; e < D; ++e) o[e] += w * vb[p * d[D_V_P] + e];
            }
            const float inv = 1.0f / L;
            for (int64_t e = 0; e < D; ++e) o[e] *= inv;
        }
        free(sc);
    }
    return failed ? PA_NOMEM : PA_OK;
}

/* A decode step over a contiguous cache (cuvil_backend_cpu/decode_attention.py): one query per
 * sequence, k and v the whole cache, the sequence lengths read off the mask (a prefix of allowed
 * positions per sequence, see prefix_lengths); the cache is `batch` blocks of S positions behind the
 * identity block table. A mask that is not such a prefix runs decode_any_mask. out: [B, H, D]
 * contiguous. Returns cuvil_paged_attention's codes. */
int cuvil_decode_attention(const float *q, const void *kc, const void *vc, const void *mask, float *out,
                           const int64_t *d, float scale, float drop) {
    const int64_t B = d[D_BATCH], S = d[D_POSITIONS];
    if (d[D_KV_HEADS] < 1 || d[D_HEADS] % d[D_KV_HEADS]) return PA_SHAPE;
    int32_t *buf = malloc((size_t)(3 * B + 1) * sizeof *buf);
    if (!buf) return PA_NOMEM;
    int32_t *tables = buf, *lens = buf + B, *starts = buf + 2 * B;
    for (int64_t b = 0; b <= B; ++b) starts[b] = (int32_t)b;
    for (int64_t b = 0; b < B; ++b) tables[b] = (int32_t)b, lens[b] = (int32_t)S;
    if (S < 1 || (d[D_MASK] && prefix_lengths(mask, d[D_MASK] == 2, B, S, d[D_MASK_B], drop, lens))) {
        free(buf);
        return decode_any_mask(q, (const float *)kc, (const float *)vc, mask, out, d, scale);
    }
    const int64_t P[P_COUNT] = {
        [P_TOKENS] = B, [P_HEADS] = d[D_HEADS], [P_KV_HEADS] = d[D_KV_HEADS], [P_DIM] = d[D_DIM],
        [P_BATCH] = B, [P_MAX_BLOCKS] = 1, [P_BLOCK_SIZE] = S, [P_NUM_BLOCKS] = B,
        [P_Q_T] = d[D_Q_B], [P_Q_H] = d[D_Q_H],
        [P_K_B] = d[D_K_B], [P_K_P] = d[D_K_P], [P_K_H] = d[D_K_H],
        [P_V_B] = d[D_V_B], [P_V_P] = d[D_V_P], [P_V_H] = d[D_V_H],
        [P_DTYPE] = 0, [P_THREADS] = d[D_THREADS], [P_SPLIT_MIN] = d[D_SPLIT_MIN], [P_QT] = d[D_QT],
    };
    int64_t info[2];
    const int rc = cuvil_paged_attention(q, kc, vc, tables, lens, starts, out, P, scale, info);
    free(buf);
    return rc;
}

/* cuvil_decode_attention as a step of a native run (cuvil_runtime/native_runs.py), whose steps
 * take integers only: d holds its D_COUNT params, then the scale's and the drop value's float32 bits. */
int cuvil_decode_attention_step(const float *q, const void *kc, const void *vc, const void *mask, float *out,
                                const int64_t *d) {
    union {
        uint32_t u;
        float f;
    } scale = {(uint32_t)d[D_COUNT]}, drop = {(uint32_t)d[D_COUNT + 1]};
    return cuvil_decode_attention(q, kc, vc, mask, out, d, scale.f, drop.f);
}

void cuvil_paged_attention_info(int64_t *vw, int64_t *pt) {
    *vw = VW;
    *pt = PT;
}
