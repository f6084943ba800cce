/* sync_ddp.c - stage 0 behind the sync interface: whole replicas, the DDP engine averaging bucket by
 * bucket while backward runs (a codec may replace a bucket's allreduce), a whole optimizer. */
#include <stdlib.h>
#include <string.h>

#include "../core/err.h"
#include "../optim/optim_int.h"
#include "norm.h"
#include "sync.h"

static int ddp_layer_ready(void *arg, int layer) { return tally_ddp_layer_ready(arg, layer); }

static tally__model_hooks ddp_hooks(tally__sync *s) {
    return (tally__model_hooks){.arg = s->ddp, .after_backward = ddp_layer_ready};
}

static int ddp_micro_begin(tally__sync *s, int k) {
    int rc = tally_ddp_begin(s->ddp);
    return rc < 0 ? rc : 0;
}

static int ddp_micro_end(tally__sync *s) { return tally_ddp_wait(s->ddp); }
static int ddp_drain(tally__sync *s) { return 0; } /* tally_ddp_wait left nothing in flight */

static int ddp_skip(tally__sync *s) {
    memset(s->m->grads, 0, s->m->nparams * sizeof(float));
    return 0;
}

/* Weight decay where it applies: everywhere, or the ranges between the ones it skips. */
static int ddp_apply(tally__sync *s, float lr) {
    float *p = s->m->params;
    const float *g = s->m->grads;
    if (!s->nnodecay) {
        tally_optim_step(&s->optim, p, g, lr);
    } else {
        size_t at = 0;
        for (int i = 0; i < s->nnodecay; i++) {
            tally__optim_step_range(&s->optim, p, g, at, s->nodecay[2 * i], lr, 1);
            tally__optim_step_range(&s->optim, p, g, s->nodecay[2 * i], s->nodecay[2 * i + 1], lr, 0);
            at = s->nodecay[2 * i + 1];
        }
        tally__optim_step_range(&s->optim, p, g, at, s->m->nparams, lr, 1);
        tally__optim_count_step(&s->optim);
    }
    memset(s->m->grads, 0, s->m->nparams * sizeof(float));
    return 0;
}

/* Every rank holds the whole averaged gradient: its norm needs no communication. */
static int ddp_clip(tally__sync *s, float max_norm, double *norm) {
    float *g = s->m->grads;
    *norm = tally__grad_clip_to(g, s->m->nparams, tally__grad_sumsq(g, s->m->nparams), max_norm);
    return 0;
}

static void ddp_stats(const tally__sync *s, tally__sync_stats *out) {
    tally_ddp_stats d;
    tally_ddp_get_stats(s->ddp, &d);
    *out =
        (tally__sync_stats){.comm_s = d.comm_s, .wait_s = d.wait_s, .grad_bytes = d.bytes_sent, .buckets = d.buckets};
}

static double ddp_blocked(const tally__sync *s) { return 0; }

static int ddp_each_layer(tally__sync *s, void (*fn)(void *, int, const float *, size_t), void *arg) {
    const tally__model *m = s->m;
    for (int l = 0; l < m->nlayers; l++) fn(arg, l, m->params + m->offsets[l], m->offsets[l + 1] - m->offsets[l]);
    return 0;
}

static tally__sync_mem ddp_memory(const tally__sync *s) {
    return (tally__sync_mem){
        .params = s->m->params_bytes, .grads = s->m->grads_bytes, .optim = tally_optim_state_bytes(&s->optim)};
}

static int ddp_overflow(const tally__sync *s) { return tally__codec_overflow(s->codec); }
static void ddp_step_begin(tally__sync *s) { tally__codec_step_begin(s->codec); }
static void ddp_step_end(tally__sync *s, int taken) { tally__codec_step_end(s->codec, taken); }

static void ddp_close(tally__sync *s) {
    free(s->nodecay);
    s->nodecay = NULL;
    tally_ddp_free(s->ddp);
    tally__codec_free(s->codec);
    tally_optim_free(&s->optim);
    s->ddp = NULL;
    s->codec = NULL;
}

static const float *ddp_opt_layer(tally__sync *s, int second, int layer, float *buf, int *rc) {
    *rc = 0;
    return (second ? s->optim.v : s->optim.m) + s->m->offsets[layer];
}

static int ddp_load_part(tally__sync *s, int what, int (*read)(void *, size_t, size_t, float *), void *arg) {
    float *dst = what == 0 ? s->m->params : what == 1 ? s->optim.m : s->optim.v;
    return read(arg, 0, s->m->nparams, dst);
}

static long long ddp_opt_step(const tally__sync *s) { return s->optim.step; }
static void ddp_set_opt_step(tally__sync *s, long long step) { s->optim.step = step; }
static void ddp_params_changed(tally__sync *s) {}

static const tally__sync_ops ddp_ops = {.hooks = ddp_hooks,
                                        .micro_begin = ddp_micro_begin,
                                        .micro_end = ddp_micro_end,
                                        .drain = ddp_drain,
                                        .skip = ddp_skip,
                                        .apply = ddp_apply,
                                        .stats = ddp_stats,
                                        .blocked = ddp_blocked,
                                        .each_layer = ddp_each_layer,
                                        .memory = ddp_memory,
                                        .overflow = ddp_overflow,
                                        .step_begin = ddp_step_begin,
                                        .step_end = ddp_step_end,
                                        .close = ddp_close,
                                        .opt_layer = ddp_opt_layer,
                                        .load_part = ddp_load_part,
                                        .opt_step = ddp_opt_step,
                                        .set_opt_step = ddp_set_opt_step,
                                        .params_changed = ddp_params_changed,
                                        .clip = ddp_clip};

/* The engine's buckets to the codec, and one plain f32 allreduce of each, on zeros, counted: the bytes
 * the step would send uncompressed. */
static int ddp_codec_attach(tally__sync *s) {
    tally_ddp_stats st;
    tally_ddp_get_stats(s->ddp, &st);
    int rank = tally_comm_rank(s->comm);
    size_t *begin = malloc(2 * (size_t)st.buckets * sizeof *begin), *end = begin + st.buckets, most = 0;
    if (!begin) return tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory", rank);
    for (int i = 0; i < st.buckets; i++) {
        tally_ddp_bucket(s->ddp, i, &begin[i], &end[i]);
        if (end[i] - begin[i] > most) most = end[i] - begin[i];
    }
    int rc = tally__codec_set_buckets(s->codec, st.buckets, begin, end);
    float *zeros = rc ? NULL : calloc(most + 1, sizeof(float));
    if (!rc && !zeros) rc = tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory", rank);
    unsigned long long sent0 = tally_comm_bytes_sent(s->comm);
    for (int i = 0; i < st.buckets && !rc; i++)
        rc = tally_allreduce(s->comm, zeros, zeros, end[i] - begin[i], TALLY_F32, TALLY_SUM);
    s->f32_bytes_step = tally_comm_bytes_sent(s->comm) - sent0;
    free(zeros);
    free(begin);
    return rc;
}

/* The model's 1-D tensors (biases, norms), adjacent ones merged, in buffer order. */
static int ddp_nodecay_ranges(tally__sync *s) {
    const tally__model *m = s->m;
    s->nodecay = malloc(2 * (size_t)(m->ntensors + 1) * sizeof *s->nodecay);
    if (!s->nodecay) return tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory", tally_comm_rank(s->comm));
    for (int t = 0; t < m->ntensors; t++) {
        const tally__tensor *T = &m->tensor[t];
        if (T->ndim >= 2) continue;
        size_t *last = s->nnodecay ? &s->nodecay[2 * s->nnodecay - 1] : NULL;
        if (last && *last == T->offset) {
            *last += T->count;
            continue;
        }
        s->nodecay[2 * s->nnodecay] = T->offset;
        s->nodecay[2 * s->nnodecay + 1] = T->offset + T->count;
        s->nnodecay++;
    }
    return 0;
}

int tally__sync_open_ddp(tally__sync *s, const tally__sync_cfg *cfg) {
    tally__model *m = s->m;
    s->ops = &ddp_ops;
    tally_ddp_opts dopts = {.bucket_bytes = (size_t)((cfg->bucket_mb > 0 ? cfg->bucket_mb : 25.0) * 1048576.0),
                            .no_overlap = cfg->no_overlap,
                            .accum = cfg->accum};
    int compress = cfg->codec.kind != TALLY__CODEC_NONE, rc;
    if (compress) {
        if ((rc = tally__codec_create(&cfg->codec, s->comm, m, s->seed, &s->codec))) return rc;
        dopts.reduce = tally__codec_reduce;
        dopts.reduce_arg = s->codec;
    }
    if ((rc = tally_ddp_create(s->comm, m->grads, m->nparams, m->offsets, m->nlayers, &dopts, &s->ddp))) return rc;
    if (compress && (rc = ddp_codec_attach(s))) return rc;
    if (cfg->decay_matrices && (rc = ddp_nodecay_ranges(s))) return rc;
    return tally_optim_init(&s->optim, &s->optim_cfg, m->nparams);
}
