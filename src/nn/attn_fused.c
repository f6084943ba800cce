/* attn_fused.c - causal attention for one sample and head at a time in AVX-512 registers: scores, softmax
 * and output in blocks of four query rows, and the backward's four products, with no BLAS call. */
#include "attn_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"

/* OpenBLAS ran these products (32-128 wide, K = 64) on its small-matrix kernels at 30-65 GFLOP/s, half
 * of attention's time; here every product is one kernel: C[r][v] = alpha sum_d A(r, d) B[d][v] for R
 * rows and NV vectors of 16, A read through strides so that a transposed A costs nothing. GCC builds only:
 * its unrolling pragma keeps the accumulators in registers; other compilers take the sgemm way. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>

#define AF_TARGET __attribute__((target("avx512f,avx512dq")))
#define AF_INLINE static inline __attribute__((always_inline)) AF_TARGET
__m512 _ZGVeN16v_expf(__m512 x);
/* The accumulators live in registers only if the loops over rows and vectors are unrolled whole. */
#define AF_UNROLL _Pragma("GCC unroll 4")

typedef struct {
    const float *p;
    long rs, ds; /* A(r, d) = p[r * rs + d * ds] */
} af_a;

AF_INLINE void af_kernel(float *c, long c_rs, float alpha, af_a a, const float *b, long b_ds, int K, const int R,
                         const int NV) {
    __m512 acc[4][4];
    const float *ap = a.p;
    AF_UNROLL for (int r = 0; r < R; r++) { AF_UNROLL for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps(); }
    for (int d = 0; d < K; d++, ap += a.ds, b += b_ds) { /* pointers stepped, not indices multiplied */
        __m512 bv[4];
        AF_UNROLL for (int v = 0; v < NV; v++) bv[v] = _mm512_loadu_ps(b + v * 16);
        AF_UNROLL for (int r = 0; r < R; r++) {
            __m512 ar = _mm512_set1_ps(ap[r * a.rs]);
            AF_UNROLL for (int v = 0; v < NV; v++) acc[r][v] = _mm512_fmadd_ps(ar, bv[v], acc[r][v]);
        }
    }
    __m512 k = _mm512_set1_ps(alpha);
    AF_UNROLL for (int r = 0; r < R; r++) {
        AF_UNROLL for (int v = 0; v < NV; v++) _mm512_storeu_ps(c + r * c_rs + v * 16, _mm512_mul_ps(acc[r][v], k));
    }
}

#define AF_CASE(R, NV)                                                                                                 \
    case NV: af_kernel(c, c_rs, alpha, a, b, b_ds, K, R, NV); break;

/* R rows (4 or 1) by nvec vectors, four vectors a pass, the widths constant in every kernel built. */
AF_TARGET static void af_product(float *c, long c_rs, float alpha, af_a a, const float *b, long b_ds, int K, int R,
                                 int nvec) {
    for (int v0 = 0; v0 < nvec; v0 += 4, c += 64, b += 64) {
        int nv = nvec - v0 < 4 ? nvec - v0 : 4;
        if (R == 4) {
            switch (nv) { AF_CASE(4, 1) AF_CASE(4, 2) AF_CASE(4, 3) AF_CASE(4, 4) }
        } else {
            switch (nv) { AF_CASE(1, 1) AF_CASE(1, 2) AF_CASE(1, 3) AF_CASE(1, 4) }
        }
    }
}

static inline __mmask16 af_tail(int left) { return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1); }

/* dst[d][j] = src[j * ld + d] for j < T, 0 for T <= j < Tp: sixteen keys a gather (one at a time was
 * 40% of the backward's own time). */
AF_TARGET static void af_transpose(float *dst, const float *src, int T, int Tp, int hs, int ld) {
    const __m512i lane = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32(ld));
    for (int j0 = 0; j0 < Tp; j0 += 16) {
        __mmask16 k = af_tail(T - j0);
        const float *col = src + (size_t)j0 * ld;
        for (int d = 0; d < hs; d++)
            _mm512_storeu_ps(dst + (size_t)d * Tp + j0,
                             _mm512_mask_i32gather_ps(_mm512_setzero_ps(), k, lane, col + d, 4));
    }
}

/* p[0..n) = softmax(s[0..n)), p[n..T) = 0. */
AF_TARGET static void af_softmax_row(float *p, const float *s, int n, int T) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < n; j += 16) m = _mm512_max_ps(m, _mm512_mask_loadu_ps(m, af_tail(n - j), s + j));
    __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(m)), sum = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 16) {
        __mmask16 k = af_tail(n - j);
        __m512 e = _mm512_maskz_mov_ps(k, _ZGVeN16v_expf(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), mx)));
        _mm512_mask_storeu_ps(p + j, k, e);
        sum = _mm512_add_ps(sum, e);
    }
    __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
    for (int j = 0; j < n; j += 16) {
        __mmask16 k = af_tail(n - j);
        _mm512_mask_storeu_ps(p + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, p + j), inv));
    }
    memset(p + n, 0, (size_t)(T - n) * sizeof *p);
}

/* ds[j] = p[j] (dp[j] - sum_k p[k] dp[k]) for j < n, 0 for n <= j < T: softmax's backward. */
AF_TARGET static void af_softmax_grad_row(float *ds, const float *p, const float *dp, int n, int T) {
    __m512 dot = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 16) {
        __mmask16 k = af_tail(n - j);
        dot = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, p + j), _mm512_maskz_loadu_ps(k, dp + j), dot);
    }
    __m512 d = _mm512_set1_ps(_mm512_reduce_add_ps(dot));
    for (int j = 0; j < n; j += 16) {
        __mmask16 k = af_tail(n - j);
        __m512 g = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, p + j), _mm512_sub_ps(_mm512_maskz_loadu_ps(k, dp + j), d));
        _mm512_mask_storeu_ps(ds + j, k, g);
    }
    memset(ds + n, 0, (size_t)(T - n) * sizeof *ds);
}

static int af_rows(int i0, int T) { return T - i0 >= 4 ? 4 : 1; }

int tally__attn_fused_fits(int T, int hs) { return tally__cpu_avx512() && T > 0 && hs > 0 && hs % 16 == 0; }

/* The kernels' scratch: one sample's rows regrouped by head, inputs and outputs (part k of head h at pk[k] +
 * h T hs, rows hs floats apart), a head's keys or values transposed, four rows of scores. In qkv a head's
 * rows lie 3C floats apart: read in place they fall into a few of L1's sets (3 KB apart: 4 of 64) and evict
 * one another within a product, and head by head from memory they arrive (or, written, are fetched to be
 * written) 256 bytes at a time, which cost the backward more than its products. */
#define AF_PARTS_FORWARD 4 /* q, k, v in; y out */
#define AF_PARTS         7 /* the backward's q, k, v, dy in; dq, dk, dv out: the most either takes */
typedef struct {
    float *pk[AF_PARTS], *t, *rows;
    int Tp;
} af_work;

static int af_work_get(af_work *w, int parts, int T, int C, int hs) {
    w->Tp = (T + 15) / 16 * 16;
    size_t part = (size_t)T * C, t = (size_t)hs * w->Tp;
    if (!(w->pk[0] = malloc((parts * part + t + 4 * (size_t)w->Tp) * sizeof(float)))) return -1;
    for (int k = 1; k < parts; k++) w->pk[k] = w->pk[0] + k * part;
    w->t = w->pk[0] + parts * part;
    w->rows = w->t + t;
    return 0;
}

/* parts consecutive blocks of C floats per row of src (ld apart), row by row in memory order, into
 * w->pk[first + k]: head h's part k at h T hs. */
static void af_regroup(const af_work *w, int first, const float *src, int parts, int T, int C, int H, int ld) {
    int hs = C / H;
    for (int t = 0; t < T; t++)
        for (int k = 0; k < parts; k++)
            for (int h = 0; h < H; h++)
                memcpy(w->pk[first + k] + ((size_t)h * T + t) * hs,
                       src + (size_t)t * ld + (size_t)k * C + (size_t)h * hs, (size_t)hs * sizeof(float));
}

/* af_regroup's inverse: w->pk[first + k] back into parts blocks of C floats per row of dst, in memory order. */
static void af_ungroup(float *dst, const af_work *w, int first, int parts, int T, int C, int H, int ld) {
    int hs = C / H;
    for (int t = 0; t < T; t++)
        for (int k = 0; k < parts; k++)
            for (int h = 0; h < H; h++)
                memcpy(dst + (size_t)t * ld + (size_t)k * C + (size_t)h * hs,
                       w->pk[first + k] + ((size_t)h * T + t) * hs, (size_t)hs * sizeof(float));
}

/* One head: q, k, v and y its packed rows (hs apart), att T x T. */
AF_TARGET static void af_head_forward(float *y, float *att, const float *q, const float *k, const float *v,
                                      const af_work *w, int T, int hs, float scale) {
    int Tp = w->Tp;
    float *rows = w->rows;
    af_transpose(w->t, k, T, Tp, hs, hs);
    for (int i0 = 0; i0 < T;) {
        int R = af_rows(i0, T), cols = i0 + R;
        af_product(rows, Tp, scale, (af_a){q + (size_t)i0 * hs, hs, 1}, w->t, Tp, hs, R, (cols + 15) / 16);
        for (int r = 0; r < R; r++) af_softmax_row(att + (size_t)(i0 + r) * T, rows + (size_t)r * Tp, i0 + r + 1, T);
        af_product(y + (size_t)i0 * hs, hs, 1.0f, (af_a){att + (size_t)i0 * T, T, 1}, v, hs, cols, R, hs / 16);
        i0 += R;
    }
}

int tally__attn_fused_forward(float *y, float *att, const float *qkv, int B, int T, int C, int H) {
    const int hs = C / H, ld = 3 * C;
    af_work w;
    if (af_work_get(&w, AF_PARTS_FORWARD, T, C, hs)) return -1;
    const float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++) {
        af_regroup(&w, 0, qkv + (size_t)b * T * ld, 3, T, C, H, ld);
        for (int h = 0; h < H; h++) {
            size_t at = (size_t)h * T * hs;
            af_head_forward(w.pk[3] + at, att + ((size_t)b * H + h) * T * T, w.pk[0] + at, w.pk[1] + at, w.pk[2] + at,
                            &w, T, hs, scale);
        }
        af_ungroup(y + (size_t)b * T * C, &w, 3, 1, T, C, H, C);
    }
    free(w.pk[0]);
    return 0;
}

/* One head's dq, dk, dv from its g (dy), q, k, v and its att a, every one but a packed; ds holds T x T. */
AF_TARGET static void af_head_backward(float *dq, float *dk, float *dv, float *ds, const float *g, const float *a,
                                       const float *q, const float *k, const float *v, const af_work *w, int T, int hs,
                                       float scale) {
    int Tp = w->Tp;
    float *rows = w->rows;
    af_transpose(w->t, v, T, Tp, hs, hs);
    for (int i0 = 0; i0 < T;) { /* datt = dy v^T, then dscores, then dq = scale dscores k */
        int R = af_rows(i0, T), cols = i0 + R;
        af_product(rows, Tp, 1.0f, (af_a){g + (size_t)i0 * hs, hs, 1}, w->t, Tp, hs, R, (cols + 15) / 16);
        for (int r = 0; r < R; r++) {
            size_t i = (size_t)(i0 + r);
            af_softmax_grad_row(ds + i * T, a + i * T, rows + (size_t)r * Tp, (int)i + 1, T);
        }
        af_product(dq + (size_t)i0 * hs, hs, scale, (af_a){ds + (size_t)i0 * T, T, 1}, k, hs, cols, R, hs / 16);
        i0 += R;
    }
    for (int j0 = 0; j0 < T;) { /* key j sees the rows i >= j: dk = scale dscores^T q, dv = att^T dy */
        int R = af_rows(j0, T), n = T - j0;
        af_product(dk + (size_t)j0 * hs, hs, scale, (af_a){ds + (size_t)j0 * T + j0, 1, T}, q + (size_t)j0 * hs, hs, n,
                   R, hs / 16);
        af_product(dv + (size_t)j0 * hs, hs, 1.0f, (af_a){a + (size_t)j0 * T + j0, 1, T}, g + (size_t)j0 * hs, hs, n, R,
                   hs / 16);
        j0 += R;
    }
}

int tally__attn_fused_backward(float *dqkv, float *scratch, const float *dy, const float *qkv, const float *att, int B,
                               int T, int C, int H) {
    const int hs = C / H, ld = 3 * C;
    af_work w;
    if (af_work_get(&w, AF_PARTS, T, C, hs)) return -1;
    const float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++) {
        af_regroup(&w, 0, qkv + (size_t)b * T * ld, 3, T, C, H, ld);
        af_regroup(&w, 3, dy + (size_t)b * T * C, 1, T, C, H, C);
        for (int h = 0; h < H; h++) {
            size_t at = (size_t)h * T * hs;
            af_head_backward(w.pk[4] + at, w.pk[5] + at, w.pk[6] + at, scratch, w.pk[3] + at,
                             att + ((size_t)b * H + h) * T * T, w.pk[0] + at, w.pk[1] + at, w.pk[2] + at, &w, T, hs,
                             scale);
        }
        af_ungroup(dqkv + (size_t)b * T * ld, &w, 4, 3, T, C, H, ld);
    }
    free(w.pk[0]);
    return 0;
}
#else
int tally__attn_fused_fits(int T, int hs) { return 0; }
int tally__attn_fused_forward(float *y, float *att, const float *qkv, int B, int T, int C, int H) { return -1; }
int tally__attn_fused_backward(float *dqkv, float *scratch, const float *dy, const float *qkv, const float *att, int B,
                               int T, int C, int H) {
    return -1;
}
#endif
