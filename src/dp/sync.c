/* sync.c - the gradient-sync engine's life and a step's calls, the same for every stage: open (the model
 * laid out for the stage, the shards, the collectives), the micro-batches, drain, skip, clip, the update. */
#include "sync.h"

#include <stdlib.h>
#include <string.h>
#include <tally/ddp.h>

#include "../core/clock.h"
#include "../core/err.h"
#include "sync_int.h"

/* Gradients in the communicator's shared memory, so its peers read them in place. */
static void *sync_grads_alloc(void *comm, size_t bytes) { return tally_mem_alloc(comm, bytes); }
static void sync_grads_release(void *comm, void *p) { tally_mem_free(comm, p); }

/* The stage's shards and collectives. Weight decay on matrices only follows each layer's weight at every
 * stage (its bias or a norm's 1-D tensors take none), so every stage updates each element alike. */
static int sync_open_engine(tally__sync *s, const tally__sync_cfg *cfg) {
    s->stage = cfg->zero;
    s->rank = tally_comm_rank(s->comm);
    s->size = tally_comm_size(s->comm);
    s->accum = cfg->accum;
    s->overlap = !cfg->no_overlap && s->size > 1;
    s->half = -1;
    s->held[0] = s->held[1] = -1;
    s->gather_ticket[0] = s->gather_ticket[1] = s->staging_ticket[0] = s->staging_ticket[1] = -1;
    s->last_micro = s->accum == 1;
    s->averaged = !s->stage;
    int rc = tally__sync_layout(s);
    if (!rc) rc = tally__sync_alloc_shards(s, s->seed);
    if (!rc && cfg->decay_matrices) tally__sync_decay_matrices(s);
    return rc ? rc : tally__sync_open_comm(s, cfg);
}

int tally__sync_open(tally__sync *s, tally_comm *comm, tally__model *m, const tally__model_cfg *mc, int max_batch,
                     const tally__sync_cfg *cfg, const tally_optim_cfg *optim, uint64_t seed) {
    memset(s, 0, sizeof *s);
    s->comm = comm;
    s->m = m;
    /* Stages 2-3 keep gradients in shards, stage 3 parameters too: the model leaves those out. */
    int flags = (cfg->zero >= 2 ? TALLY__MODEL_NO_GRADS : 0) | (cfg->zero == 3 ? TALLY__MODEL_NO_PARAMS : 0);
    tally__mem_source src = {.alloc = sync_grads_alloc, .release = sync_grads_release, .ctx = comm};
    int rc = tally__model_init(m, mc, max_batch, seed, cfg->zero >= 2 ? NULL : &src, flags);
    /* Identical initialisation already follows from the seed; the broadcast makes it so by contract. */
    if (!rc && m->params) rc = tally_ddp_sync_params(comm, m->params, m->nparams);
    if (rc) return rc;
    s->optim_cfg = *optim;
    s->codec_cfg = cfg->codec;
    s->seed = seed;
    return sync_open_engine(s, cfg);
}

void tally__sync_close(tally__sync *s) {
    tally__post_free(&s->q); /* first: queued operations use what follows */
    tally__buckets_free(&s->buckets);
    tally__codec_free(s->codec);
    s->codec = NULL;
    free(s->hbuf);
    s->hbuf = NULL;
    tally__sync_free_shards(s);
}

int tally__sync_micro_begin(tally__sync *s, int k) {
    s->last_micro = k == s->accum - 1;
    if (s->stage >= 2 || s->last_micro) tally__buckets_begin(&s->buckets); /* this one's backward reduces */
    return 0;
}

/* A layer never marked is reduced now (without overlap, stages 0-1: every one, in order); on the step's
 * last micro-batch the step's reductions are then waited for. */
int tally__sync_micro_end(tally__sync *s) {
    if (s->stage < 2 && !s->last_micro) return tally__post_failed(&s->q);
    uint64_t t0 = tally__now_ns();
    tally__buckets_all_ready(&s->buckets);
    int rc = tally__sync_post_ready(s);
    if (!rc && s->last_micro) rc = tally__post_drain(&s->q);
    s->end_wait_s += (double)(tally__now_ns() - t0) * 1e-9;
    return rc;
}

int tally__sync_drain(tally__sync *s) { return tally__post_drain(&s->q); }

int tally__sync_skip(tally__sync *s) {
    int rc = tally__post_drain(&s->q);
    tally__sync_clear_step(s);
    return rc;
}

int tally__sync_clip(tally__sync *s, float max_norm, double *norm) {
    int rc = tally__post_drain(&s->q);
    if (rc) return rc;
    tally__sync_average(s);
    return tally__sync_clip_shards(s, max_norm, norm);
}

/* Each layer's pieces are updated and (stages 1-2) sent out while the next layer is updated. */
int tally__sync_apply(tally__sync *s, float lr) {
    int rc = tally__post_drain(&s->q);
    if (!rc) tally__sync_average(s);
    for (int l = s->nlayers - 1; l >= 0 && !rc; l--) {
        tally__sync_update_layer(s, l, lr);
        long t = s->stage == 1 || s->stage == 2 ? tally__sync_share_params(s, l) : 0;
        if (t < 0) rc = (int)t;
    }
    if (!rc) rc = tally__post_drain(&s->q);
    tally__sync_clear_step(s);
    return rc;
}

void tally__sync_stats_get(const tally__sync *s, tally__sync_stats *out) {
    *out = (tally__sync_stats){.comm_s = s->q.comm_s,
                               .wait_s = s->q.wait_s,
                               .grad_bytes = s->q.bytes[TALLY__POST_GRAD],
                               .buckets = s->stage ? 0 : s->buckets.n};
}

double tally__sync_blocked(const tally__sync *s) { return s->q.wait_s - s->end_wait_s; }

int tally__sync_each_layer(tally__sync *s, void (*fn)(void *, int, const float *, size_t), void *arg) {
    for (int l = 0; l < s->nlayers; l++) {
        const tally__sync_layer *L = &s->layer[l];
        const float *p = s->m->params ? s->m->params + L->off : NULL;
        if (s->stage == 3) {
            int rc = tally__sync_use_params(s, l, -1);
            if (rc) return rc;
            p = s->gathered[tally__sync_buf_of(s, l)];
        }
        fn(arg, l, p, L->n);
    }
    return 0;
}

tally__sync_mem tally__sync_memory(const tally__sync *s) { return tally__sync_shard_memory(s); }

int tally__sync_overflow(const tally__sync *s) {
    if (!s->stage) return tally__codec_overflow(s->codec);
    return s->overflow ? TALLY__SYNC_OVERFLOW_LAYER : -1;
}

void tally__sync_step_begin(tally__sync *s) {
    tally__codec_step_begin(s->codec);
    s->overflow = 0;
}

void tally__sync_step_end(tally__sync *s, int taken) { tally__codec_step_end(s->codec, taken); }
