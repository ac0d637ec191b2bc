/* Fused float32 passes of the streamed global TIES (book/method.md, M2), loaded by
 * pactlib/native/__init__.py through ctypes. Each function is one pass over one chunk and gives
 * the same integers and the same float32 bits as the torch expression it replaces
 * (pactlib/merges/ties.py: GlobalThreshold.observe, GlobalThreshold.mask, ties_kernel, task_sum).
 * Built with -ffp-contract=off and without -ffast-math: every float operation is the IEEE one. */
#include <stdint.h>
#include <string.h>

#define DIGIT 16
#define BLOCK 512 /* positions per block of the merge pass */

/* |x|'s bit pattern: the sign bit cleared (torch.abs then .view(int32)). */
static inline uint32_t abs_bits(float x) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b & 0x7fffffffu;
}

/* Count one chunk of n entries of one task in the 2^16-bin histogram of the current digit.
 * shift: the digit's shift; prefix: the digits found so far (above shift + 16). An entry counts
 * when its higher digits equal prefix (always on the first pass, shift + 16 == 32). */
void pact_digit_hist_f32(const float *x, int64_t n, int64_t prefix, int32_t shift, int64_t *hist) {
    const uint32_t *b = (const uint32_t *)x;
    int top = shift + DIGIT;
    if (top >= 32) {
        for (int64_t i = 0; i < n; i++)
            hist[(b[i] & 0x7fffffffu) >> shift]++;
        return;
    }
    uint32_t want = (uint32_t)prefix;
    for (int64_t i = 0; i < n; i++) {
        uint32_t a = b[i] & 0x7fffffffu;
        if ((a >> top) == want)
            hist[(a >> shift) & 0xffffu]++;
    }
}

/* The sum over the T rows of one block of m columns in the order of pactlib.merges.ties.task_sum
 * (ATen's cascade over an outer dimension: four levels of 2^p rows, p = max(4, ceil(log2 T) / 4)),
 * added to 0. rows: T rows of m floats, stride ld. */
static int ceil_log2(int64_t x) {
    if (x <= 2) return 1;
    int r = 0;
    uint64_t u = (uint64_t)(x - 1);
    while (u) { r++; u >>= 1; }
    return r;
}

static void cascade_sum(const float *restrict rows, int64_t T, int64_t ld, int m, float *restrict out,
                        float *restrict acc /* 4 * BLOCK */) {
    const int levels = 4;
    int power = ceil_log2(T) / levels;
    if (power < 4) power = 4;
    const int64_t step = (int64_t)1 << power, mask = step - 1;
    for (int l = 0; l < levels; l++)
        for (int j = 0; j < m; j++) acc[l * BLOCK + j] = 0.0f;
    int64_t i = 0;
    while (i + step <= T) {
        for (int64_t k = 0; k < step; k++, i++) {
            const float *restrict r = rows + i * ld;
            for (int j = 0; j < m; j++) acc[j] += r[j];
        }
        for (int l = 1; l < levels; l++) {
            float *restrict hi = acc + l * BLOCK, *restrict lo = acc + (l - 1) * BLOCK;
            for (int j = 0; j < m; j++) { hi[j] += lo[j]; lo[j] = 0.0f; }
            if ((i & (mask << (l * power))) != 0) break;
        }
    }
    for (; i < T; i++) {
        const float *restrict r = rows + i * ld;
        for (int j = 0; j < m; j++) acc[j] += r[j];
    }
    for (int l = 1; l < levels; l++)
        for (int j = 0; j < m; j++) acc[j] += acc[l * BLOCK + j];
    for (int j = 0; j < m; j++) out[j] = 0.0f + acc[j];
}

/* Trim, elect and disjoint mean of one chunk: st holds T rows of n entries (row stride ld) of the
 * task vectors; v[t] is task t's threshold bit pattern, left[t] how many entries equal to it are
 * still to keep (the first by position: decremented here). out gets the n merged entries.
 * work: 2 * T * BLOCK + 4 * BLOCK floats of scratch. Returns 0. */
int pact_ties_merge_f32(const float *st, int64_t T, int64_t n, int64_t ld, const int64_t *v, int64_t *left,
                        float *out, float *work) {
    float *y = work;                         /* trimmed rows, T x BLOCK */
    float *kept = work + T * BLOCK;          /* agreeing rows, T x BLOCK */
    float *acc = work + 2 * T * BLOCK;       /* cascade accumulators, 4 x BLOCK */
    float s[BLOCK], total[BLOCK];
    uint8_t count[BLOCK];
    for (int64_t i0 = 0; i0 < n; i0 += BLOCK) {
        int m = (int)(n - i0 < BLOCK ? n - i0 : BLOCK);
        for (int64_t t = 0; t < T; t++) {
            const float *row = st + t * ld + i0;
            float *yt = y + t * BLOCK;
            uint32_t vt = (uint32_t)v[t];
            int ties = 0;
            for (int j = 0; j < m; j++) {  /* torch.mul(Δ, mask): Δ·1 or Δ·0 (−0 for a negative Δ) */
                uint32_t a = abs_bits(row[j]);
                yt[j] = row[j] * (a > vt ? 1.0f : 0.0f);
                ties += a == vt;
            }
            if (ties && left[t] > 0) {
                for (int j = 0; j < m && left[t] > 0; j++)
                    if (abs_bits(row[j]) == vt) { yt[j] = row[j]; left[t]--; }
            }
        }
        cascade_sum(y, T, BLOCK, m, s, acc);
        for (int j = 0; j < m; j++) {
            float e = s[j];
            s[j] = (e > 0.0f) ? 1.0f : (e < 0.0f) ? -1.0f : e; /* torch.sign: ±0 and NaN kept */
            count[j] = 0;
        }
        for (int64_t t = 0; t < T; t++) {
            const float *yt = y + t * BLOCK;
            float *kt = kept + t * BLOCK;
            for (int j = 0; j < m; j++) {
                int agree = yt[j] * s[j] > 0.0f;
                count[j] += (uint8_t)agree;
                kt[j] = agree ? yt[j] : 0.0f;
            }
        }
        cascade_sum(kept, T, BLOCK, m, total, acc);
        float *o = out + i0;
        for (int j = 0; j < m; j++) {
            float c = count[j] ? (float)count[j] : 1.0f;
            float q = total[j] / c;
            o[j] = count[j] ? q : 0.0f;
        }
    }
    return 0;
}
