/* layers_norm.c - LayerNorm over each row's last dimension, forward (keeping the row's mean and
 * reciprocal deviation) and backward, as PyTorch's nn.LayerNorm. */
#include <math.h>
#include <tally/layers.h>

void tally_layernorm_forward(float *y, float *mean, float *rstd, const float *x, const float *w, const float *b,
                             size_t n, int C) {
    for (size_t r = 0; r < n; r++) {
        const float *xr = x + r * (size_t)C;
        float *yr = y + r * (size_t)C;
        float m = 0.0f;
        for (int i = 0; i < C; i++) m += xr[i];
        m /= (float)C;
        float v = 0.0f; /* two passes: the mean first, so the variance does not cancel */
        for (int i = 0; i < C; i++) {
            float d = xr[i] - m;
            v += d * d;
        }
        float s = 1.0f / sqrtf(v / (float)C + TALLY_LAYERNORM_EPS);
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
    float gsum = 0.0f, gxsum = 0.0f;
    for (int i = 0; i < C; i++) {
        float xhat = (xr[i] - m) * s, g = gr[i] * w[i];
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
