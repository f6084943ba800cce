/* sync_int.h - the gradient-sync engine's files as they share it: the shards (zero.c), the collectives and
 * hooks (sync_comm.c), the step's calls (sync.c) and the state dict (sync_state.c); no interface. */
#ifndef TALLY_DP_SYNC_INT_H
#define TALLY_DP_SYNC_INT_H

#include "sync.h"

/* ---- zero.c: what each rank owns ---- */

/* Every layer's piece and tail for the stage and their optimizers; then the shard buffers (stage 3: its
 * parameters drawn from seed as the model would have drawn them). */
int tally__sync_layout(tally__sync *s);
int tally__sync_alloc_shards(tally__sync *s, uint64_t seed);
void tally__sync_free_shards(tally__sync *s);
/* Weight decay on the model's tensors of two or more dimensions only (their weights). */
void tally__sync_decay_matrices(tally__sync *s);
/* Which of the two layer buffers layer l uses: by parity with overlap, the only one without. */
static inline int tally__sync_buf_of(const tally__sync *s, int l) { return s->overlap ? l & 1 : 0; }
/* The step's reductions summed micro-batches (stages 1-3): divided once, before clipping or updating. */
void tally__sync_average(tally__sync *s);
/* The global norm of the averaged gradients, and the scaling to max_norm (collective at stages 1-3). */
int tally__sync_clip_shards(tally__sync *s, float max_norm, double *norm);
/* Layer l's piece and tail updated by their optimizers. */
void tally__sync_update_layer(tally__sync *s, int l, float lr);
/* What every step ends with, whether it updated or not: gradients cleared, gathered layers stale. */
void tally__sync_clear_step(tally__sync *s);
tally__sync_mem tally__sync_shard_memory(const tally__sync *s);

/* ---- sync_comm.c: the collectives ---- */

/* The stage's buckets, stage 0's reducer and (with a codec) its buckets and f32 baseline. */
int tally__sync_open_comm(tally__sync *s, const tally__sync_cfg *cfg);
/* Hands every bucket whose layers are all ready, in index order, to the communicator. */
int tally__sync_post_ready(tally__sync *s);
/* Stages 1-2, after the update: every rank's new piece of layer l to everyone. */
long tally__sync_share_params(tally__sync *s, int l);
/* Stage 3: layer l's parameters gathered into its buffer and put in place for its op (with overlap, the
 * next one's sent for too; next < 0: none). */
int tally__sync_use_params(tally__sync *s, int l, int next);

/* ---- the state dict's access (zero.c) ---- */

/* The optimizer's state of kind `second` (0: m, 1: v) for a whole layer: its own memory, or buf (pieces
 * are gathered: collective); NULL with *rc on failure. */
const float *tally__sync_opt_layer(tally__sync *s, int second, int layer, float *buf, int *rc);
/* Asks read() for every range of the flat layout this rank keeps of `what` (0: parameters; 1, 2: the
 * optimizer's m, v), into where it keeps them. */
int tally__sync_load_part(tally__sync *s, int what, int (*read)(void *arg, size_t begin, size_t count, float *dst),
                          void *arg);
/* The parameters were replaced from outside (a checkpoint): layers gathered before are stale. */
void tally__sync_params_changed(tally__sync *s);

#endif
