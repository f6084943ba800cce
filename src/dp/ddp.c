/* ddp.c - the data-parallel engine: gradient buckets (views into the flat buffer, last layers first),
 * reduced in a fixed order on a thread of their own while backward goes on; accumulation; averaging. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tally/ddp.h>

#include "../core/clock.h"
#include "../core/err.h"

#define DDP_DEFAULT_BUCKET_BYTES (25u << 20)

typedef struct ddp_bucket {
    size_t begin, end;   /* elements of grad */
    int layers;          /* layers it holds */
    int remaining;       /* of those, not yet ready in the step in flight */
} ddp_bucket;

struct tally_ddp {
    tally_comm *comm;
    float *grad;
    int size;            /* world size */
    int accum;
    int overlap;         /* reductions on the engine thread while backward runs */
    int (*reduce)(void *arg, tally_comm *comm, int bucket, float *grad, size_t count, float denom);
    void *reduce_arg;    /* the caller's bucket reducer (NULL: plain allreduce) */
    int nlayers, nbuckets;
    int *layer_bucket;   /* layer -> bucket */
    unsigned char *layer_ready;
    ddp_bucket *bucket;

    int micro;           /* micro-batch index within the step */
    int begun, sync;     /* inside a micro-batch; it is the step's last */

    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t work, done_cv;
    int in_flight;       /* a step's buckets may be reduced */
    int busy;            /* a thread is reducing bucket `done` */
    int done;            /* buckets reduced so far in the step in flight (they go in index order) */
    int stop;
    int err;             /* sticky: the first failed reduction */
    char errmsg[1024];

    double comm_s, wait_s;
    unsigned long long bytes_sent, reductions;
};

/* Allreduce of one bucket, then the division that makes it a mean over ranks and micro-batches. */
static int ddp_reduce_bucket(tally_ddp *d, int k, double *secs, unsigned long long *bytes) {
    const ddp_bucket *b = &d->bucket[k];
    float *g = d->grad + b->begin;
    size_t n = b->end - b->begin;
    uint64_t t0 = tally__now_ns();
    unsigned long long sent0 = tally_comm_bytes_sent(d->comm);
    int rc = 0;
    if (d->reduce) {
        rc = d->reduce(d->reduce_arg, d->comm, k, g, n, (float)d->size * (float)d->accum);
    } else if (d->accum == 1) {
        rc = tally_allreduce(d->comm, g, g, n, TALLY_F32, TALLY_AVG);
    } else {
        rc = tally_allreduce(d->comm, g, g, n, TALLY_F32, TALLY_SUM);
        const float denom = (float)d->size * (float)d->accum;
        for (size_t i = 0; i < n && !rc; i++) g[i] /= denom;
    }
    *bytes = tally_comm_bytes_sent(d->comm) - sent0;
    *secs = (double)(tally__now_ns() - t0) * 1e-9;
    return rc;
}

/* Called with mu held: keeps the first error's message for the thread that will wait. */
static void ddp_record_error(tally_ddp *d, int rc) {
    if (d->err) return;
    d->err = rc;
    snprintf(d->errmsg, sizeof d->errmsg, "%s", tally_last_error());
}

static int ddp_bucket_launchable(const tally_ddp *d) {
    return d->in_flight && !d->busy && d->done < d->nbuckets && d->bucket[d->done].remaining == 0;
}

/* With mu held and the next bucket launchable: reduces it with mu released (only one thread reduces
 * at a time: `busy`), then publishes the result. Either the engine thread or the waiter calls it. */
static void ddp_take_bucket(tally_ddp *d) {
    int k = d->done, prior = d->err;
    d->busy = 1;
    pthread_mutex_unlock(&d->mu);
    double secs = 0;
    unsigned long long bytes = 0;
    int rc = prior ? prior : ddp_reduce_bucket(d, k, &secs, &bytes);
    pthread_mutex_lock(&d->mu);
    d->busy = 0;
    if (rc) {
        ddp_record_error(d, rc);
        d->done = d->nbuckets; /* nothing more this step: the waiter returns the error */
    } else {
        d->comm_s += secs;
        d->bytes_sent += bytes;
        d->done++;
    }
    pthread_cond_broadcast(&d->done_cv);
}

static void *ddp_thread(void *arg) {
    tally_ddp *d = arg;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!d->stop && !ddp_bucket_launchable(d)) pthread_cond_wait(&d->work, &d->mu);
        if (d->stop) break;
        ddp_take_bucket(d);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

static int ddp_check_layout(const size_t *off, int nlayers, size_t count) {
    if (!off || nlayers < 1) return tally__seterr(TALLY_E_INVALID, "tally_ddp_create: need at least one layer");
    if (off[0] != 0 || off[nlayers] != count)
        return tally__seterr(TALLY_E_INVALID,
                             "tally_ddp_create: offsets must run from 0 to count (%zu); got %zu .. %zu", count,
                             off[0], off[nlayers]);
    for (int i = 0; i < nlayers; i++)
        if (off[i + 1] < off[i])
            return tally__seterr(TALLY_E_INVALID, "tally_ddp_create: offsets decrease at layer %d (%zu > %zu)",
                                 i, off[i], off[i + 1]);
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
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->work, NULL);
    pthread_cond_init(&d->done_cv, NULL);
    if ((rc = ddp_make_buckets(d, offsets, bucket_elems))) goto fail;
    if (d->overlap) {
        if ((rc = pthread_create(&d->thread, NULL, ddp_thread, d))) {
            rc = tally__seterr(TALLY_E_SYSTEM, "tally_ddp_create: cannot start the engine thread: %s",
                               strerror(rc));
            goto fail;
        }
        d->thread_started = 1;
    }
    *out = d;
    return 0;
fail:
    tally_ddp_free(d);
    return rc;
}

TALLY_API int tally_ddp_free(tally_ddp *d) {
    if (!d) return 0;
    if (d->thread_started) {
        pthread_mutex_lock(&d->mu);
        d->stop = 1;
        pthread_cond_broadcast(&d->work);
        pthread_mutex_unlock(&d->mu);
        pthread_join(d->thread, NULL);
    }
    pthread_cond_destroy(&d->done_cv);
    pthread_cond_destroy(&d->work);
    pthread_mutex_destroy(&d->mu);
    free(d->bucket);
    free(d->layer_bucket);
    free(d->layer_ready);
    free(d);
    return 0;
}

TALLY_API int tally_ddp_sync_params(tally_comm *comm, float *params, size_t count) {
    return tally_broadcast(comm, params, count, TALLY_F32, 0);
}

static int ddp_error(tally_ddp *d) { return tally__seterr(d->err, "%s", d->errmsg); }

TALLY_API int tally_ddp_begin(tally_ddp *d) {
    if (!d) return tally__seterr(TALLY_E_INVALID, "tally_ddp_begin: engine is NULL");
    if (d->err) return ddp_error(d);
    if (d->begun)
        return tally__seterr(TALLY_E_INVALID, "tally_ddp_begin: the previous micro-batch was not ended with "
                                              "tally_ddp_wait");
    d->begun = 1;
    d->sync = d->micro == d->accum - 1;
    if (!d->sync) return 0;
    pthread_mutex_lock(&d->mu);
    for (int k = 0; k < d->nbuckets; k++) d->bucket[k].remaining = d->bucket[k].layers;
    memset(d->layer_ready, 0, (size_t)d->nlayers);
    d->done = 0;
    d->in_flight = 1;
    pthread_mutex_unlock(&d->mu);
    return 1;
}

/* With mu held. Returns nonzero when this made the next bucket in line launchable. */
static int ddp_mark_ready(tally_ddp *d, int layer) {
    if (d->layer_ready[layer]) return 0;
    d->layer_ready[layer] = 1;
    int k = d->layer_bucket[layer];
    return --d->bucket[k].remaining == 0 && k == d->done;
}

TALLY_API int tally_ddp_layer_ready(tally_ddp *d, int layer) {
    if (!d) return tally__seterr(TALLY_E_INVALID, "tally_ddp_layer_ready: engine is NULL");
    if (layer < 0 || layer >= d->nlayers)
        return tally__seterr(TALLY_E_INVALID, "tally_ddp_layer_ready: layer %d is not in 0..%d", layer,
                             d->nlayers - 1);
    if (!d->begun)
        return tally__seterr(TALLY_E_INVALID, "tally_ddp_layer_ready: call tally_ddp_begin first");
    if (!d->sync || !d->overlap) return 0; /* accumulating locally, or everything waits for the end */
    pthread_mutex_lock(&d->mu);
    if (ddp_mark_ready(d, layer)) pthread_cond_signal(&d->work);
    pthread_mutex_unlock(&d->mu);
    return 0;
}

/* No engine thread: every bucket in order on the caller's thread, after backward. */
static int ddp_reduce_inline(tally_ddp *d) {
    for (int k = 0; k < d->nbuckets; k++) {
        double secs;
        unsigned long long bytes;
        int rc = ddp_reduce_bucket(d, k, &secs, &bytes);
        if (rc) {
            ddp_record_error(d, rc);
            return rc;
        }
        d->comm_s += secs;
        d->wait_s += secs;
        d->bytes_sent += bytes;
    }
    return 0;
}

/* What backward left unreduced the waiter reduces itself: handing it to the engine thread would only
 * add two thread switches (on a busy core, a scheduling delay each) to a wait that has nothing else
 * to do. A bucket the engine thread is reducing is waited for. */
static int ddp_wait_thread(tally_ddp *d) {
    pthread_mutex_lock(&d->mu);
    for (int l = d->nlayers - 1; l >= 0; l--) ddp_mark_ready(d, l);
    uint64_t t0 = tally__now_ns();
    while (d->done < d->nbuckets) {
        if (ddp_bucket_launchable(d))
            ddp_take_bucket(d);
        else
            pthread_cond_wait(&d->done_cv, &d->mu);
    }
    d->wait_s += (double)(tally__now_ns() - t0) * 1e-9;
    d->in_flight = 0;
    int rc = d->err;
    pthread_mutex_unlock(&d->mu);
    return rc;
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
    if (d->err) return ddp_error(d);
    int rc = d->overlap ? ddp_wait_thread(d) : ddp_reduce_inline(d);
    if (rc) return ddp_error(d);
    d->reductions++;
    return 0;
}

TALLY_API void tally_ddp_get_stats(const tally_ddp *d, tally_ddp_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!d) return;
    pthread_mutex_lock((pthread_mutex_t *)&d->mu);
    out->comm_s = d->comm_s;
    out->wait_s = d->wait_s;
    out->bytes_sent = d->bytes_sent;
    out->reductions = d->reductions;
    out->buckets = d->nbuckets;
    pthread_mutex_unlock((pthread_mutex_t *)&d->mu);
}

TALLY_API int tally_ddp_bucket(const tally_ddp *d, int i, size_t *begin, size_t *end) {
    if (!d || i < 0 || i >= d->nbuckets)
        return tally__seterr(TALLY_E_INVALID, "tally_ddp_bucket: no bucket %d", i);
    if (begin) *begin = d->bucket[i].begin;
    if (end) *end = d->bucket[i].end;
    return 0;
}
