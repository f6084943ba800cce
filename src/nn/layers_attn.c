/* layers_attn.c - causal multi-head self-attention over a sequence, forward and backward: the fused AVX-512
 * kernels where they fit, else per sample and head sgemm calls on strided views of qkv, no packing. */
#include <cblas.h>
#include <math.h>
#include <string.h>
#include <tally/layers.h>

#include "attn_int.h"
#include "simd.h"

/* The largest of s[0..n): sixteen running maxima, so the compares do not wait on one another. */
TALLY_SIMD_CLONES static float row_max(const float *s, int n) {
    float m = s[0];
    int j = 0;
    if (n >= 16) {
        v16f v = load16(s);
        for (j = 16; j + 16 <= n; j += 16) v = max16(v, load16(s + j));
        for (int k = 0; k < 16; k++) m = v[k] > m ? v[k] : m;
    }
    for (; j < n; j++) m = s[j] > m ? s[j] : m;
    return m;
}

/* s[j] = exp(s[j] - m) for j < n, returning their sum: sixteen lanes of glibc's libmvec where the CPU
 * has AVX-512 (libm's scalar expf was most of softmax's time), one at a time elsewhere. */
#if defined(__x86_64__) && defined(__SSE2__)
#include <immintrin.h>
__m512 _ZGVeN16v_expf(__m512 x);

__attribute__((target("avx512f,avx512dq"))) static inline v16f exp16(v16f x) { return (v16f)_ZGVeN16v_expf((__m512)x); }

__attribute__((target("avx512f,avx512dq"))) static float exp_shifted16(float *s, int n, float m) {
    v16f acc = {0};
    int j = 0;
    for (; j + 16 <= n; j += 16) {
        v16f v = exp16(load16(s + j) - m);
        store16(s + j, v);
        acc += v;
    }
    if (j < n) { /* the tail padded with -inf, whose exp adds 0 */
        float t[16];
        int k = n - j;
        for (int u = k; u < 16; u++) t[u] = -INFINITY;
        memcpy(t, s + j, (size_t)k * sizeof *t);
        v16f v = exp16(load16(t) - m);
        memcpy(s + j, &v, (size_t)k * sizeof *s);
        acc += v;
    }
    return sum16(acc);
}
#else
static float exp_shifted16(float *s, int n, float m) { return 0.0f; }
#endif

static float exp_shifted(float *s, int n, float m) {
    if (tally__cpu_avx512()) return exp_shifted16(s, n, m);
    float sum = 0.0f;
    for (int j = 0; j < n; j++) {
        s[j] = expf(s[j] - m);
        sum += s[j];
    }
    return sum;
}

/* s[0..n) *= k, then s[n..T) = 0. */
TALLY_SIMD_CLONES static void scale_then_clear(float *s, int n, int T, float k) {
    int j = 0;
    for (; j + 16 <= n; j += 16) store16(s + j, load16(s + j) * k);
    for (; j < n; j++) s[j] *= k;
    if (n < T) memset(s + n, 0, (size_t)(T - n) * sizeof *s);
}

/* Row i of scores: softmax over columns 0..i in place, the future set to 0 (it then adds nothing to
 * att v, and gets no gradient). */
static void causal_softmax_row(float *s, int i, int T) {
    scale_then_clear(s, i + 1, T, 1.0f / exp_shifted(s, i + 1, row_max(s, i + 1)));
}

/* Causal blocks: query rows [i0, i0 + rows) attend to keys [0, i0 + rows) only, so the products skip
 * the blocks above the diagonal (for T = 128, 10 of 16 blocks of 32 are computed). */
#define ATTN_BLOCK 32

static int block_rows(int i0, int T) { return T - i0 < ATTN_BLOCK ? T - i0 : ATTN_BLOCK; }

void tally__attn_blas_forward(float *y, float *att, const float *qkv, int B, int T, int C, int H) {
    const int hs = C / H, ld = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const float *q = qkv + (size_t)b * T * ld + (size_t)h * hs, *k = q + C, *v = q + 2 * C;
            float *a = att + ((size_t)b * H + h) * T * T, *out = y + (size_t)b * T * C + (size_t)h * hs;
            for (int i0 = 0; i0 < T; i0 += ATTN_BLOCK) {
                int rows = block_rows(i0, T), cols = i0 + rows;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, hs, scale, q + (size_t)i0 * ld, ld, k,
                            ld, 0.0f, a + (size_t)i0 * T, T);
            }
            for (int i = 0; i < T; i++) causal_softmax_row(a + (size_t)i * T, i, T); /* zeroes the rest */
            for (int i0 = 0; i0 < T; i0 += ATTN_BLOCK) {
                int rows = block_rows(i0, T), cols = i0 + rows;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, cols, 1.0f, a + (size_t)i0 * T, T, v,
                            ld, 0.0f, out + (size_t)i0 * C, C);
            }
        }
}

/* dscore = att * (datt - rowsum(att * datt)), in place over datt: softmax's backward, row by row. */
TALLY_SIMD_CLONES static void softmax_backward_rows(float *d, const float *a, int T) {
    for (int i = 0; i < T; i++) {
        float *dr = d + (size_t)i * T;
        const float *ar = a + (size_t)i * T;
        v16f d0 = {0};
        int j = 0, n = i + 1;
        for (; j + 16 <= n; j += 16) d0 += load16(ar + j) * load16(dr + j);
        float dot = sum16(d0);
        for (; j < n; j++) dot += ar[j] * dr[j];
        for (j = 0; j + 16 <= n; j += 16) store16(dr + j, load16(ar + j) * (load16(dr + j) - dot));
        for (; j < n; j++) dr[j] = ar[j] * (dr[j] - dot);
        if (n < T) memset(dr + n, 0, (size_t)(T - n) * sizeof *dr);
    }
}

/* Key-side gradients (dv, dk) sum over the query blocks that see a key: the last block sees every key,
 * so it goes first and overwrites (beta 0), the others add to the keys they see. */
void tally__attn_blas_backward(float *dqkv, float *scratch, const float *dy, const float *qkv, const float *att, int B,
                               int T, int C, int H) {
    const int hs = C / H, ld = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    const int last = (T - 1) / ATTN_BLOCK * ATTN_BLOCK;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            size_t off = (size_t)b * T * ld + (size_t)h * hs;
            const float *q = qkv + off, *k = q + C, *v = q + 2 * C;
            float *dq = dqkv + off, *dk = dq + C, *dv = dq + 2 * C;
            const float *a = att + ((size_t)b * H + h) * T * T, *g = dy + (size_t)b * T * C + (size_t)h * hs;
            for (int i0 = last; i0 >= 0; i0 -= ATTN_BLOCK) { /* datt = dy v^T; dv = att^T dy */
                int rows = block_rows(i0, T), cols = i0 + rows;
                const float *ab = a + (size_t)i0 * T, *gb = g + (size_t)i0 * C;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, hs, 1.0f, gb, C, v, ld, 0.0f,
                            scratch + (size_t)i0 * T, T);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, hs, rows, 1.0f, ab, T, gb, C,
                            i0 == last ? 0.0f : 1.0f, dv, ld);
            }
            softmax_backward_rows(scratch, a, T);
            for (int i0 = last; i0 >= 0; i0 -= ATTN_BLOCK) { /* dq = scale dscore k; dk = scale dscore^T q */
                int rows = block_rows(i0, T), cols = i0 + rows;
                const float *sb = scratch + (size_t)i0 * T;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, cols, scale, sb, T, k, ld, 0.0f,
                            dq + (size_t)i0 * ld, ld);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, hs, rows, scale, sb, T, q + (size_t)i0 * ld,
                            ld, i0 == last ? 0.0f : 1.0f, dk, ld);
            }
        }
}

/* The fused kernels where they fit and their scratch could be had, else BLAS: the same sums in another order. */
void tally_attention_forward(float *y, float *att, const float *qkv, int B, int T, int C, int H) {
    if (B > 0 && H > 0 && tally__attn_fused_fits(T, C / H) && tally__attn_fused_forward(y, att, qkv, B, T, C, H) == 0)
        return;
    tally__attn_blas_forward(y, att, qkv, B, T, C, H);
}

void tally_attention_backward(float *dqkv, float *scratch, const float *dy, const float *qkv, const float *att, int B,
                              int T, int C, int H) {
    if (B > 0 && H > 0 && tally__attn_fused_fits(T, C / H) &&
        tally__attn_fused_backward(dqkv, scratch, dy, qkv, att, B, T, C, H) == 0)
        return;
    tally__attn_blas_backward(dqkv, scratch, dy, qkv, att, B, T, C, H);
}
