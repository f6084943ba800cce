/* layers_norm.c - LayerNorm over each row's last dimension, forward (keeping the row's mean and
 * reciprocal deviation) and backward, as PyTorch's nn.LayerNorm. */
#include <math.h>
#include <string.h>
#include <tally/layers.h>

#include "simd.h"

/* A row's sums with eight running sums side by side (two vectors of four), so the additions do not
 * wait on one another (one chain of C dependent adds was most of the layer's time); the same lanes
 * for every row. */
static inline float lanes_sum(v4f a, v4f b) {
    v4f v = a + b;
    return (v[0] + v[1]) + (v[2] + v[3]);
}

static float row_sum(const float *x, int C) {
    v4f a = {0}, b = {0};
    int i = 0;
    for (; i + 8 <= C; i += 8) a += load4(x + i), b += load4(x + i + 4);
    float s = lanes_sum(a, b);
    for (; i < C; i++) s += x[i];
    return s;
}

/* Sum of squared deviations from m: two passes (the mean first), so the variance does not cancel. */
static float row_sq_dev(const float *x, float m, int C) {
    v4f a = {0}, b = {0};
    int i = 0;
    for (; i + 8 <= C; i += 8) {
        v4f d0 = load4(x + i) - m, d1 = load4(x + i + 4) - m;
        a += d0 * d0, b += d1 * d1;
    }
    float s = lanes_sum(a, b);
    for (; i < C; i++) s += (x[i] - m) * (x[i] - m);
    return s;
}

void tally_layernorm_forward(float *y, float *mean, float *rstd, const float *x, const float *w, const float *b,
                             size_t n, int C) {
    for (size_t r = 0; r < n; r++) {
        const float *xr = x + r * (size_t)C;
        float *yr = y + r * (size_t)C;
        float m = row_sum(xr, C) / (float)C;
        float s = 1.0f / sqrtf(row_sq_dev(xr, m, C) / (float)C + TALLY_LAYERNORM_EPS);
        for (int i = 0; i < C; i++) yr[i] = (xr[i] - m) * s * w[i] + b[i];
        mean[r] = m;
        rstd[r] = s;
    }
}

/* One row's share of the parameter gradients. */
static void row_param_grads(float *dw, float *db, const float *gr, const float *xr, float m, float s, int C) {
    for (int i = 0; i < C; i++) {
        dw[i] += gr[i] * ((xr[i] - m) * s);
        db[i] += gr[i];
    }
}

static void row_input_grad(float *dr, const float *gr, const float *xr, const float *w, float m, float s, int C) {
    v4f g0 = {0}, g1 = {0}, gx0 = {0}, gx1 = {0};
    int j = 0;
    for (; j + 8 <= C; j += 8) {
        v4f xh0 = (load4(xr + j) - m) * s, xh1 = (load4(xr + j + 4) - m) * s;
        v4f ga = load4(gr + j) * load4(w + j), gb = load4(gr + j + 4) * load4(w + j + 4);
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
    for (int i = 0; i < C; i++) {
        float xhat = (xr[i] - m) * s;
        dr[i] = (gr[i] * w[i] - gsum - xhat * gxsum) * s;
    }
}

void tally_layernorm_backward(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w,
                              const float *mean, const float *rstd, size_t n, int C) {
    for (size_t r = 0; r < n; r++) {
        const float *xr = x + r * (size_t)C, *gr = dy + r * (size_t)C;
        if (dw) row_param_grads(dw, db, gr, xr, mean[r], rstd[r], C);
        if (dx) row_input_grad(dx + r * (size_t)C, gr, xr, w, mean[r], rstd[r], C);
    }
}
