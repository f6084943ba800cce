/* layers_norm.c - LayerNorm over each row's last dimension, forward (keeping the row's mean and
 * reciprocal deviation) and backward, as PyTorch's nn.LayerNorm. */
#include <math.h>
#include <string.h>
#include <tally/layers.h>

#include "simd.h"

/* A row's sums with thirty-two running sums side by side (two vectors of sixteen), so the additions do
 * not wait on one another (one chain of C dependent adds was most of the layer's time); the same lanes
 * for every row and every CPU. */
TALLY_SIMD_INLINE float lanes_sum(v16f a, v16f b) { return sum16(a + b); }

TALLY_SIMD_INLINE float row_sum(const float *x, int C) {
    v16f a = {0}, b = {0};
    int i = 0;
    for (; i + 32 <= C; i += 32) a += load16(x + i), b += load16(x + i + 16);
    float s = lanes_sum(a, b);
    for (; i < C; i++) s += x[i];
    return s;
}

/* Sum of squared deviations from m: two passes (the mean first), so the variance does not cancel. */
TALLY_SIMD_INLINE float row_sq_dev(const float *x, float m, int C) {
    v16f a = {0}, b = {0};
    int i = 0;
    for (; i + 32 <= C; i += 32) {
        v16f d0 = load16(x + i) - m, d1 = load16(x + i + 16) - m;
        a += d0 * d0, b += d1 * d1;
    }
    float s = lanes_sum(a, b);
    for (; i < C; i++) s += (x[i] - m) * (x[i] - m);
    return s;
}

TALLY_SIMD_CLONES void tally_layernorm_forward(float *y, float *mean, float *rstd, const float *x, const float *w,
                                               const float *b, size_t n, int C) {
    for (size_t r = 0; r < n; r++) {
        const float *xr = x + r * (size_t)C;
        float *yr = y + r * (size_t)C;
        float m = row_sum(xr, C) / (float)C;
        float s = 1.0f / sqrtf(row_sq_dev(xr, m, C) / (float)C + TALLY_LAYERNORM_EPS);
        int i = 0;
        for (; i + 16 <= C; i += 16) store16(yr + i, (load16(xr + i) - m) * s * load16(w + i) + load16(b + i));
        for (; i < C; i++) yr[i] = (xr[i] - m) * s * w[i] + b[i];
        mean[r] = m;
        rstd[r] = s;
    }
}

/* One row's share of the parameter gradients; each element adds its rows in order. */
TALLY_SIMD_INLINE void row_param_grads(float *dw, float *db, const float *gr, const float *xr, float m, float s,
                                       int C) {
    int i = 0;
    for (; i + 16 <= C; i += 16) {
        v16f g = load16(gr + i);
        store16(dw + i, load16(dw + i) + g * ((load16(xr + i) - m) * s));
        store16(db + i, load16(db + i) + g);
    }
    for (; i < C; i++) {
        dw[i] += gr[i] * ((xr[i] - m) * s);
        db[i] += gr[i];
    }
}

TALLY_SIMD_INLINE void row_input_grad(float *dr, const float *gr, const float *xr, const float *w, float m, float s,
                                      int C) {
    v16f g0 = {0}, g1 = {0}, gx0 = {0}, gx1 = {0};
    int j = 0;
    for (; j + 32 <= C; j += 32) {
        v16f xh0 = (load16(xr + j) - m) * s, xh1 = (load16(xr + j + 16) - m) * s;
        v16f ga = load16(gr + j) * load16(w + j), gb = load16(gr + j + 16) * load16(w + j + 16);
        g0 += ga, g1 += gb, gx0 += ga * xh0, gx1 += gb * xh1;
    }
    float gsum = lanes_sum(g0, g1), gxsum = lanes_sum(gx0, gx1);
    for (; j < C; j++) {
        float xhat = (xr[j] - m) * s, g = gr[j] * w[j];
        gsum += g;
        gxsum += g * xhat;
    }
    gsum /= (float)C;
    gxsum /= (float)C;
    int i = 0;
    for (; i + 16 <= C; i += 16) {
        v16f xhat = (load16(xr + i) - m) * s;
        store16(dr + i, (load16(gr + i) * load16(w + i) - gsum - xhat * gxsum) * s);
    }
    for (; i < C; i++) {
        float xhat = (xr[i] - m) * s;
        dr[i] = (gr[i] * w[i] - gsum - xhat * gxsum) * s;
    }
}

TALLY_SIMD_CLONES void tally_layernorm_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
                                                const float *w, const float *mean, const float *rstd, size_t n, int C) {
    for (size_t r = 0; r < n; r++) {
        const float *xr = x + r * (size_t)C, *gr = dy + r * (size_t)C;
        if (dw) row_param_grads(dw, db, gr, xr, mean[r], rstd[r], C);
        if (dx) row_input_grad(dx + r * (size_t)C, gr, xr, w, mean[r], rstd[r], C);
    }
}
