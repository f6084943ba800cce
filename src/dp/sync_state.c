/* sync_state.c - the sync engine's state dict: the optimizer's kind, step and per-tensor state, the
 * parameters and the codec's state, whole, through the engine's calls (every stage alike). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../ckpt/state.h"
#include "../core/err.h"
#include "sync_int.h"

/* The most optimizer updates a checkpoint may record: far past any run, and step + 1 (AdamW's bias
 * correction) neither overflows nor loses its last digit in a double. */
#define TALLY__SYNC_MAX_OPT_STEP (1ll << 52)

/* The optimizer's per-parameter state, named as torch.optim's state_dict names it. */
typedef struct state_kind {
    const char *suffix;
    int second; /* 0: tally_optim.m, 1: tally_optim.v */
} state_kind;

static int kinds_of(const tally_optim_cfg *o, state_kind *out) {
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

/* The table: optim.step, optim.kind, param.* [T], optim.*.<kind> [K x T], codec.spec, codec.residual.<k>
 * [R], codec.velocity.<k> [V], codec.q.* [Q]; T tensors, K state kinds, R residuals (one per rank), V dgc's
 * momentum buffers (one per rank), Q PowerSGD factors. */
typedef struct layout {
    int T, K, R, V, Q;
    state_kind kinds[2];
    int first_param, first_state, first_codec;
} layout;

static layout layout_of(const tally__sync *s) {
    layout L = {.T = s->m->ntensors};
    L.K = kinds_of(&s->optim_cfg, L.kinds);
    L.R = tally__codec_residual(s->codec) ? tally_comm_size(s->comm) : 0;
    L.V = tally__codec_velocity(s->codec) ? tally_comm_size(s->comm) : 0;
    for (int t = 0; t < s->m->ntensors; t++) L.Q += tally__codec_q(s->codec, t, NULL, NULL) != NULL;
    L.first_param = 2;
    L.first_state = L.first_param + L.T;
    L.first_codec = L.first_state + L.K * L.T;
    return L;
}

static int st_count(void *arg) {
    layout L = layout_of(arg);
    return L.first_codec + 1 + L.R + L.V + L.Q;
}

/* The k-th factor's tensor, in tensor order. */
static int nth_q(const tally__sync *s, int k) {
    for (int t = 0; t < s->m->ntensors; t++)
        if (tally__codec_q(s->codec, t, NULL, NULL) && k-- == 0) return t;
    return -1;
}

static void st_entry(void *arg, int i, char *name, size_t cap, tally__ckpt_tensor *t) {
    const tally__sync *s = arg;
    layout L = layout_of(s);
    const tally__model *m = s->m;
    *t = (tally__ckpt_tensor){.dtype = TALLY_F32, .ndim = 1};
    if (i == 0) {
        snprintf(name, cap, "optim.step");
        *t = (tally__ckpt_tensor){.dtype = TALLY_I64, .ndim = 1, .shape = {1}};
    } else if (i == 1) {
        snprintf(name, cap, "optim.kind");
        *t = (tally__ckpt_tensor){.dtype = TALLY_U8, .ndim = 1, .shape = {strlen(tally_optim_name(s->optim_cfg.kind))}};
    } else if (i < L.first_codec) {
        int param = i < L.first_state, k = param ? 0 : (i - L.first_state) / L.T;
        const tally__tensor *T = &m->tensor[param ? i - L.first_param : (i - L.first_state) % L.T];
        if (param)
            snprintf(name, cap, "param.%s", T->name);
        else
            snprintf(name, cap, "optim.%s.%s", T->name, L.kinds[k].suffix);
        t->ndim = T->ndim;
        for (int d = 0; d < T->ndim; d++) t->shape[d] = (uint64_t)T->shape[d];
    } else if (i == L.first_codec) {
        char spec[48];
        tally__codec_spec(&s->codec_cfg, spec, sizeof spec);
        snprintf(name, cap, "codec.spec");
        *t = (tally__ckpt_tensor){.dtype = TALLY_U8, .ndim = 1, .shape = {strlen(spec)}};
    } else if (i <= L.first_codec + L.R) {
        snprintf(name, cap, "codec.residual.%d", i - L.first_codec - 1);
        t->shape[0] = m->nparams;
    } else if (i <= L.first_codec + L.R + L.V) {
        snprintf(name, cap, "codec.velocity.%d", i - L.first_codec - 1 - L.R);
        t->shape[0] = m->nparams;
    } else {
        int tq = nth_q(s, i - L.first_codec - 1 - L.R - L.V), rows = 0, cols = 0;
        tally__codec_q(s->codec, tq, &rows, &cols);
        snprintf(name, cap, "codec.q.%s", m->tensor[tq].name);
        *t = (tally__ckpt_tensor){.dtype = TALLY_F32, .ndim = 2, .shape = {(uint64_t)rows, (uint64_t)cols}};
    }
}

/* ---- saving ---- */

typedef struct st_save {
    const tally__sync *s;
    const tally__state_sink *out;
    int first; /* entry index of this layer's first tensor of the kind being saved */
} st_save;

/* The tensors of the layer whose flat values [off, off + n) are at p. */
static void put_layer(const st_save *v, size_t off, size_t n, const float *p) {
    const tally__model *m = v->s->m;
    for (int t = 0; t < m->ntensors; t++) {
        const tally__tensor *T = &m->tensor[t];
        if (T->offset >= off && T->offset < off + n)
            v->out->put(v->out->arg, v->first + t, p + (T->offset - off), T->count * 4);
    }
}

static void put_param_layer(void *arg, int layer, const float *p, size_t n) {
    const st_save *v = arg;
    put_layer(v, v->s->m->offsets[layer], n, p);
}

/* Every rank's residual, then dgc's velocity, sent in turn to rank 0 (one in memory at a time); the
 * factors, the same on every rank, from rank 0's own. */
static int put_codec(tally__sync *s, const layout *L, int first, const tally__state_sink *out) {
    char spec[48];
    tally__codec_spec(&s->codec_cfg, spec, sizeof spec);
    int i = first + L->first_codec, rank = tally_comm_rank(s->comm), rc = 0;
    out->put(out->arg, i++, spec, strlen(spec));
    float *per_rank[2] = {tally__codec_residual(s->codec), tally__codec_velocity(s->codec)}, *buf = NULL;
    const int count[2] = {L->R, L->V};
    size_t n = s->m->nparams;
    if ((L->R || L->V) && !(buf = malloc(n * sizeof(float) + 4)))
        return tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory", rank);
    for (int a = 0; a < 2; a++)
        for (int k = 0; k < count[a] && !rc; k++, i++) {
            if (rank == k) memcpy(buf, per_rank[a], n * sizeof(float));
            if (!(rc = tally_broadcast(s->comm, buf, n, TALLY_F32, k))) out->put(out->arg, i, buf, n * sizeof(float));
        }
    free(buf);
    for (int t = 0; t < s->m->ntensors && !rc; t++) {
        int rows, cols;
        const float *q = tally__codec_q(s->codec, t, &rows, &cols);
        if (q) out->put(out->arg, i++, q, (size_t)rows * cols * sizeof(float));
    }
    return rc;
}

static int st_save_all(void *arg, int first, const tally__state_sink *out) {
    tally__sync *s = arg;
    layout L = layout_of(s);
    const tally__model *m = s->m;
    int64_t step = tally__sync_opt_step(s);
    const char *kind = tally_optim_name(s->optim_cfg.kind);
    out->put(out->arg, first, &step, sizeof step);
    out->put(out->arg, first + 1, kind, strlen(kind));
    st_save v = {.s = s, .out = out, .first = first + L.first_param};
    int rc = tally__sync_each_layer(s, put_param_layer, &v); /* stage 3 gathers: collective */
    if (!rc) rc = tally__sync_drain(s);
    size_t largest = 0;
    for (int l = 0; l < m->nlayers; l++)
        if (m->offsets[l + 1] - m->offsets[l] > largest) largest = m->offsets[l + 1] - m->offsets[l];
    float *buf = L.K ? malloc(largest * sizeof(float) + 4) : NULL;
    if (!rc && L.K && !buf) rc = tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory", tally_comm_rank(s->comm));
    for (int k = 0; k < L.K && !rc; k++) {
        v.first = first + L.first_state + k * L.T;
        for (int l = 0; l < m->nlayers && !rc; l++) {
            const float *p = tally__sync_opt_layer(s, L.kinds[k].second, l, buf, &rc);
            if (p) put_layer(&v, m->offsets[l], m->offsets[l + 1] - m->offsets[l], p);
        }
    }
    free(buf);
    return rc ? rc : put_codec(s, &L, first, out);
}

/* ---- loading ---- */

typedef struct st_read {
    const tally__ckpt *ck;
    const tally__model *m;
    const char *prefix, *suffix;
} st_read;

/* Values [begin, begin + count) of the flat layout from the tensors prefix + name (+ "." + suffix). */
static int read_range(void *arg, size_t begin, size_t count, float *dst) {
    const st_read *q = arg;
    for (int t = 0; t < q->m->ntensors; t++) {
        const tally__tensor *T = &q->m->tensor[t];
        size_t lo = T->offset > begin ? T->offset : begin;
        size_t hi = T->offset + T->count < begin + count ? T->offset + T->count : begin + count;
        if (lo >= hi) continue;
        char name[128];
        snprintf(name, sizeof name, "%s%s%s%s", q->prefix, T->name, q->suffix[0] ? "." : "", q->suffix);
        const float *data;
        uint64_t shape[TALLY__CKPT_MAX_DIMS];
        for (int d = 0; d < T->ndim; d++) shape[d] = (uint64_t)T->shape[d];
        int rc = tally__state_f32(q->ck, name, T->ndim, shape, lo - T->offset, hi - lo, &data); /* finite */
        if (rc) return rc;
        memcpy(dst + (lo - begin), data + (lo - T->offset), (hi - lo) * sizeof(float));
    }
    return 0;
}

/* A per-rank vector of the codec (prefix.<k>, into dst; NULL: the codec has none): at the same world size
 * each rank takes back its own; at another, the mean of the saved ones. */
static int load_per_rank(tally__sync *s, const tally__ckpt *ck, const char *prefix, float *dst) {
    int rank = tally_comm_rank(s->comm), size = tally_comm_size(s->comm), saved = 0;
    char name[128];
    for (; dst; saved++) {
        snprintf(name, sizeof name, "%s.%d", prefix, saved);
        if (!tally__ckpt_find(ck, name)) break;
    }
    if (dst && !saved)
        return tally__seterr(TALLY_E_CORRUPT, "rank %d: checkpoint %s has no %s.0", rank, tally__ckpt_label(ck),
                             prefix);
    snprintf(name, sizeof name, "%s.", prefix);
    return dst ? tally__state_f32_per_rank(ck, name, "", saved, rank, size, s->m->nparams, dst) : 0;
}

/* The codec must be the one that wrote it (a checkpoint without codec.spec was written without one). */
static int codec_is_the_one(tally__sync *s, const tally__ckpt *ck) {
    int rank = tally_comm_rank(s->comm);
    char want[48];
    tally__codec_spec(&s->codec_cfg, want, sizeof want);
    if (tally__ckpt_find(ck, "codec.spec")) return tally__state_string_is(ck, "codec.spec", want, rank, "--compress");
    if (!strcmp(want, "none")) return 0;
    return tally__seterr(TALLY_E_INVALID,
                         "rank %d: checkpoint %s was written for --compress 'none', and this run has '%s': resume "
                         "with the settings that wrote it, or use another --ckpt directory",
                         rank, tally__ckpt_label(ck), want);
}

/* At the same world size each rank takes back its own residual (and dgc's velocity): exact. At another,
 * each rank starts from the mean of the saved ones: the ranks' residuals enter the next averaged update
 * as their mean, so that mean is what carries their contribution over, whatever the number of ranks. */
static int load_codec(tally__sync *s, const tally__ckpt *ck) {
    char name[128]; /* room for any tensor name: too long a one is simply not found */
    int rc = load_per_rank(s, ck, "codec.residual", tally__codec_residual(s->codec));
    if (!rc) rc = load_per_rank(s, ck, "codec.velocity", tally__codec_velocity(s->codec));
    for (int i = 0; i < s->m->ntensors && !rc; i++) {
        int rows, cols;
        float *q = tally__codec_q(s->codec, i, &rows, &cols);
        const float *p;
        snprintf(name, sizeof name, "codec.q.%s", s->m->tensor[i].name);
        const uint64_t qshape[2] = {(uint64_t)rows, (uint64_t)cols};
        if (q && !(rc = tally__state_f32(ck, name, 2, qshape, 0, (size_t)rows * cols, &p)))
            memcpy(q, p, (size_t)rows * cols * sizeof(float));
    }
    return rc;
}

static int st_load(void *arg, const tally__ckpt *ck) {
    tally__sync *s = arg;
    int rank = tally_comm_rank(s->comm);
    /* The codec first: dgc moves SGD's momentum out of the optimizer, so another codec's checkpoint lacks
     * (or has) optimizer state this run would otherwise name as the difference. */
    int rc = codec_is_the_one(s, ck);
    if (!rc) rc = tally__state_string_is(ck, "optim.kind", tally_optim_name(s->optim_cfg.kind), rank, "the optimizer");
    st_read q = {.ck = ck, .m = s->m, .prefix = "param.", .suffix = ""};
    if (!rc) rc = tally__sync_load_part(s, 0, read_range, &q);
    state_kind kinds[2];
    int nk = kinds_of(&s->optim_cfg, kinds);
    int64_t step = 0;
    if (!rc) rc = tally__state_i64(ck, "optim.step", &step);
    if (!rc && (step < 0 || step > TALLY__SYNC_MAX_OPT_STEP))
        rc = tally__seterr(TALLY_E_CORRUPT,
                           "rank %d: checkpoint %s: optim.step is %lld, outside 0..%lld (the optimizer's updates so "
                           "far): the file is malformed",
                           rank, tally__ckpt_label(ck), (long long)step, (long long)TALLY__SYNC_MAX_OPT_STEP);
    for (int k = 0; k < nk && !rc; k++) {
        q = (st_read){.ck = ck, .m = s->m, .prefix = "optim.", .suffix = kinds[k].suffix};
        rc = tally__sync_load_part(s, 1 + kinds[k].second, read_range, &q);
    }
    if (!rc) tally__sync_set_opt_step(s, step);
    if (!rc) tally__codec_set_steps(s->codec, (long)step); /* dgc's warm-up goes on where it stopped */
    if (!rc) rc = load_codec(s, ck);
    if (!rc) tally__sync_params_changed(s);
    return rc;
}

/* ---- the optimizer's state as flat vectors ---- */

int tally__sync_opt_kinds(const tally__sync *s) {
    state_kind k[2];
    return kinds_of(&s->optim_cfg, k);
}

const char *tally__sync_opt_kind_name(const tally__sync *s, int k) {
    state_kind kinds[2];
    return k < kinds_of(&s->optim_cfg, kinds) ? kinds[k].suffix : "";
}

int tally__sync_opt_flat(tally__sync *s, int k, float *dst) {
    state_kind kinds[2];
    kinds_of(&s->optim_cfg, kinds);
    int rc = 0;
    for (int l = 0; l < s->m->nlayers && !rc; l++) {
        size_t off = s->m->offsets[l];
        const float *p = tally__sync_opt_layer(s, kinds[k].second, l, dst + off, &rc);
        if (p && p != dst + off) memcpy(dst + off, p, (s->m->offsets[l + 1] - off) * sizeof(float));
    }
    return rc;
}

static int read_flat(void *arg, size_t begin, size_t count, float *dst) {
    memcpy(dst, (const float *)arg + begin, count * sizeof(float));
    return 0;
}

int tally__sync_opt_load_flat(tally__sync *s, int k, const float *src) {
    state_kind kinds[2];
    kinds_of(&s->optim_cfg, kinds);
    return tally__sync_load_part(s, 1 + kinds[k].second, read_flat, (void *)src);
}

void tally__sync_state(tally__sync *s, tally__state *out) {
    *out = (tally__state){.arg = s, .count = st_count, .entry = st_entry, .save = st_save_all, .load = st_load};
}
