/* sync.h - keeping the replicas in step: one engine whose ZeRO stage is data (what is sharded: 0 nothing,
 * the DDP buckets; 1 the optimizer state; 2 and the gradients; 3 and the parameters). */
#ifndef TALLY_DP_SYNC_H
#define TALLY_DP_SYNC_H

#include <stddef.h>
#include <stdint.h>
#include <tally.h>
#include <tally/optim.h>

#include "../nn/model.h"
#include "buckets.h"
#include "codec.h"
#include "post.h"

/* How to keep the replicas in step (`tally train --zero --accum --bucket-mb --no-overlap --compress
 * --nan`). */
#define TALLY__SYNC_BUCKET_MB_DEFAULT 25.0
typedef struct tally__sync_cfg {
    int zero;               /* the ZeRO stage, 0-3 */
    int accum;              /* micro-batches per step */
    int no_overlap;         /* communicate after backward, not while it (and, stage 3, forward) runs */
    double bucket_mb;       /* stage 0's buckets; 0 means TALLY__SYNC_BUCKET_MB_DEFAULT */
    tally__codec_cfg codec; /* --compress: stage 0 per bucket, stages 1-3 16-bit reductions */
    int nan_policy;         /* tally__nan_policy (guard.h): a NaN or Inf gradient skips the step,
                             * stops, or is not looked for */
    int decay_matrices;     /* weight decay on tensors of two or more dimensions only (GPT's, nanoGPT's);
                             * 0: on every parameter (torch.optim's) */
} tally__sync_cfg;

/* Cumulative since open; take differences around a step. Read between steps only, when nothing is in
 * flight. */
typedef struct tally__sync_stats {
    double comm_s;                 /* seconds in the gradient collectives (whichever thread ran them) */
    double wait_s;                 /* seconds the training thread waited for them (or ran them itself) */
    unsigned long long grad_bytes; /* sent in the gradient reductions */
    int buckets;                   /* stage 0's buckets per step (0 for stages 1-3) */
} tally__sync_stats;

/* What this rank holds: parameters, gradients, optimizer state, layer-sized buffers. */
typedef struct tally__sync_mem {
    size_t params, grads, optim, buffers;
} tally__sync_mem;

/* tally__sync_overflow's answer for a 16-bit sum that overflowed in some layer (stages 1-3). */
#define TALLY__SYNC_OVERFLOW_LAYER (-2)

/* What rank r owns of a layer: elements [off + r*piece, off + (r+1)*piece) and all of its tail
 * [off + N*piece, off + n), which every rank keeps (reduce-scatter needs equal pieces, and a tail of fewer
 * than N elements costs less as one small allreduce than as padding every buffer). Stage 0 shards nothing:
 * piece 0, the whole layer a tail. */
typedef struct tally__sync_layer {
    size_t off, n;      /* the layer in the model's flat layout */
    size_t piece, tail; /* n = N*piece + tail */
    size_t shard_off;   /* where its piece, then its tail, sit in this rank's shard arrays */
    size_t decay_n;     /* its first decay_n elements take weight decay (n, or the weight's, or none) */
    tally_optim opt_piece, opt_tail;
} tally__sync_layer;

typedef struct tally__sync {
    int stage; /* what is sharded: 0 nothing, 1 optimizer state, 2 + gradients, 3 + parameters */
    int rank, size, accum;
    int overlap; /* collectives on the communication thread while compute goes on */
    tally_comm *comm;
    tally__model *m;
    int nlayers;
    tally__sync_layer *layer;
    size_t shard_len; /* elements this rank owns over all layers */
    size_t largest;   /* elements of the largest layer */
    float *gshard;    /* stage >= 2: this rank's accumulated gradients [shard_len] */
    float *pshard;    /* stage 3: this rank's parameters [shard_len] */
    /* Two of each layer-sized buffer, used by layer parity: with overlap, layer l+1's (forward) or
     * l-1's (backward) parameters arrive while layer l computes, and a layer's gradients are reduced
     * while the next layer's backward fills the other buffer. */
    float *staging[2];  /* stage 2: one layer's full gradients while backward makes them */
    float *gathered[2]; /* stage 3: one layer's full parameters, gathered for forward or backward, then in
                         * backward its gradients (they replace the parameters once the input's is made) */
    int held[2];        /* the layer a gathered buffer holds or is receiving (-1: none, or stale) */
    long gather_ticket[2], staging_ticket[2]; /* the last operation writing / reading each */
    int last_micro;                           /* the micro-batch in progress is the step's last */
    int averaged;                             /* this step's gradients are already means */
    /* The reductions: buckets of whole layers (stage 0: up to --bucket-mb; stages 1-3: a layer each, its
     * pieces reduce-scattered), posted in order to the communicator's engine. */
    tally__buckets buckets;
    tally__bucket_reducer bucket; /* stage 0's reduction of a bucket (a codec's, with --compress) */
    tally__post q;
    tally__codec *codec;               /* stage 0 with --compress */
    int half;                          /* stages 1-3: TALLY_F16 / TALLY_BF16 reductions in 16 bits; -1: f32 */
    uint16_t *hbuf;                    /* [largest]: a layer's gradients cast */
    int overflow;                      /* stages 1-3: a 16-bit sum came out non-finite from finite inputs this step */
    double end_wait_s;                 /* of the waits, those at the end of a step's backward (not inside a pass) */
    unsigned long long f32_bytes_step; /* what one step's gradient reductions would send in f32 (measured) */
    tally_optim_cfg optim_cfg;         /* what it was opened with, for the state dict */
    uint64_t seed;                     /* the model's parameters and PowerSGD's first factors */
    tally__codec_cfg codec_cfg;
} tally__sync;

/* Lays out the model m for the stage (the buffers it keeps whole; gradients from the communicator's
 * shared memory) with batches up to max_batch, initialised from seed, and the engine over it with the
 * optimizer; with a codec, measures the f32 baseline of a step (collective). Every rank calls it alike. */
int tally__sync_open(tally__sync *s, tally_comm *comm, tally__model *m, const tally__model_cfg *mc, int max_batch,
                     const tally__sync_cfg *cfg, const tally_optim_cfg *optim, uint64_t seed);
/* Opened (and not closed). */
static inline int tally__sync_is_open(const tally__sync *s) { return s->layer != NULL; }
/* The hooks forward and backward run with. */
tally__model_hooks tally__sync_hooks(tally__sync *s);
/* Before micro-batch k of a step's forward. */
int tally__sync_micro_begin(tally__sync *s, int k);
/* After its backward: on the step's last micro-batch every reduction of the step is done when it returns. */
int tally__sync_micro_end(tally__sync *s);
/* Nothing in flight: the communicator is free for the caller's collectives. */
int tally__sync_drain(tally__sync *s);
/* Drops the step's gradients (every rank agreed to skip it); parameters and state stay. */
int tally__sync_skip(tally__sync *s);
/* After drain, before apply: clips the averaged gradients to a global L2 norm of max_norm (PyTorch's
 * clip_grad_norm_: scaled by max_norm / (norm + 1e-6) when that is below 1), the norm over the whole
 * model whatever the stage; *norm gets it. */
int tally__sync_clip(tally__sync *s, float max_norm, double *norm);
/* The optimizer's update from the averaged gradients (stages 1-2: then every rank's new pieces to
 * everyone), then the gradients cleared. */
int tally__sync_apply(tally__sync *s, float lr);
void tally__sync_stats_get(const tally__sync *s, tally__sync_stats *out);
/* Seconds the training thread has waited for communication inside the passes and the update so far (not
 * at the end of a step's backward): readable at any time on that thread. */
double tally__sync_blocked(const tally__sync *s);
/* Every layer's whole parameters in turn (stage 3 gathers them: collective). */
int tally__sync_each_layer(tally__sync *s, void (*fn)(void *arg, int layer, const float *p, size_t n), void *arg);
tally__sync_mem tally__sync_memory(const tally__sync *s);
/* After drain: -1, or where a 16-bit sum overflowed (a bucket, or TALLY__SYNC_OVERFLOW_LAYER). */
int tally__sync_overflow(const tally__sync *s);
/* Around a step: the codec's state is kept (taken) or dropped. */
void tally__sync_step_begin(tally__sync *s);
void tally__sync_step_end(tally__sync *s, int taken);
/* Its state dict (sync_state.c): the optimizer's kind and step, every parameter tensor as param.<name>,
 * the optimizer's state per tensor as optim.<name>.<exp_avg|exp_avg_sq|momentum_buffer> (torch.optim's
 * names), and the codec's spec, residuals and factors; all whole. */
struct tally__state;
void tally__sync_state(tally__sync *s, struct tally__state *out);
/* The optimizer's per-element state as whole flat vectors [nparams] (what local SGD keeps per rank):
 * how many kinds it has (AdamW's exp_avg and exp_avg_sq, SGD's momentum_buffer, or none) and kind k's
 * name; kind k into dst (stages 1-3 gather it: collective), or this rank's part of it from src. */
int tally__sync_opt_kinds(const tally__sync *s);
const char *tally__sync_opt_kind_name(const tally__sync *s, int k);
int tally__sync_opt_flat(tally__sync *s, int k, float *dst);
int tally__sync_opt_load_flat(tally__sync *s, int k, const float *src);
/* The optimizer's updates so far (AdamW's bias correction counts them), and setting them. */
long long tally__sync_opt_step(const tally__sync *s);
void tally__sync_set_opt_step(tally__sync *s, long long step);
/* Frees the engine (not the model); safe on a zeroed or half-opened one. */
void tally__sync_close(tally__sync *s);

#endif
