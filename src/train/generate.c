/* generate.c - a checkpoint back into a model (its description, then every parameter by name) and
 * autoregressive sampling from it: the window of the last T bytes forward, the next byte drawn. */
#include "generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../ckpt/ckpt.h"
#include "../ckpt/state.h"
#include "../core/err.h"
#include "../core/rng.h"
#include "ckpt_train.h"

/* The model's description from "model.name" and "model.config". */
static int load_cfg(const tally__ckpt *ck, tally__model_cfg *mc) {
    const tally__ckpt_tensor *name = tally__ckpt_find(ck, "model.name");
    const void *data;
    uint64_t n = TALLY__CKPT_MODEL_CONFIG;
    if (!name || tally__ckpt_get(ck, "model.config", TALLY_I64, 1, &n, &data))
        return tally__seterr(TALLY_E_INVALID,
                             "checkpoint %s does not describe its model (it was written by a tally "
                             "that did not record one): train again to write one that does",
                             tally__ckpt_label(ck));
    char kind[32] = {0};
    const void *text;
    uint64_t len = name->shape[0] < sizeof kind ? name->shape[0] : sizeof kind - 1;
    int rc = tally__ckpt_get(ck, "model.name", TALLY_U8, 1, &name->shape[0], &text);
    if (rc) return rc;
    memcpy(kind, text, (size_t)len);
    int k = tally__model_parse(kind);
    if (k < 0)
        return tally__seterr(TALLY_E_INVALID, "checkpoint %s holds a model '%s' this tally does not know",
                             tally__ckpt_label(ck), kind);
    return tally__ckpt_model_config_read(data, (tally__model_kind)k, tally__ckpt_label(ck), mc);
}

/* Every tensor from "param.<name>", in the model's own shape and finite; and no "param." tensor that the
 * model its config describes lacks (a config that disagrees with the tensors stored beside it). */
static int load_params(const tally__ckpt *ck, tally__model *m) {
    for (int t = 0; t < m->ntensors; t++) {
        const tally__tensor *T = &m->tensor[t];
        char name[128];
        uint64_t shape[4];
        for (int d = 0; d < T->ndim; d++) shape[d] = (uint64_t)T->shape[d];
        snprintf(name, sizeof name, "param.%s", T->name);
        const float *data;
        int rc = tally__state_f32(ck, name, T->ndim, shape, 0, T->count, &data);
        if (rc) return rc;
        memcpy(T->param, data, T->count * sizeof(float));
    }
    int stored = 0;
    const tally__ckpt_tensor *extra = NULL;
    for (int i = 0; i < tally__ckpt_count(ck); i++) {
        const tally__ckpt_tensor *t = tally__ckpt_at(ck, i);
        if (strncmp(t->name, "param.", 6)) continue;
        stored++;
        int known = 0;
        for (int k = 0; k < m->ntensors && !known; k++) known = !strcmp(t->name + 6, m->tensor[k].name);
        if (!known && !extra) extra = t;
    }
    if (extra)
        return tally__seterr(TALLY_E_CORRUPT,
                             "checkpoint %s holds %d parameter tensors, among them '%s', which the model its "
                             "model.config describes (%d tensors) does not have: the file is malformed",
                             tally__ckpt_label(ck), stored, extra->name, m->ntensors);
    return 0;
}

/* A model of text is one of bytes: a vocabulary of TALLY_TEXT_VOCAB, every token it emits a byte. */
static int check_vocab(const tally__ckpt *ck, const tally__model *m) {
    if (m->cfg.outputs == TALLY_TEXT_VOCAB) return 0;
    return tally__seterr(TALLY_E_CORRUPT,
                         "checkpoint %s: its %s model has a vocabulary of %d, and a model of text, whose tokens are "
                         "bytes, has %d: the file is malformed",
                         tally__ckpt_label(ck), tally__model_name(m->cfg.kind), m->cfg.outputs, TALLY_TEXT_VOCAB);
}

int tally__generate_load(const char *dir, tally__model *m) {
    tally__ckpt *ck = NULL;
    memset(m, 0, sizeof *m);
    int rc = tally__ckpt_open_latest(dir, &ck);
    if (rc == TALLY__CKPT_NONE)
        return tally__seterr(TALLY_E_INVALID, "no checkpoint in %s: train with --ckpt %s first", dir, dir);
    if (rc) return rc;
    tally__model_cfg mc;
    if (!(rc = load_cfg(ck, &mc)) && (rc = tally__model_init(m, &mc, 1, 0, NULL, 0))) { /* the bounds first */
        char where[256];
        snprintf(where, sizeof where, "checkpoint %.200s: model.config: ", tally__ckpt_label(ck));
        rc = tally__err_wrap(rc, where, "");
    } else if (!rc && !m->token_input) {
        rc = tally__seterr(TALLY_E_INVALID, "checkpoint %s holds the %s model, which does not read text",
                           tally__ckpt_label(ck), tally__model_name(mc.kind));
    }
    if (!rc) rc = check_vocab(ck, m);
    if (!rc) rc = load_params(ck, m);
    tally__ckpt_close(ck);
    if (rc) tally__model_free(m);
    return rc;
}

/* The next byte from the logits of one position: the likeliest, or a draw from the softmax of
 * logits / temperature over the top_k likeliest (all when top_k is 0). */
/* p[V] and sorted[V] are the caller's scratch, allocated once for the whole generation. */
static int sample_row(const float *logits, int V, const tally__sample_cfg *cfg, tally__rng *r, double *p,
                      float *sorted) {
    int best = 0;
    for (int j = 1; j < V; j++)
        if (logits[j] > logits[best]) best = j;
    if (cfg->temperature <= 0) return best;
    float cut = -INFINITY; /* the k-th largest logit: those below it cannot be drawn */
    if (cfg->top_k > 0 && cfg->top_k < V) {
        memcpy(sorted, logits, (size_t)V * sizeof *sorted);
        for (int i = 0; i < cfg->top_k; i++) /* a partial selection: k is small */
            for (int j = i + 1; j < V; j++)
                if (sorted[j] > sorted[i]) {
                    float tmp = sorted[i];
                    sorted[i] = sorted[j];
                    sorted[j] = tmp;
                }
        cut = sorted[cfg->top_k - 1];
    }
    double sum = 0;
    for (int j = 0; j < V; j++) sum += p[j] = logits[j] >= cut ? exp((logits[j] - logits[best]) / cfg->temperature) : 0;
    double u = tally__rng_uniform(r) * sum;
    for (int j = 0; j < V; j++)
        if ((u -= p[j]) < 0) return j;
    return best;
}

/* Logits that are not numbers would draw byte 0 for ever: parameters that load (every one finite) can
 * still overflow float on the way (a weight of 3e38 squared in a LayerNorm), and nothing sampled from
 * that is the model's. */
static int check_logits(const float *logits, int V, int n, size_t pos) {
    for (int j = 0; j < V; j++)
        if (!isfinite(logits[j]))
            return tally__seterr(TALLY_E_NONFINITE,
                                 "generate: the model's logit for byte %d is %s at byte %d drawn (position %zu of "
                                 "the window): its forward pass overflows; the checkpoint's parameters are "
                                 "too large to be a trained model's",
                                 j,
                                 isnan(logits[j]) ? "NaN"
                                 : logits[j] > 0  ? "+Inf"
                                                  : "-Inf",
                                 n + 1, pos);
    return 0;
}

int tally__generate(tally__model *m, const uint8_t *prompt, size_t len, const tally__sample_cfg *cfg,
                    void (*emit)(void *arg, int byte), void *arg) {
    int T = m->cfg.in_dim, V = m->cfg.outputs;
    if (V != TALLY_TEXT_VOCAB || !m->token_input)
        return tally__seterr(TALLY_E_INVALID,
                             "generate: the model has a vocabulary of %d%s, and what it emits is bytes, %d of them", V,
                             m->token_input ? "" : " and reads floats", TALLY_TEXT_VOCAB);
    int32_t *win = calloc((size_t)T, sizeof *win), *tgt = calloc((size_t)T, sizeof *tgt);
    double *p = malloc((size_t)V * sizeof *p);
    float *sorted = malloc((size_t)V * sizeof *sorted);
    int rc = !win || !tgt || !p || !sorted ? tally__seterr(TALLY_E_NOMEM, "generate: out of memory") : 0;
    tally__rng r;
    tally__rng_seed(&r, cfg->seed, 0x67656e65726174ull); /* "generat" */
    size_t have = len < (size_t)T ? len : (size_t)T;     /* the window: the last T bytes so far */
    for (size_t i = 0; i < have && !rc; i++) win[i] = prompt[len - have + i];
    if (!have && !rc) win[have++] = '\n'; /* no prompt: begin as a new line would */
    for (int n = 0; n < cfg->tokens && !rc; n++) {
        float loss; /* causal: the positions past the window's last byte change nothing before it */
        if ((rc = tally__model_forward(m, win, tgt, NULL, 1, NULL, &loss))) break;
        const float *logits = m->act[m->nvalues - 1] + (have - 1) * (size_t)V;
        if ((rc = check_logits(logits, V, n, have - 1))) break;
        int next = sample_row(logits, V, cfg, &r, p, sorted);
        emit(arg, next);
        if (have == (size_t)T) memmove(win, win + 1, (size_t)(T - 1) * sizeof *win), have--;
        win[have++] = next;
    }
    free(win);
    free(tgt);
    free(p);
    free(sorted);
    return rc;
}
