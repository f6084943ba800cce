/* test_layers_gpt.c - the transformer's layers (embedding, LayerNorm, GELU, causal attention) against
 * naive double-precision references, forward and backward; each reference's backward against central
 * finite differences of a random linear functional of its output. Sizes 1, odd, and not multiples of
 * the SIMD width. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tally/layers.h>

#include "harness.h"
#include "nn/attn_int.h"
#include "ref_check.h"

/* ---- LayerNorm ---- */

static void ref_ln(double *y, const double *x, const double *w, const double *b, size_t n, int C) {
    for (size_t r = 0; r < n; r++) {
        const double *xr = x + r * C;
        double m = 0, v = 0;
        for (int i = 0; i < C; i++) m += xr[i];
        m /= C;
        for (int i = 0; i < C; i++) v += (xr[i] - m) * (xr[i] - m);
        double s = 1.0 / sqrt(v / C + TALLY_LAYERNORM_EPS);
        for (int i = 0; i < C; i++) y[r * C + i] = (xr[i] - m) * s * w[i] + b[i];
    }
}

/* L = sum g . y: its gradient with respect to y is g, so backward(g) must match L's differences. */
typedef struct {
    double *x, *w, *b, *g, *y;
    size_t n;
    int C;
} ln_ctx;

static double ln_loss(void *p) {
    ln_ctx *c = p;
    ref_ln(c->y, c->x, c->w, c->b, c->n, c->C);
    return dot(c->y, c->g, c->n * c->C);
}

static void test_layernorm(size_t n, int C) {
    char tag[64];
    snprintf(tag, sizeof tag, "layernorm n=%zu C=%d", n, C);
    size_t nx = n * C;
    float *x = frand(nx, -2, 2), *w = frand(C, 0.5f, 1.5f), *b = frand(C, -0.5f, 0.5f), *g = frand(nx, -1, 1);
    float *y = falloc(nx), *mean = falloc(n), *rstd = falloc(n), *dx = falloc(nx);
    float *dw = ffill(C, 0.25f), *db = ffill(C, -0.5f); /* backward adds into them */
    tally_layernorm_forward(y, mean, rstd, x, w, b, n, C);
    tally_layernorm_backward(dx, dw, db, g, x, w, mean, rstd, n, C);
    ln_ctx c = {widen(x, nx), widen(w, C), widen(b, C), widen(g, nx), dalloc(nx), n, C};
    ln_loss(&c);
    check_close(tag, y, c.y, nx, TOL_F);
    char t2[80];
    snprintf(t2, sizeof t2, "%s dx", tag);
    fd_check(t2, dx, c.x, nx, ln_loss, &c);
    /* dw and db started at 0.25 and -0.5: what backward added is their change */
    for (int i = 0; i < C; i++) dw[i] -= 0.25f, db[i] += 0.5f;
    snprintf(t2, sizeof t2, "%s dw", tag);
    fd_check(t2, dw, c.w, C, ln_loss, &c);
    snprintf(t2, sizeof t2, "%s db", tag);
    fd_check(t2, db, c.b, C, ln_loss, &c);
    /* The halves alone give the full call's bits: dx without touching dw and db, then dw and db
     * without reading w (ZeRO-3 reuses its memory for them) */
    float *dx0 = falloc(nx), *dw0 = ffill(C, 0.25f), *db0 = ffill(C, -0.5f);
    tally_layernorm_backward(dx0, NULL, NULL, g, x, w, mean, rstd, n, C);
    tally_layernorm_backward(NULL, dw0, db0, g, x, NULL, mean, rstd, n, C);
    for (int i = 0; i < C; i++) dw0[i] -= 0.25f, db0[i] += 0.5f;
    TH_CHECK(!memcmp(dx0, dx, nx * sizeof *dx) && !memcmp(dw0, dw, C * sizeof *dw) && !memcmp(db0, db, C * sizeof *db),
             "%s: the halves differ from the full call", tag);
    free(dx0), free(dw0), free(db0);
    free(x), free(w), free(b), free(g), free(y), free(mean), free(rstd), free(dx), free(dw), free(db);
    free(c.x), free(c.w), free(c.b), free(c.g), free(c.y);
}

/* ---- GELU (tanh form) ---- */

static double ref_gelu(double x) { return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }

typedef struct {
    double *x, *g;
    size_t n;
} gelu_ctx;

static double gelu_loss(void *p) {
    gelu_ctx *c = p;
    double s = 0;
    for (size_t i = 0; i < c->n; i++) s += ref_gelu(c->x[i]) * c->g[i];
    return s;
}

static void test_gelu(size_t n) {
    char tag[64];
    snprintf(tag, sizeof tag, "gelu n=%zu", n);
    float *x = frand(n, -5, 5), *g = frand(n, -1, 1), *y = falloc(n), *dx = falloc(n);
    if (n > 2) x[0] = 0.0f, x[1] = -12.0f, x[2] = 12.0f; /* the middle and both saturated ends */
    tally_gelu_forward(y, x, n);
    tally_gelu_backward(dx, g, x, n);
    gelu_ctx c = {widen(x, n), widen(g, n), n};
    double *want = dalloc(n);
    for (size_t i = 0; i < n; i++) want[i] = ref_gelu(c.x[i]);
    check_close(tag, y, want, n, TOL_F);
    fd_check(tag, dx, c.x, n, gelu_loss, &c);
    memcpy(y, g, n * sizeof *y); /* in place: dx == dy */
    tally_gelu_backward(y, y, x, n);
    TH_CHECK(!memcmp(y, dx, n * sizeof *y), "%s: dx == dy in place differs", tag);
    free(x), free(g), free(y), free(dx), free(want), free(c.x), free(c.g);
}

/* ---- causal self-attention ---- */

static void ref_attn(double *y, const double *qkv, int B, int T, int C, int H) {
    int hs = C / H;
    double *s = dalloc(T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < T; i++) {
                const double *q = qkv + ((size_t)b * T + i) * 3 * C + h * hs;
                double m = -INFINITY, sum = 0;
                for (int j = 0; j <= i; j++) {
                    const double *k = qkv + ((size_t)b * T + j) * 3 * C + C + h * hs;
                    s[j] = 0;
                    for (int d = 0; d < hs; d++) s[j] += q[d] * k[d];
                    s[j] /= sqrt(hs);
                    m = fmax(m, s[j]);
                }
                for (int j = 0; j <= i; j++) sum += (s[j] = exp(s[j] - m));
                double *out = y + ((size_t)b * T + i) * C + h * hs;
                for (int d = 0; d < hs; d++) {
                    out[d] = 0;
                    for (int j = 0; j <= i; j++)
                        out[d] += s[j] / sum * qkv[((size_t)b * T + j) * 3 * C + 2 * C + h * hs + d];
                }
            }
    free(s);
}

typedef struct {
    double *qkv, *g, *y;
    int B, T, C, H;
} attn_ctx;

static double attn_loss(void *p) {
    attn_ctx *c = p;
    ref_attn(c->y, c->qkv, c->B, c->T, c->C, c->H);
    return dot(c->y, c->g, (size_t)c->B * c->T * c->C);
}

static void test_attention(int B, int T, int C, int H) {
    char tag[64];
    snprintf(tag, sizeof tag, "attention B=%d T=%d C=%d H=%d", B, T, C, H);
    size_t nq = (size_t)B * T * 3 * C, ny = (size_t)B * T * C, na = (size_t)B * H * T * T;
    float *qkv = frand(nq, -2, 2), *g = frand(ny, -1, 1), *y = falloc(ny), *att = falloc(na);
    float *dqkv = ffill(nq, 7.0f), *scratch = falloc((size_t)T * T); /* dqkv is overwritten, not added to */
    tally_attention_forward(y, att, qkv, B, T, C, H);
    tally_attention_backward(dqkv, scratch, g, qkv, att, B, T, C, H);
    attn_ctx c = {widen(qkv, nq), widen(g, ny), dalloc(ny), B, T, C, H};
    attn_loss(&c);
    check_close(tag, y, c.y, ny, TOL_F);
    int future = 0; /* att keeps the probabilities, the future's 0 and each row summing to 1 */
    double worst_sum = 0;
    for (size_t r = 0; r < (size_t)B * H * T; r++) {
        int i = (int)(r % T);
        double sum = 0;
        for (int j = 0; j < T; j++) {
            sum += att[r * T + j];
            future += j > i && att[r * T + j] != 0.0f;
        }
        worst_sum = fmax(worst_sum, fabs(sum - 1));
    }
    TH_CHECK(!future && worst_sum < 1e-5, "%s: att: %d future entries not 0, row sums off by %g", tag, future,
             worst_sum);
    char t2[80];
    snprintf(t2, sizeof t2, "%s dqkv", tag);
    fd_check(t2, dqkv, c.qkv, nq, attn_loss, &c);
    free(qkv), free(g), free(y), free(att), free(dqkv), free(scratch), free(c.qkv), free(c.g), free(c.y);
}

/* Shapes too large for finite differences: the fused kernels (where this CPU runs them) against the double
 * reference forward and the BLAS way's backward, with head sizes 16-128, T of 1, odd, not a multiple of 4 or 16,
 * and past 128; dqkv starts as garbage, since both overwrite it. */
static void test_attention_ways(int B, int T, int C, int H) {
    char tag[80];
    snprintf(tag, sizeof tag, "attention fused against BLAS B=%d T=%d C=%d H=%d", B, T, C, H);
    if (!tally__attn_fused_fits(T, C / H)) {
        printf("  %s: the fused kernels do not run here (no AVX-512)\n", tag);
        return;
    }
    size_t nq = (size_t)B * T * 3 * C, ny = (size_t)B * T * C, na = (size_t)B * H * T * T;
    float *qkv = frand(nq, -2, 2), *g = frand(ny, -1, 1), *y = falloc(ny), *att = falloc(na);
    float *y2 = falloc(ny), *att2 = falloc(na), *scratch = falloc((size_t)T * T);
    float *dqkv = ffill(nq, 7.0f), *dqkv2 = ffill(nq, -3.0f);
    TH_CHECK(tally__attn_fused_forward(y, att, qkv, B, T, C, H) == 0, "%s: forward ran", tag);
    TH_CHECK(tally__attn_fused_backward(dqkv, scratch, g, qkv, att, B, T, C, H) == 0, "%s: backward ran", tag);
    tally__attn_blas_forward(y2, att2, qkv, B, T, C, H);
    tally__attn_blas_backward(dqkv2, scratch, g, qkv, att2, B, T, C, H);
    double *want = dalloc(ny), *q = widen(qkv, nq);
    ref_attn(want, q, B, T, C, H);
    check_close(tag, y, want, ny, TOL_F);
    double *w2 = widen(att2, na), *w3 = widen(dqkv2, nq);
    char t2[112];
    snprintf(t2, sizeof t2, "%s att", tag);
    check_close(t2, att, w2, na, TOL_F);
    snprintf(t2, sizeof t2, "%s dqkv", tag);
    check_close(t2, dqkv, w3, nq, TOL_F);
    int future = 0;
    for (size_t r = 0; r < (size_t)B * H * T; r++)
        for (int j = (int)(r % T) + 1; j < T; j++) future += att[r * T + j] != 0.0f;
    TH_CHECK(!future, "%s: %d future entries of att not 0", tag, future);
    free(qkv), free(g), free(y), free(att), free(y2), free(att2), free(scratch), free(dqkv), free(dqkv2);
    free(want), free(q), free(w2), free(w3);
}

/* ---- embedding ---- */

static void test_embedding(size_t n, int V, int D) {
    char tag[64];
    snprintf(tag, sizeof tag, "embedding n=%zu V=%d D=%d", n, V, D);
    float *w = frand((size_t)V * D, -1, 1), *y = falloc(n * D), *g = frand(n * D, -1, 1);
    float *dw = ffill((size_t)V * D, 0.5f);
    int32_t *tok = malloc((n ? n : 1) * sizeof *tok);
    for (size_t i = 0; i < n; i++) tok[i] = (int32_t)tally__rng_below(&rng, V > 1 ? V - 1 : 1); /* V-1 unseen */
    TH_CHECK(tally_embedding_forward(y, tok, w, n, V, D) == -1, "%s: a token in range refused", tag);
    tally_embedding_backward(dw, g, tok, n, D);
    double *want_y = dalloc(n * D), *want_dw = dalloc((size_t)V * D);
    for (size_t j = 0; j < (size_t)V * D; j++) want_dw[j] = 0.5;
    for (size_t i = 0; i < n; i++)
        for (int d = 0; d < D; d++) {
            want_y[i * D + d] = w[(size_t)tok[i] * D + d];
            want_dw[(size_t)tok[i] * D + d] += g[i * D + d];
        }
    check_close(tag, y, want_y, n * D, 0);
    check_close(tag, dw, want_dw, (size_t)V * D, TOL_F);
    if (n > 1) {
        tok[n - 1] = -1;
        TH_CHECK(tally_embedding_forward(y, tok, w, n, V, D) == (long)n - 1, "%s: token -1 not refused", tag);
        tok[n - 1] = V;
        TH_CHECK(tally_embedding_forward(y, tok, w, n, V, D) == (long)n - 1, "%s: token V not refused", tag);
    }
    free(w), free(y), free(g), free(dw), free(tok), free(want_y), free(want_dw);
}

int main(void) {
    tally__rng_seed(&rng, 2024, 0);
    size_t ln[][2] = {{1, 1}, {1, 2}, {3, 5}, {2, 17}, {4, 64}, {1, 255}, {3, 333}};
    for (size_t i = 0; i < sizeof ln / sizeof *ln; i++) test_layernorm(ln[i][0], (int)ln[i][1]);
    size_t gelu[] = {1, 3, 7, 9, 33, 1001};
    for (size_t i = 0; i < sizeof gelu / sizeof *gelu; i++) test_gelu(gelu[i]);
    int attn[][4] = {{1, 1, 1, 1},  {1, 3, 2, 2},   {2, 5, 6, 3},  {1, 7, 9, 1},
                     {2, 4, 8, 4},  {1, 17, 12, 2}, {1, 33, 4, 2}, {1, 70, 6, 3},  /* 33, 70: causal blocks of 32 */
                     {1, 1, 16, 1}, {1, 6, 32, 2},  {2, 9, 48, 3}, {1, 5, 64, 1}}; /* head sizes of 16 lanes */
    for (size_t i = 0; i < sizeof attn / sizeof *attn; i++)
        test_attention(attn[i][0], attn[i][1], attn[i][2], attn[i][3]);
    int ways[][4] = {{1, 1, 64, 4},    {2, 37, 64, 4},  {1, 21, 96, 2},   {1, 19, 80, 1},
                     {3, 130, 128, 2}, {1, 64, 384, 3}, {2, 128, 256, 4}, {1, 203, 32, 2}};
    for (size_t i = 0; i < sizeof ways / sizeof *ways; i++)
        test_attention_ways(ways[i][0], ways[i][1], ways[i][2], ways[i][3]);
    size_t emb[][3] = {{0, 3, 2}, {1, 1, 1}, {9, 5, 3}, {64, 7, 17}};
    for (size_t i = 0; i < sizeof emb / sizeof *emb; i++) test_embedding(emb[i][0], (int)emb[i][1], (int)emb[i][2]);
    return th_verdict("test_layers_gpt");
}
