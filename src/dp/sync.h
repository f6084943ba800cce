/* sync.h - one interface for keeping the replicas in step whatever the ZeRO stage: stage 0 (the DDP
 * engine's buckets and a whole optimizer, sync_ddp.c) and stages 1-3 (ZeRO's shards, sync_zero.c). */
#ifndef TALLY_DP_SYNC_H
#define TALLY_DP_SYNC_H

#include <stddef.h>
#include <stdint.h>
#include <tally.h>
#include <tally/ddp.h>
#include <tally/optim.h>

#include "../nn/model.h"
#include "codec.h"
#include "zero.h"

/* How to keep the replicas in step (`tally train --zero --accum --bucket-mb --no-overlap --compress
 * --nan`). */
#define TALLY__SYNC_BUCKET_MB_DEFAULT 25.0
typedef struct tally__sync_cfg {
    int zero;               /* the ZeRO stage, 0-3 */
    int accum;              /* micro-batches per step */
    int no_overlap;         /* communicate after backward, not while it (and, stage 3, forward) runs */
    double bucket_mb;       /* stage 0's buckets; 0 means 25 */
    tally__codec_cfg codec; /* --compress: stage 0 per bucket, stages 1-3 16-bit reductions */
    int nan_policy;         /* tally__nan_policy (guard.h): a NaN or Inf gradient skips the step,
                             * stops, or is not looked for */
    int decay_matrices;     /* weight decay on tensors of two or more dimensions only (GPT's, nanoGPT's);
                             * 0: on every parameter (torch.optim's) */
} tally__sync_cfg;

/* Cumulative since open; take differences around a step. Read between steps only, when nothing is in
 * flight (the communication thread writes them meanwhile). */
typedef struct tally__sync_stats {
    double comm_s;                 /* seconds in the gradient collectives (whichever thread ran them) */
    double wait_s;                 /* seconds the training thread waited for them */
    unsigned long long grad_bytes; /* sent in the gradient reductions */
    int buckets;                   /* stage 0's buckets per step (0 for stages 1-3) */
} tally__sync_stats;

/* What this rank holds: parameters, gradients, optimizer state, layer-sized buffers. */
typedef struct tally__sync_mem {
    size_t params, grads, optim, buffers;
} tally__sync_mem;

/* tally__sync_overflow's answer for a 16-bit sum that overflowed in some layer (stages 1-3). */
#define TALLY__SYNC_OVERFLOW_LAYER (-2)

typedef struct tally__sync tally__sync;
typedef struct tally__sync_ops {
    tally__model_hooks (*hooks)(tally__sync *s);
    int (*micro_begin)(tally__sync *s, int k);
    int (*micro_end)(tally__sync *s);
    int (*drain)(tally__sync *s);
    int (*skip)(tally__sync *s);
    int (*apply)(tally__sync *s, float lr);
    void (*stats)(const tally__sync *s, tally__sync_stats *out);
    double (*blocked)(const tally__sync *s);
    int (*each_layer)(tally__sync *s, void (*fn)(void *arg, int layer, const float *p, size_t n), void *arg);
    tally__sync_mem (*memory)(const tally__sync *s);
    int (*overflow)(const tally__sync *s);
    void (*step_begin)(tally__sync *s);
    void (*step_end)(tally__sync *s, int taken);
    void (*close)(tally__sync *s);
    /* For the state dict (sync_state.c). The optimizer's state of kind `second` (0: m, 1: v) for a
     * whole layer: its own memory, or buf (stages 1-3 gather it: collective); NULL with *rc on failure. */
    const float *(*opt_layer)(tally__sync *s, int second, int layer, float *buf, int *rc);
    /* Asks read() for every range of the flat layout this rank keeps of `what` (0: parameters; 1, 2: the
     * optimizer's m, v), into where it keeps them. */
    int (*load_part)(tally__sync *s, int what, int (*read)(void *arg, size_t begin, size_t count, float *dst),
                     void *arg);
    long long (*opt_step)(const tally__sync *s);
    void (*set_opt_step)(tally__sync *s, long long step);
    void (*params_changed)(tally__sync *s); /* parameters were replaced from outside */
    /* The averaged gradients' global L2 norm into *norm; when above max_norm, the gradients scaled to it. */
    int (*clip)(tally__sync *s, float max_norm, double *norm);
} tally__sync_ops;

/* The engines' state lives here (the checkpoint code reads the one in use: optim or zero). */
struct tally__sync {
    const tally__sync_ops *ops;
    tally_comm *comm;
    tally__model *m;
    tally_ddp *ddp;                    /* stage 0 */
    tally_optim optim;                 /* stage 0 */
    tally__codec *codec;               /* stage 0 with --compress */
    tally__zero zero;                  /* stages 1-3 */
    unsigned long long f32_bytes_step; /* what one step's gradient reductions would send in f32 (measured) */
    tally_optim_cfg optim_cfg;         /* what it was opened with, for the state dict */
    uint64_t seed;                     /* the model's parameters and PowerSGD's first factors */
    size_t *nodecay; /* stage 0 with decay_matrices: [begin, end) pairs of the flat layout weight decay skips */
    int nnodecay;    /* (biases, norms); 0 pairs: decay everywhere */
    tally__codec_cfg codec_cfg;
};

/* Lays out the model m for the stage (the buffers it keeps whole; gradients from the communicator's
 * shared memory) with batches up to max_batch, initialised from seed, and the engine over it with the
 * optimizer; with a codec, measures the f32 baseline of a step (collective). Every rank calls it alike. */
int tally__sync_open(tally__sync *s, tally_comm *comm, tally__model *m, const tally__model_cfg *mc, int max_batch,
                     const tally__sync_cfg *cfg, const tally_optim_cfg *optim, uint64_t seed);
/* The hooks forward and backward run with. */
static inline tally__model_hooks tally__sync_hooks(tally__sync *s) { return s->ops->hooks(s); }
/* Before micro-batch k of a step's forward. */
static inline int tally__sync_micro_begin(tally__sync *s, int k) { return s->ops->micro_begin(s, k); }
/* After its backward: on the step's last micro-batch stage 0 waits here for its buckets. */
static inline int tally__sync_micro_end(tally__sync *s) { return s->ops->micro_end(s); }
/* Every reduction of the step done: the communicator is free for the caller's collectives. */
static inline int tally__sync_drain(tally__sync *s) { return s->ops->drain(s); }
/* Drops the step's gradients (every rank agreed to skip it); parameters and state stay. */
static inline int tally__sync_skip(tally__sync *s) { return s->ops->skip(s); }
/* After drain, before apply: clips the averaged gradients to a global L2 norm of max_norm (PyTorch's
 * clip_grad_norm_: scaled by max_norm / (norm + 1e-6) when that is below 1), the norm over the whole
 * model whatever the stage; *norm gets it. */
static inline int tally__sync_clip(tally__sync *s, float max_norm, double *norm) {
    return s->ops->clip(s, max_norm, norm);
}
/* The optimizer's update from the averaged gradients, then the gradients cleared. */
static inline int tally__sync_apply(tally__sync *s, float lr) { return s->ops->apply(s, lr); }
static inline void tally__sync_stats_get(const tally__sync *s, tally__sync_stats *out) { s->ops->stats(s, out); }
/* Seconds the training thread has waited for communication inside the passes and the update so far
 * (stages 1-3; 0 for stage 0, which waits only in micro_end): readable at any time on that thread. */
static inline double tally__sync_blocked(const tally__sync *s) { return s->ops->blocked(s); }
/* Every layer's whole parameters in turn (stage 3 gathers them: collective). */
static inline int tally__sync_each_layer(tally__sync *s, void (*fn)(void *, int, const float *, size_t), void *arg) {
    return s->ops->each_layer(s, fn, arg);
}
static inline tally__sync_mem tally__sync_memory(const tally__sync *s) { return s->ops->memory(s); }
/* After drain: -1, or where a 16-bit sum overflowed (a bucket, or TALLY__SYNC_OVERFLOW_LAYER). */
static inline int tally__sync_overflow(const tally__sync *s) { return s->ops->overflow(s); }
/* Around a step: the codec's state is kept (taken) or dropped. */
static inline void tally__sync_step_begin(tally__sync *s) { s->ops->step_begin(s); }
static inline void tally__sync_step_end(tally__sync *s, int taken) { s->ops->step_end(s, taken); }
/* Its state dict (sync_state.c): the optimizer's kind and step, every parameter tensor as param.<name>,
 * the optimizer's state per tensor as optim.<name>.<exp_avg|exp_avg_sq|momentum_buffer> (torch.optim's
 * names), and the codec's spec, residuals and factors; all whole. */
struct tally__state;
void tally__sync_state(tally__sync *s, struct tally__state *out);
/* Frees the engine (not the model); safe on a zeroed or half-opened one. */
void tally__sync_close(tally__sync *s);

/* The two engines (sync_ddp.c, sync_zero.c): open after the model, then set s->ops. */
int tally__sync_open_ddp(tally__sync *s, const tally__sync_cfg *cfg);
int tally__sync_open_zero(tally__sync *s, const tally__sync_cfg *cfg);

#endif
