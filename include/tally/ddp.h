/* tally/ddp.h - the data-parallel engine for a model of your own: register a flat gradient buffer and
 * its layer boundaries; buckets of gradients are averaged over the ranks while backward goes on. */
#ifndef TALLY_DDP_H
#define TALLY_DDP_H

#include <stddef.h>
#include <tally.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Usage, one training step (K = opts.accum micro-batches):
 *
 *     for (int k = 0; k < K; k++) {
 *         tally_ddp_begin(d);                  // micro-batch k of the step
 *         forward(...);
 *         for (int l = nlayers - 1; l >= 0; l--) {
 *             backward_layer(l, ...);          // adds into grad[offsets[l] .. offsets[l+1])
 *             tally_ddp_layer_ready(d, l);     // may start that bucket's allreduce now
 *         }
 *         tally_ddp_wait(d);                   // on the last micro-batch: grads averaged everywhere
 *     }
 *     optimizer_step(params, grad);            // the same update on every rank
 *     zero(grad);
 *
 * After tally_ddp_wait of the step's last micro-batch, grad holds the sum of every rank's accumulated
 * gradients divided by (world size * K): the mean gradient of the global batch when each micro-batch's
 * loss is a mean over its samples. The reductions run on the communicator's communication thread (the
 * one its non-blocking calls run on, in the order posted); while a step is in flight (between
 * tally_ddp_begin of its last micro-batch and tally_ddp_wait) the caller must not use the communicator,
 * nor touch gradients of layers it has marked ready. Between steps the communicator
 * is the caller's (e.g. to evaluate). Buckets are reduced in a fixed order, the same on every rank, so
 * a layer marked ready out of order only delays its bucket; a layer never marked is reduced in
 * tally_ddp_wait. */

typedef struct tally_ddp tally_ddp; /* opaque */

typedef struct tally_ddp_opts {
    size_t bucket_bytes; /* gradient bytes per bucket; 0 means 25 MiB (PyTorch's default) */
    int no_overlap;      /* nonzero: reduce every bucket inside tally_ddp_wait, after backward */
    int accum;           /* micro-batches per reduction (gradient accumulation); 0 means 1 */
    /* Optional, NULL means a plain f32 allreduce: replaces a bucket's allreduce (e.g. to compress it).
     * On return grad[0..count) must hold the sum over ranks divided by denom (= world size x accum),
     * the same on every rank. Runs on the communication thread with overlap (else in tally_ddp_wait), one
     * bucket at a time in bucket order; the bytes it sends on comm count in tally_ddp_stats. A nonzero
     * return fails the step like a failed allreduce. */
    int (*reduce)(void *arg, tally_comm *comm, int bucket, float *grad, size_t count, float denom);
    void *reduce_arg;
} tally_ddp_opts;

/* grad[count] is the flat gradient buffer (memory from tally_mem_alloc makes shm reductions one copy);
 * layer i owns grad[offsets[i] .. offsets[i+1]), offsets has nlayers + 1 entries, offsets[0] = 0,
 * non-decreasing, offsets[nlayers] = count. Buckets are runs of whole layers taken from the last layer
 * backwards, each closed once it holds bucket_bytes or more. Collective: every rank calls it with the
 * same layout. */
TALLY_API int tally_ddp_create(tally_comm *comm, float *grad, size_t count, const size_t *offsets, int nlayers,
                               const tally_ddp_opts *opts, tally_ddp **out);
/* Waits for anything in flight and frees the engine (not grad or comm). */
TALLY_API int tally_ddp_free(tally_ddp *d);

/* Broadcasts params[count] from rank 0 so every replica starts identical (as DDP does at wrap time). */
TALLY_API int tally_ddp_sync_params(tally_comm *comm, float *params, size_t count);

/* Starts a micro-batch. Returns 1 when this is the last micro-batch of the step (its backward will be
 * reduced), 0 when gradients only accumulate locally, or a negative TALLY_E_* code. */
TALLY_API int tally_ddp_begin(tally_ddp *d);
/* Layer `layer`'s gradients for this micro-batch are complete. */
TALLY_API int tally_ddp_layer_ready(tally_ddp *d, int layer);
/* Ends the micro-batch: on the step's last one, starts what is not yet started and waits until every
 * bucket is averaged. Returns 0, or the error of the failed reduction (tally_last_error() on this
 * thread has its message). After an error the engine (and its communicator) are broken. */
TALLY_API int tally_ddp_wait(tally_ddp *d);

/* Cumulative counters since tally_ddp_create; take differences around a step. */
typedef struct tally_ddp_stats {
    double comm_s;                 /* seconds spent inside the bucket allreduces (whichever thread ran them) */
    double wait_s;                 /* seconds tally_ddp_wait blocked for communication after backward */
    unsigned long long bytes_sent; /* payload bytes this rank sent in those allreduces */
    unsigned long long reductions; /* steps reduced */
    int buckets;                   /* buckets per step */
} tally_ddp_stats;
TALLY_API void tally_ddp_get_stats(const tally_ddp *d, tally_ddp_stats *out);
/* Bucket i (0 = first reduced = last layers) covers grad[*begin .. *end). Returns TALLY_E_INVALID for
 * a bad index. For logs and tests. */
TALLY_API int tally_ddp_bucket(const tally_ddp *d, int i, size_t *begin, size_t *end);

#ifdef __cplusplus
}
#endif
#endif
