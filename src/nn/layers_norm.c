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

void tally_layernorm_backward(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w,
                              const float *mean, const float *rstd, size_t n, int C) {
    for (size_t r = 0; r < n; r++) {
        const float *xr = x + r * (size_t)C, *gr = dy + r * (size_t)C;
        float m = mean[r], s = rstd[r], gsum = 0.0f, gxsum = 0.0f;
        for (int i = 0; i < C; i++) {
            float xhat = (xr[i] - m) * s, g = gr[i] * w[i];
            gsum += g;
            gxsum += g * xhat;
            dw[i] += gr[i] * xhat;
            db[i] += gr[i];
        }
        gsum /= (float)C;
        gxsum /= (float)C;
        if (!dx) continue;
        float *dr = dx + r * (size_t)C;
        for (int i = 0; i < C; i++) {
            float xhat = (xr[i] - m) * s;
            dr[i] = (gr[i] * w[i] - gsum - xhat * gxsum) * s;
        }
    }
}
