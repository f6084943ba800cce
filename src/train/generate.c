/* generate.c - a checkpoint back into a model (its description, then every parameter by name) and
 * autoregressive sampling from it: the window of the last T bytes forward, the next byte drawn. */
#include "generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../ckpt/ckpt.h"
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
    const int64_t *v = data;
    *mc = (tally__model_cfg){.kind = (tally__model_kind)k,
                             .in_dim = (int)v[0],
                             .outputs = (int)v[1],
                             .layers = (int)v[2],
                             .embd = (int)v[3],
                             .heads = (int)v[4],
                             .nhidden = (int)v[5]};
    for (int i = 0; i < mc->nhidden && i < TALLY__MODEL_MAX_HIDDEN; i++) mc->hidden[i] = (int)v[6 + i];
    return 0;
}

/* Every tensor from "param.<name>", in the model's own shape. */
static int load_params(const tally__ckpt *ck, tally__model *m) {
    for (int t = 0; t < m->ntensors; t++) {
        const tally__tensor *T = &m->tensor[t];
        char name[128];
        uint64_t shape[4];
        for (int d = 0; d < T->ndim; d++) shape[d] = (uint64_t)T->shape[d];
        snprintf(name, sizeof name, "param.%s", T->name);
        const void *data;
        int rc = tally__ckpt_get(ck, name, TALLY_F32, T->ndim, shape, &data);
        if (rc) return rc;
        memcpy(T->param, data, T->count * sizeof(float));
    }
    return 0;
}

int tally__generate_load(const char *dir, tally__model *m) {
    tally__ckpt *ck = NULL;
    memset(m, 0, sizeof *m);
    int rc = tally__ckpt_open_latest(dir, &ck);
    if (rc == TALLY__CKPT_NONE)
        return tally__seterr(TALLY_E_INVALID, "no checkpoint in %s: train with --ckpt %s first", dir, dir);
    if (rc) return rc;
    tally__model_cfg mc;
    if (!(rc = load_cfg(ck, &mc)) && !(rc = tally__model_init(m, &mc, 1, 0, NULL, 0)) && !m->token_input)
        rc = tally__seterr(TALLY_E_INVALID, "checkpoint %s holds the %s model, which does not read text",
                           tally__ckpt_label(ck), tally__model_name(mc.kind));
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

int tally__generate(tally__model *m, const uint8_t *prompt, size_t len, const tally__sample_cfg *cfg,
                    void (*emit)(void *arg, int byte), void *arg) {
    int T = m->cfg.in_dim, V = m->cfg.outputs;
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
        int next = sample_row(m->act[m->nvalues - 1] + (have - 1) * (size_t)V, V, cfg, &r, p, sorted);
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
