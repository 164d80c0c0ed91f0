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

#include "cuvil_vectors.h"

#define PT 32 /* positions per sub-tile: the scores of one sub-tile, rows x PT, stay in L1 */

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
enum { PA_OK = 0, PA_NOMEM = 1, PA_STARTS = 2, PA_LENS = 3, PA_TABLE = 4 };

#define INLINE static inline __attribute__((always_inline))

INLINE vf vload(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

INLINE void vstore(float *p, vf v) { memcpy(p, &v, sizeof v); }

INLINE vf splat(float x) { return x - (vf){0}; }

INLINE float hsum(vf v) {
    float s = 0.0f;
    for (int i = 0; i < VW; i++) s += v[i];
    return s;
}

INLINE int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
INLINE int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static float dot(const float *restrict a, const float *restrict b, int64_t D) {
    vf s0 = splat(0.0f), s1 = splat(0.0f);
    int64_t d = 0;
    for (; d + 2 * VW <= D; d += 2 * VW) {
        s0 = FMA(vload(a + d), vload(b + d), s0);
        s1 = FMA(vload(a + d + VW), vload(b + d + VW), s1);
    }
    for (; d + VW <= D; d += VW) s0 = FMA(vload(a + d), vload(b + d), s0);
    float s = hsum(s0 + s1);
    for (; d < D; ++d) s += a[d] * b[d];
    return s;
}

/* acc = acc * alpha + p * v over D */
static void scale_add(float *restrict acc, float alpha, float p, const float *restrict v, int64_t D) {
    const vf va = splat(alpha), vp = splat(p);
    int64_t d = 0;
    for (; d + VW <= D; d += VW) vstore(acc + d, FMA(vp, vload(v + d), vload(acc + d) * va));
    for (; d < D; ++d) acc[d] = acc[d] * alpha + p * v[d];
}

INLINE float bf16_to_f32(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
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

/* the float32 row of a cache at element offset `at`: in place for float32, else widened into buf */
INLINE const float *row_of(const void *cache, int64_t at, int64_t dtype, int64_t D, float *buf) {
    if (dtype == 0) return (const float *)cache + at;
    const uint16_t *h = (const uint16_t *)cache + at;
    if (dtype == 1)
        for (int64_t d = 0; d < D; ++d) buf[d] = bf16_to_f32(h[d]);
    else
        for (int64_t d = 0; d < D; ++d) buf[d] = f16_to_f32(h[d]);
    return buf;
}

typedef struct {
    int64_t b, t0, nt, nsplit, chunk, part; /* part: the first partial row of its splits, or -1 */
} Tile;

typedef struct {
    float *qs, *s, *acc, *m, *l, *kbuf, *vbuf;
} Scratch;

static float *alloc_floats(int64_t n) { return malloc((size_t)max64(n, 1) * sizeof(float)); }

/* One item: tile `tl`, kv head g, positions [p0, p1) of the sequence; rows r = i * G + j (token
 * t0 + i, head g * G + j). Leaves each row's running max, sum and accumulator in t. */
static void attend(const int64_t *P, const float *q, const void *kc, const void *vc, const int32_t *tables,
                   const Tile *tl, int64_t pos0, int64_t g, int64_t p0, int64_t p1, float scale, Scratch *t) {
    const int64_t G = P[P_HEADS] / P[P_KV_HEADS], D = P[P_DIM], BS = P[P_BLOCK_SIZE], R = tl->nt * G;
    const int64_t dt = P[P_DTYPE];
    for (int64_t i = 0; i < tl->nt; ++i)
        for (int64_t j = 0; j < G; ++j) {
            const float *qr = q + (tl->t0 + i) * P[P_Q_T] + (g * G + j) * P[P_Q_H];
            float *qd = t->qs + (i * G + j) * D;
            for (int64_t d = 0; d < D; ++d) qd[d] = qr[d] * scale;
        }
    for (int64_t r = 0; r < R; ++r) {
        t->m[r] = -INFINITY;
        t->l[r] = 0.0f;
    }
    memset(t->acc, 0, (size_t)(R * D) * sizeof(float));
    /* the tile's last row sees up to pos0 + nt - 1 */
    const int64_t end = min64(p1, pos0 + tl->nt);
    const int32_t *table = tables + tl->b * P[P_MAX_BLOCKS];
    for (int64_t p = p0; p < end;) {
        const int64_t blk = table[p / BS], off = p % BS, n = min64(min64(PT, BS - off), end - p);
        const int64_t kat = blk * P[P_K_B] + off * P[P_K_P] + g * P[P_K_H];
        const int64_t vat = blk * P[P_V_B] + off * P[P_V_P] + g * P[P_V_H];
        /* scores of the sub-tile's n positions, all rows; a row past its position gets -inf */
        for (int64_t x = 0; x < n; ++x) {
            const float *k = row_of(kc, kat + x * P[P_K_P], dt, D, t->kbuf);
            for (int64_t r = 0; r < R; ++r)
                t->s[r * PT + x] = p + x <= pos0 + r / G ? dot(t->qs + r * D, k, D) : -INFINITY;
        }
        /* online softmax: new max, rescale, probabilities in place of the scores */
        for (int64_t r = 0; r < R; ++r) {
            float *sr = t->s + r * PT;
            float mx = -INFINITY;
            for (int64_t x = 0; x < n; ++x) mx = sr[x] > mx ? sr[x] : mx;
            if (mx == -INFINITY) { /* this row sees none of the sub-tile: it stays as it is */
                for (int64_t x = 0; x < n; ++x) sr[x] = 0.0f;
                continue;
            }
            const float mnew = mx > t->m[r] ? mx : t->m[r];
            float sum = 0.0f;
            for (int64_t x = 0; x < n; ++x) {
                sr[x] = expf(sr[x] - mnew);
                sum += sr[x];
            }
            const float alpha = expf(t->m[r] - mnew); /* (0 for a row's first scores: m = -inf) */
            t->l[r] = t->l[r] * alpha + sum;
            t->m[r] = mnew;
            float *ar = t->acc + r * D;
            for (int64_t d = 0; d < D; ++d) ar[d] *= alpha;
        }
        /* the values: each V row read once, added into every row */
        for (int64_t x = 0; x < n; ++x) {
            const float *v = row_of(vc, vat + x * P[P_V_P], dt, D, t->vbuf);
            for (int64_t r = 0; r < R; ++r) {
                const float pr = t->s[r * PT + x];
                if (pr != 0.0f) scale_add(t->acc + r * D, 1.0f, pr, v, D);
            }
        }
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
    int failed = 0;
    const int64_t threads = P[P_THREADS], rmax = QT * G;
#pragma omp parallel num_threads(threads) if (threads > 1 && items > 1)
    {
        Scratch t = {alloc_floats(rmax * D), alloc_floats(rmax * PT), alloc_floats(rmax * D),
                     alloc_floats(rmax), alloc_floats(rmax), alloc_floats(D), alloc_floats(D)};
        const int ok = t.qs && t.s && t.acc && t.m && t.l && t.kbuf && t.vbuf;
        if (!ok) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t u = 0; u < items; ++u) {
            if (!ok) continue;
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
                    const float inv = 1.0f / t.l[r];
                    for (int64_t d = 0; d < D; ++d) o[d] = t.acc[r * D + d] * inv;
                }
            } else {
                float *pr = part + (tl->part + (g * tl->nsplit + c) * R) * stride;
                for (int64_t r = 0; r < R; ++r) {
                    pr[r * stride] = t.m[r];
                    pr[r * stride + 1] = t.l[r];
                    memcpy(pr + r * stride + 2, t.acc + r * D, (size_t)D * sizeof(float));
                }
            }
        }
        free(t.qs), free(t.s), free(t.acc), free(t.m), free(t.l), free(t.kbuf), free(t.vbuf);
    }
    /* the reduction of split tiles: one item per (tile, kv head) */
    if (!failed && parts) {
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
    return failed ? PA_NOMEM : PA_OK;
}

/* the build's vector width (tests) */
void cuvil_paged_attention_info(int64_t *vw, int64_t *pt) {
    *vw = VW;
    *pt = PT;
}
