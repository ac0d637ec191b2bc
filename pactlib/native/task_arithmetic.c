/* Task Arithmetic over raw checkpoint bytes (book/method.md, M1 and θ = θ0 + α·D), the task
 * vectors of raw bytes as float32 rows and θ0 + α·D of any float32 D (for the other entry-wise
 * merges), loaded by
 * pactlib/native/__init__.py through ctypes for pactlib/fastpath.py, which merges safetensors
 * files without torch. The float32 operations are those of the torch path, in its order
 * (pactlib.streaming.DeltaReader.delta, pactlib.merges.driver.RunningSum,
 * pactlib.taskvector.TaskVector.apply_to): Δt = θt − θ0; S = Δ0 + Δ1 + … in task order;
 * θ = (α·S) + θ0, cast to θ0's dtype with round-to-nearest-even.
 * Built with -ffp-contract=off and without -ffast-math: every float operation is the IEEE one. */
#include <stdint.h>
#include <string.h>

enum { F32 = 0, BF16 = 1, F16 = 2 };
#define CHUNK 1024 /* entries summed at a time (the running sums stay in the L1 cache) */

static inline float load(const void *x, int32_t code, int64_t i) {
    if (code == F32)
        return ((const float *)x)[i];
    if (code == BF16) {
        uint32_t b = (uint32_t)((const uint16_t *)x)[i] << 16;
        float f;
        memcpy(&f, &b, sizeof f);
        return f;
    }
    return (float)((const _Float16 *)x)[i];
}

static inline int finite_bits(uint32_t b) { return (b & 0x7f800000u) != 0x7f800000u; }

/* Store v in dtype code at out[i]; 0 when the stored value is not finite. */
static inline int store(void *out, int32_t code, int64_t i, float v) {
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    if (code == F32) {
        ((float *)out)[i] = v;
        return finite_bits(b);
    }
    if (code == BF16) { /* c10::BFloat16's round to nearest even (v is finite here or reported) */
        uint32_t r = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
        ((uint16_t *)out)[i] = (uint16_t)r;
        return finite_bits(r << 16) && finite_bits(b);
    }
    _Float16 h = (_Float16)v;
    ((_Float16 *)out)[i] = h;
    uint16_t hb;
    memcpy(&hb, &h, sizeof hb);
    return (hb & 0x7c00u) != 0x7c00u;
}

/* out[a + j] = (α·d[j]) + p[j] for j < m, cast to dtype code (TaskVector.apply_to: α·D, then
 * θ0 added); the number of stored values that are not finite. */
static int64_t apply(const float *d, const float *p, int64_t m, float alpha, void *out, int32_t code, int64_t a) {
    int64_t bad = 0;
    for (int64_t j = 0; j < m; j++) {
        float v = alpha * d[j];
        v = v + p[j];
        bad += !store(out, code, a + j, v);
    }
    return bad;
}

/* Clear every set flag same[i·T + k] (i < k) whose pair differs(i, k, ctx) says differs. */
static void clear_differing(int64_t T, uint8_t *same, int (*differs)(int64_t, int64_t, const void *),
                            const void *ctx) {
    for (int64_t i = 0; i < T; i++)
        for (int64_t k = i + 1; k < T; k++)
            if (same[i * T + k] && differs(i, k, ctx))
                same[i * T + k] = 0;
}

/* m entries from a of raw inputs and θ0's float32 values p of those entries. */
struct raw_chunk {
    const void *const *fts;
    const int32_t *codes;
    const float *p;
    int64_t a, m;
};

/* Whether Δi and Δk (θ − θ0 of the raw inputs) differ in some bit on the chunk. */
static int raw_differ(int64_t i, int64_t k, const void *ctx) {
    const struct raw_chunk *c = ctx;
    for (int64_t j = 0; j < c->m; j++) {
        float di = load(c->fts[i], c->codes[i], c->a + j) - c->p[j];
        float dk = load(c->fts[k], c->codes[k], c->a + j) - c->p[j];
        if (memcmp(&di, &dk, sizeof di))
            return 1;
    }
    return 0;
}

/* A (T, n) float32 stack of task vectors. */
struct rows {
    const float *stack;
    int64_t n;
};

/* Whether rows i and k differ in some bit. */
static int rows_differ_bits(int64_t i, int64_t k, const void *ctx) {
    const struct rows *r = ctx;
    return memcmp(r->stack + i * r->n, r->stack + k * r->n, (size_t)r->n * sizeof *r->stack) != 0;
}

/* Whether rows i and k differ as values (torch.equal: a NaN differs from everything, −0 equals 0). */
static int rows_differ_values(int64_t i, int64_t k, const void *ctx) {
    const struct rows *r = ctx;
    const float *a = r->stack + i * r->n, *b = r->stack + k * r->n;
    for (int64_t j = 0; j < r->n; j++)
        if (!(a[j] == b[j]))
            return 1;
    return 0;
}

/* θ = θ0 + α·Σt (θt − θ0) on n entries. pre: θ0 (dtype pre_code, also the output's); fts: T
 * pointers to the θt (dtypes codes[t]); out: n entries of pre_code. nonzero[t] is set to 1 when
 * some Δt != 0. same: T·T flags; while check_same, every set flag same[i·T + j] (i < j) is cleared
 * where Δi and Δj differ in any bit. Returns the number of output entries that are not finite
 * (θ0, a θt, the sum or the cast overflowed: the torch path raises there, naming the cause). */
int64_t pact_task_arithmetic(const void *pre, int32_t pre_code, const void *const *fts, const int32_t *codes,
                             int64_t T, int64_t n, float alpha, void *out, uint8_t *nonzero, uint8_t *same,
                             int32_t check_same) {
    float s[CHUNK], p[CHUNK];
    int64_t bad = 0;
    for (int64_t a = 0; a < n; a += CHUNK) {
        int64_t m = n - a < CHUNK ? n - a : CHUNK;
        for (int64_t j = 0; j < m; j++)
            p[j] = load(pre, pre_code, a + j);
        for (int64_t t = 0; t < T; t++) {
            const void *x = fts[t];
            int32_t c = codes[t];
            int nz = 0;
            if (c == F32) {
                const float *xf = (const float *)x + a;
                if (t == 0)
                    for (int64_t j = 0; j < m; j++) {
                        float d = xf[j] - p[j];
                        nz |= d != 0.0f;
                        s[j] = d;
                    }
                else
                    for (int64_t j = 0; j < m; j++) {
                        float d = xf[j] - p[j];
                        nz |= d != 0.0f;
                        s[j] = s[j] + d;
                    }
            } else {
                for (int64_t j = 0; j < m; j++) {
                    float d = load(x, c, a + j) - p[j];
                    nz |= d != 0.0f;
                    s[j] = t == 0 ? d : s[j] + d;
                }
            }
            if (nz)
                nonzero[t] = 1;
        }
        if (check_same) {
            struct raw_chunk c = {fts, codes, p, a, m};
            clear_differing(T, same, raw_differ, &c);
        }
        bad += apply(s, p, m, alpha, out, pre_code, a);
    }
    return bad;
}

/* The task vectors of n entries as a (T, n) float32 stack: stack[t·n + j] = θt[j] − θ0[j], as
 * pactlib.streaming.DeltaReader.delta computes them. nonzero[t] is set to 1 when some Δt != 0.
 * check_same 1: every set flag same[i·T + k] (i < k) is cleared where Δi != Δk as values
 * (torch.equal: a NaN differs from everything, −0 equals 0); 2: where their bits differ (the
 * hashes of pactlib.streaming's one-task-at-a-time checks); 0: not compared. */
void pact_deltas(const void *pre, int32_t pre_code, const void *const *fts, const int32_t *codes, int64_t T,
                 int64_t n, float *stack, uint8_t *nonzero, uint8_t *same, int32_t check_same) {
    for (int64_t t = 0; t < T; t++) {
        float *row = stack + t * n;
        int nz = 0;
        if (codes[t] == F32 && pre_code == F32) {
            const float *x = (const float *)fts[t], *p = (const float *)pre;
            for (int64_t j = 0; j < n; j++) {
                float d = x[j] - p[j];
                nz |= d != 0.0f;
                row[j] = d;
            }
        } else
            for (int64_t j = 0; j < n; j++) {
                float d = load(fts[t], codes[t], j) - load(pre, pre_code, j);
                nz |= d != 0.0f;
                row[j] = d;
            }
        if (nz)
            nonzero[t] = 1;
    }
    if (check_same) {
        struct rows r = {stack, n};
        clear_differing(T, same, check_same == 2 ? rows_differ_bits : rows_differ_values, &r);
    }
}

/* θ = θ0 + α·D on n entries (book/method.md, merges: θ0 + α·D of any method; TaskVector.apply_to):
 * D float32, θ0 and out of dtype pre_code. Returns the number of output entries that are not
 * finite (the torch path raises MergeOverflowError there, or names the NaN / Inf input). */
int64_t pact_apply(const float *D, const void *pre, int32_t pre_code, int64_t n, float alpha, void *out) {
    float p[CHUNK];
    int64_t bad = 0;
    for (int64_t a = 0; a < n; a += CHUNK) {
        int64_t m = n - a < CHUNK ? n - a : CHUNK;
        for (int64_t j = 0; j < m; j++)
            p[j] = load(pre, pre_code, a + j);
        bad += apply(D + a, p, m, alpha, out, pre_code, a);
    }
    return bad;
}

/* The radix pass of pactlib.merges.ties.GlobalThreshold.observe (pact_digit_hist_f32) on the task
 * vector θt − θ0 of n raw entries, without writing it: |Δ|'s digit at shift into hist (2^16
 * int64 counters), for the entries whose higher digits equal prefix (all on the first pass,
 * shift = 16). Returns 1 when some Δ != 0. */
int32_t pact_digit_hist_delta(const void *pre, int32_t pre_code, const void *x, int32_t code, int64_t n,
                              int64_t prefix, int32_t shift, int64_t *hist) {
    int nz = 0;
    uint32_t want = (uint32_t)prefix;
    int top = shift + 16;
    for (int64_t a = 0; a < n; a += CHUNK) {
        int64_t m = n - a < CHUNK ? n - a : CHUNK;
        float d[CHUNK];
        if (code == F32 && pre_code == F32) {
            const float *xf = (const float *)x + a, *pf = (const float *)pre + a;
            for (int64_t j = 0; j < m; j++)
                d[j] = xf[j] - pf[j];
        } else
            for (int64_t j = 0; j < m; j++)
                d[j] = load(x, code, a + j) - load(pre, pre_code, a + j);
        for (int64_t j = 0; j < m; j++) {
            uint32_t b;
            memcpy(&b, &d[j], sizeof b);
            b &= 0x7fffffffu;
            nz |= b != 0;
            if (top >= 32)
                hist[b >> shift]++;
            else if ((b >> top) == want)
                hist[(b >> shift) & 0xffffu]++;
        }
    }
    return nz;
}

/* One digit of the radix selection, as pactlib.merges.ties.GlobalThreshold.end_pass: the largest
 * digit j whose entries at or above it (in hist, 2^16 counters) number at least rank; *higher
 * gets the count of entries above j. Returns j (0 when no digit holds rank). */
int32_t pact_select_digit(const int64_t *hist, int64_t rank, int64_t *higher) {
    int64_t acc = 0;
    for (int32_t j = 65535; j >= 0; j--) {
        if (acc + hist[j] >= rank) {
            *higher = acc;
            return j;
        }
        acc += hist[j];
    }
    *higher = 0;
    return 0;
}
