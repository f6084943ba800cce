/* layers_linear.c - the fully connected layer, y = x w^T + b, forward and backward, each product one
 * sgemm over the whole batch so BLAS sees the largest matrices the layer has. */
#include <cblas.h>
#include <string.h>
#include <tally/layers.h>

void tally_linear_forward(float *y, const float *x, const float *w, const float *b, int B, int in, int out) {
    /* Seeding y with the bias lets the sgemm add it for free through beta = 1. */
    if (b)
        for (int i = 0; i < B; i++) memcpy(y + (size_t)i * out, b, (size_t)out * sizeof *y);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, out, in, 1.0f, x, in, w, in, b ? 1.0f : 0.0f, y, out);
}

/* Row after row, so both arrays are walked along contiguous memory (no stride-out column walk). */
static void column_sums_add(float *db, const float *dy, int B, int out) {
    for (int i = 0; i < B; i++) {
        const float *row = dy + (size_t)i * out;
        for (int j = 0; j < out; j++) db[j] += row[j];
    }
}

void tally_linear_backward(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w, int B,
                           int in, int out) {
    if (dw) cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, B, 1.0f, dy, out, x, in, 1.0f, dw, in);
    if (dw && db) column_sums_add(db, dy, B, out);
    if (dx) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
}
