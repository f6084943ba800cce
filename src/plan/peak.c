/* peak.c - the single-thread sgemm rate of this machine: the denominator of the trainer's MFU (model
 * FLOP utilisation), measured rather than taken from a data sheet. */
#include <cblas.h>
#include <stdlib.h>

#include "../core/clock.h"
#include "calibrate.h"

#define PEAK_N     512
#define PEAK_MIN_S 0.2

double tally__sgemm_peak_gflops(void) {
    const int n = PEAK_N;
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n), *c = malloc(sizeof(float) * n * n);
    double best = 0;
    if (!a || !b || !c) goto out;
    for (int i = 0; i < n * n; i++) a[i] = b[i] = 1.0f / (float)(1 + i % 13);
    int threads = openblas_get_num_threads();
    openblas_set_num_threads(1);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n); /* warm up */
    double t_end = tally__now_s() + PEAK_MIN_S;
    while (tally__now_s() < t_end) {
        double t0 = tally__now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
        double g = 2.0 * n * n * n / (tally__now_s() - t0) * 1e-9;
        if (g > best) best = g;
    }
    openblas_set_num_threads(threads);
out:
    free(a);
    free(b);
    free(c);
    return best;
}
