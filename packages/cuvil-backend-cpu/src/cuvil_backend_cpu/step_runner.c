/* The native runs of a program's step list (docs/native-runner.md, [Note: native runs] in
 * cuvil_runtime/native_runs.py): one call runs consecutive steps, each a C function called by its
 * address, with the arguments the tables say, so the Python wrapper makes one call (which ctypes
 * makes with the GIL released) where it made one per step.
 *
 * Every callee takes only integer-class arguments (pointers, int64, int) and returns void or int:
 * each is called through a function pointer of its arity whose parameters are all int64_t, which
 * passes them exactly as its own prototype would on the ABIs this target builds for (x86-64 System
 * V and AArch64 AAPCS64: integer registers, then 8-byte stack slots). The runner never calls a
 * function with a float argument (the planner leaves such steps to Python).
 *
 * Tables (int64 each):
 *   steps  4 per step: function address, argument count, index of its first argument, whether a
 *          nonzero (int) return is a failure
 *   args   4 per argument: kind 0: slots[a] + b (an address plus a byte offset, or a number);
 *          kind 1: a parameter block: slots[a .. a + c) filled from the c entries ents[b ..], and
 *          its address passed
 *   ents   2 per block entry: slots[s] + add
 *   slots  the values: those the wrapper writes per call (addresses of inputs and outputs, the
 *          thread count), those of the size binding, and the blocks' storage
 * cuvil_run_steps takes a header of six int64: the step count and the addresses of steps, args,
 * ents, slots and rc. Returns 0, or 1 + the index of the step that failed, its return code in rc. */
#include <stdint.h>
#include <string.h>

#define CUVIL_MAX_ARGS 32

typedef int64_t I;
#define P2 I, I
#define P4 P2, P2
#define P8 P4, P4
#define P16 P8, P8

static int64_t call(int64_t address, int64_t n, const int64_t *a) {
    const void *f = (const void *)(intptr_t)address;
    switch (n) {
#define A1 a[0]
#define A2 A1, a[1]
#define A3 A2, a[2]
#define A4 A3, a[3]
#define A5 A4, a[4]
#define A6 A5, a[5]
#define A7 A6, a[6]
#define A8 A7, a[7]
#define A9 A8, a[8]
#define A10 A9, a[9]
#define A11 A10, a[10]
#define A12 A11, a[11]
#define A13 A12, a[12]
#define A14 A13, a[13]
#define A15 A14, a[14]
#define A16 A15, a[15]
#define A17 A16, a[16]
#define A18 A17, a[17]
#define A19 A18, a[18]
#define A20 A19, a[19]
#define A21 A20, a[20]
#define A22 A21, a[21]
#define A23 A22, a[22]
#define A24 A23, a[23]
#define A25 A24, a[24]
#define A26 A25, a[25]
#define A27 A26, a[26]
#define A28 A27, a[27]
#define A29 A28, a[28]
#define A30 A29, a[29]
#define A31 A30, a[30]
#define A32 A31, a[31]
#define T1 I
#define T2 P2
#define T3 P2, I
#define T4 P4
#define T5 P4, I
#define T6 P4, P2
#define T7 P4, P2, I
#define T8 P8
#define T9 P8, I
#define T10 P8, P2
#define T11 P8, P2, I
#define T12 P8, P4
#define T13 P8, P4, I
#define T14 P8, P4, P2
#define T15 P8, P4, P2, I
#define T16 P16
#define T17 P16, I
#define T18 P16, P2
#define T19 P16, P2, I
#define T20 P16, P4
#define T21 P16, P4, I
#define T22 P16, P4, P2
#define T23 P16, P4, P2, I
#define T24 P16, P8
#define T25 P16, P8, I
#define T26 P16, P8, P2
#define T27 P16, P8, P2, I
#define T28 P16, P8, P4
#define T29 P16, P8, P4, I
#define T30 P16, P8, P4, P2
#define T31 P16, P8, P4, P2, I
#define T32 P16, P16
#define CASE(k) \
    case k: return ((I(*)(T##k))f)(A##k);
    case 0: return ((I(*)(void))f)();
    CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
    CASE(9) CASE(10) CASE(11) CASE(12) CASE(13) CASE(14) CASE(15) CASE(16)
    CASE(17) CASE(18) CASE(19) CASE(20) CASE(21) CASE(22) CASE(23) CASE(24)
    CASE(25) CASE(26) CASE(27) CASE(28) CASE(29) CASE(30) CASE(31) CASE(32)
    }
    return -1;
}

int64_t cuvil_run_steps(const int64_t *head) {
    const int64_t n = head[0];
    const int64_t *steps = (const int64_t *)(intptr_t)head[1], *args = (const int64_t *)(intptr_t)head[2];
    const int64_t *ents = (const int64_t *)(intptr_t)head[3];
    int64_t *slots = (int64_t *)(intptr_t)head[4], *rc = (int64_t *)(intptr_t)head[5];
    for (int64_t i = 0; i < n; ++i) {
        const int64_t *s = steps + 4 * i;
        const int64_t count = s[1];
        if (count < 0 || count > CUVIL_MAX_ARGS) {
            *rc = -1;
            return i + 1;
        }
        int64_t a[CUVIL_MAX_ARGS];
        for (int64_t j = 0; j < count; ++j) {
            const int64_t *g = args + 4 * (s[2] + j);
            if (g[0] == 0) {
                a[j] = slots[g[1]] + g[2];
            } else {
                int64_t *block = slots + g[1];
                for (int64_t e = 0; e < g[3]; ++e) {
                    const int64_t *en = ents + 2 * (g[2] + e);
                    block[e] = slots[en[0]] + en[1];
                }
                a[j] = (int64_t)(intptr_t)block;
            }
        }
        const int r = (int)call(s[0], count, a); /* (an int return: the low half) */
        if (s[3] && r != 0) {
            *rc = r;
            return i + 1;
        }
    }
    return 0;
}

/* the most arguments a step may take (the planner's limit) */
int64_t cuvil_run_steps_max_args(void) { return CUVIL_MAX_ARGS; }

/* ``dst.index_copy_(dim, index, src)`` written in place: a decoder's static-cache writes as steps
 * of a run ([Note: updates in place] in cuvil_ir/graph_ir/in_place.py; the planner makes a run
 * with one only for a call that may write the argument, else the wrapper runs torch's).
 * p: rank, dim, element bytes, index count, then dst's shape, dst's strides, src's strides
 * (elements; src's shape is dst's with the index count along dim). Every index is checked before
 * anything is written (eager's IndexError leaves dst as it was): returns 0, or 3 where one is out
 * of range. Duplicate indices: the last wins (eager leaves the order unspecified). */
#define CUVIL_INDEX_COPY_RANK 8
int cuvil_index_copy(char *dst, const int64_t *index, const char *src, const int64_t *p) {
    const int64_t rank = p[0], dim = p[1], size = p[2], n = p[3];
    const int64_t *shape = p + 4, *dstr = p + 4 + rank, *sstr = p + 4 + 2 * rank;
    if (rank < 1 || rank > CUVIL_INDEX_COPY_RANK || dim < 0 || dim >= rank) return 4;
    for (int64_t j = 0; j < n; ++j)
        if (index[j] < 0 || index[j] >= shape[dim]) return 3;
    int64_t count = 1; /* elements of one slice (every dim but dim) */
    for (int64_t d = 0; d < rank; ++d)
        if (d != dim) count *= shape[d];
    if (count == 0) return 0;
    /* the innermost dim other than dim: rows copied whole where both sides are dense along it */
    int64_t last = rank - 1 == dim ? rank - 2 : rank - 1;
    const int64_t row = last >= 0 && dstr[last] == 1 && sstr[last] == 1 ? shape[last] : 1;
    for (int64_t j = 0; j < n; ++j) {
        int64_t at[CUVIL_INDEX_COPY_RANK] = {0};
        for (int64_t done = 0; done < count; done += row) {
            int64_t o = index[j] * dstr[dim], i = j * sstr[dim];
            for (int64_t d = 0; d < rank; ++d)
                if (d != dim) {
                    o += at[d] * dstr[d];
                    i += at[d] * sstr[d];
                }
            memcpy(dst + o * size, src + i * size, (size_t)(row * size));
            /* the next slice position (an odometer over the dims but dim, rows as one step) */
            for (int64_t d = row > 1 ? last - 1 : last; d >= 0; --d) {
                if (d == dim) continue;
                if (++at[d] < shape[d]) break;
                at[d] = 0;
            }
        }
    }
    return 0;
}
