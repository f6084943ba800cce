/* sync_zero.c - ZeRO stages 1-3 behind the sync interface: each rank owns a shard of the optimizer
 * state (and of the gradients, and of the parameters), its collectives on ZeRO's queue. */
#include "sync.h"

#include <string.h>

static tally__model_hooks zs_hooks(tally__sync *s) { return tally__zero_hooks(&s->zero); }

static int zs_micro_begin(tally__sync *s, int k) {
    tally__zero_micro(&s->zero, k);
    return 0;
}

static int zs_micro_end(tally__sync *s) { return 0; } /* the reductions run on the queue meanwhile */
static int zs_drain(tally__sync *s) { return tally__zero_drain(&s->zero); }
static int zs_skip(tally__sync *s) { return tally__zero_skip(&s->zero); }
static int zs_apply(tally__sync *s, float lr) { return tally__zero_step(&s->zero, lr); }

static void zs_stats(const tally__sync *s, tally__sync_stats *out) {
    *out = (tally__sync_stats){.comm_s = s->zero.q.comm_s,
                               .wait_s = tally__zero_blocked(&s->zero),
                               .grad_bytes = s->zero.q.bytes[TALLY__POST_GRAD]};
}

static double zs_blocked(const tally__sync *s) { return tally__zero_blocked(&s->zero); }

static int zs_each_layer(tally__sync *s, void (*fn)(void *, int, const float *, size_t), void *arg) {
    return tally__zero_each_layer(&s->zero, fn, arg);
}

static tally__sync_mem zs_memory(const tally__sync *s) {
    tally__zero_bytes b = tally__zero_memory(&s->zero);
    return (tally__sync_mem){.params = b.params, .grads = b.grads, .optim = b.optim, .buffers = b.buffers};
}

static int zs_overflow(const tally__sync *s) { return s->zero.overflow ? TALLY__SYNC_OVERFLOW_LAYER : -1; }
static void zs_step_begin(tally__sync *s) { s->zero.overflow = 0; }
static void zs_step_end(tally__sync *s, int taken) {}
static void zs_close(tally__sync *s) { tally__zero_free(&s->zero); }

static float *zs_state_of(const tally_optim *o, int second) { return second ? o->v : o->m; }

/* A layer's pieces from their owners, then the tail every rank holds alike. */
static const float *zs_opt_layer(tally__sync *s, int second, int layer, float *buf, int *rc) {
    tally__zero_layer *L = &s->zero.layer[layer];
    if ((*rc = tally_allgather(s->comm, zs_state_of(&L->opt_piece, second), buf, L->piece, TALLY_F32))) return NULL;
    if (L->tail) memcpy(buf + (size_t)s->zero.size * L->piece, zs_state_of(&L->opt_tail, second), L->tail * 4);
    return buf;
}

/* This rank's piece of each layer, then the layer's tail; parameters below stage 3 are whole. */
static int zs_load_part(tally__sync *s, int what, int (*read)(void *, size_t, size_t, float *), void *arg) {
    tally__zero *z = &s->zero;
    if (what == 0 && z->stage < 3) return read(arg, 0, s->m->nparams, s->m->params);
    int rc = 0;
    for (int l = 0; l < z->nlayers && !rc; l++) {
        tally__zero_layer *L = &z->layer[l];
        float *piece = what == 0 ? z->pshard + L->shard_off : zs_state_of(&L->opt_piece, what == 2);
        float *tail = what == 0 ? piece + L->piece : zs_state_of(&L->opt_tail, what == 2);
        rc = read(arg, L->off + (size_t)z->rank * L->piece, L->piece, piece);
        if (!rc) rc = read(arg, L->off + (size_t)z->size * L->piece, L->tail, tail);
    }
    return rc;
}

/* Every shard's optimizer counts the same updates: the first stands for all. */
static long long zs_opt_step(const tally__sync *s) { return s->zero.layer[0].opt_piece.step; }

static void zs_set_opt_step(tally__sync *s, long long step) {
    for (int l = 0; l < s->zero.nlayers; l++) s->zero.layer[l].opt_piece.step = s->zero.layer[l].opt_tail.step = step;
}

static void zs_params_changed(tally__sync *s) { tally__zero_params_changed(&s->zero); }
static int zs_clip(tally__sync *s, float max_norm, double *norm) { return tally__zero_clip(&s->zero, max_norm, norm); }

static const tally__sync_ops zero_ops = {.hooks = zs_hooks,
                                         .micro_begin = zs_micro_begin,
                                         .micro_end = zs_micro_end,
                                         .drain = zs_drain,
                                         .skip = zs_skip,
                                         .apply = zs_apply,
                                         .stats = zs_stats,
                                         .blocked = zs_blocked,
                                         .each_layer = zs_each_layer,
                                         .memory = zs_memory,
                                         .overflow = zs_overflow,
                                         .step_begin = zs_step_begin,
                                         .step_end = zs_step_end,
                                         .close = zs_close,
                                         .opt_layer = zs_opt_layer,
                                         .load_part = zs_load_part,
                                         .opt_step = zs_opt_step,
                                         .set_opt_step = zs_set_opt_step,
                                         .params_changed = zs_params_changed,
                                         .clip = zs_clip};

int tally__sync_open_zero(tally__sync *s, const tally__sync_cfg *cfg) {
    s->ops = &zero_ops;
    int rc = tally__zero_init(&s->zero, s->comm, s->m, cfg->zero, cfg->accum, &s->optim_cfg, s->seed, !cfg->no_overlap);
    if (!rc && cfg->decay_matrices) tally__zero_decay_matrices(&s->zero);
    if (rc || cfg->codec.kind == TALLY__CODEC_NONE) return rc;
    if ((rc = tally__zero_set_half(&s->zero, (tally_dtype)tally__codec_half_dtype(&cfg->codec)))) return rc;
    return tally__zero_measure_f32(&s->zero, &s->f32_bytes_step);
}
