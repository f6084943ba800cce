/* test_int8.c - int8 with a scale per block: a block's quantization (its error at most half a step, NaN
 * and infinity as NaN, zeros), and the mean over 1-4 ranks sent that way against a reference written
 * here, for every size class, over shm and tcp: the same bytes on every rank, within two steps' error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tally.h>

#include "dp/codec.h"
#include "harness.h"

#define B TALLY__INT8_BLOCK

static void test_quantize(void) {
    float x[B], back[B];
    int8_t q[B];
    for (int i = 0; i < B; i++) x[i] = sinf((float)i * 0.37f) * (i % 7 == 0 ? 3.0f : 0.01f);
    float scale = tally__int8_quantize(x, B, q);
    float top = 0;
    for (int i = 0; i < B; i++) top = fmaxf(top, fabsf(x[i]));
    TH_CHECK(scale == top / 127.0f, "scale %g, want the largest magnitude over 127 (%g)", (double)scale,
             (double)(top / 127.0f));
    tally__int8_dequantize(q, B, scale, back);
    int worst = -1;
    for (int i = 0; i < B; i++)
        if (fabsf(back[i] - x[i]) > scale * 0.5f * (1 + 1e-5f) && worst < 0) worst = i;
    TH_CHECK(worst < 0, "value %d: %g came back %g, more than half a step (%g) away", worst,
             (double)x[worst < 0 ? 0 : worst], (double)back[worst < 0 ? 0 : worst], (double)scale * 0.5);
    int extremes = 1;
    for (int i = 0; i < B; i++) extremes &= q[i] != -128; /* -127..127: symmetric, no lone -128 */
    TH_CHECK(extremes, "a value quantized to -128");

    memset(x, 0, sizeof x);
    scale = tally__int8_quantize(x, B, q);
    tally__int8_dequantize(q, B, scale, back);
    TH_CHECK(scale == 0 && back[0] == 0 && back[B - 1] == 0, "zeros: scale %g, back %g", (double)scale,
             (double)back[0]);

    const float bad[2] = {NAN, INFINITY};
    for (int k = 0; k < 2; k++) {
        x[5] = bad[k];
        scale = tally__int8_quantize(x, 7, q);
        tally__int8_dequantize(q, 7, scale, back);
        TH_CHECK(isnan(back[0]) && isnan(back[6]), "a block holding %g comes back %g, not NaN", (double)bad[k],
                 (double)back[0]);
    }
    x[5] = 0;
    x[0] = 1.0f; /* len 1: its own largest */
    scale = tally__int8_quantize(x, 1, q);
    TH_CHECK(q[0] == 127 && scale == 1.0f / 127.0f, "one value: q %d scale %g", q[0], (double)scale);
}

/* Rank r's input: values of every magnitude, different on each rank, some blocks all zero. */
static float input(int rank, size_t i) {
    if ((i / B) % 5 == 3) return 0; /* a block of zeros */
    double mag = pow(10.0, (double)((i * 7 + (size_t)rank) % 9) - 6);
    return (float)(mag * sin((double)i * 0.61 + rank * 1.7));
}

/* The mean as the header says it travels: each rank's blocks quantized, summed in rank order in f32,
 * divided, quantized again. */
static void reference(int size, size_t n, float *out) {
    size_t padded = (n + B - 1) / B * B;
    float *acc = calloc(padded + 1, sizeof(float)), x[B], back[B];
    int8_t q[B];
    for (int r = 0; r < size; r++)
        for (size_t b = 0; b < padded; b += B) {
            for (size_t i = 0; i < B; i++) x[i] = b + i < n ? input(r, b + i) : 0;
            tally__int8_dequantize(q, B, tally__int8_quantize(x, B, q), back);
            for (size_t i = 0; i < B; i++) acc[b + i] += back[i];
        }
    for (size_t b = 0; b < padded; b += B) {
        for (size_t i = 0; i < B; i++) x[i] = acc[b + i] / (float)size;
        tally__int8_dequantize(q, B, tally__int8_quantize(x, B, q), back);
        for (size_t i = 0; i < B && b + i < n; i++) out[b + i] = back[i];
    }
    free(acc);
}

#define MAX_N 100003
typedef struct mean_case {
    size_t n;
    int rc[4];
    unsigned long long sent[4];
    float got[4][MAX_N];
    float err[4][MAX_N];
} mean_case;

static int mean_rank(int rank, int size, void *arg) {
    mean_case *mc = arg;
    tally_comm *c;
    if (tally_comm_init(&c)) return fprintf(stderr, "rank %d: %s\n", rank, tally_last_error()), 1;
    for (size_t i = 0; i < mc->n; i++) mc->got[rank][i] = input(rank, i);
    unsigned long long s0 = tally_comm_bytes_sent(c);
    mc->rc[rank] = tally__codec_int8_mean(c, mc->got[rank], mc->n, mc->err[rank]);
    mc->sent[rank] = tally_comm_bytes_sent(c) - s0;
    if (mc->rc[rank]) fprintf(stderr, "rank %d: %s\n", rank, tally_last_error());
    tally_comm_free(c);
    return mc->rc[rank] != 0;
}

/* Within the two quantizations' error of the exact mean: half of the largest step any rank's block
 * took, and half the step of the mean's block (taken from the result's own block). */
static double worst_excess(int size, size_t n, const float *got) {
    double worst = 0;
    for (size_t b = 0; b < n; b += B) {
        double in_step = 0, out_top = 0;
        for (int r = 0; r < size; r++) {
            double top = 0;
            for (size_t i = b; i < b + B && i < n; i++) top = fmax(top, fabs(input(r, i)));
            in_step = fmax(in_step, top / 127);
        }
        for (size_t i = b; i < b + B && i < n; i++) out_top = fmax(out_top, fabs(got[i]));
        double bound = 0.5 * in_step + 0.5 * (out_top + 0.5 * in_step) / 127 + 1e-6 * out_top;
        for (size_t i = b; i < b + B && i < n; i++) {
            double exact = 0;
            for (int r = 0; r < size; r++) exact += input(r, i);
            exact /= size;
            double excess = fabs(got[i] - exact) - bound;
            if (excess > worst) worst = excess;
        }
    }
    return worst;
}

static void test_mean(const char *tp, int size, size_t n) {
    mean_case *mc = th_shared_alloc(sizeof *mc);
    mc->n = n;
    th_opts o = {.transport = tp, .wall_s = 60};
    TH_CHECK(th_run(size, &o, mean_rank, mc) == 0, "int8 mean %s n=%d size %zu: ranks failed", tp, size, n);
    float *want = malloc((n + 1) * sizeof(float));
    reference(size, n, want);
    if (size == 1)
        for (size_t i = 0; i < n; i++) want[i] = input(0, i); /* one rank: nothing travels, nothing rounds */
    for (int r = 0; r < size; r++) {
        size_t bad = n;
        for (size_t i = 0; i < n && bad == n; i++)
            if (memcmp(&mc->got[r][i], &want[i], sizeof(float))) bad = i;
        TH_CHECK(bad == n, "int8 mean %s n=%d size %zu rank %d: value %zu is %.9g, the reference %.9g", tp, size, n, r,
                 bad, (double)mc->got[r][bad < n ? bad : 0], (double)want[bad < n ? bad : 0]);
    }
    for (int r = 0; r < size; r++) { /* err: the input less what its own quantization sent */
        float x[B], back[B];
        int8_t q[B];
        size_t bad = n;
        for (size_t b = 0; b < n && bad == n; b += B) {
            size_t len = n - b < B ? n - b : B;
            memset(x, 0, sizeof x);
            for (size_t i = 0; i < len; i++) x[i] = input(r, b + i);
            tally__int8_dequantize(q, B, tally__int8_quantize(x, B, q), back);
            for (size_t i = 0; i < len && bad == n; i++) {
                float want = size == 1 ? 0 : x[i] - back[i];
                if (memcmp(&mc->err[r][b + i], &want, sizeof want)) bad = b + i;
            }
        }
        TH_CHECK(bad == n, "int8 mean %s n=%d size %zu rank %d: err[%zu] is %g", tp, size, n, r, bad,
                 (double)mc->err[r][bad < n ? bad : 0]);
    }
    double excess = worst_excess(size, n, mc->got[0]);
    TH_CHECK(excess <= 0, "int8 mean %s n=%d size %zu: %g past the two quantizations' bound", tp, size, n, excess);
    if (size > 1 && n >= 100000) {
        double f32_ring = 2.0 * (size - 1) / size * 4.0 * (double)n;
        TH_CHECK(mc->sent[0] < f32_ring * 0.3, "int8 mean n=%d size %zu: %llu bytes sent, an f32 ring sends %.0f", size,
                 n, mc->sent[0], f32_ring);
    }
    free(want);
    th_shared_free(mc, sizeof *mc);
}

int main(void) {
    test_quantize();
    const size_t sizes[] = {0, 1, B - 1, B, B + 1, 1000, 4 * B + 3, MAX_N};
    for (int size = 1; size <= 4; size++)
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) test_mean("shm", size, sizes[k]);
    test_mean("tcp", 3, 1000);
    test_mean("tcp", 2, MAX_N);
    return th_verdict("test_int8");
}
