/* ckpt_train.c - a training run as a checkpoint: the table of every component's state dict (the run's
 * position and identity here, the sync engine's), written by rank 0, loaded by each rank at any size. */
#include "ckpt_train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../ckpt/ckpt.h"
#include "../ckpt/state.h"
#include "../core/err.h"
#include "../core/log.h"

/* ---- the run's own state: position and identity ---- */

enum {
    RUN_STEP,
    RUN_EPOCH,
    RUN_EPOCH_SAMPLES,
    RUN_SKIPPED,
    RUN_SEED,
    RUN_WORLD,
    RUN_MODEL,
    RUN_MODEL_NAME,   /* what `tally generate` rebuilds the model from (checkpoints before it lack them) */
    RUN_MODEL_CONFIG, /* i64[TALLY__CKPT_MODEL_CONFIG]: ckpt_train.h says what each holds */
    RUN_COUNT
};
static const char *const run_names[RUN_COUNT] = {"train.step",    "train.epoch", "train.epoch_samples",
                                                 "train.skipped", "train.seed",  "train.world",
                                                 "train.model",   "model.name",  "model.config"};

static void ck_model_id(const train_run *r, char *buf, size_t n) {
    snprintf(buf, n, "%s, %zu parameters in %d tensors", tally__model_name(r->model.cfg.kind), r->model.nparams,
             r->model.ntensors);
}

static int run_count(void *arg) { return RUN_COUNT; }

static void run_entry(void *arg, int i, char *name, size_t cap, tally__ckpt_tensor *t) {
    const train_run *r = arg;
    char id[96];
    ck_model_id(r, id, sizeof id);
    snprintf(name, cap, "%s", run_names[i]);
    uint64_t n = i == RUN_MODEL          ? strlen(id)
                 : i == RUN_MODEL_NAME   ? strlen(tally__model_name(r->model.cfg.kind))
                 : i == RUN_MODEL_CONFIG ? TALLY__CKPT_MODEL_CONFIG
                                         : 1;
    *t = (tally__ckpt_tensor){
        .dtype = i == RUN_MODEL || i == RUN_MODEL_NAME ? TALLY_U8 : TALLY_I64, .ndim = 1, .shape = {n}};
}

void tally__ckpt_model_config(const tally__model_cfg *mc, int64_t *v) {
    int64_t head[] = {mc->in_dim, mc->outputs, mc->layers, mc->embd, mc->heads, mc->nhidden};
    memset(v, 0, TALLY__CKPT_MODEL_CONFIG * sizeof *v);
    memcpy(v, head, sizeof head);
    for (int k = 0; k < mc->nhidden && k < TALLY__MODEL_MAX_HIDDEN; k++) v[6 + k] = mc->hidden[k];
}

int tally__ckpt_model_config_read(const int64_t *v, tally__model_kind kind, const char *label, tally__model_cfg *mc) {
    int gpt = kind == TALLY__MODEL_GPT;
    const char *fields[6] = {
        gpt ? "context" : "inputs", gpt ? "vocabulary" : "outputs", "layers", "width", "heads", "hidden layers"};
    for (int i = 0; i < TALLY__CKPT_MODEL_CONFIG; i++) {
        char field[48];
        if (i < 6)
            snprintf(field, sizeof field, "%s", fields[i]);
        else
            snprintf(field, sizeof field, "hidden layer %d's width", i - 6);
        int64_t hi = i == 5 ? TALLY__MODEL_MAX_HIDDEN : i >= 6 + v[5] ? 0 : TALLY__MODEL_MAX_FIELD;
        if (v[i] < 0 || v[i] > hi)
            return tally__seterr(TALLY_E_CORRUPT,
                                 "checkpoint %s: model.config[%d], the %s model's %s, is %lld, outside 0..%lld: the "
                                 "file is malformed",
                                 label, i, tally__model_name(kind), field, (long long)v[i], (long long)hi);
    }
    *mc = (tally__model_cfg){.kind = kind,
                             .in_dim = (int)v[0],
                             .outputs = (int)v[1],
                             .layers = (int)v[2],
                             .embd = (int)v[3],
                             .heads = (int)v[4],
                             .nhidden = (int)v[5]};
    for (int k = 0; k < mc->nhidden; k++) mc->hidden[k] = (int)v[6 + k];
    return 0;
}

static int run_save(void *arg, int first, const tally__state_sink *out) {
    train_run *r = arg;
    const tally__train_cfg *c = r->cfg;
    long samples_per_step = (long)c->batch * c->sync.accum * r->size;
    int epoch = r->epoch;
    long in_epoch = r->in_epoch;
    if (in_epoch >= r->steps_per_epoch) epoch++, in_epoch = 0;
    int64_t v[RUN_MODEL] = {r->saving_step,   epoch,  in_epoch * samples_per_step, r->guard.skipped,
                            (int64_t)c->seed, r->size};
    for (int i = 0; i < RUN_MODEL; i++) out->put(out->arg, first + i, &v[i], sizeof v[i]);
    char id[96];
    ck_model_id(r, id, sizeof id);
    out->put(out->arg, first + RUN_MODEL, id, strlen(id));
    const char *kind = tally__model_name(r->model.cfg.kind);
    out->put(out->arg, first + RUN_MODEL_NAME, kind, strlen(kind));
    int64_t config[TALLY__CKPT_MODEL_CONFIG];
    tally__ckpt_model_config(&r->model.cfg, config);
    out->put(out->arg, first + RUN_MODEL_CONFIG, config, sizeof config);
    return 0;
}

/* The run must be the one that wrote it: the model, and the seed (which fixes data order). */
static int ck_check_identity(train_run *r, const tally__ckpt *ck) {
    char id[96];
    ck_model_id(r, id, sizeof id);
    int rc = tally__state_string_is(ck, "train.model", id, r->rank, "the model");
    int64_t seed = 0;
    if (!rc) rc = tally__state_i64(ck, "train.seed", &seed);
    if (!rc && (uint64_t)seed != r->cfg->seed)
        rc = tally__seterr(TALLY_E_INVALID,
                           "rank %d: checkpoint %s was written with --seed %llu and this run has --seed %llu: the seed "
                           "fixes the data order, so resume with the same one",
                           r->rank, tally__ckpt_label(ck), (unsigned long long)seed, (unsigned long long)r->cfg->seed);
    return rc;
}

/* Where the loop starts: the same step; the same epoch and sample position in it, in steps of this
 * run's size (exact when batch, accum and world size are those that wrote it). */
static int ck_load_position(train_run *r, const tally__ckpt *ck) {
    int64_t step, epoch, samples, skipped;
    int rc = tally__state_i64(ck, "train.step", &step);
    if (!rc) rc = tally__state_i64(ck, "train.epoch", &epoch);
    if (!rc) rc = tally__state_i64(ck, "train.epoch_samples", &samples);
    if (!rc) rc = tally__state_i64(ck, "train.skipped", &skipped);
    if (rc) return rc;
    if (step < 0 || epoch < 0 || epoch > 1000000 || samples < 0 || skipped < 0)
        return tally__seterr(TALLY_E_CORRUPT,
                             "rank %d: checkpoint %s holds an impossible position (step %lld, epoch "
                             "%lld, %lld samples into it)",
                             r->rank, tally__ckpt_label(ck), (long long)step, (long long)epoch, (long long)samples);
    long per_step = (long)r->cfg->batch * r->cfg->sync.accum * r->size;
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

static int run_load(void *arg, const tally__ckpt *ck) {
    int rc = ck_check_identity(arg, ck);
    return rc ? rc : ck_load_position(arg, ck);
}

/* ---- the components, in table order ---- */

typedef struct ck_parts {
    tally__state p[3];
    int count[3]; /* each one's entries, asked once */
    int n;
} ck_parts;

static void ck_parts_of(train_run *r, ck_parts *out) {
    out->p[0] = (tally__state){.arg = r, .count = run_count, .entry = run_entry, .save = run_save, .load = run_load};
    tally__sync_state(&r->sync, &out->p[1]);
    out->n = 2;
    if (r->solo) tally__local_state(&r->local, &out->p[out->n++]); /* after the engine's: it reads the parameters */
    for (int i = 0; i < out->n; i++) out->count[i] = out->p[i].count(out->p[i].arg);
}

/* ---- saving ---- */

/* Room for a composed name ("optim." + a tensor's name + ".exp_avg_sq") longer than a checkpoint holds,
 * so a long one is refused by its length instead of cut short into another's. */
#define CK_NAME_CAP 256

typedef struct ck_save {
    tally__ckpt_tensor *t;
    char (*names)[CK_NAME_CAP];
    int count;
    tally__ckpt_writer *w; /* rank 0 only; NULL elsewhere, or once writing failed */
    int wrc;               /* rank 0: the first writing error */
    char why[1024];        /* its message: the collectives after it start with a clear one */
} ck_save;

static void ck_write_failed(ck_save *s, int rc) {
    if (!rc || s->wrc) return;
    s->wrc = rc;
    snprintf(s->why, sizeof s->why, "%s", tally_last_error());
}

static void ck_put(void *arg, int index, const void *p, size_t bytes) {
    ck_save *s = arg;
    if (!s->w || s->wrc) return;
    ck_write_failed(s, tally__ckpt_write(s->w, index, p, bytes));
}

/* Every component's entries, one after another. */
static int ck_table_make(train_run *r, const ck_parts *parts, ck_save *s) {
    for (int i = 0; i < parts->n; i++) s->count += parts->count[i];
    s->t = calloc((size_t)s->count, sizeof *s->t);
    s->names = calloc((size_t)s->count, sizeof *s->names);
    if (!s->t || !s->names) return tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory", r->rank);
    for (int i = 0, k = 0; i < parts->n; i++)
        for (int j = 0; j < parts->count[i]; j++, k++) {
            parts->p[i].entry(parts->p[i].arg, j, s->names[k], sizeof s->names[k], &s->t[k]);
            s->t[k].name = s->names[k];
        }
    return 0;
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
                             r->cfg->ckpt.dir, text);
    return tally__seterr(v, "rank 0: %s", text);
}

int tally__train_ckpt_check_names(train_run *r) {
    ck_save s = {0};
    ck_parts parts;
    ck_parts_of(r, &parts);
    int rc = ck_table_make(r, &parts, &s);
    for (int k = 0; k < s.count && !rc; k++) {
        size_t n = strlen(s.names[k]);
        if (n > TALLY__CKPT_NAME_MAX)
            rc = tally__seterr(TALLY_E_INVALID,
                               "rank %d: the checkpoint entry '%s' has %zu characters and a checkpoint names "
                               "its entries in at most %d; shorten the model's tensor names, or train without --ckpt",
                               r->rank, s.names[k], n, TALLY__CKPT_NAME_MAX);
    }
    free(s.t);
    free(s.names);
    return rc;
}

int tally__train_ckpt_save(train_run *r, long steps_done) {
    ck_save s = {0};
    ck_parts parts;
    ck_parts_of(r, &parts);
    r->saving_step = steps_done;
    int rc = ck_table_make(r, &parts, &s);
    if (!rc && r->rank == 0)
        ck_write_failed(&s, tally__ckpt_write_begin(r->cfg->ckpt.dir, steps_done, s.t, s.count, &s.w));
    tally__state_sink sink = {.put = ck_put, .arg = &s};
    for (int i = 0, first = 0; i < parts.n && !rc; first += parts.count[i], i++)
        rc = parts.p[i].save(parts.p[i].arg, first, &sink);
    if (r->rank == 0 && s.w) {
        if (rc || s.wrc) {
            tally__ckpt_write_abort(s.w);
        } else {
            ck_write_failed(&s, tally__ckpt_write_commit(s.w, r->cfg->ckpt.keep > 0 ? r->cfg->ckpt.keep
                                                                                    : TALLY__CKPT_KEEP_DEFAULT));
        }
    }
    free(s.t);
    free(s.names);
    if (rc) return rc; /* a collective failed: every rank has its own error */
    if ((rc = ck_agree(r, s.wrc, s.why, "write"))) return rc;
    r->saved_step = steps_done;
    r->saves++;
    return 0;
}

/* ---- resuming ---- */

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
                         r->rank, r->cfg->ckpt.dir, found ? "at" : "none,", (long long)mine[1], (long long)lo[1],
                         (long long)hi[1]);
}

int tally__train_ckpt_resume(train_run *r) {
    tally__ckpt *ck = NULL;
    int rc = tally__ckpt_open_latest(r->cfg->ckpt.dir, &ck);
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
        return tally__seterr(TALLY_E_CORRUPT,
                             "rank %d: another rank could not read the checkpoint in %s (its "
                             "message says why)",
                             r->rank, r->cfg->ckpt.dir);
    }
    rc = ck_same_everywhere(r, found, found ? tally__ckpt_step(ck) : -1);
    if (!rc && !found) {
        if (r->rank == 0)
            tally__log_notice("--resume: no checkpoint in %s yet; starting from step 0", r->cfg->ckpt.dir);
        return 0;
    }
    ck_parts parts;
    ck_parts_of(r, &parts);
    for (int i = 0; i < parts.n && !rc; i++) rc = parts.p[i].load(parts.p[i].arg, ck);
    if (!rc) r->saved_step = r->start_step;
    tally__ckpt_close(ck);
    /* A rank that failed here stops every rank: the others would otherwise train from another state. */
    int32_t failed = rc != 0, anyf = 0;
    snprintf(why, sizeof why, "%s", rc ? tally_last_error() : "");
    crc = tally_allreduce(r->comm, &failed, &anyf, 1, TALLY_I32, TALLY_MAX);
    if (crc) return crc;
    if (failed) return tally__seterr(rc, "%s", why);
    if (anyf)
        return tally__seterr(TALLY_E_INVALID,
                             "rank %d: another rank could not resume from the checkpoint in %s "
                             "(its message says why)",
                             r->rank, r->cfg->ckpt.dir);
    if (r->rank == 0)
        tally__log_notice("resumed from the checkpoint of step %ld in %s", r->start_step, r->cfg->ckpt.dir);
    return 0;
}

int tally__train_ckpt_check_fresh(train_run *r) {
    int32_t v = 0;
    char why[1024] = "";
    if (r->rank == 0) {
        tally__ckpt *ck = NULL;
        int rc = tally__ckpt_open_latest(r->cfg->ckpt.dir, &ck);
        if (rc == 0)
            v = tally__seterr(TALLY_E_INVALID,
                              "rank 0: %s already holds checkpoints (the newest of step %lld): continue that run "
                              "with --resume, or give another --ckpt directory",
                              r->cfg->ckpt.dir, (long long)tally__ckpt_step(ck));
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
                         r->cfg->ckpt.dir);
}
