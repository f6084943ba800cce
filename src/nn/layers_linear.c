/* layers_linear.c - the fully connected layer, y = x w^T + b, forward and backward, each product one
 * sgemm over the whole batch so BLAS sees the largest matrices the layer has. */
#include <cblas.h>
#include <string.h>
#include <tally/layers.h>

#include "simd.h"

void tally_linear_forward(float *y, const float *x, const float *w, const float *b, int B, int in, int out) {
    /* Seeding y with the bias lets the sgemm add it for free through beta = 1. */
    if (b)
        for (int i = 0; i < B; i++) memcpy(y + (size_t)i * out, b, (size_t)out * sizeof *y);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, out, in, 1.0f, x, in, w, in, b ? 1.0f : 0.0f, y, out);
}

/* db += dy's column sums. Each column adds its rows in order; sixty-four columns side by side are four
 * independent chains of sixteen lanes, walked down blocks of rows that stay in L2 (one chain of
 * scalar adds was 1.4% of a GPT step). */
#define COLSUM_ROWS 64

static void column_sums_tail(float *db, const float *dy, int i0, int i1, int j, int out) {
    for (; j < out; j++) {
        float s = db[j];
        for (int i = i0; i < i1; i++) s += dy[(size_t)i * out + j];
        db[j] = s;
    }
}

TALLY_SIMD_CLONES static void column_sums_add(float *db, const float *dy, int B, int out) {
    for (int i0 = 0; i0 < B; i0 += COLSUM_ROWS) {
        int i1 = B - i0 < COLSUM_ROWS ? B : i0 + COLSUM_ROWS, j = 0;
        for (; j + 64 <= out; j += 64) {
            v16f s0 = load16(db + j), s1 = load16(db + j + 16), s2 = load16(db + j + 32), s3 = load16(db + j + 48);
            for (int i = i0; i < i1; i++) {
                const float *row = dy + (size_t)i * out + j;
                s0 += load16(row), s1 += load16(row + 16), s2 += load16(row + 32), s3 += load16(row + 48);
            }
            store16(db + j, s0), store16(db + j + 16, s1), store16(db + j + 32, s2), store16(db + j + 48, s3);
        }
        for (; j + 16 <= out; j += 16) {
            v16f s = load16(db + j);
            for (int i = i0; i < i1; i++) s += load16(dy + (size_t)i * out + j);
            store16(db + j, s);
        }
        column_sums_tail(db, dy, i0, i1, j, out);
    }
}

void tally_linear_backward(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w, int B,
                           int in, int out) {
    if (dw) cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, B, 1.0f, dy, out, x, in, 1.0f, dw, in);
    if (dw && db) column_sums_add(db, dy, B, out);
    if (dx) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
}
