/* Float32 linears on a prepacked weight, for the cpu target's GEMM choice (driven by
 * cuvil_backend_cpu/packed_gemm.py; docs/cpu-backend.md, "GEMMs"):
 *
 *   y[m,n] = act(sum_k x[m,k] * W[n,k] (+ bias[n]) (+ other[m,n]))
 *
 * act: none, relu, gelu (erf as codegen.py's cu_erff), gelu_tanh or silu (cpu_linear_epilogue's).
 * W [N][K] is packed once per weight (cuvil_pg_pack) into panels of NR = 2 VW columns, each panel
 * k-major: P[p][k][j] = W[p NR + j][k], zero past N. A register tile is MR rows of x by one panel:
 * MR x 2 vector accumulators; per k, two vector loads of the panel, MR broadcasts of x and 2 MR
 * multiply-adds (AVX2: 6 x 16, 12 accumulators of 16 registers; AVX-512: 12 x 32, 24 of 32). A
 * tile runs the whole of K with its accumulators in registers, so C is written once, the bias, the
 * residual and the activation applied in the store. The panel (K NR floats) and the tile's rows of x stream from L1/L2 in order.
 *
 * The rows of x go in blocks of about 256 KiB (whole tiles); within a block the tiles are panel-major.
 * Threads (OpenMP) split the tiles into contiguous ranges: a thread's tiles mostly share a panel,
 * which stays in its cache while it walks the block's rows, and the block stays in cache while
 * the panels pass (without the blocks, a tall x was read from memory once per panel).
 *
 * One source for every ISA (GCC vector types; FMA where the ISA has it, as attention.c).
 */
#include <stdint.h>
#include <string.h>

#include "cuvil_vectors.h"

#define NR (2 * VW)
#if VW >= 16
#define MR 12
#else
#define MR 6
#endif

#define INLINE static inline __attribute__((always_inline))

/* params: M, N, K, ldx (x's row stride), ldy (y's row stride), threads, has_bias, act, ldo (the
   residual's row stride; 0: no residual) */
enum { P_M, P_N, P_K, P_LDX, P_LDY, P_THREADS, P_BIAS, P_ACT, P_LDO, P_COUNT };

/* the epilogue's activation, applied after the bias and the residual (cpu_linear_epilogue's) */
enum { ACT_NONE = 0, ACT_RELU = 1, ACT_GELU = 2, ACT_GELU_TANH = 3, ACT_SILU = 4 };

/* bytes of x a block of rows holds (half of a 512 KiB L2) */
#define X_BLOCK_BYTES (256 * 1024)

/* below this many multiply-adds the work stays on one thread (a parallel region costs a few us) */
#define PARALLEL_MIN (1 << 16)

INLINE vf vload(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

INLINE void vstore(float *p, vf v) { memcpy(p, &v, sizeof v); }

/* erf as codegen.py's cu_erff (the rational function of erf_fit.py), lane-wise */
INLINE vf verf(vf x) {
    const vf a = select(x > splat(3.92f), splat(3.92f), select(x < splat(-3.92f), splat(-3.92f), x));
    const vf t = a * a;
    vf p = splat(-1.2658604831017328e-08f);
    p = FMA(p, t, splat(4.5838205551262945e-06f));
    p = FMA(p, t, splat(0.00037578423507511616f));
    p = FMA(p, t, splat(0.0038333649281412363f));
    p = FMA(p, t, splat(0.054214395582675934f));
    p = FMA(p, t, splat(0.1850714385509491f));
    p = FMA(p, t, splat(1.128379225730896f));
    vf q = splat(6.21620929450728e-05f);
    q = FMA(q, t, splat(0.0012991661205887794f));
    q = FMA(q, t, splat(0.01541600190103054f));
    q = FMA(q, t, splat(0.11382868140935898f));
    q = FMA(q, t, splat(0.49734869599342346f));
    q = FMA(q, t, splat(1.0f));
    const vf r = a * p / q;
    return select(r > splat(1.0f), splat(1.0f), select(r < splat(-1.0f), splat(-1.0f), r));
}

/* tanh(u) = sign(u) (1 - e) / (1 + e), e = exp(-2|u|) (vexp takes x <= 0) */
INLINE vf vtanh(vf u) {
    const vf e = vexp(splat(-2.0f) * vabs(u));
    const vf t = (splat(1.0f) - e) / (splat(1.0f) + e);
    return select(u < splat(0.0f), -t, t);
}

static vf activate(vf v, int act) {
    switch (act) {
    case ACT_RELU:
        return select(v < splat(0.0f), splat(0.0f), v); /* (NaN stays NaN, as torch's) */
    case ACT_GELU:
        return splat(0.5f) * v * (splat(1.0f) + verf(v * splat(0.70710678118654752f)));
    case ACT_GELU_TANH: {
        const vf u = splat(0.79788456080286536f) * FMA(splat(0.044715f) * v, v * v, v);
        return splat(0.5f) * v * (splat(1.0f) + vtanh(u));
    }
    case ACT_SILU:
        return vsilu(v); /* (cuvil_vectors.h) */
    default:
        return v;
    }
}

/* floats a packed weight of N x K takes */
int64_t cuvil_pg_packed_size(int64_t N, int64_t K) { return (N + NR - 1) / NR * NR * K; }

void cuvil_pg_pack(const float *w, int64_t N, int64_t K, float *packed) {
    const int64_t panels = (N + NR - 1) / NR;
    for (int64_t p = 0; p < panels; p++) {
        float *dst = packed + p * K * NR;
        for (int64_t j = 0; j < NR; j++) {
            const int64_t n = p * NR + j;
            if (n < N) {
                const float *src = w + n * K;
                for (int64_t k = 0; k < K; k++) dst[k * NR + j] = src[k];
            } else {
                for (int64_t k = 0; k < K; k++) dst[k * NR + j] = 0.0f;
            }
        }
    }
}

/* the same panels from W stored transposed, [K][N] (the right operand of x @ W: GPT-2's Conv1D) */
void cuvil_pg_pack_kn(const float *w, int64_t N, int64_t K, float *packed) {
    const int64_t panels = (N + NR - 1) / NR;
    for (int64_t p = 0; p < panels; p++) {
        float *dst = packed + p * K * NR;
        const int64_t n0 = p * NR, nc = N - n0 < NR ? N - n0 : NR;
        for (int64_t k = 0; k < K; k++) {
            memcpy(dst + k * NR, w + k * N + n0, (size_t)nc * sizeof(float));
            for (int64_t j = nc; j < NR; j++) dst[k * NR + j] = 0.0f;
        }
    }
}

/* rows m0.. (mr of them, a constant at each call site) of x times panel pw; columns n0.. of y
   (nc of them: NR but for the last panel) */
INLINE void tile(const float *x, int64_t ldx, const float *pw, int64_t K, const float *bias, const float *other,
                 int64_t ldo, int act, float *y, int64_t ldy, int mr, int nc) {
    vf acc[MR][2];
    for (int m = 0; m < mr; m++) acc[m][0] = acc[m][1] = (vf){0};
    for (int64_t k = 0; k < K; k++) {
        const vf b0 = vload(pw + k * NR), b1 = vload(pw + k * NR + VW);
        for (int m = 0; m < mr; m++) {
            const vf a = splat(x[m * ldx + k]);
            acc[m][0] = FMA(a, b0, acc[m][0]);
            acc[m][1] = FMA(a, b1, acc[m][1]);
        }
    }
    if (bias) {
        vf c0, c1;
        if (nc == NR) {
            c0 = vload(bias);
            c1 = vload(bias + VW);
        } else {
            float tmp[NR] = {0};
            memcpy(tmp, bias, (size_t)nc * sizeof(float));
            c0 = vload(tmp);
            c1 = vload(tmp + VW);
        }
        for (int m = 0; m < mr; m++) {
            acc[m][0] += c0;
            acc[m][1] += c1;
        }
    }
    if (other)
        for (int m = 0; m < mr; m++) {
            float tmp[NR] = {0};
            memcpy(tmp, other + m * ldo, (size_t)nc * sizeof(float));
            acc[m][0] += vload(tmp);
            acc[m][1] += vload(tmp + VW);
        }
    if (act != ACT_NONE)
        for (int m = 0; m < mr; m++) {
            acc[m][0] = activate(acc[m][0], act);
            acc[m][1] = activate(acc[m][1], act);
        }
    for (int m = 0; m < mr; m++) {
        float *yr = y + m * ldy;
        if (nc == NR) {
            vstore(yr, acc[m][0]);
            vstore(yr + VW, acc[m][1]);
        } else {
            float tmp[NR];
            vstore(tmp, acc[m][0]);
            vstore(tmp + VW, acc[m][1]);
            memcpy(yr, tmp, (size_t)nc * sizeof(float));
        }
    }
}

#define CASE(R)                                                                                             \
    case R: tile(x, ldx, pw, K, bias, other, ldo, act, y, ldy, R, nc); break;

static void tile_any(const float *x, int64_t ldx, const float *pw, int64_t K, const float *bias, const float *other,
                     int64_t ldo, int act, float *y, int64_t ldy, int mr, int nc) {
    switch (mr) {
        CASE(1)
        CASE(2)
        CASE(3)
        CASE(4)
        CASE(5)
        CASE(6)
#if MR > 6
        CASE(7)
        CASE(8)
        CASE(9)
        CASE(10)
        CASE(11)
        CASE(12)
#endif
    }
}

/* y = act(x @ W^T (+ bias) (+ other)) on W packed by cuvil_pg_pack. Returns 0; 1 for parameters it
   does not take. */
int cuvil_pg_linear(const float *x, const float *packed, const float *bias, const float *other, float *y,
                    const int64_t *p) {
    const int64_t M = p[P_M], N = p[P_N], K = p[P_K], ldx = p[P_LDX], ldy = p[P_LDY], ldo = p[P_LDO];
    const int act = (int)p[P_ACT];
    if (M < 0 || N < 0 || K < 0 || ldx < K || ldy < N || (ldo && ldo < N) || act < ACT_NONE || act > ACT_SILU)
        return 1;
    const float *b = p[P_BIAS] ? bias : 0, *o = ldo ? other : 0;
    const int64_t panels = (N + NR - 1) / NR, mblocks = (M + MR - 1) / MR;
    /* rows of x in blocks of about X_BLOCK_BYTES (whole tiles): every panel meets one block while it
       stays in cache, so x is read from memory once, not once per panel */
    int64_t most = X_BLOCK_BYTES / (MR * (K > 0 ? K : 1) * (int64_t)sizeof(float));
    most = most < 1 ? 1 : most;
    /* blocks of equal size (give or take a tile): a short last block would leave the threads whose
       range falls in it idle */
    const int64_t xblocks = (mblocks + most - 1) / most, per_block = (mblocks + xblocks - 1) / xblocks;
    const int64_t tiles = xblocks * panels * per_block;
    const int threads = (int)(p[P_THREADS] > 0 ? p[P_THREADS] : 1);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && M * N * K >= PARALLEL_MIN)
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t xb = t / (panels * per_block), r = t % (panels * per_block);
        const int64_t pi = r / per_block, mt = xb * per_block + r % per_block;
        if (mt >= mblocks)
            continue; /* (the last block of rows is short) */
        const int64_t m0 = mt * MR, n0 = pi * NR;
        const int mr = (int)(M - m0 < MR ? M - m0 : MR), nc = (int)(N - n0 < NR ? N - n0 : NR);
        tile_any(x + m0 * ldx, ldx, packed + pi * K * NR, K, b ? b + n0 : 0, o ? o + m0 * ldo + n0 : 0, ldo, act,
                 y + m0 * ldy + n0, ldy, mr, nc);
    }
    return 0;
}

/* what this build is: its vector width and tile (tests and benchmarks print it) */
void cuvil_pg_info(int64_t *vw, int64_t *mr, int64_t *nr) {
    *vw = VW;
    *mr = MR;
    *nr = NR;
}
