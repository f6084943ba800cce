/* ddp.c - the data-parallel engine for a model of one's own (include/tally/ddp.h): the buckets every stage
 * shares (buckets.c), reduced in a fixed order on the communicator's thread while backward goes on. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tally/ddp.h>

#include "../core/clock.h"
#include "../core/err.h"
#include "buckets.h"
#include "post.h"
#include "sync.h"

struct tally_ddp {
    int overlap; /* reductions on the communication thread while backward runs */
    int accum, nlayers;
    tally__buckets B;
    tally__bucket_reducer R;
    int micro;       /* micro-batch index within the step */
    int begun, sync; /* inside a micro-batch; it is the step's last */
    tally__post q;   /* on the communicator's thread (or, without overlap, inline in tally_ddp_wait) */
    double wait_s;
    unsigned long long reductions;
};

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
    int size = tally_comm_size(comm);
    d->accum = o.accum ? o.accum : 1;
    d->overlap = !o.no_overlap && size > 1;
    d->nlayers = nlayers;
    size_t bucket_bytes = o.bucket_bytes ? o.bucket_bytes : (size_t)(TALLY__SYNC_BUCKET_MB_DEFAULT * 1048576.0);
    tally__post_init(&d->q, comm, d->overlap);
    if ((rc = tally__buckets_init(&d->B, offsets, nlayers, (bucket_bytes + sizeof(float) - 1) / sizeof(float)))) {
        tally_ddp_free(d);
        return rc;
    }
    d->R = (tally__bucket_reducer){.comm = comm,
                                   .grad = grad,
                                   .B = &d->B,
                                   .denom = (float)size * (float)d->accum,
                                   .accum = d->accum,
                                   .reduce = o.reduce,
                                   .reduce_arg = o.reduce_arg};
    *out = d;
    return 0;
}

TALLY_API int tally_ddp_free(tally_ddp *d) {
    if (!d) return 0;
    tally__post_free(&d->q);
    tally__buckets_free(&d->B);
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
    tally__buckets_begin(&d->B);
    return 1;
}

/* Hands every bucket whose layers are all ready, in index order, to the communicator. An error is the
 * queue's: it stays there for tally_ddp_wait to report. */
static void ddp_post_ready(tally_ddp *d) {
    for (int k; (k = tally__buckets_next(&d->B)) >= 0;)
        if (tally__buckets_post(&d->q, &d->R, k) < 0) d->B.next = d->B.n;
}

TALLY_API int tally_ddp_layer_ready(tally_ddp *d, int layer) {
    if (!d) return tally__seterr(TALLY_E_INVALID, "tally_ddp_layer_ready: engine is NULL");
    if (layer < 0 || layer >= d->nlayers)
        return tally__seterr(TALLY_E_INVALID, "tally_ddp_layer_ready: layer %d is not in 0..%d", layer, d->nlayers - 1);
    if (!d->begun) return tally__seterr(TALLY_E_INVALID, "tally_ddp_layer_ready: call tally_ddp_begin first");
    if (!d->sync || !d->overlap) return 0; /* accumulating locally, or everything waits for the end */
    tally__buckets_ready(&d->B, layer);
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
    tally__buckets_all_ready(&d->B);
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
    out->buckets = d->B.n;
}

TALLY_API int tally_ddp_bucket(const tally_ddp *d, int i, size_t *begin, size_t *end) {
    if (!d || i < 0 || i >= d->B.n) return tally__seterr(TALLY_E_INVALID, "tally_ddp_bucket: no bucket %d", i);
    if (begin) *begin = d->B.b[i].begin;
    if (end) *end = d->B.b[i].end;
    return 0;
}
