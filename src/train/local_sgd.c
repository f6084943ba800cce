/* local_sgd.c - --local-steps H (DiLoCo): the round's end (the parameter change averaged over the ranks,
 * sent in f32, fp16 or int8, and the outer Nesterov step), and the outer state as a checkpoint component. */
#include "local_sgd.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/clock.h"
#include "../core/err.h"
#include "../dp/codec.h"
#include "trainer.h"

const char *const tally__outer_compress_words[] = {"none", "fp16", "int8", NULL};
static const double compress_ratios[] = {1, 0.5, 0.25};

int tally__outer_compress_parse(const char *s) {
    for (int i = 0; tally__outer_compress_words[i]; i++)
        if (!strcmp(s, tally__outer_compress_words[i])) return i;
    return -1;
}

const char *tally__outer_compress_name(int c) { return c >= 0 && c < 3 ? tally__outer_compress_words[c] : "?"; }

double tally__outer_compress_ratio(int c) { return c >= 0 && c < 3 ? compress_ratios[c] : 1; }

const char *tally__outer_ratio_name(double ratio) {
    return ratio == compress_ratios[TALLY__OUTER_INT8]   ? "int8"
           : ratio == compress_ratios[TALLY__OUTER_FP16] ? "fp16"
                                                         : "f32";
}

int tally__local_check(const tally__train_cfg *cfg, int rank) {
    const tally__local_cfg *c = &cfg->local;
    const char *clash = cfg->async.enabled        ? "--mode async (the workers of a parameter server)"
                        : cfg->sync.zero          ? "--zero 1, 2 or 3 (every rank keeps its own optimizer state)"
                        : cfg->sync.codec.kind    ? "--compress (the averaged change has --outer-compress)"
                        : cfg->check_replicas > 0 ? "--check-replicas (the replicas differ between averagings)"
                                                  : NULL;
    if (c->steps <= 0) return 0;
    if (clash)
        return tally__seterr(TALLY_E_INVALID, "rank %d: --local-steps does not go with %s; leave one out", rank, clash);
    if (!(c->outer_lr > 0) || !(c->outer_momentum >= 0 && c->outer_momentum < 1) || c->compress < 0 ||
        c->compress > TALLY__OUTER_INT8)
        return tally__seterr(TALLY_E_INVALID,
                             "rank %d: --outer-lr must be > 0 (it is %g), --outer-momentum in [0, 1) (it is %g) and "
                             "--outer-compress none, fp16 or int8",
                             rank, c->outer_lr, c->outer_momentum);
    return 0;
}

int tally__local_open(tally__local_sgd *l, const tally__local_cfg *cfg, tally_comm *world, tally__sync *inner) {
    memset(l, 0, sizeof *l);
    l->cfg = *cfg;
    l->world = world;
    l->inner = inner;
    l->rank = tally_comm_rank(world);
    l->size = tally_comm_size(world);
    l->n = inner->m->nparams;
    size_t bytes = l->n * sizeof(float) + 4;
    l->anchor = malloc(bytes);
    l->momentum = calloc(1, bytes);
    l->delta = calloc(1, bytes);
    if (cfg->compress == TALLY__OUTER_FP16) l->half = malloc(l->n * sizeof(uint16_t) + 2);
    if (!l->anchor || !l->momentum || !l->delta || (cfg->compress == TALLY__OUTER_FP16 && !l->half))
        return tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory for local SGD's outer state (%zu parameters)",
                             l->rank, l->n);
    memcpy(l->anchor, inner->m->params, l->n * sizeof(float));
    unsigned long long sent0 = tally_comm_bytes_sent(world);
    int rc = tally_allreduce(world, l->delta, l->delta, l->n, TALLY_F32, TALLY_SUM); /* zeros: stay zeros */
    l->f32_bytes = tally_comm_bytes_sent(world) - sent0;
    return rc;
}

void tally__local_close(tally__local_sgd *l) {
    free(l->anchor);
    free(l->momentum);
    free(l->delta);
    free(l->half);
    memset(l, 0, sizeof *l);
}

/* The ranks' mean of delta, in place, sent as --outer-compress says. */
static int local_mean(tally__local_sgd *l) {
    if (l->cfg.compress == TALLY__OUTER_INT8) return tally__codec_int8_mean(l->world, l->delta, l->n, NULL);
    if (l->cfg.compress == TALLY__OUTER_F32)
        return tally_allreduce(l->world, l->delta, l->delta, l->n, TALLY_F32, TALLY_AVG);
    int overflowed = 0;
    int rc = tally__codec_half_reduce(l->world, l->delta, l->n, 0, l->n, TALLY_F16, TALLY_SUM, 0, (float)l->size,
                                      l->half, &overflowed);
    if (!rc && overflowed)
        return tally__seterr(TALLY_E_NONFINITE,
                             "rank %d: round %ld's parameter change overflowed fp16's range in the sum over the "
                             "ranks; train with --outer-compress int8 or none",
                             l->rank, l->rounds + 1);
    return rc;
}

/* Nesterov as torch.optim.SGD's: buf = mu buf + g; the step takes g + mu buf. Every replica becomes the
 * new anchor. */
static void local_outer_step(tally__local_sgd *l) {
    float lr = (float)l->cfg.outer_lr, mu = (float)l->cfg.outer_momentum;
    float *p = l->inner->m->params;
    for (size_t i = 0; i < l->n; i++) {
        float g = l->delta[i], m = mu * l->momentum[i] + g;
        l->momentum[i] = m;
        l->anchor[i] -= lr * (g + mu * m);
        p[i] = l->anchor[i];
    }
}

int tally__local_average(tally__local_sgd *l) {
    uint64_t t0 = tally__now_ns();
    unsigned long long sent0 = tally_comm_bytes_sent(l->world);
    const float *p = l->inner->m->params;
    for (size_t i = 0; i < l->n; i++) l->delta[i] = l->anchor[i] - p[i];
    int rc = local_mean(l);
    int finite = 1;
    for (size_t i = 0; i < l->n && !rc; i++) finite &= isfinite(l->delta[i]) != 0;
    if (!rc && !finite)
        rc = tally__seterr(TALLY_E_NONFINITE,
                           "rank %d: round %ld's averaged parameter change holds a NaN or an infinity: some rank's "
                           "replica diverged in its local steps; lower --lr or --local-steps",
                           l->rank, l->rounds + 1);
    if (!rc) local_outer_step(l);
    l->since = 0;
    l->rounds += !rc;
    l->run_rounds += !rc;
    l->seconds += (double)(tally__now_ns() - t0) * 1e-9;
    l->bytes += tally_comm_bytes_sent(l->world) - sent0;
    return rc;
}

/* ---- the state dict ---- */

/* outer.rounds, outer.inner_step [N], outer.momentum [n], then outer.inner.<r>.<kind> [n], r-major. */
enum { ENTRY_ROUNDS, ENTRY_STEPS, ENTRY_MOMENTUM, ENTRY_INNER };

static int ls_count(void *arg) {
    const tally__local_sgd *l = arg;
    return ENTRY_INNER + l->size * tally__sync_opt_kinds(l->inner);
}

static void ls_entry(void *arg, int i, char *name, size_t cap, tally__ckpt_tensor *t) {
    const tally__local_sgd *l = arg;
    *t = (tally__ckpt_tensor){.dtype = TALLY_F32, .ndim = 1, .shape = {l->n}};
    if (i == ENTRY_ROUNDS) {
        snprintf(name, cap, "outer.rounds");
        *t = (tally__ckpt_tensor){.dtype = TALLY_I64, .ndim = 1, .shape = {1}};
    } else if (i == ENTRY_STEPS) {
        snprintf(name, cap, "outer.inner_step");
        *t = (tally__ckpt_tensor){.dtype = TALLY_I64, .ndim = 1, .shape = {(uint64_t)l->size}};
    } else if (i == ENTRY_MOMENTUM) {
        snprintf(name, cap, "outer.momentum");
    } else {
        int k = (i - ENTRY_INNER) % tally__sync_opt_kinds(l->inner),
            r = (i - ENTRY_INNER) / tally__sync_opt_kinds(l->inner);
        snprintf(name, cap, "outer.inner.%d.%s", r, tally__sync_opt_kind_name(l->inner, k));
    }
}

/* Every rank's inner state sent to rank 0 in turn (one in memory at a time). */
static int ls_save(void *arg, int first, const tally__state_sink *out) {
    tally__local_sgd *l = arg;
    int64_t rounds = l->rounds, mine = tally__sync_opt_step(l->inner);
    int64_t *steps = malloc(sizeof(int64_t) * (size_t)l->size);
    float *buf = malloc(l->n * sizeof(float) + 4);
    int rc = steps && buf ? 0 : tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory", l->rank);
    if (!rc) rc = tally_allgather(l->world, &mine, steps, 1, TALLY_I64);
    if (!rc) {
        out->put(out->arg, first + ENTRY_ROUNDS, &rounds, sizeof rounds);
        out->put(out->arg, first + ENTRY_STEPS, steps, sizeof(int64_t) * (size_t)l->size);
        out->put(out->arg, first + ENTRY_MOMENTUM, l->momentum, l->n * sizeof(float));
    }
    int kinds = tally__sync_opt_kinds(l->inner);
    for (int r = 0; r < l->size && !rc; r++)
        for (int k = 0; k < kinds && !rc; k++) {
            if (r == l->rank) rc = tally__sync_opt_flat(l->inner, k, buf);
            if (!rc) rc = tally_broadcast(l->world, buf, l->n, TALLY_F32, r);
            if (!rc) out->put(out->arg, first + ENTRY_INNER + r * kinds + k, buf, l->n * sizeof(float));
        }
    free(steps);
    free(buf);
    return rc;
}

static int ls_f32(const tally__local_sgd *l, const tally__ckpt *ck, const char *name, const float **v) {
    const uint64_t shape[1] = {l->n};
    return tally__state_f32(ck, name, 1, shape, 0, l->n, v);
}

/* The inner state of kind k: this rank's own when the checkpoint has as many ranks, else their mean. */
static int ls_load_inner(tally__local_sgd *l, const tally__ckpt *ck, int saved, int k) {
    char kind[48];
    snprintf(kind, sizeof kind, ".%s", tally__sync_opt_kind_name(l->inner, k));
    int rc = tally__state_f32_per_rank(ck, "outer.inner.", kind, saved, l->rank, l->size, l->n, l->delta);
    if (!rc) rc = tally__sync_opt_load_flat(l->inner, k, l->delta);
    memset(l->delta, 0, l->n * sizeof(float));
    return rc;
}

static int ls_load(void *arg, const tally__ckpt *ck) {
    tally__local_sgd *l = arg;
    memcpy(l->anchor, l->inner->m->params, l->n * sizeof(float)); /* checkpoints are taken between rounds */
    l->since = 0;
    if (!tally__ckpt_find(ck, "outer.rounds")) return 0; /* a synchronous run's: the outer state starts afresh */
    int64_t rounds = 0;
    const float *v;
    int rc = tally__state_i64(ck, "outer.rounds", &rounds);
    if (!rc && rounds < 0)
        rc = tally__seterr(TALLY_E_CORRUPT, "rank %d: checkpoint %s: outer.rounds is %lld: the file is malformed",
                           l->rank, tally__ckpt_label(ck), (long long)rounds);
    if (!rc && !(rc = ls_f32(l, ck, "outer.momentum", &v))) memcpy(l->momentum, v, l->n * sizeof(float));
    const tally__ckpt_tensor *t = rc ? NULL : tally__ckpt_find(ck, "outer.inner_step");
    int saved = t && t->ndim == 1 && t->shape[0] <= INT32_MAX ? (int)t->shape[0] : 0;
    const void *steps = NULL;
    if (!rc && !saved)
        rc = tally__seterr(TALLY_E_CORRUPT, "rank %d: checkpoint %s: outer.inner_step is missing or malformed", l->rank,
                           tally__ckpt_label(ck));
    if (!rc) rc = tally__ckpt_get(ck, "outer.inner_step", TALLY_I64, 1, (const uint64_t[1]){(uint64_t)saved}, &steps);
    for (int k = 0; k < tally__sync_opt_kinds(l->inner) && !rc; k++) rc = ls_load_inner(l, ck, saved, k);
    int64_t mine = 0;
    if (!rc && saved == l->size) memcpy(&mine, (const char *)steps + sizeof mine * (size_t)l->rank, sizeof mine);
    if (!rc && saved == l->size && mine < 0)
        rc = tally__seterr(TALLY_E_CORRUPT, "rank %d: checkpoint %s: outer.inner_step[%d] is negative", l->rank,
                           tally__ckpt_label(ck), l->rank);
    if (!rc && saved == l->size) tally__sync_set_opt_step(l->inner, mine);
    if (!rc) l->rounds = rounds;
    return rc;
}

void tally__local_state(tally__local_sgd *l, tally__state *out) {
    *out = (tally__state){.arg = l, .count = ls_count, .entry = ls_entry, .save = ls_save, .load = ls_load};
}
