/* codec_topk.c - top-k sparsification with error feedback: the k largest magnitudes of gradient plus
 * residual per bucket, every rank's (index, value) pairs all-gathered and summed in rank order. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/err.h"
#include "codec_int.h"

size_t tally__codec_topk_k(const tally__codec *c, size_t n) {
    if (!n) return 0;
    double k = ceil(c->cfg.ratio * (double)n);
    return k < 1 ? 1 : k > (double)n ? n : (size_t)k;
}

static float med3(float a, float b, float c) {
    if (a > b) { float t = a; a = b; b = t; }
    if (b > c) b = c;
    return a > b ? a : b;
}

/* The k-th largest of a[0..n) (1 <= k <= n), rearranging a: quickselect with a three-way partition,
 * as gradients hold many equal values (exact zeros behind a ReLU). */
static float kth_largest(float *a, size_t n, size_t k) {
    size_t lo = 0, hi = n, want = k - 1;
    while (hi - lo > 1) {
        float p = med3(a[lo], a[lo + (hi - lo) / 2], a[hi - 1]);
        size_t lt = lo, i = lo, gt = hi; /* [lo,lt) > p, [lt,gt) == p, [gt,hi) < p */
        while (i < gt) {
            float v = a[i];
            if (v > p) {
                a[i++] = a[lt];
                a[lt++] = v;
            } else if (v < p) {
                a[i] = a[--gt];
                a[gt] = v;
            } else {
                i++;
            }
        }
        if (want < lt)
            hi = lt;
        else if (want >= gt)
            lo = gt;
        else
            return p;
    }
    return a[lo];
}

/* A total order makes the chosen set independent of how it was found: magnitude, then lower index. */
static float mag(float v) { return isnan(v) ? INFINITY : fabsf(v); }

void tally__topk_select(const float *x, size_t n, size_t k, uint32_t *idx, float *key) {
    if (!k) return;
    if (k >= n) {
        for (size_t i = 0; i < n; i++) idx[i] = (uint32_t)i;
        return;
    }
    for (size_t i = 0; i < n; i++) key[i] = mag(x[i]);
    float t = kth_largest(key, n, k);
    size_t above = 0;
    for (size_t i = 0; i < n; i++) above += mag(x[i]) > t;
    size_t ties = k - above, o = 0;
    for (size_t i = 0; i < n && o < k; i++) {
        float m = mag(x[i]);
        if (m > t || (m == t && ties && ties--)) idx[o++] = (uint32_t)i;
    }
}

int tally__codec_topk_alloc(tally__codec *c) {
    size_t k = tally__codec_topk_k(c, c->largest) + 1, n = c->largest + 1;
    c->key = malloc(n * sizeof(float));
    c->idx = malloc(k * sizeof(uint32_t));
    c->pairs = malloc(k * 8);
    c->gathered = malloc(k * 8 * (size_t)c->size);
    if (!c->key || !c->idx || !c->pairs || !c->gathered)
        return tally__seterr(TALLY_E_NOMEM, "rank %d: codec topk: out of memory", c->rank);
    if (c->largest > UINT32_MAX)
        return tally__seterr(TALLY_E_INVALID, "rank %d: codec topk: a bucket of %zu elements is past 32-bit "
                             "indices; use a smaller --bucket-mb", c->rank, c->largest);
    return 0;
}

/* Every rank's pairs added into the zeroed bucket in rank order: the same sums on every replica. */
static void topk_sum(tally__codec *c, float *grad, size_t n, size_t k) {
    memset(grad, 0, n * sizeof(float));
    for (int r = 0; r < c->size; r++) {
        const unsigned char *p = c->gathered + (size_t)r * k * 8;
        for (size_t j = 0; j < k; j++) {
            uint32_t i;
            float v;
            memcpy(&i, p + 8 * j, 4);
            memcpy(&v, p + 8 * j + 4, 4);
            if (i < n) grad[i] += v;
        }
    }
}

int tally__codec_topk_reduce(tally__codec *c, const codec_bucket *b, float *grad, float denom) {
    size_t n = b->end - b->begin, k = tally__codec_topk_k(c, n);
    if (!n) return 0;
    float *res = c->residual ? c->residual + b->begin : NULL, *acc = c->acc;
    for (size_t i = 0; i < n; i++) acc[i] = res ? grad[i] + res[i] : grad[i];
    tally__topk_select(acc, n, k, c->idx, c->key);
    for (size_t j = 0; j < k; j++) {
        memcpy(c->pairs + 8 * j, &c->idx[j], 4);
        memcpy(c->pairs + 8 * j + 4, &acc[c->idx[j]], 4);
    }
    int rc = tally_allgather(c->comm, c->pairs, c->gathered, k * 8, TALLY_U8);
    if (rc) return rc;
    topk_sum(c, grad, n, k);
    for (size_t i = 0; i < n; i++) grad[i] /= denom;
    if (res) { /* what was not sent waits for the next step; what was sent is exactly gone */
        memcpy(res, acc, n * sizeof(float));
        for (size_t j = 0; j < k; j++) res[c->idx[j]] = 0;
    }
    return 0;
}
