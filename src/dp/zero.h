/* zero.h - ZeRO stages 1-3 for the trainer: each rank owns 1/N of every layer (its piece; the few
 * elements a layer has beyond a multiple of N, its tail, every rank keeps) and holds state only for it. */
#ifndef TALLY_DP_ZERO_H
#define TALLY_DP_ZERO_H

#include <stddef.h>
#include <tally.h>
#include <tally/optim.h>

#include "../nn/model.h"
#include "post.h"

/* Rank r owns elements [off + r*piece, off + (r+1)*piece) of the layer and all of its tail
 * [off + N*piece, off + n): reduce-scatter needs equal pieces, and a tail of fewer than N elements
 * costs less as one small allreduce than as padding every buffer. */
typedef struct tally__zero_layer {
    size_t off, n;      /* the layer in the model's flat layout */
    size_t piece, tail; /* n = N*piece + tail */
    size_t shard_off;   /* where its piece, then its tail, sit in this rank's shard arrays */
    size_t decay_n;     /* its first decay_n elements take weight decay (n, or the weight's, or none) */
    tally_optim opt_piece, opt_tail;
} tally__zero_layer;

typedef struct tally__zero {
    int stage; /* 1: optimizer state sharded; 2: + gradients; 3: + parameters */
    int rank, size, accum;
    tally_comm *comm;
    tally__model *m;
    int nlayers;
    tally__zero_layer *layer;
    size_t shard_len; /* elements this rank owns over all layers */
    float *gshard;    /* stage >= 2: this rank's accumulated gradients [shard_len] */
    float *pshard;    /* stage 3: this rank's parameters [shard_len] */
    /* Two of each layer-sized buffer, used by layer parity: with overlap, layer l+1's (forward) or
     * l-1's (backward) parameters arrive while layer l computes, and a layer's gradients are reduced
     * while the next layer's backward fills the other buffer. */
    float *staging[2];  /* stage 2: one layer's full gradients while backward makes them */
    float *gathered[2]; /* stage 3: one layer's full parameters, gathered for forward or backward, then in
                         * backward its gradients (they replace the parameters once the input's is made) */
    int held[2];        /* the layer a gathered buffer holds or is receiving (-1: none, or stale) */
    long gather_ticket[2], staging_ticket[2]; /* the last queued operation writing / reading each */
    size_t largest;                           /* elements of the largest layer */
    int overlap;                              /* collectives on the communication thread while compute goes on */
    int last_micro; /* the micro-batch in progress is the step's last (stage 1 reduces then) */
    int averaged;   /* this step's gradient shards are already means (tally__zero_clip did it) */
    tally__post q;  /* its collectives, in order on the communicator's thread (or inline) */
    /* compression */
    int half;       /* TALLY_F16 / TALLY_BF16: gradients reduced in 16 bits; -1: in f32 */
    uint16_t *hbuf; /* [largest]: a layer's gradients cast */
    int overflow;   /* 1: a 16-bit sum came out non-finite from finite inputs (the trainer clears it) */
} tally__zero;

/* Sets up stage 1-3 over a model made by tally__model_init (stage 3: with TALLY__MODEL_NO_PARAMS,
 * stage 2-3: with TALLY__MODEL_NO_GRADS); draws stage 3's parameter shard from seed as the model
 * would have. Collective. */
int tally__zero_init(tally__zero *z, tally_comm *comm, tally__model *m, int stage, int accum,
                     const tally_optim_cfg *ocfg, uint64_t seed, int overlap);
/* Gradients reduced in 16 bits (dt TALLY_F16 or TALLY_BF16; the kernels add in f32), each rank's piece
 * cast back; call after init. */
int tally__zero_set_half(tally__zero *z, tally_dtype dt);
/* The bytes one step's gradient reductions send in f32 (every layer's reduce-scatter and tail, run once
 * on zeros, times accum at stages 2-3, which reduce each micro-batch; collective, with the queue idle). */
int tally__zero_measure_f32(tally__zero *z, unsigned long long *bytes);
/* Waits until no collective is queued or running, so the caller may use the communicator. */
int tally__zero_drain(tally__zero *z);
/* Says which micro-batch of the step begins (k of accum). */
void tally__zero_micro(tally__zero *z, int k);
/* Seconds the training thread has spent blocked on communication so far (the collectives themselves
 * without overlap; waiting for the communication thread with it). */
double tally__zero_blocked(const tally__zero *z);
void tally__zero_free(tally__zero *z);
/* The hooks forward and backward must run with (stage 2: gradient staging and reduce-scatter per
 * layer; stage 3: also the parameter gathers). */
tally__model_hooks tally__zero_hooks(tally__zero *z);
/* After the step's last micro-batch: (stage 1: reduce-scatter the gradients,) average, update this
 * rank's shard, (stages 1-2: all-gather the parameters,) clear the gradients. */
int tally__zero_step(tally__zero *z, float lr);
/* Weight decay on the model's tensors of two or more dimensions only (their weights), not on biases
 * and norms; call after init. */
void tally__zero_decay_matrices(tally__zero *z);
/* After the step's reductions: averages this rank's shards, and scales every shard so the whole model's
 * gradient has an L2 norm of at most max_norm (one allreduce of the ranks' partial sums of squares;
 * a tail, which every rank holds, counted once). *norm gets the norm before clipping. Collective. */
int tally__zero_clip(tally__zero *z, float max_norm, double *norm);
/* Ends a step without an update (every rank agreed to skip it): waits for the queued reductions and
 * clears the gradients; parameters and optimizer state stay as they were. */
int tally__zero_skip(tally__zero *z);
/* The parameters were replaced from outside (a checkpoint): layers gathered before are stale. */
void tally__zero_params_changed(tally__zero *z);
/* Every layer's full parameters in turn (stage 3 gathers them; collective), to fn(arg, layer, params). */
int tally__zero_each_layer(tally__zero *z, void (*fn)(void *arg, int layer, const float *p, size_t n), void *arg);

/* Bytes this rank holds: parameters, gradients, optimizer state, layer-sized buffers (two with
 * overlap, one without: stage 2's for gradients, stage 3's for parameters and then gradients). */
typedef struct tally__zero_bytes {
    size_t params, grads, optim, buffers;
} tally__zero_bytes;
tally__zero_bytes tally__zero_memory(const tally__zero *z);

#endif
