/* layers_pool.c - max pooling over k x k windows with stride k (floor mode), remembering each
 * window's winner so backward routes the gradient without rereading the input. */
#include <math.h>
#include <string.h>
#include <tally/layers.h>

#include "simd.h"

/* The first maximum wins ties; a NaN wins and then stays, as in PyTorch, so it propagates. */
static inline int beats(float v, float m) { return (v > m || isnan(v)) && !isnan(m); }

static void pool_plane(float *y, int32_t *am, const float *x, int H, int W, int k) {
    int OH = H / k, OW = W / k;
    for (int oh = 0; oh < OH; oh++) {
        for (int ow = 0; ow < OW; ow++) {
            int best = oh * k * W + ow * k;
            float m = x[best];
            for (int i = 0; i < k; i++) {
                int at = (oh * k + i) * W + ow * k;
                for (int j = 0; j < k; j++)
                    if (beats(x[at + j], m)) {
                        m = x[at + j];
                        best = at + j;
                    }
            }
            y[oh * OW + ow] = m;
            am[oh * OW + ow] = best;
        }
    }
}

/* The 2 x 2 case, four windows at a time with compare-and-select: at the build's -O2 the scalar
 * compares stay branches, which mispredict on every other window of random activations. */
#ifdef __clang__
#define EVENS(a, b) __builtin_shufflevector(a, b, 0, 2, 4, 6)
#define ODDS(a, b)  __builtin_shufflevector(a, b, 1, 3, 5, 7)
#else
#define EVENS(a, b) __builtin_shuffle(a, b, (v4i){0, 2, 4, 6})
#define ODDS(a, b)  __builtin_shuffle(a, b, (v4i){1, 3, 5, 7})
#endif

/* beats() lane by lane, as all-ones / all-zeros masks. */
static inline v4i beats4(v4f v, v4f m) { return ((v > m) | (v != v)) & (m == m); }
static inline v4f pick_f(v4i mask, v4f a, v4f b) { return (v4f)(((v4i)a & mask) | ((v4i)b & ~mask)); }
static inline v4i pick_i(v4i mask, v4i a, v4i b) { return (a & mask) | (b & ~mask); }

/* Output windows ow .. ow+3 of output row oh; candidates go in the scalar order (row-major). */
static void pool4_2x2(float *y, int32_t *am, const float *x, int W, int oh, int ow) {
    int at = 2 * oh * W + 2 * ow;
    v4f a0 = load4(x + at), a1 = load4(x + at + 4), b0 = load4(x + at + W), b1 = load4(x + at + W + 4);
    v4i first = at + (v4i){0, 2, 4, 6}, best = first;
    v4f m = EVENS(a0, a1);
    v4f cand[3] = {ODDS(a0, a1), EVENS(b0, b1), ODDS(b0, b1)};
    int off[3] = {1, W, W + 1};
    for (int t = 0; t < 3; t++) {
        v4i win = beats4(cand[t], m);
        m = pick_f(win, cand[t], m);
        best = pick_i(win, first + off[t], best);
    }
    memcpy(y, &m, sizeof m);
    memcpy(am, &best, sizeof best);
}

static void pool_plane2(float *y, int32_t *am, const float *x, int H, int W) {
    int OH = H / 2, OW = W / 2;
    if (OW < 4) {
        pool_plane(y, am, x, H, W, 2);
        return;
    }
    for (int oh = 0; oh < OH; oh++) {
        float *yr = y + oh * OW;
        int32_t *ar = am + oh * OW;
        int ow = 0;
        for (; ow + 4 <= OW; ow += 4) pool4_2x2(yr + ow, ar + ow, x, W, oh, ow);
        /* The last windows again as one overlapping group of four: recomputing an output is
         * harmless, and it spares a scalar tail its branches. */
        if (ow < OW) pool4_2x2(yr + OW - 4, ar + OW - 4, x, W, oh, OW - 4);
    }
}

void tally_maxpool_forward(float *y, int32_t *argmax, const float *x, int B, int C, int H, int W, int k) {
    size_t in_plane = (size_t)H * W, out_plane = (size_t)(H / k) * (W / k);
    for (size_t p = 0; p < (size_t)B * C; p++) {
        if (k == 2)
            pool_plane2(y + p * out_plane, argmax + p * out_plane, x + p * in_plane, H, W);
        else
            pool_plane(y + p * out_plane, argmax + p * out_plane, x + p * in_plane, H, W, k);
    }
}

void tally_maxpool_backward(float *dx, const float *dy, const int32_t *argmax, int B, int C, int H, int W, int k) {
    size_t in_plane = (size_t)H * W, out_plane = (size_t)(H / k) * (W / k);
    memset(dx, 0, (size_t)B * C * in_plane * sizeof *dx);
    for (size_t p = 0; p < (size_t)B * C; p++) {
        float *d = dx + p * in_plane;
        const float *g = dy + p * out_plane;
        const int32_t *a = argmax + p * out_plane;
        /* Windows never overlap (stride k), so each winner is written at most once. */
        for (size_t o = 0; o < out_plane; o++) d[a[o]] = g[o];
    }
}
