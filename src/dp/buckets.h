/* buckets.h - gradient buckets for every engine (tally_ddp and every ZeRO stage): runs of whole layers from
 * the last one backwards, handed to the communicator in index order as their layers' gradients are ready. */
#ifndef TALLY_DP_BUCKETS_H
#define TALLY_DP_BUCKETS_H

#include <stddef.h>
#include <tally.h>

#include "post.h"

typedef struct tally__bucket {
    size_t begin, end; /* elements of the flat gradients */
    int last, layers;  /* it holds layers last - layers + 1 .. last */
    int remaining;     /* of those, not yet ready in the reduction in flight */
} tally__bucket;

typedef struct tally__buckets {
    int nlayers, n;
    tally__bucket *b;
    int *layer_bucket; /* layer -> bucket */
    unsigned char *layer_ready;
    int next; /* buckets of the reduction in flight handed on so far (they go in index order) */
} tally__buckets;

/* Buckets over layers whose gradients are off[l] .. off[l + 1], each closed once it holds `elems` or more
 * (0: a layer each). */
int tally__buckets_init(tally__buckets *B, const size_t *off, int nlayers, size_t elems);
void tally__buckets_free(tally__buckets *B);
/* A reduction of every bucket begins: none ready, none handed on. */
void tally__buckets_begin(tally__buckets *B);
/* Layer l's gradients are complete (again: no effect); every layer's. */
void tally__buckets_ready(tally__buckets *B, int layer);
void tally__buckets_all_ready(tally__buckets *B);
/* The next bucket in index order whose layers are all ready, counted as handed on; -1 when none is. */
int tally__buckets_next(tally__buckets *B);

/* A bucket's plain reduction: grad[begin, end) summed over the ranks and divided by denom (the world size
 * times the micro-batches summed), or reduce(reduce_arg, ...) instead when set (a codec). */
typedef struct tally__bucket_reducer {
    tally_comm *comm;
    float *grad;
    const tally__buckets *B;
    float denom;
    int accum;
    int (*reduce)(void *arg, tally_comm *comm, int bucket, float *grad, size_t count, float denom);
    void *reduce_arg;
} tally__bucket_reducer;
/* Posts bucket k's reduction: one averaging tally_iallreduce when that is all it takes, else an operation
 * of the engine's own. Its ticket, or the first error (< 0). */
long tally__buckets_post(tally__post *q, tally__bucket_reducer *R, int k);

#endif
