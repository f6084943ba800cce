/* ddp.c - the data-parallel engine: gradient buckets (views into the flat buffer, last layers first),
 * reduced in a fixed order on the communicator's thread (post.c) while backward goes on; averaging. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tally/ddp.h>

#include "../core/clock.h"
#include "../core/err.h"
#include "../core/trace.h"
#include "post.h"

#define DDP_DEFAULT_BUCKET_BYTES (25u << 20)

typedef struct ddp_bucket {
    size_t begin, end; /* elements of grad */
    int layers;        /* layers it holds */
    int remaining;     /* of those, not yet ready in the step in flight */
} ddp_bucket;

struct tally_ddp {
    tally_comm *comm;
    float *grad;
    int size; /* world size */
    int accum;
    int overlap; /* reductions on the communication thread while backward runs */
    int (*reduce)(void *arg, tally_comm *comm, int bucket, float *grad, size_t count, float denom);
    void *reduce_arg; /* the caller's bucket reducer (NULL: plain allreduce) */
    int nlayers, nbuckets;
    int *layer_bucket; /* layer -> bucket */
    unsigned char *layer_ready;
    ddp_bucket *bucket;

    int micro;       /* micro-batch index within the step */
    int begun, sync; /* inside a micro-batch; it is the step's last */
    int posted;      /* buckets of the step in flight handed to the queue (they go in index order) */
    tally__post q;   /* on the communicator's thread (or, without overlap, inline in tally_ddp_wait) */
    double wait_s;
    unsigned long long reductions;
};

/* Bucket k reduced by the caller's reducer, or summed and then divided into a mean over ranks and
 * micro-batches: on the communication thread or on the waiter. */
static int ddp_op_reduce(void *ctx, int k, int unused) {
    tally_ddp *d = ctx;
    const ddp_bucket *b = &d->bucket[k];
    float *g = d->grad + b->begin;
    size_t n = b->end - b->begin;
    const float denom = (float)d->size * (float)d->accum;
    if (d->reduce) return d->reduce(d->reduce_arg, d->comm, k, g, n, denom);
    int rc = tally_allreduce(d->comm, g, g, n, TALLY_F32, TALLY_SUM);
    for (size_t i = 0; i < n && !rc; i++) g[i] /= denom;
    return rc;
}

/* Bucket k handed to the communicator: one averaging allreduce when that is all it takes. */
static long ddp_post_bucket(tally_ddp *d, int k) {
    if (d->reduce || d->accum > 1) return tally__post_fn(&d->q, ddp_op_reduce, k, 0, TALLY__POST_GRAD);
    float *g = d->grad + d->bucket[k].begin;
    tally__call a = {TALLY__ALLREDUCE, g, g, d->bucket[k].end - d->bucket[k].begin, TALLY_F32, TALLY_AVG, -1};
    return tally__post_call(&d->q, &a, TALLY__POST_GRAD);
}

static int ddp_check_layout(const size_t *off, int nlayers, size_t count) {
    if (!off || nlayers < 1) return tally__seterr(TALLY_E_INVALID, "tally_ddp_create: need at least one layer");
    if (off[0] != 0 || off[nlayers] != count)
        return tally__seterr(TALLY_E_INVALID,
                             "tally_ddp_create: offsets must run from 0 to count (%zu); got %zu .. %zu", count, off[0],
                             off[nlayers]);
    for (int i = 0; i < nlayers; i++)
        if (off[i + 1] < off[i])
            return tally__seterr(TALLY_E_INVALID, "tally_ddp_create: offsets decrease at layer %d (%zu > %zu)", i,
                                 off[i], off[i + 1]);
    return 0;
}

/* Whole layers from the last one backwards, a bucket closed once it reaches the byte budget. */
static int ddp_make_buckets(tally_ddp *d, const size_t *off, size_t bucket_elems) {
    d->bucket = calloc((size_t)d->nlayers, sizeof *d->bucket);
    d->layer_bucket = calloc((size_t)d->nlayers, sizeof *d->layer_bucket);
    d->layer_ready = calloc((size_t)d->nlayers, 1);
    if (!d->bucket || !d->layer_bucket || !d->layer_ready)
        return tally__seterr(TALLY_E_NOMEM, "tally_ddp_create: out of memory");
    int k = -1;
    for (int l = d->nlayers - 1; l >= 0; l--) {
        if (k < 0 || d->bucket[k].end - d->bucket[k].begin >= bucket_elems) {
            k++;
            d->bucket[k].end = off[l + 1];
        }
        d->bucket[k].begin = off[l];
        d->bucket[k].layers++;
        d->layer_bucket[l] = k;
    }
    d->nbuckets = k + 1;
    return 0;
}

TALLY_API int tally_ddp_create(tally_comm *comm, float *grad, size_t count, const size_t *offsets, int nlayers,
                               const tally_ddp_opts *opts, tally_ddp **out) {
    tally__clearerr();
    if (!out || !comm || (!grad && count))
        return tally__seterr(TALLY_E_INVALID, "tally_ddp_create: comm, grad and out must not be NULL");
    *out = NULL;
    int rc = ddp_check_layout(offsets, nlayers, count);
    if (rc) return rc;
    tally_ddp_opts o = opts ? *opts : (tally_ddp_opts){0};
    if (o.accum < 0) return tally__seterr(TALLY_E_INVALID, "tally_ddp_create: accum %d is negative", o.accum);
    tally_ddp *d = calloc(1, sizeof *d);
    if (!d) return tally__seterr(TALLY_E_NOMEM, "tally_ddp_create: out of memory");
    d->comm = comm;
    d->grad = grad;
    d->size = tally_comm_size(comm);
    d->accum = o.accum ? o.accum : 1;
    d->overlap = !o.no_overlap && d->size > 1;
    d->reduce = o.reduce;
    d->reduce_arg = o.reduce_arg;
    d->nlayers = nlayers;
    size_t bucket_bytes = o.bucket_bytes ? o.bucket_bytes : DDP_DEFAULT_BUCKET_BYTES;
    size_t bucket_elems = (bucket_bytes + sizeof(float) - 1) / sizeof(float);
    tally__post_init(&d->q, comm, d, d->overlap);
    if ((rc = ddp_make_buckets(d, offsets, bucket_elems))) goto fail;
    *out = d;
    return 0;
fail:
    tally_ddp_free(d);
    return rc;
}

TALLY_API int tally_ddp_free(tally_ddp *d) {
    if (!d) return 0;
    tally__post_free(&d->q);
    free(d->bucket);
    free(d->layer_bucket);
    free(d->layer_ready);
    free(d);
    return 0;
}

TALLY_API int tally_ddp_sync_params(tally_comm *comm, float *params, size_t count) {
    return tally_broadcast(comm, params, count, TALLY_F32, 0);
}

TALLY_API int tally_ddp_begin(tally_ddp *d) {
    if (!d) return tally__seterr(TALLY_E_INVALID, "tally_ddp_begin: engine is NULL");
    int rc = tally__post_failed(&d->q);
    if (rc) return rc;
    if (d->begun)
        return tally__seterr(TALLY_E_INVALID, "tally_ddp_begin: the previous micro-batch was not ended with "
                                              "tally_ddp_wait");
    d->begun = 1;
    d->sync = d->micro == d->accum - 1;
    if (!d->sync) return 0;
    for (int k = 0; k < d->nbuckets; k++) d->bucket[k].remaining = d->bucket[k].layers;
    memset(d->layer_ready, 0, (size_t)d->nlayers);
    d->posted = 0;
    return 1;
}

/* Hands every bucket whose layers are all ready, in index order, to the queue. An error is the
 * queue's: it stays there for tally_ddp_wait to report. */
static void ddp_post_ready(tally_ddp *d) {
    while (d->posted < d->nbuckets && d->bucket[d->posted].remaining == 0) {
        if (tally__trace_on) { /* the moment it could leave: the timeline shows how long it then waited */
            const ddp_bucket *b = &d->bucket[d->posted];
            tally__trace_arg args[] = {{"bucket", NULL, d->posted},
                                       {"bytes", NULL, (int64_t)((b->end - b->begin) * 4)}};
            uint64_t now = tally__trace_now();
            tally__trace_span("dp", "bucket ready", now, now, args, 2);
        }
        if (ddp_post_bucket(d, d->posted++) < 0) d->posted = d->nbuckets;
    }
}

static void ddp_mark_ready(tally_ddp *d, int layer) {
    if (d->layer_ready[layer]) return;
    d->layer_ready[layer] = 1;
    d->bucket[d->layer_bucket[layer]].remaining--;
}

TALLY_API int tally_ddp_layer_ready(tally_ddp *d, int layer) {
    if (!d) return tally__seterr(TALLY_E_INVALID, "tally_ddp_layer_ready: engine is NULL");
    if (layer < 0 || layer >= d->nlayers)
        return tally__seterr(TALLY_E_INVALID, "tally_ddp_layer_ready: layer %d is not in 0..%d", layer, d->nlayers - 1);
    if (!d->begun) return tally__seterr(TALLY_E_INVALID, "tally_ddp_layer_ready: call tally_ddp_begin first");
    if (!d->sync || !d->overlap) return 0; /* accumulating locally, or everything waits for the end */
    ddp_mark_ready(d, layer);
    ddp_post_ready(d);
    return 0;
}

TALLY_API int tally_ddp_wait(tally_ddp *d) {
    if (!d) return tally__seterr(TALLY_E_INVALID, "tally_ddp_wait: engine is NULL");
    if (!d->begun) return tally__seterr(TALLY_E_INVALID, "tally_ddp_wait: call tally_ddp_begin first");
    d->begun = 0;
    if (!d->sync) {
        d->micro++;
        return 0;
    }
    d->micro = 0;
    int rc = tally__post_failed(&d->q);
    if (rc) return rc;
    /* A layer never marked is reduced now; without a thread every bucket runs here, in order. */
    uint64_t t0 = tally__now_ns();
    for (int l = d->nlayers - 1; l >= 0; l--) ddp_mark_ready(d, l);
    ddp_post_ready(d);
    rc = tally__post_drain(&d->q);
    d->wait_s += (double)(tally__now_ns() - t0) * 1e-9;
    if (!rc) d->reductions++;
    return rc;
}

TALLY_API void tally_ddp_get_stats(const tally_ddp *d, tally_ddp_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!d) return;
    out->comm_s = d->q.comm_s;
    out->wait_s = d->wait_s;
    out->bytes_sent = d->q.bytes[TALLY__POST_GRAD];
    out->reductions = d->reductions;
    out->buckets = d->nbuckets;
}

TALLY_API int tally_ddp_bucket(const tally_ddp *d, int i, size_t *begin, size_t *end) {
    if (!d || i < 0 || i >= d->nbuckets) return tally__seterr(TALLY_E_INVALID, "tally_ddp_bucket: no bucket %d", i);
    if (begin) *begin = d->bucket[i].begin;
    if (end) *end = d->bucket[i].end;
    return 0;
}
