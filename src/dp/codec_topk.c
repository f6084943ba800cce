/* codec_topk.c - top-k sparsification: the k largest magnitudes of gradient plus residual per bucket
 * (error feedback), or of DGC's momentum-corrected accumulation, every rank's (index, value) pairs
 * all-gathered and summed in rank order. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/err.h"
#include "codec_int.h"

/* Geometric from TALLY__DGC_WARMUP_DENSITY to ratio over the warm-up steps (DGC's exponential
 * warm-up: each step keeps a constant fraction of the last one's density). */
double tally__codec_density(const tally__codec *c) {
    double r = c->cfg.ratio;
    if (c->cfg.kind != TALLY__CODEC_DGC || c->cfg.warmup_steps <= 0 || c->steps >= c->cfg.warmup_steps ||
        r >= TALLY__DGC_WARMUP_DENSITY)
        return r;
    double t = (double)c->steps / (double)c->cfg.warmup_steps;
    return TALLY__DGC_WARMUP_DENSITY * pow(r / TALLY__DGC_WARMUP_DENSITY, t);
}

size_t tally__codec_topk_k(const tally__codec *c, size_t n) {
    if (!n) return 0;
    double k = ceil(tally__codec_density(c) * (double)n);
    return k < 1 ? 1 : k > (double)n ? n : (size_t)k;
}

/* |v| as ordered bits (the sign cleared, NaN taken as Inf): unsigned order is magnitude order. */
static inline uint32_t key_of(float v) {
    uint32_t b;
    memcpy(&b, &v, 4);
    b &= 0x7fffffffu;
    return b > 0x7f800000u ? 0x7f800000u : b;
}

/* The k-th largest key of x[0..n) (1 <= k <= n), by radix selection on 11, 11 and 10 bits: a histogram
 * per round and the values of the one bin that holds the k-th kept in cand. No comparisons to
 * mispredict, and many equal values (exact zeros behind a ReLU) cost nothing extra. *ties: how many
 * values equal to it the k largest take (the rest of the k are larger). */
static uint32_t kth_largest_key(const float *x, size_t n, size_t k, uint32_t *cand, size_t *ties) {
    static const int shift[3] = {21, 10, 0};
    static const uint32_t bins[3] = {0x7ff, 0x7ff, 0x3ff};
    uint32_t prefix = 0;
    size_t m = n;
    for (int r = 0; r < 3; r++) {
        size_t hist[2048] = {0}, above = 0;
        int sh = shift[r];
        for (size_t i = 0; i < m; i++) hist[((r ? cand[i] : key_of(x[i])) >> sh) & bins[r]]++;
        uint32_t b = bins[r];
        for (; b > 0 && above + hist[b] < k; b--) above += hist[b];
        k -= above;
        prefix |= b << sh;
        size_t o = 0; /* o <= i: compacting cand in place is safe */
        for (size_t i = 0; i < m; i++) {
            uint32_t u = r ? cand[i] : key_of(x[i]);
            if (((u >> sh) & bins[r]) == b) cand[o++] = u;
        }
        m = o;
    }
    *ties = k;
    return prefix;
}

void tally__topk_select(const float *x, size_t n, size_t k, uint32_t *idx, float *key) {
    if (!k) return;
    if (k >= n) {
        for (size_t i = 0; i < n; i++) idx[i] = (uint32_t)i;
        return;
    }
    size_t ties, o = 0; /* the k-th's equals are taken lowest indices first */
    uint32_t t = kth_largest_key(x, n, k, (uint32_t *)(void *)key, &ties);
    for (size_t i = 0; i < n && o < k; i++) {
        uint32_t u = key_of(x[i]);
        if (u > t || (u == t && ties && ties--)) idx[o++] = (uint32_t)i;
    }
}

int tally__codec_topk_alloc(tally__codec *c) {
    double most = c->cfg.kind == TALLY__CODEC_DGC && c->cfg.warmup_steps > 0 && c->cfg.ratio < TALLY__DGC_WARMUP_DENSITY
                      ? TALLY__DGC_WARMUP_DENSITY
                      : c->cfg.ratio;
    size_t k = (size_t)ceil(most * (double)c->largest) + 1, n = c->largest + 1;
    c->key = malloc(n * sizeof(float));
    c->idx = malloc(k * sizeof(uint32_t));
    c->pairs = malloc(k * 8);
    c->gathered = malloc(k * 8 * (size_t)c->size);
    if (!c->key || !c->idx || !c->pairs || !c->gathered)
        return tally__seterr(TALLY_E_NOMEM, "rank %d: codec topk: out of memory", c->rank);
    if (c->largest > UINT32_MAX)
        return tally__seterr(TALLY_E_INVALID,
                             "rank %d: codec topk: a bucket of %zu elements is past 32-bit "
                             "indices; use a smaller --bucket-mb",
                             c->rank, c->largest);
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

/* The k largest |acc[0..n)| into c->idx, sent as (index, value) pairs, and every rank's summed into grad. */
static int topk_exchange(tally__codec *c, const float *acc, size_t n, size_t k, float *grad) {
    tally__topk_select(acc, n, k, c->idx, c->key);
    for (size_t j = 0; j < k; j++) {
        memcpy(c->pairs + 8 * j, &c->idx[j], 4);
        memcpy(c->pairs + 8 * j + 4, &acc[c->idx[j]], 4);
    }
    int rc = tally_allgather(c->comm, c->pairs, c->gathered, k * 8, TALLY_U8);
    if (!rc) topk_sum(c, grad, n, k);
    return rc;
}

int tally__codec_topk_reduce(tally__codec *c, const codec_bucket *b, float *grad, float denom) {
    size_t n = b->end - b->begin, k = tally__codec_topk_k(c, n);
    if (!n) return 0;
    float *res = c->residual ? c->residual + b->begin : NULL, *next = c->residual ? c->next + b->begin : NULL;
    float *acc = c->acc;
    for (size_t i = 0; i < n; i++) acc[i] = res ? grad[i] + res[i] : grad[i];
    int rc = topk_exchange(c, acc, n, k, grad);
    if (rc) return rc;
    for (size_t i = 0; i < n; i++) grad[i] /= denom;
    if (next) { /* what was not sent waits for the next step; what was sent is exactly gone */
        memcpy(next, acc, n * sizeof(float));
        for (size_t j = 0; j < k; j++) next[c->idx[j]] = 0;
    }
    return 0;
}

/* DGC (Lin et al., 2018): this rank's mean gradient, clipped to its share of --clip (the norm over N
 * ranks' sum grows as sqrt(N): each takes clip / sqrt(N), and a bucket the part of that its elements are
 * of the model), goes through momentum u = m u + g into the accumulation v += u; the k largest |v| are
 * sent, and where they were sent u and v start again from zero (momentum factor masking). The mean of
 * what the ranks sent is the step's update: the optimizer applies it without momentum of its own. */
int tally__codec_dgc_reduce(tally__codec *c, const codec_bucket *b, float *grad, float denom) {
    size_t n = b->end - b->begin, k = tally__codec_topk_k(c, n);
    if (!n) return 0;
    const float *u = c->u + b->begin, *v = c->residual + b->begin;
    float *unext = c->u_next + b->begin, *vnext = c->next + b->begin, *acc = c->acc;
    float to_mean = (float)c->size / denom, m = (float)c->cfg.momentum;
    if (c->cfg.clip > 0) {
        double sq = 0;
        for (size_t i = 0; i < n; i++) sq += (double)grad[i] * grad[i];
        double norm = sqrt(sq) * to_mean, share = (double)n / (double)c->m->nparams;
        double bound = c->cfg.clip * sqrt(share / c->size);
        if (norm > bound) to_mean *= (float)(bound / norm);
    }
    for (size_t i = 0; i < n; i++) {
        unext[i] = m * u[i] + grad[i] * to_mean;
        acc[i] = v[i] + unext[i];
    }
    int rc = topk_exchange(c, acc, n, k, grad);
    if (rc) return rc;
    for (size_t i = 0; i < n; i++) grad[i] /= (float)c->size;
    memcpy(vnext, acc, n * sizeof(float));
    for (size_t j = 0; j < k; j++) vnext[c->idx[j]] = unext[c->idx[j]] = 0;
    return 0;
}
