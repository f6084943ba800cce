/* test_layers.c - every layer of tally/layers.h against naive double-precision references (forward),
 * central finite differences (backward), accumulation into dw/db, dx == NULL, and odd shapes. */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tally/layers.h>

#include "harness.h"
#include "ref_check.h"

/* ---- linear ---- */

static void ref_linear(double *y, const double *x, const double *w, const double *b, int B, int in, int out) {
    for (int i = 0; i < B; i++)
        for (int o = 0; o < out; o++) {
            double s = b[o];
            for (int k = 0; k < in; k++) s += x[(size_t)i * in + k] * w[(size_t)o * in + k];
            y[(size_t)i * out + o] = s;
        }
}

static void ref_linear_back(double *dx, double *dw, double *db, const double *g, const double *x, const double *w,
                            int B, int in, int out) {
    for (int i = 0; i < B; i++)
        for (int o = 0; o < out; o++) {
            double go = g[(size_t)i * out + o];
            db[o] += go;
            for (int k = 0; k < in; k++) {
                dx[(size_t)i * in + k] += go * w[(size_t)o * in + k];
                dw[(size_t)o * in + k] += go * x[(size_t)i * in + k];
            }
        }
}

typedef struct lin_ctx {
    int B, in, out;
    double *x, *w, *b, *g, *y;
} lin_ctx;

static double lin_loss(void *p) {
    lin_ctx *c = p;
    ref_linear(c->y, c->x, c->w, c->b, c->B, c->in, c->out);
    return dot(c->y, c->g, (size_t)c->B * c->out);
}

static void test_linear(int B, int in, int out, int fd) {
    char tag[96];
    size_t nx = (size_t)B * in, nw = (size_t)out * in, ny = (size_t)B * out;
    float *x = frand(nx, -1, 1), *w = frand(nw, -1, 1), *b = frand(out, -1, 1), *g = frand(ny, -1, 1);
    lin_ctx c = {B, in, out, widen(x, nx), widen(w, nw), widen(b, out), widen(g, ny), dalloc(ny)};

    float *y = ffill(ny, NAN);
    tally_linear_forward(y, x, w, b, B, in, out);
    ref_linear(c.y, c.x, c.w, c.b, B, in, out);
    snprintf(tag, sizeof tag, "linear %dx%d->%d forward", B, in, out);
    check_close(tag, y, c.y, ny, TOL_F);

    double *rdx = dalloc(nx), *rdw = dalloc(nw), *rdb = dalloc(out);
    ref_linear_back(rdx, rdw, rdb, c.g, c.x, c.w, B, in, out);
    float *dx = ffill(nx, NAN), *dw = ffill(nw, 0), *db = ffill(out, 0);
    tally_linear_backward(dx, dw, db, g, x, w, B, in, out);
    snprintf(tag, sizeof tag, "linear %dx%d->%d backward", B, in, out);
    check_close(tag, dx, rdx, nx, TOL_F);
    check_close(tag, dw, rdw, nw, TOL_F);
    check_close(tag, db, rdb, out, TOL_F);
    if (fd) {
        snprintf(tag, sizeof tag, "linear %dx%d->%d finite differences", B, in, out);
        fd_check(tag, dx, c.x, nx, lin_loss, &c);
        fd_check(tag, dw, c.w, nw, lin_loss, &c);
        fd_check(tag, db, c.b, out, lin_loss, &c);
    }

    /* A second call adds the same gradients again; dx is overwritten, not added to. */
    double *rdw2 = scaled(rdw, nw, 2), *rdb2 = scaled(rdb, out, 2);
    tally_linear_backward(dx, dw, db, g, x, w, B, in, out);
    snprintf(tag, sizeof tag, "linear %dx%d->%d accumulate", B, in, out);
    check_close(tag, dx, rdx, nx, TOL_F);
    check_close(tag, dw, rdw2, nw, TOL_F);
    check_close(tag, db, rdb2, out, TOL_F);

    /* The two halves alone (ZeRO-3 takes dx, then reuses w's memory for dw): the parameter half
     * never reads w, the input half leaves dw and db alone; each gives the full call's bits. */
    float *dw0 = ffill(nw, 0), *db0 = ffill(out, 0), *dx0 = ffill(nx, NAN);
    tally_linear_backward(NULL, dw0, db0, g, x, NULL, B, in, out);
    snprintf(tag, sizeof tag, "linear %dx%d->%d dx=NULL", B, in, out);
    check_close(tag, dw0, rdw, nw, TOL_F);
    check_close(tag, db0, rdb, out, TOL_F);
    tally_linear_backward(dx0, NULL, db0, g, x, w, B, in, out);
    TH_CHECK(!memcmp(dx0, dx, nx * sizeof *dx), "%s dw=NULL: dx differs from the full call's", tag);
    check_close(tag, db0, rdb, out, TOL_F);
    free(dx0);

    free(x), free(w), free(b), free(g), free(y), free(dx), free(dw), free(db), free(dw0), free(db0);
    free(c.x), free(c.w), free(c.b), free(c.g), free(c.y);
    free(rdx), free(rdw), free(rdb), free(rdw2), free(rdb2);
}

/* ---- relu ---- */

typedef struct relu_ctx {
    size_t n;
    double *x, *g;
} relu_ctx;

static double relu_loss(void *p) {
    relu_ctx *c = p;
    double s = 0;
    for (size_t i = 0; i < c->n; i++) s += (c->x[i] > 0 ? c->x[i] : 0) * c->g[i];
    return s;
}

static void test_relu(size_t n, int fd) {
    char tag[64];
    snprintf(tag, sizeof tag, "relu n=%zu", n);
    float *x = frand(n, -1, 1), *g = frand(n, -1, 1);
    /* Keep away from the kink, so a difference of +-EPS_FD never crosses zero. */
    for (size_t i = 0; i < n; i++)
        if (fabsf(x[i]) < 0.01f) x[i] = x[i] < 0 ? -0.01f - x[i] : 0.01f + x[i];
    relu_ctx c = {n, widen(x, n), widen(g, n)};
    double *ry = dalloc(n), *rdx = dalloc(n);
    for (size_t i = 0; i < n; i++) {
        ry[i] = x[i] > 0 ? x[i] : 0;
        rdx[i] = x[i] > 0 ? g[i] : 0;
    }
    float *y = ffill(n, NAN), *dx = ffill(n, NAN);
    tally_relu_forward(y, x, n);
    check_close(tag, y, ry, n, 0);
    tally_relu_backward(dx, g, y, n);
    check_close(tag, dx, rdx, n, 0);
    if (fd) fd_check(tag, dx, c.x, n, relu_loss, &c);

    /* In place, as a model that saves memory calls it. */
    float *io = falloc(n);
    memcpy(io, x, n * sizeof *io);
    tally_relu_forward(io, io, n);
    check_close(tag, io, ry, n, 0);
    memcpy(dx, g, n * sizeof *dx);
    tally_relu_backward(dx, dx, y, n);
    check_close(tag, dx, rdx, n, 0);

    free(x), free(g), free(y), free(dx), free(io), free(c.x), free(c.g), free(ry), free(rdx);
}

/* A NaN passes through forward (PyTorch's rule, so divergence shows) in the vector body and the
 * tail alike; backward gives it no gradient. */
static void test_relu_nan(void) {
    float x[6] = {NAN, -0.0f, 1, -1, 2, NAN}, y[6], dy[6] = {1, 1, 1, 1, 1, 1}, dx[6];
    tally_relu_forward(y, x, 6);
    tally_relu_backward(dx, dy, y, 6);
    TH_CHECK(isnan(y[0]) && isnan(y[5]) && y[1] == 0 && y[2] == 1 && y[3] == 0 && y[4] == 2,
             "relu: NaN must propagate, negatives map to 0");
    TH_CHECK(dx[0] == 0 && dx[1] == 0 && dx[2] == 1 && dx[3] == 0 && dx[4] == 1 && dx[5] == 0,
             "relu backward: gradient only where y > 0");
}

/* ---- softmax + cross-entropy ---- */

typedef struct xent_ctx {
    int B, C;
    double *z, *p;
    const int32_t *labels;
} xent_ctx;

/* Mean loss in double; also the probabilities into c->p. */
static double xent_loss(void *ctx) {
    xent_ctx *c = ctx;
    double loss = 0;
    for (int i = 0; i < c->B; i++) {
        const double *z = c->z + (size_t)i * c->C;
        double m = z[0], s = 0;
        for (int j = 1; j < c->C; j++) m = fmax(m, z[j]);
        for (int j = 0; j < c->C; j++) s += exp(z[j] - m);
        for (int j = 0; j < c->C; j++) c->p[(size_t)i * c->C + j] = exp(z[j] - m) / s;
        loss += log(s) - (z[c->labels[i]] - m);
    }
    return loss / c->B;
}

typedef struct xent32_ctx {
    int B, C;
    float *z, *p;
    const int32_t *labels;
} xent32_ctx;

/* Central differences of the float loss the layer itself returns, perturbing float logits. */
static void xent_fd32(const char *tag, const float *dz, xent32_ctx *c) {
    size_t n = (size_t)c->B * c->C;
    double *want = dalloc(n);
    for (size_t i = 0; i < n; i++) {
        float save = c->z[i];
        c->z[i] = save + EPS_FD32;
        double lp = tally_softmax_xent_forward(c->p, c->z, c->labels, c->B, c->C);
        c->z[i] = save - EPS_FD32;
        double lm = tally_softmax_xent_forward(c->p, c->z, c->labels, c->B, c->C);
        c->z[i] = save;
        want[i] = (lp - lm) / (2.0 * EPS_FD32);
    }
    check_close(tag, dz, want, n, TOL_FD32);
    free(want);
}

static void test_xent(int B, int C, float spread, int fd) {
    char tag[64];
    snprintf(tag, sizeof tag, "softmax_xent %dx%d spread %g", B, C, spread);
    size_t n = (size_t)B * C;
    float *z = frand(n, -spread, spread), *p = ffill(n, NAN), *dz = ffill(n, NAN);
    int32_t *labels = malloc(B * sizeof *labels);
    for (int i = 0; i < B; i++) labels[i] = (int32_t)tally__rng_below(&rng, C);
    xent_ctx c = {B, C, widen(z, n), dalloc(n), labels};
    double want = xent_loss(&c);
    float loss = tally_softmax_xent_forward(p, z, labels, B, C);
    TH_CHECK(isfinite(loss) && fabs(loss - want) <= TOL_F * fmax(1, fabs(want)), "%s: loss %.9g want %.9g", tag, loss,
             want);
    check_close(tag, p, c.p, n, TOL_F);

    double *rdz = dalloc(n);
    for (int i = 0; i < B; i++) {
        for (int j = 0; j < C; j++) rdz[(size_t)i * C + j] = c.p[(size_t)i * C + j] / B;
        rdz[(size_t)i * C + labels[i]] -= 1.0 / B;
    }
    tally_softmax_xent_backward(dz, p, labels, B, C);
    check_close(tag, dz, rdz, n, TOL_F);
    if (fd) {
        fd_check(tag, dz, c.z, n, xent_loss, &c);
        xent32_ctx c32 = {B, C, z, falloc(n), labels};
        xent_fd32(tag, dz, &c32);
        free(c32.p);
    }
    free(z), free(p), free(dz), free(labels), free(c.z), free(c.p), free(rdz);
}

/* Logits far apart: nothing overflows, and the label's probability underflowing to 0 still gives
 * its exact (large, finite) loss. */
static void test_xent_extreme(void) {
    float z[6] = {1000, -1000, 0, 88.8f, -200, 30};
    int32_t labels[2] = {1, 2};
    float p[6], dz[6];
    float loss = tally_softmax_xent_forward(p, z, labels, 2, 3);
    double lse1 = (double)88.8f + log1p(exp(-200.0 - 88.8f) + exp(30.0 - 88.8f));
    double want = (2000.0 + lse1 - 30.0) / 2;
    TH_CHECK(isfinite(loss) && fabs(loss - want) <= TOL_F * want, "xent extreme: loss %.9g want %.9g", loss, want);
    int finite = 1;
    for (int i = 0; i < 6; i++) finite &= isfinite(p[i]) && p[i] >= 0 && p[i] <= 1;
    tally_softmax_xent_backward(dz, p, labels, 2, 3);
    for (int i = 0; i < 6; i++) finite &= isfinite(dz[i]);
    TH_CHECK(finite, "xent extreme: probabilities or gradients not finite");
    TH_CHECK(p[0] == 1.0f && dz[1] == -0.5f, "xent extreme: p0 %g dz1 %g", p[0], dz[1]);
}

/* ---- mse ---- */

typedef struct mse_ctx {
    int B, D;
    double *pred, *target;
} mse_ctx;

static double mse_loss(void *ctx) {
    mse_ctx *c = ctx;
    double s = 0;
    for (size_t i = 0; i < (size_t)c->B * c->D; i++) s += (c->pred[i] - c->target[i]) * (c->pred[i] - c->target[i]);
    return 0.5 * s / c->B;
}

static void test_mse(int B, int D, int fd) {
    char tag[64];
    snprintf(tag, sizeof tag, "mse %dx%d", B, D);
    size_t n = (size_t)B * D;
    float *pred = frand(n, -2, 2), *target = frand(n, -2, 2), *dp = ffill(n, NAN);
    mse_ctx c = {B, D, widen(pred, n), widen(target, n)};
    double want = mse_loss(&c);
    float loss = tally_mse_forward(pred, target, B, D);
    TH_CHECK(fabs(loss - want) <= TOL_F * fmax(1, want), "%s: loss %.9g want %.9g", tag, loss, want);
    double *rdp = dalloc(n);
    for (size_t i = 0; i < n; i++) rdp[i] = (c.pred[i] - c.target[i]) / B;
    tally_mse_backward(dp, pred, target, B, D);
    check_close(tag, dp, rdp, n, TOL_F);
    if (fd) {
        fd_check(tag, dp, c.pred, n, mse_loss, &c);
        double *want32 = dalloc(n);
        for (size_t i = 0; i < n; i++) {
            float save = pred[i];
            pred[i] = save + EPS_FD32;
            double lp = tally_mse_forward(pred, target, B, D);
            pred[i] = save - EPS_FD32;
            double lm = tally_mse_forward(pred, target, B, D);
            pred[i] = save;
            want32[i] = (lp - lm) / (2.0 * EPS_FD32);
        }
        check_close(tag, dp, want32, n, TOL_FD32);
        free(want32);
    }
    free(pred), free(target), free(dp), free(c.pred), free(c.target), free(rdp);
}

/* ---- conv2d ---- */

typedef struct conv_ctx {
    tally_conv2d_shape s;
    int B, OH, OW;
    double *x, *w, *b, *g, *y;
} conv_ctx;

/* Visits every (image, out channel, out pixel, in channel, kernel offset) whose input is inside
 * the image, i.e. every product of the convolution; padding contributes nothing. */
#define CONV_FOR_EACH(c, body)                                                                                         \
    for (int n = 0; n < (c)->B; n++)                                                                                   \
        for (int k = 0; k < (c)->s.K; k++)                                                                             \
            for (int oh = 0; oh < (c)->OH; oh++)                                                                       \
                for (int ow = 0; ow < (c)->OW; ow++)                                                                   \
                    for (int ch = 0; ch < (c)->s.C; ch++)                                                              \
                        for (int kh = 0; kh < (c)->s.R; kh++)                                                          \
                            for (int kw = 0; kw < (c)->s.R; kw++) {                                                    \
                                int ih = oh * (c)->s.stride + kh - (c)->s.pad;                                         \
                                int iw = ow * (c)->s.stride + kw - (c)->s.pad;                                         \
                                if (ih < 0 || ih >= (c)->s.H || iw < 0 || iw >= (c)->s.W) continue;                    \
                                size_t yi = (((size_t)n * (c)->s.K + k) * (c)->OH + oh) * (c)->OW + ow;                \
                                size_t xi = (((size_t)n * (c)->s.C + ch) * (c)->s.H + ih) * (c)->s.W + iw;             \
                                size_t wi = (((size_t)k * (c)->s.C + ch) * (c)->s.R + kh) * (c)->s.R + kw;             \
                                body;                                                                                  \
                            }

static void ref_conv(conv_ctx *c) {
    size_t plane = (size_t)c->OH * c->OW;
    for (size_t i = 0; i < (size_t)c->B * c->s.K * plane; i++) c->y[i] = c->b[(i / plane) % c->s.K];
    CONV_FOR_EACH(c, c->y[yi] += c->x[xi] * c->w[wi]);
}

static void ref_conv_back(conv_ctx *c, double *dx, double *dw, double *db) {
    size_t plane = (size_t)c->OH * c->OW;
    for (size_t i = 0; i < (size_t)c->B * c->s.K * plane; i++) db[(i / plane) % c->s.K] += c->g[i];
    CONV_FOR_EACH(c, {
        dx[xi] += c->g[yi] * c->w[wi];
        dw[wi] += c->g[yi] * c->x[xi];
    });
}

static double conv_loss(void *p) {
    conv_ctx *c = p;
    ref_conv(c);
    return dot(c->y, c->g, (size_t)c->B * c->s.K * c->OH * c->OW);
}

static void test_conv(tally_conv2d_shape s, int B, int fd) {
    char tag[128];
    int OH = tally_conv2d_out_h(&s), OW = tally_conv2d_out_w(&s);
    snprintf(tag, sizeof tag, "conv B%d C%d %dx%d K%d R%d s%d p%d", B, s.C, s.H, s.W, s.K, s.R, s.stride, s.pad);
    TH_CHECK(OH == (s.H + 2 * s.pad - s.R) / s.stride + 1 && OW == (s.W + 2 * s.pad - s.R) / s.stride + 1,
             "%s: out %dx%d", tag, OH, OW);
    size_t nx = (size_t)B * s.C * s.H * s.W, nw = (size_t)s.K * s.C * s.R * s.R, ny = (size_t)B * s.K * OH * OW;
    size_t nscratch = tally_conv2d_scratch_floats(&s, B);
    float *x = frand(nx, -1, 1), *w = frand(nw, -1, 1), *b = frand(s.K, -1, 1), *g = frand(ny, -1, 1);
    float *scratch = ffill(nscratch, NAN); /* nothing may be read from scratch before it is written */
    conv_ctx c = {s, B, OH, OW, widen(x, nx), widen(w, nw), widen(b, s.K), widen(g, ny), dalloc(ny)};

    float *y = ffill(ny, NAN);
    tally_conv2d_forward(y, x, w, b, &s, B, scratch);
    ref_conv(&c);
    check_close(tag, y, c.y, ny, TOL_F);
    if (B > 1) { /* scratch sized for B serves a smaller last batch */
        float *y_small = ffill(ny, NAN);
        tally_conv2d_forward(y_small, x, w, b, &s, B - 1, scratch);
        check_close(tag, y_small, c.y, ny / B * (B - 1), TOL_F);
        free(y_small);
    }

    double *rdx = dalloc(nx), *rdw = dalloc(nw), *rdb = dalloc(s.K);
    ref_conv_back(&c, rdx, rdw, rdb);
    float *dx = ffill(nx, NAN), *dw = ffill(nw, 0), *db = ffill(s.K, 0);
    for (size_t i = 0; i < nscratch; i++) scratch[i] = NAN;
    tally_conv2d_backward(dx, dw, db, g, x, w, &s, B, scratch);
    check_close(tag, dx, rdx, nx, TOL_F);
    check_close(tag, dw, rdw, nw, TOL_F);
    check_close(tag, db, rdb, s.K, TOL_F);
    if (fd) {
        fd_check(tag, dx, c.x, nx, conv_loss, &c);
        fd_check(tag, dw, c.w, nw, conv_loss, &c);
        fd_check(tag, db, c.b, s.K, conv_loss, &c);
    }

    double *rdw2 = scaled(rdw, nw, 2), *rdb2 = scaled(rdb, s.K, 2);
    tally_conv2d_backward(dx, dw, db, g, x, w, &s, B, scratch);
    check_close(tag, dx, rdx, nx, TOL_F);
    check_close(tag, dw, rdw2, nw, TOL_F);
    check_close(tag, db, rdb2, s.K, TOL_F);

    float *dw0 = ffill(nw, 0), *db0 = ffill(s.K, 0), *dx0 = ffill(nx, NAN);
    tally_conv2d_backward(NULL, dw0, db0, g, x, NULL, &s, B, scratch); /* w is not read */
    check_close(tag, dw0, rdw, nw, TOL_F);
    check_close(tag, db0, rdb, s.K, TOL_F);
    tally_conv2d_backward(dx0, NULL, db0, g, x, w, &s, B, scratch); /* dx alone: db left as it was */
    TH_CHECK(!memcmp(dx0, dx, nx * sizeof *dx), "%s dw=NULL: dx differs from the full call's", tag);
    check_close(tag, db0, rdb, s.K, TOL_F);
    free(dx0);

    free(x), free(w), free(b), free(g), free(scratch), free(y), free(dx), free(dw), free(db), free(dw0), free(db0);
    free(c.x), free(c.w), free(c.b), free(c.g), free(c.y), free(rdx), free(rdw), free(rdb), free(rdw2), free(rdb2);
}

/* ---- max pool ---- */

typedef struct pool_ctx {
    int B, C, H, W, k;
    double *x, *g;
} pool_ctx;

/* The reference winner of one window: the first maximum in row-major order. */
static size_t ref_argmax(const double *plane, int W, int k, int oh, int ow) {
    size_t best = (size_t)oh * k * W + ow * k;
    for (int i = 0; i < k; i++)
        for (int j = 0; j < k; j++) {
            size_t at = (size_t)(oh * k + i) * W + ow * k + j;
            if (plane[at] > plane[best]) best = at;
        }
    return best;
}

static double pool_loss(void *p) {
    pool_ctx *c = p;
    int OH = c->H / c->k, OW = c->W / c->k;
    double s = 0;
    for (size_t pl = 0; pl < (size_t)c->B * c->C; pl++)
        for (int oh = 0; oh < OH; oh++)
            for (int ow = 0; ow < OW; ow++) {
                const double *plane = c->x + pl * c->H * c->W;
                s += plane[ref_argmax(plane, c->W, c->k, oh, ow)] * c->g[(pl * OH + oh) * OW + ow];
            }
    return s;
}

/* Distinct values 0.01 apart in random order: no ties, and a difference of +-EPS_FD never changes
 * a window's winner. */
static float *distinct_values(size_t n) {
    float *x = falloc(n);
    for (size_t i = 0; i < n; i++) x[i] = (float)((double)i * 0.01 - (double)n * 0.005);
    for (size_t i = n; i > 1; i--) {
        size_t j = tally__rng_below(&rng, i);
        float t = x[i - 1];
        x[i - 1] = x[j], x[j] = t;
    }
    return x;
}

static void test_pool(int B, int C, int H, int W, int k, int fd) {
    char tag[96];
    snprintf(tag, sizeof tag, "maxpool B%d C%d %dx%d k%d", B, C, H, W, k);
    int OH = H / k, OW = W / k;
    size_t nx = (size_t)B * C * H * W, ny = (size_t)B * C * OH * OW;
    float *x = distinct_values(nx), *g = frand(ny, -1, 1), *y = ffill(ny, NAN), *dx = ffill(nx, NAN);
    int32_t *am = malloc((ny ? ny : 1) * sizeof *am);
    pool_ctx c = {B, C, H, W, k, widen(x, nx), widen(g, ny)};
    double *ry = dalloc(ny), *rdx = dalloc(nx);
    size_t bad_argmax = 0;
    tally_maxpool_forward(y, am, x, B, C, H, W, k);
    for (size_t pl = 0; pl < (size_t)B * C; pl++)
        for (int oh = 0; oh < OH; oh++)
            for (int ow = 0; ow < OW; ow++) {
                size_t o = (pl * OH + oh) * OW + ow, a = ref_argmax(c.x + pl * H * W, W, k, oh, ow);
                ry[o] = c.x[pl * H * W + a];
                rdx[pl * H * W + a] = g[o];
                bad_argmax += am[o] != (int32_t)a;
            }
    check_close(tag, y, ry, ny, 0);
    TH_CHECK(bad_argmax == 0, "%s: %zu argmax entries wrong", tag, bad_argmax);
    tally_maxpool_backward(dx, g, am, B, C, H, W, k);
    check_close(tag, dx, rdx, nx, 0);
    if (fd) fd_check(tag, dx, c.x, nx, pool_loss, &c);
    free(x), free(g), free(y), free(dx), free(am), free(c.x), free(c.g), free(ry), free(rdx);
}

/* Ties go to the first element in row-major order, and a NaN wins its window (PyTorch's rules),
 * in the 2x2 vector path (6 windows per row: one group of four plus an overlapping one) and the
 * generic path. */
static void test_pool_ties_nan(void) {
    enum { H = 4, W = 12 };
    for (int k = 2; k <= 3; k++) {
        float x[H * W] = {0}, y[H * W];
        int32_t am[H * W];
        x[2 * W + 2 * k + 1] = NAN; /* window (1, 2) for k = 2; (0, 2) for k = 3 */
        tally_maxpool_forward(y, am, x, 1, 1, H, W, k);
        int OW = W / k, nan_window = k == 2 ? 1 * OW + 2 : 2, ok = 1;
        for (int o = 0; o < (H / k) * OW; o++) {
            int oh = o / OW, ow = o % OW;
            if (o == nan_window)
                ok &= isnan(y[o]) && am[o] == 2 * W + 2 * k + 1;
            else
                ok &= y[o] == 0 && am[o] == oh * k * W + ow * k;
        }
        TH_CHECK(ok, "maxpool k%d: ties must pick the first element, NaN must win", k);
    }
}

/* ---- main ---- */

int main(void) {
    openblas_set_num_threads(1);
    tally__rng_seed(&rng, 20240607, 1);
    int light = th_light(), full = !light;

    int lin[][3] = {{1, 1, 1}, {1, 3, 2}, {3, 5, 7}, {5, 13, 9}, {7, 17, 33}, {2, 9, 4}};
    for (size_t i = 0; i < sizeof lin / sizeof *lin; i++) test_linear(lin[i][0], lin[i][1], lin[i][2], 1);
    test_linear(64, full ? 784 : 100, full ? 512 : 60, 0);
    test_linear(64, 120, 84, 0);
    test_linear(33, 84, 10, 0);
    test_linear(70, 9, 83, 0); /* the bias's column sums: row blocks of 64 and a rest, 64 + 16 + 3 columns */

    size_t relu_n[] = {1, 3, 4, 5, 17, 63};
    for (size_t i = 0; i < sizeof relu_n / sizeof *relu_n; i++) test_relu(relu_n[i], 1);
    test_relu(full ? (size_t)64 * 6 * 784 : 10001, 0);
    test_relu_nan();

    int xent[][2] = {{1, 1}, {1, 2}, {3, 5}, {7, 10}, {2, 33}};
    for (size_t i = 0; i < sizeof xent / sizeof *xent; i++) test_xent(xent[i][0], xent[i][1], 5, 1);
    test_xent(64, 10, 5, 0);
    test_xent(5, 1000, 20, 0);
    test_xent_extreme();

    int mse[][2] = {{1, 1}, {3, 7}, {4, 1}};
    for (size_t i = 0; i < sizeof mse / sizeof *mse; i++) test_mse(mse[i][0], mse[i][1], 1);
    test_mse(64, 10, 0);

    /* {C, H, W, K, R, stride, pad}, batch, finite differences */
    struct {
        tally_conv2d_shape s;
        int B, fd;
    } conv[] = {
        {{1, 1, 1, 1, 1, 1, 0}, 1, 1},                  /* everything 1 */
        {{2, 7, 6, 3, 3, 1, 1}, 2, 1},                  /* H != W, C and K > 1 */
        {{3, 9, 8, 2, 3, 2, 0}, 3, 1},                  /* stride 2 */
        {{2, 8, 11, 3, 5, 2, 2}, 2, 1},                 /* stride 2, pad 2, odd W */
        {{3, 5, 7, 4, 2, 1, 0}, 2, 1},                  /* even kernel */
        {{2, 10, 9, 3, 2, 3, 1}, 2, 1},                 /* stride 3 > R: pixels skipped */
        {{1, 3, 3, 2, 3, 1, 2}, 3, 1},                  /* pad leaves patches all zero at the corners */
        {{1, 28, 28, 6, 5, 1, 2}, full ? 64 : 4, 0},    /* LeNet conv1 */
        {{6, 14, 14, 16, 5, 1, 0}, full ? 64 : 4, 0},   /* LeNet conv2 */
        {{1, 128, 128, 4, 3, 1, 1}, full ? 20 : 19, 0}, /* past the scratch budget: several chunks */
    };
    for (size_t i = 0; i < sizeof conv / sizeof *conv; i++) test_conv(conv[i].s, conv[i].B, conv[i].fd);

    int pool[][5] = {{1, 1, 1, 1, 1},  {1, 1, 2, 2, 2},  {2, 3, 7, 5, 2},   {2, 2, 9, 10, 3},
                     {3, 2, 6, 13, 2}, {1, 1, 5, 16, 2}, {1, 2, 11, 11, 4}, {2, 2, 3, 7, 2}};
    for (size_t i = 0; i < sizeof pool / sizeof *pool; i++)
        test_pool(pool[i][0], pool[i][1], pool[i][2], pool[i][3], pool[i][4], 1);
    test_pool(full ? 64 : 4, 6, 28, 28, 2, 0);
    test_pool(full ? 64 : 4, 16, 10, 10, 2, 0);
    test_pool_ties_nan();

    return th_verdict("test_layers");
}
