/* buckets.c - gradient buckets: the layout (whole layers, last first, closed at a size), which are ready,
 * the order they leave in (index order, the same on every rank), and a bucket's plain reduction. */
#include "buckets.h"

#include <stdlib.h>
#include <string.h>

#include "../core/err.h"
#include "../core/trace.h"

int tally__buckets_init(tally__buckets *B, const size_t *off, int nlayers, size_t elems) {
    memset(B, 0, sizeof *B);
    B->nlayers = nlayers;
    B->b = calloc((size_t)nlayers, sizeof *B->b);
    B->layer_bucket = calloc((size_t)nlayers, sizeof *B->layer_bucket);
    B->layer_ready = calloc((size_t)nlayers, 1);
    if (!B->b || !B->layer_bucket || !B->layer_ready)
        return tally__seterr(TALLY_E_NOMEM, "out of memory for the gradient buckets of %d layers", nlayers);
    int k = -1;
    for (int l = nlayers - 1; l >= 0; l--) {
        if (k < 0 || B->b[k].end - B->b[k].begin >= elems) {
            k++;
            B->b[k].end = off[l + 1];
            B->b[k].last = l;
        }
        B->b[k].begin = off[l];
        B->b[k].layers++;
        B->layer_bucket[l] = k;
    }
    B->n = k + 1;
    return 0;
}

void tally__buckets_free(tally__buckets *B) {
    free(B->b);
    free(B->layer_bucket);
    free(B->layer_ready);
    memset(B, 0, sizeof *B);
}

void tally__buckets_begin(tally__buckets *B) {
    for (int k = 0; k < B->n; k++) B->b[k].remaining = B->b[k].layers;
    memset(B->layer_ready, 0, (size_t)B->nlayers);
    B->next = 0;
}

void tally__buckets_ready(tally__buckets *B, int layer) {
    if (B->layer_ready[layer]) return;
    B->layer_ready[layer] = 1;
    B->b[B->layer_bucket[layer]].remaining--;
}

void tally__buckets_all_ready(tally__buckets *B) {
    for (int l = B->nlayers - 1; l >= 0; l--) tally__buckets_ready(B, l);
}

int tally__buckets_next(tally__buckets *B) {
    if (B->next >= B->n || B->b[B->next].remaining) return -1;
    if (tally__trace_on) { /* the moment it could leave: the timeline shows how long it then waited */
        const tally__bucket *b = &B->b[B->next];
        tally__trace_arg args[] = {{"bucket", NULL, B->next}, {"bytes", NULL, (int64_t)((b->end - b->begin) * 4)}};
        uint64_t now = tally__trace_now();
        tally__trace_span("dp", "bucket ready", now, now, args, 2);
    }
    return B->next++;
}

/* Summed, then divided into a mean over ranks and micro-batches; or the reducer's own. */
static int bucket_reduce(void *ctx, int k, int unused) {
    tally__bucket_reducer *R = ctx;
    const tally__bucket *b = &R->B->b[k];
    float *g = R->grad + b->begin;
    size_t n = b->end - b->begin;
    if (R->reduce) return R->reduce(R->reduce_arg, R->comm, k, g, n, R->denom);
    int rc = tally_allreduce(R->comm, g, g, n, TALLY_F32, TALLY_SUM);
    for (size_t i = 0; i < n && !rc; i++) g[i] /= R->denom;
    return rc;
}

long tally__buckets_post(tally__post *q, tally__bucket_reducer *R, int k) {
    if (R->reduce || R->accum > 1) return tally__post_fn(q, bucket_reduce, R, k, 0, TALLY__POST_GRAD);
    const tally__bucket *b = &R->B->b[k];
    float *g = R->grad + b->begin;
    tally__call a = {.coll = TALLY__ALLREDUCE,
                     .send = g,
                     .recv = g,
                     .count = b->end - b->begin,
                     .t = TALLY_F32,
                     .op = TALLY_AVG,
                     .root = -1};
    return tally__post_call(q, &a, TALLY__POST_GRAD);
}
