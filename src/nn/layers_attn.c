/* layers_attn.c - causal multi-head self-attention over a sequence, forward and backward: per sample
 * and head, the score and output products are sgemm calls on strided views of qkv, no packing. */
#include <cblas.h>
#include <math.h>
#include <string.h>
#include <tally/layers.h>

/* Row i of scores: softmax over columns 0..i in place, the future set to 0 (it then adds nothing to
 * att v, and gets no gradient). */
static void causal_softmax_row(float *s, int i, int T) {
    float m = s[0];
    for (int j = 1; j <= i; j++) m = s[j] > m ? s[j] : m;
    float sum = 0.0f;
    for (int j = 0; j <= i; j++) {
        s[j] = expf(s[j] - m);
        sum += s[j];
    }
    float inv = 1.0f / sum;
    for (int j = 0; j <= i; j++) s[j] *= inv;
    for (int j = i + 1; j < T; j++) s[j] = 0.0f;
}

void tally_attention_forward(float *y, float *att, const float *qkv, int B, int T, int C, int H) {
    const int hs = C / H, ld = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const float *q = qkv + (size_t)b * T * ld + (size_t)h * hs, *k = q + C, *v = q + 2 * C;
            float *a = att + ((size_t)b * H + h) * T * T;
            /* every score, the future's too: one sgemm beats T short ones, and the mask sets them after */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, ld, k, ld, 0.0f, a, T);
            for (int i = 0; i < T; i++) causal_softmax_row(a + (size_t)i * T, i, T);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, v, ld, 0.0f,
                        y + (size_t)b * T * C + (size_t)h * hs, C);
        }
}

/* dscore = att * (datt - rowsum(att * datt)), in place over datt: softmax's backward, row by row. */
static void softmax_backward_rows(float *d, const float *a, int T) {
    for (int i = 0; i < T; i++) {
        float *dr = d + (size_t)i * T;
        const float *ar = a + (size_t)i * T;
        float dot = 0.0f;
        for (int j = 0; j <= i; j++) dot += ar[j] * dr[j];
        for (int j = 0; j <= i; j++) dr[j] = ar[j] * (dr[j] - dot);
        for (int j = i + 1; j < T; j++) dr[j] = 0.0f;
    }
}

void tally_attention_backward(float *dqkv, float *scratch, const float *dy, const float *qkv, const float *att, int B,
                              int T, int C, int H) {
    const int hs = C / H, ld = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            size_t off = (size_t)b * T * ld + (size_t)h * hs;
            const float *q = qkv + off, *k = q + C, *v = q + 2 * C;
            float *dq = dqkv + off, *dk = dq + C, *dv = dq + 2 * C;
            const float *a = att + ((size_t)b * H + h) * T * T, *g = dy + (size_t)b * T * C + (size_t)h * hs;
            /* datt = dy v^T; dv = att^T dy */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, g, C, v, ld, 0.0f, scratch, T);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, g, C, 0.0f, dv, ld);
            softmax_backward_rows(scratch, a, T);
            /* dq = scale dscore k; dk = scale dscore^T q */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, scale, scratch, T, k, ld, 0.0f, dq, ld);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, scale, scratch, T, q, ld, 0.0f, dk, ld);
        }
}
