/* The fast path's own loops for TIES (book/method.md, M2), compiled together with
 * pactlib/native/ties.c and task_arithmetic.c (whose functions they call) by
 * pactlib/fastpath/kernels.py, which checks them against those functions on a probe before use.
 * Each gives the integers and float32 bits of the native loops it stands for.
 * Built with -ffp-contract=off and without -ffast-math: every float operation is the IEEE one. */
#include <stdint.h>
#include <string.h>

enum { F32 = 0, BF16 = 1, F16 = 2 };
#define BLOCK 512 /* positions per block of pact_ties_merge_f32 */
#define GROUP 64  /* entries tested together by pact_hist_low_f32 */

void pact_deltas(const void *pre, int32_t pre_code, const void *const *fts, const int32_t *codes, int64_t T,
                 int64_t n, float *stack, uint8_t *nonzero, uint8_t *same, int32_t check_same);
int pact_ties_merge_f32(const float *st, int64_t T, int64_t n, int64_t ld, const int64_t *v, int64_t *left,
                        float *out, float *work);
int64_t pact_apply(const float *D, const void *pre, int32_t pre_code, int64_t n, float alpha, void *out);

static inline int64_t itemsize(int32_t code) { return code == F32 ? 4 : 2; }

static inline uint32_t abs_delta_bits(float d) {
    uint32_t b;
    memcpy(&b, &d, sizeof b);
    return b & 0x7fffffffu;
}

/* TIES' merge pass over n entries of raw inputs: for each BLOCK of positions, the task vectors
 * (pact_deltas), trim, elect and disjoint mean (pact_ties_merge_f32, left decremented as there)
 * and θ0 + α·D in θ0's dtype (pact_apply), so a block's task vectors stay in the cache. ptrs: T
 * pointers of scratch; work: (T + 1)·BLOCK floats, then pact_ties_merge_f32's workspace; seen: T
 * bytes (pact_deltas' flags). Returns the number of stored values that are not finite. */
int64_t pact_ties_merge_raw(const void *pre, int32_t pre_code, const void *const *fts, const int32_t *codes,
                            int64_t T, int64_t n, const int64_t *v, int64_t *left, float alpha, void *out,
                            const void **ptrs, float *work, uint8_t *seen) {
    float *st = work, *D = work + T * BLOCK, *ws = work + (T + 1) * BLOCK;
    int64_t bad = 0, size = itemsize(pre_code);
    for (int64_t a = 0; a < n; a += BLOCK) {
        int64_t m = n - a < BLOCK ? n - a : BLOCK;
        for (int64_t t = 0; t < T; t++)
            ptrs[t] = (const char *)fts[t] + a * itemsize(codes[t]);
        const char *p = (const char *)pre + a * size;
        pact_deltas(p, pre_code, (const void *const *)ptrs, codes, T, m, st, seen, 0, 0);
        pact_ties_merge_f32(st, T, m, m, v, left, D, ws);
        bad += pact_apply(D, p, pre_code, m, alpha, (char *)out + a * size);
    }
    return bad;
}

/* The entries of θt − θ0 (n raw entries) whose |Δ| has the bit pattern v: a threshold's ties.
 * Other dtypes than float32 go through pact_deltas a BLOCK at a time. */
int64_t pact_count_ties(const void *pre, int32_t pre_code, const void *x, int32_t code, int64_t n, int64_t v) {
    uint32_t w = (uint32_t)v;
    int64_t c = 0;
    if (code == F32 && pre_code == F32) {
        const float *xf = (const float *)x, *pf = (const float *)pre;
        for (int64_t i = 0; i < n; i++)
            c += abs_delta_bits(xf[i] - pf[i]) == w;
        return c;
    }
    float d[BLOCK];
    uint8_t seen;
    for (int64_t a = 0; a < n; a += BLOCK) {
        int64_t m = n - a < BLOCK ? n - a : BLOCK;
        const void *xa = (const char *)x + a * itemsize(code);
        pact_deltas((const char *)pre + a * itemsize(pre_code), pre_code, &xa, &code, 1, m, d, &seen, 0, 0);
        for (int64_t i = 0; i < m; i++)
            c += abs_delta_bits(d[i]) == w;
    }
    return c;
}

/* How many of the n entries hold high digit want (one vector loop), or'ing their bits into *any. */
static int64_t high_digit_hits(const float *restrict pre, const float *restrict x, int64_t n, uint32_t want,
                               uint32_t *any) {
    int64_t hits = 0;
    uint32_t bits = 0;
    for (int64_t j = 0; j < n; j++) {
        uint32_t u = abs_delta_bits(x[j] - pre[j]);
        bits |= u;
        hits += (u >> 16) == want;
    }
    *any |= bits;
    return hits;
}

/* pact_digit_hist_delta's second pass (shift 0) on float32 inputs: the low digits of the
 * entries of θt − θ0 whose high digit is prefix, counted in hist (2^16 int64 counters). Only a
 * group of GROUP entries that holds one is counted entry by entry. Returns whether some Δ != 0. */
int32_t pact_hist_low_f32(const float *pre, const float *x, int64_t n, int64_t prefix, int64_t *hist) {
    uint32_t want = (uint32_t)prefix, any = 0;
    for (int64_t a = 0; a < n; a += GROUP) {
        int64_t m = n - a < GROUP ? n - a : GROUP;
        if (!high_digit_hits(pre + a, x + a, m, want, &any))
            continue;
        for (int64_t j = a; j < a + m; j++) {
            uint32_t u = abs_delta_bits(x[j] - pre[j]);
            if ((u >> 16) == want)
                hist[u & 0xffffu]++;
        }
    }
    return any != 0;
}
