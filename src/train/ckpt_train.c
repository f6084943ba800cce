/* ckpt_train.c - what a training checkpoint holds (position, identity, every parameter tensor, the
 * optimizer's state per tensor, all whole), how ranks gather shards so rank 0 can write it, and how
 * each rank takes back its part of every tensor, whatever world size or ZeRO stage wrote it. */
#include "ckpt_train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/err.h"
#include "../core/log.h"
#include "../ckpt/ckpt.h"

/* The optimizer's per-parameter state, named as torch.optim's state_dict names it. */
typedef struct state_kind {
    const char *suffix;
    int second;              /* 0: tally_optim.m, 1: tally_optim.v */
} state_kind;

static int ck_state_kinds(const tally_optim_cfg *o, state_kind *out) {
    if (o->kind == TALLY_OPTIM_ADAMW) {
        out[0] = (state_kind){"exp_avg", 0};
        out[1] = (state_kind){"exp_avg_sq", 1};
        return 2;
    }
    if (o->momentum > 0) {
        out[0] = (state_kind){"momentum_buffer", 0};
        return 1;
    }
    return 0;
}

static float *ck_state_of(const tally_optim *o, int second) { return second ? o->v : o->m; }

/* The optimizer whose step count stands for all (every shard's counts the same updates). */
static tally_optim *ck_first_optim(train_run *r) {
    return r->cfg->zero ? &r->sync.zero.layer[0].opt_piece : &r->sync.optim;
}

/* ---- the table ---- */

enum { CK_STEP, CK_EPOCH, CK_EPOCH_SAMPLES, CK_SKIPPED, CK_SEED, CK_WORLD, CK_OPT_STEP, CK_MODEL, CK_OPT_KIND, CK_NSCALAR };

typedef struct ck_table {
    tally__ckpt_tensor *t;
    char (*names)[TALLY__CKPT_NAME_MAX + 1];
    int count;
    int first_param, first_state; /* where the parameter tensors and each state kind's tensors begin */
    int nkinds;
    state_kind kinds[2];
    char model_id[96];
    int first_codec, nresidual, nq; /* codec.spec, then codec.residual.<rank> x nresidual, codec.q.<tensor> */
    char codec_spec[48];
} ck_table;

static void ck_model_id(const train_run *r, char *buf, size_t n) {
    snprintf(buf, n, "%s, %zu parameters in %d tensors", tally__model_name(r->model.cfg.kind), r->model.nparams,
             r->model.ntensors);
}

static void ck_scalar(ck_table *tb, int i, const char *name, tally_dtype dt, uint64_t len) {
    snprintf(tb->names[i], sizeof tb->names[i], "%s", name);
    tb->t[i] = (tally__ckpt_tensor){.name = tb->names[i], .dtype = dt, .ndim = 1, .shape = {len}};
}

static void ck_tensor(ck_table *tb, int i, const tally__tensor *T, const char *prefix, const char *suffix) {
    snprintf(tb->names[i], sizeof tb->names[i], "%s%s%s%s", prefix, T->name, suffix[0] ? "." : "", suffix);
    tb->t[i] = (tally__ckpt_tensor){.name = tb->names[i], .dtype = TALLY_F32, .ndim = T->ndim};
    for (int d = 0; d < T->ndim; d++) tb->t[i].shape[d] = (uint64_t)T->shape[d];
}

/* The codec's entries: its spec; each rank's residual (error feedback); PowerSGD's Q per matrix. */
static void ck_table_codec(const train_run *r, ck_table *tb) {
    tally__codec_spec(&r->cfg->codec, tb->codec_spec, sizeof tb->codec_spec);
    ck_scalar(tb, tb->first_codec, "codec.spec", TALLY_U8, strlen(tb->codec_spec));
    int i = tb->first_codec + 1;
    for (int k = 0; k < tb->nresidual; k++, i++) {
        snprintf(tb->names[i], sizeof tb->names[i], "codec.residual.%d", k);
        tb->t[i] = (tally__ckpt_tensor){.name = tb->names[i], .dtype = TALLY_F32, .ndim = 1,
                                        .shape = {r->model.nparams}};
    }
    for (int t = 0; t < r->model.ntensors; t++) {
        int rows, cols;
        if (!tally__codec_q(r->sync.codec, t, &rows, &cols)) continue;
        snprintf(tb->names[i], sizeof tb->names[i], "codec.q.%s", r->model.tensor[t].name);
        tb->t[i] = (tally__ckpt_tensor){.name = tb->names[i], .dtype = TALLY_F32, .ndim = 2,
                                        .shape = {(uint64_t)rows, (uint64_t)cols}};
        i++;
    }
}

static int ck_count_q(const train_run *r) {
    int n = 0;
    for (int t = 0; t < r->model.ntensors; t++) n += tally__codec_q(r->sync.codec, t, NULL, NULL) != NULL;
    return n;
}

static int ck_table_make(const train_run *r, ck_table *tb) {
    memset(tb, 0, sizeof *tb);
    const tally__model *m = &r->model;
    tb->nkinds = ck_state_kinds(&r->cfg->optim, tb->kinds);
    tb->nresidual = tally__codec_residual(r->sync.codec) ? r->size : 0;
    tb->nq = ck_count_q(r);
    tb->first_codec = CK_NSCALAR + m->ntensors * (1 + tb->nkinds);
    tb->count = tb->first_codec + 1 + tb->nresidual + tb->nq;
    tb->t = calloc((size_t)tb->count, sizeof *tb->t);
    tb->names = calloc((size_t)tb->count, sizeof *tb->names);
    if (!tb->t || !tb->names) return tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory", r->rank);
    ck_model_id(r, tb->model_id, sizeof tb->model_id);
    const char *scalars[] = {"train.step", "train.epoch", "train.epoch_samples", "train.skipped",
                             "train.seed", "train.world", "optim.step"};
    for (int i = 0; i < CK_MODEL; i++) ck_scalar(tb, i, scalars[i], TALLY_I64, 1);
    ck_scalar(tb, CK_MODEL, "train.model", TALLY_U8, strlen(tb->model_id));
    ck_scalar(tb, CK_OPT_KIND, "optim.kind", TALLY_U8, strlen(tally_optim_name(r->cfg->optim.kind)));
    tb->first_param = CK_NSCALAR;
    tb->first_state = tb->first_param + m->ntensors;
    for (int t = 0; t < m->ntensors; t++) ck_tensor(tb, tb->first_param + t, &m->tensor[t], "param.", "");
    for (int k = 0; k < tb->nkinds; k++)
        for (int t = 0; t < m->ntensors; t++)
            ck_tensor(tb, tb->first_state + k * m->ntensors + t, &m->tensor[t], "optim.", tb->kinds[k].suffix);
    ck_table_codec(r, tb);
    return 0;
}

static void ck_table_free(ck_table *tb) {
    free(tb->t);
    free(tb->names);
}

/* ---- saving ---- */

typedef struct ck_save {
    train_run *r;
    ck_table tb;
    tally__ckpt_writer *w;   /* rank 0 only; NULL elsewhere, or once writing failed */
    int wrc;                 /* rank 0: the first writing error */
    char why[1024];          /* its message: the collectives after it start with a clear one */
    float *layer_buf;        /* a whole layer's optimizer state, gathered from the shards */
} ck_save;

static void ck_write_failed(ck_save *s, int rc) {
    if (!rc || s->wrc) return;
    s->wrc = rc;
    snprintf(s->why, sizeof s->why, "%s", tally_last_error());
}

static void ck_put(ck_save *s, int index, const void *p, size_t bytes) {
    if (!s->w || s->wrc) return;
    ck_write_failed(s, tally__ckpt_write(s->w, index, p, bytes));
}

/* The tensors of the layer whose flat values [off, off + n) are at p, as entries first + tensor. */
static void ck_put_layer(ck_save *s, int first, size_t off, size_t n, const float *p) {
    const tally__model *m = &s->r->model;
    for (int t = 0; t < m->ntensors; t++) {
        const tally__tensor *T = &m->tensor[t];
        if (T->offset >= off && T->offset < off + n) ck_put(s, first + t, p + (T->offset - off), T->count * 4);
    }
}

static void ck_put_scalars(ck_save *s, long steps_done) {
    train_run *r = s->r;
    const tally__train_cfg *c = r->cfg;
    long samples_per_step = (long)c->batch * c->accum * r->size;
    int epoch = r->epoch;
    long in_epoch = r->in_epoch;
    if (in_epoch >= r->steps_per_epoch) epoch++, in_epoch = 0;
    int64_t v[CK_MODEL] = {steps_done, epoch, in_epoch * samples_per_step, r->guard.skipped, (int64_t)c->seed,
                           r->size, ck_first_optim(r)->step};
    for (int i = 0; i < CK_MODEL; i++) ck_put(s, i, &v[i], sizeof v[i]);
    ck_put(s, CK_MODEL, s->tb.model_id, strlen(s->tb.model_id));
    const char *kind = tally_optim_name(c->optim.kind);
    ck_put(s, CK_OPT_KIND, kind, strlen(kind));
}

static void ck_stage3_layer(void *arg, int layer, const float *p, size_t n) {
    ck_save *s = arg;
    ck_put_layer(s, s->tb.first_param, s->r->model.offsets[layer], n, p);
}

static int ck_put_params(ck_save *s) {
    train_run *r = s->r;
    if (r->cfg->zero == 3) {
        int rc = tally__zero_each_layer(&r->sync.zero, ck_stage3_layer, s); /* gathers: collective */
        return rc ? rc : tally__zero_drain(&r->sync.zero);
    }
    ck_put_layer(s, s->tb.first_param, 0, r->model.nparams, r->model.params);
    return 0;
}

/* One state kind of every layer: whole on every rank at stage 0; else each layer's pieces gathered
 * from their owners (the tails every rank holds alike). */
static int ck_put_state(ck_save *s, int k) {
    train_run *r = s->r;
    int first = s->tb.first_state + k * r->model.ntensors, second = s->tb.kinds[k].second;
    if (!r->cfg->zero) {
        ck_put_layer(s, first, 0, r->model.nparams, ck_state_of(&r->sync.optim, second));
        return 0;
    }
    for (int l = 0; l < r->sync.zero.nlayers; l++) {
        tally__zero_layer *L = &r->sync.zero.layer[l];
        int rc = tally_allgather(r->comm, ck_state_of(&L->opt_piece, second), s->layer_buf, L->piece, TALLY_F32);
        if (rc) return rc;
        if (L->tail) memcpy(s->layer_buf + (size_t)r->size * L->piece, ck_state_of(&L->opt_tail, second), L->tail * 4);
        ck_put_layer(s, first, L->off, L->n, s->layer_buf);
    }
    return 0;
}

/* The codec's state: every rank's residual sent in turn to rank 0 (one of them in memory at a time),
 * and the factors, the same on every rank, from rank 0's own. */
static int ck_put_codec(ck_save *s) {
    train_run *r = s->r;
    int i = s->tb.first_codec;
    ck_put(s, i++, s->tb.codec_spec, strlen(s->tb.codec_spec));
    float *res = tally__codec_residual(r->sync.codec), *buf = NULL;
    size_t n = r->model.nparams;
    if (s->tb.nresidual && !(buf = malloc(n * sizeof(float) + 4)))
        return tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory", r->rank);
    int rc = 0;
    for (int k = 0; k < s->tb.nresidual && !rc; k++, i++) {
        if (r->rank == k) memcpy(buf, res, n * sizeof(float));
        if (!(rc = tally_broadcast(r->comm, buf, n, TALLY_F32, k))) ck_put(s, i, buf, n * sizeof(float));
    }
    free(buf);
    for (int t = 0; t < r->model.ntensors && !rc; t++) {
        int rows, cols;
        const float *q = tally__codec_q(r->sync.codec, t, &rows, &cols);
        if (q) ck_put(s, i++, q, (size_t)rows * cols * sizeof(float));
    }
    return rc;
}

/* Every rank learns rank 0's outcome, so all go on or all stop, and on a failure rank 0's message `why`
 * too: the first rank to exit stops the others, and that may be one that only knew "rank 0 failed". */
static int ck_agree(train_run *r, int rc, const char *why, const char *what) {
    int32_t v = rc;
    int brc = tally_broadcast(r->comm, &v, 1, TALLY_I32, 0);
    if (brc || !v) return brc;
    char text[1024];
    snprintf(text, sizeof text, "%.1000s", why[0] ? why : "no reason given");
    if ((brc = tally_broadcast(r->comm, text, sizeof text, TALLY_U8, 0))) return brc;
    text[sizeof text - 1] = '\0';
    if (r->rank != 0)
        return tally__seterr(v, "rank %d: rank 0 could not %s the checkpoint in %s: %s", r->rank, what,
                             r->cfg->ckpt_dir, text);
    return tally__seterr(v, "rank 0: %s", text);
}

int tally__train_ckpt_save(train_run *r, long steps_done) {
    ck_save s = {.r = r};
    int rc = ck_table_make(r, &s.tb);
    if (!rc && r->cfg->zero && !(s.layer_buf = malloc(r->sync.zero.largest * sizeof(float) + 4)))
        rc = tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory", r->rank);
    if (!rc && r->rank == 0)
        ck_write_failed(&s, tally__ckpt_write_begin(r->cfg->ckpt_dir, steps_done, s.tb.t, s.tb.count, &s.w));
    if (!rc) {
        ck_put_scalars(&s, steps_done);
        rc = ck_put_params(&s);
        for (int k = 0; k < s.tb.nkinds && !rc; k++) rc = ck_put_state(&s, k);
        if (!rc) rc = ck_put_codec(&s);
    }
    if (r->rank == 0 && s.w) {
        if (rc || s.wrc) {
            tally__ckpt_write_abort(s.w);
        } else {
            ck_write_failed(&s, tally__ckpt_write_commit(s.w, r->cfg->ckpt_keep > 0 ? r->cfg->ckpt_keep : 2));
        }
    }
    free(s.layer_buf);
    ck_table_free(&s.tb);
    if (rc) return rc; /* a collective failed: every rank has its own error */
    if ((rc = ck_agree(r, s.wrc, s.why, "write"))) return rc;
    r->saved_step = steps_done;
    r->saves++;
    return 0;
}

/* ---- resuming ---- */

/* Values [begin, begin + count) of the flat layout from the tensors prefix + name (+ "." + suffix). */
static int ck_read_range(const tally__ckpt *ck, const tally__model *m, const char *prefix, const char *suffix,
                         size_t begin, size_t count, float *dst) {
    for (int t = 0; t < m->ntensors; t++) {
        const tally__tensor *T = &m->tensor[t];
        size_t lo = T->offset > begin ? T->offset : begin;
        size_t hi = T->offset + T->count < begin + count ? T->offset + T->count : begin + count;
        if (lo >= hi) continue;
        char name[TALLY__CKPT_NAME_MAX + 1];
        snprintf(name, sizeof name, "%s%s%s%s", prefix, T->name, suffix[0] ? "." : "", suffix);
        const void *data;
        uint64_t shape[TALLY__CKPT_MAX_DIMS];
        for (int d = 0; d < T->ndim; d++) shape[d] = (uint64_t)T->shape[d];
        int rc = tally__ckpt_get(ck, name, TALLY_F32, T->ndim, shape, &data);
        if (rc) return rc;
        memcpy(dst + (lo - begin), (const float *)data + (lo - T->offset), (hi - lo) * sizeof(float));
    }
    return 0;
}

static int ck_scalar_get(const tally__ckpt *ck, const char *name, int64_t *v) {
    const void *p;
    static const uint64_t one[1] = {1};
    int rc = tally__ckpt_get(ck, name, TALLY_I64, 1, one, &p);
    if (!rc) memcpy(v, p, sizeof *v);
    return rc;
}

static int ck_string_is(const tally__ckpt *ck, const char *name, const char *want, int rank, const char *what) {
    const tally__ckpt_tensor *t = tally__ckpt_find(ck, name);
    if (!t || t->dtype != TALLY_U8)
        return tally__seterr(TALLY_E_INVALID, "rank %d: checkpoint %s has no %s ('%s')", rank, tally__ckpt_label(ck),
                             what, name);
    if (t->bytes == strlen(want) && !memcmp(t->data, want, t->bytes)) return 0;
    return tally__seterr(TALLY_E_INVALID,
                         "rank %d: checkpoint %s was written for %s '%.*s', and this run has '%s': resume with the "
                         "settings that wrote it, or use another --ckpt directory",
                         rank, tally__ckpt_label(ck), what, (int)(t->bytes < 200 ? t->bytes : 200),
                         (const char *)t->data, want);
}

/* The run must be the one that wrote it: model, optimizer and seed (which fixes data order). */
static int ck_check_identity(train_run *r, const tally__ckpt *ck) {
    char id[96];
    ck_model_id(r, id, sizeof id);
    int rc = ck_string_is(ck, "train.model", id, r->rank, "the model");
    if (!rc) rc = ck_string_is(ck, "optim.kind", tally_optim_name(r->cfg->optim.kind), r->rank, "the optimizer");
    int64_t seed = 0;
    if (!rc) rc = ck_scalar_get(ck, "train.seed", &seed);
    if (!rc && (uint64_t)seed != r->cfg->seed)
        rc = tally__seterr(TALLY_E_INVALID,
                           "rank %d: checkpoint %s was written with --seed %llu and this run has --seed %llu: the seed "
                           "fixes the data order, so resume with the same one",
                           r->rank, tally__ckpt_label(ck), (unsigned long long)seed,
                           (unsigned long long)r->cfg->seed);
    return rc;
}

static int ck_load_params(train_run *r, const tally__ckpt *ck) {
    const tally__model *m = &r->model;
    if (r->cfg->zero != 3) return ck_read_range(ck, m, "param.", "", 0, m->nparams, m->params);
    for (int l = 0; l < r->sync.zero.nlayers; l++) {
        const tally__zero_layer *L = &r->sync.zero.layer[l];
        float *piece = r->sync.zero.pshard + L->shard_off;
        int rc = ck_read_range(ck, m, "param.", "", L->off + (size_t)r->rank * L->piece, L->piece, piece);
        if (!rc) rc = ck_read_range(ck, m, "param.", "", L->off + (size_t)r->size * L->piece, L->tail, piece + L->piece);
        if (rc) return rc;
    }
    return 0;
}

static int ck_load_state(train_run *r, const tally__ckpt *ck) {
    state_kind kinds[2];
    int nk = ck_state_kinds(&r->cfg->optim, kinds);
    int64_t step = 0;
    int rc = ck_scalar_get(ck, "optim.step", &step);
    const tally__model *m = &r->model;
    for (int k = 0; k < nk && !rc; k++) {
        const char *sfx = kinds[k].suffix;
        if (!r->cfg->zero) {
            rc = ck_read_range(ck, m, "optim.", sfx, 0, m->nparams, ck_state_of(&r->sync.optim, kinds[k].second));
            continue;
        }
        for (int l = 0; l < r->sync.zero.nlayers && !rc; l++) {
            tally__zero_layer *L = &r->sync.zero.layer[l];
            rc = ck_read_range(ck, m, "optim.", sfx, L->off + (size_t)r->rank * L->piece, L->piece,
                               ck_state_of(&L->opt_piece, kinds[k].second));
            if (!rc)
                rc = ck_read_range(ck, m, "optim.", sfx, L->off + (size_t)r->size * L->piece, L->tail,
                                   ck_state_of(&L->opt_tail, kinds[k].second));
        }
    }
    if (rc) return rc;
    if (!r->cfg->zero) r->sync.optim.step = step;
    for (int l = 0; r->cfg->zero && l < r->sync.zero.nlayers; l++) r->sync.zero.layer[l].opt_piece.step =
        r->sync.zero.layer[l].opt_tail.step = step;
    return 0;
}

/* The codec must be the one that wrote it (a checkpoint without codec.spec was written without one).
 * At the same world size each rank takes back its own residual: exact. At another, each rank starts
 * from the mean of the saved residuals: the ranks' residuals enter the next averaged update as their
 * mean, so that mean is what carries their contribution over, whatever the number of ranks. */
static int ck_load_codec(train_run *r, const tally__ckpt *ck) {
    char want[48];
    tally__codec_spec(&r->cfg->codec, want, sizeof want);
    const tally__ckpt_tensor *t = tally__ckpt_find(ck, "codec.spec");
    int rc = t ? ck_string_is(ck, "codec.spec", want, r->rank, "--compress")
               : strcmp(want, "none") ? tally__seterr(TALLY_E_INVALID, "rank %d: checkpoint %s was written for "
                                                       "--compress 'none', and this run has '%s': resume with the "
                                                       "settings that wrote it, or use another --ckpt directory",
                                                       r->rank, tally__ckpt_label(ck), want)
                                      : 0;
    float *res = tally__codec_residual(r->sync.codec);
    size_t n = r->model.nparams;
    int saved = 0;
    char name[TALLY__CKPT_NAME_MAX + 1];
    for (; !rc && res; saved++) {
        snprintf(name, sizeof name, "codec.residual.%d", saved);
        if (!tally__ckpt_find(ck, name)) break;
    }
    if (!rc && res && !saved)
        rc = tally__seterr(TALLY_E_CORRUPT, "rank %d: checkpoint %s has no codec.residual.0", r->rank,
                           tally__ckpt_label(ck));
    for (int k = 0; !rc && res && k < saved; k++) {
        if (saved == r->size && k != r->rank) continue;
        const void *p;
        snprintf(name, sizeof name, "codec.residual.%d", k);
        const uint64_t flat[1] = {n};
        if ((rc = tally__ckpt_get(ck, name, TALLY_F32, 1, flat, &p))) break;
        const float *v = p;
        for (size_t i = 0; i < n; i++)
            res[i] = saved == r->size ? v[i] : (k ? res[i] : 0.0f) + v[i] / (float)saved;
    }
    for (int i = 0; i < r->model.ntensors && !rc; i++) {
        int rows, cols;
        float *q = tally__codec_q(r->sync.codec, i, &rows, &cols);
        const void *p;
        snprintf(name, sizeof name, "codec.q.%s", r->model.tensor[i].name);
        const uint64_t qshape[2] = {(uint64_t)rows, (uint64_t)cols};
        if (q && !(rc = tally__ckpt_get(ck, name, TALLY_F32, 2, qshape, &p)))
            memcpy(q, p, (size_t)rows * cols * sizeof(float));
    }
    return rc;
}

/* Where the loop starts: the same step; the same epoch and sample position in it, in steps of this
 * run's size (exact when batch, accum and world size are those that wrote it). */
static int ck_load_position(train_run *r, const tally__ckpt *ck) {
    int64_t step, epoch, samples, skipped;
    int rc = ck_scalar_get(ck, "train.step", &step);
    if (!rc) rc = ck_scalar_get(ck, "train.epoch", &epoch);
    if (!rc) rc = ck_scalar_get(ck, "train.epoch_samples", &samples);
    if (!rc) rc = ck_scalar_get(ck, "train.skipped", &skipped);
    if (rc) return rc;
    if (step < 0 || epoch < 0 || epoch > 1000000 || samples < 0 || skipped < 0)
        return tally__seterr(TALLY_E_CORRUPT, "rank %d: checkpoint %s holds an impossible position (step %lld, epoch "
                             "%lld, %lld samples into it)", r->rank, tally__ckpt_label(ck), (long long)step,
                             (long long)epoch, (long long)samples);
    long per_step = (long)r->cfg->batch * r->cfg->accum * r->size;
    r->start_step = step;
    r->start_epoch = (int)epoch;
    r->start_in_epoch = samples / per_step;
    if (r->start_in_epoch >= r->steps_per_epoch) r->start_epoch++, r->start_in_epoch = 0;
    if (samples % per_step && r->rank == 0)
        tally__log_notice("checkpoint %s stopped %lld samples into epoch %lld, not a whole number of this run's "
                          "steps (%ld samples): resuming at the step boundary before it",
                          tally__ckpt_label(ck), (long long)samples, (long long)epoch + 1, per_step);
    r->start_skipped = r->guard.skipped = skipped;
    return 0;
}

/* Every rank must have found the same checkpoint (or none): a directory that is not shared, or one
 * written to while being read, would otherwise start the ranks from different states. */
static int ck_same_everywhere(train_run *r, int found, int64_t step) {
    int64_t mine[2] = {found, found ? step : -1}, lo[2], hi[2];
    int rc = tally_allreduce(r->comm, mine, lo, 2, TALLY_I64, TALLY_MIN);
    if (!rc) rc = tally_allreduce(r->comm, mine, hi, 2, TALLY_I64, TALLY_MAX);
    if (rc) return rc;
    if (lo[0] == hi[0] && lo[1] == hi[1]) return 0;
    return tally__seterr(TALLY_E_INVALID,
                         "rank %d: the ranks found different checkpoints in %s (this rank: %s step %lld; others "
                         "from step %lld to %lld): --ckpt must name a directory every rank sees alike",
                         r->rank, r->cfg->ckpt_dir, found ? "at" : "none,", (long long)mine[1], (long long)lo[1],
                         (long long)hi[1]);
}

int tally__train_ckpt_resume(train_run *r) {
    tally__ckpt *ck = NULL;
    int rc = tally__ckpt_open_latest(r->cfg->ckpt_dir, &ck);
    int found = rc == 0;
    /* A rank that cannot read it says why; the others learn of it from the agreement below. */
    int32_t bad = rc < 0, any_bad = 0;
    char why[1024];
    snprintf(why, sizeof why, "%s", rc < 0 ? tally_last_error() : "");
    int crc = tally_allreduce(r->comm, &bad, &any_bad, 1, TALLY_I32, TALLY_MAX);
    if (crc || any_bad) {
        tally__ckpt_close(ck);
        if (crc) return crc;
        if (bad) return tally__seterr(rc, "%s", why);
        return tally__seterr(TALLY_E_CORRUPT, "rank %d: another rank could not read the checkpoint in %s (its "
                             "message says why)", r->rank, r->cfg->ckpt_dir);
    }
    rc = ck_same_everywhere(r, found, found ? tally__ckpt_step(ck) : -1);
    if (!rc && !found) {
        if (r->rank == 0) tally__log_notice("--resume: no checkpoint in %s yet; starting from step 0", r->cfg->ckpt_dir);
        return 0;
    }
    if (!rc) rc = ck_check_identity(r, ck);
    if (!rc) rc = ck_load_params(r, ck);
    if (!rc) rc = ck_load_state(r, ck);
    if (!rc) rc = ck_load_position(r, ck);
    if (!rc) rc = ck_load_codec(r, ck);
    if (!rc && r->cfg->zero) tally__zero_params_changed(&r->sync.zero);
    if (!rc) r->saved_step = r->start_step;
    tally__ckpt_close(ck);
    /* A rank that failed here stops every rank: the others would otherwise train from another state. */
    int32_t failed = rc != 0, anyf = 0;
    snprintf(why, sizeof why, "%s", rc ? tally_last_error() : "");
    crc = tally_allreduce(r->comm, &failed, &anyf, 1, TALLY_I32, TALLY_MAX);
    if (crc) return crc;
    if (failed) return tally__seterr(rc, "%s", why);
    if (anyf) return tally__seterr(TALLY_E_INVALID, "rank %d: another rank could not resume from the checkpoint in %s "
                                   "(its message says why)", r->rank, r->cfg->ckpt_dir);
    if (r->rank == 0)
        tally__log_notice("resumed from the checkpoint of step %ld in %s", r->start_step, r->cfg->ckpt_dir);
    return 0;
}

int tally__train_ckpt_check_fresh(train_run *r) {
    int32_t v = 0;
    char why[1024] = "";
    if (r->rank == 0) {
        tally__ckpt *ck = NULL;
        int rc = tally__ckpt_open_latest(r->cfg->ckpt_dir, &ck);
        if (rc == 0)
            v = tally__seterr(TALLY_E_INVALID,
                              "rank 0: %s already holds checkpoints (the newest of step %lld): continue that run "
                              "with --resume, or give another --ckpt directory",
                              r->cfg->ckpt_dir, (long long)tally__ckpt_step(ck));
        else if (rc < 0)
            v = rc;
        snprintf(why, sizeof why, "%s", v ? tally_last_error() : "");
        tally__ckpt_close(ck);
    }
    int rc = tally_broadcast(r->comm, &v, 1, TALLY_I32, 0);
    if (rc) return rc;
    if (!v) return 0;
    if (r->rank == 0) return tally__seterr(v, "%s", why);
    return tally__seterr(v, "rank %d: rank 0 refused the --ckpt directory %s (its message says why)", r->rank,
                         r->cfg->ckpt_dir);
}
