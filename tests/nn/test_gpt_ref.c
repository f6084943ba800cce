/* test_gpt_ref.c - tally's GPT against PyTorch on the same weights and batch (tests/fixtures/gpt_ref.bin,
 * written by scripts/gpt_reference.py): the logits, the loss, every parameter's gradient, then the
 * losses of 10 AdamW steps with clipping. No torch at test time. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tally/optim.h>

#include "harness.h"
#include "nn/model.h"
#include "nn/model_build.h"

/* Bounds, as |got - want| <= tol * max(|want|, floor), floor 1% of the array's largest |want| (values
 * near zero are judged against that, their own relative error being rounding noise). fp32 on both
 * sides, summed in other orders (sgemm blocking, attention per head): measured here 1.2e-5 on the
 * logits, 8.6e-8 on the loss, 2e-5 on the gradients (the worst wpe.weight, whose entries are sums over
 * the batch), 1.1e-7 on the 10 losses; the bounds leave 4-5x for another BLAS kernel or CPU. */
#define TOL_FORWARD 5e-5
#define TOL_GRAD    1e-4
#define TOL_STEPS   1e-5

typedef struct rec {
    char name[96];
    int dtype, ndim; /* dtype 0: f32, 1: i32 */
    uint32_t shape[4];
    size_t count;
    const void *data;
} rec;

static unsigned char *g_file;
static rec g_rec[128];
static int g_nrec;
static uint32_t g_hdr[7]; /* L C H T B V steps */

static int load(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    g_file = malloc((size_t)n);
    if (!g_file || fread(g_file, 1, (size_t)n, f) != (size_t)n) return fclose(f), -1;
    fclose(f);
    if (n < 36 || memcmp(g_file, "TGPTREF1", 8)) return -1;
    memcpy(g_hdr, g_file + 8, sizeof g_hdr);
    for (long at = 36; at < n && g_nrec < 128;) {
        rec *r = &g_rec[g_nrec++];
        uint32_t len, v[2];
        memcpy(&len, g_file + at, 4);
        if (len >= sizeof r->name) return -1;
        memcpy(r->name, g_file + at + 4, len);
        r->name[len] = 0;
        at += 4 + len;
        memcpy(v, g_file + at, 8);
        r->dtype = (int)v[0];
        r->ndim = (int)v[1];
        if (r->ndim > 4) return -1;
        memcpy(r->shape, g_file + at + 8, 4 * (size_t)r->ndim);
        at += 8 + 4 * r->ndim;
        r->count = 1;
        for (int d = 0; d < r->ndim; d++) r->count *= r->shape[d];
        if (at + (long)(4 * r->count) > n) return -1;
        void *copy = malloc(4 * r->count + 4); /* the file packs records unaligned; int32 and f32 want 4 */
        if (!copy) return -1;
        memcpy(copy, g_file + at, 4 * r->count);
        r->data = copy;
        at += (long)(4 * r->count);
    }
    return 0;
}

static const rec *find(const char *name) {
    for (int i = 0; i < g_nrec; i++)
        if (!strcmp(g_rec[i].name, name)) return &g_rec[i];
    TH_CHECK(0, "the reference file has no %s", name);
    return NULL;
}

/* The worst of |got - want| / max(|want|, 1% of max |want|), as the bounds above judge. */
static double worst_rel(const float *got, const float *want, size_t n) {
    double top = 0, worst = 0;
    for (size_t i = 0; i < n; i++) top = fmax(top, fabs(want[i]));
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]) / fmax(fabs(want[i]), 0.01 * top);
        worst = isnan(e) ? INFINITY : fmax(worst, e);
    }
    return worst;
}

/* Each parameter from param.<name>, shapes checked; every parameter of the file used. */
static void load_params(tally__model *m) {
    int used = 0;
    for (int i = 0; i < g_nrec; i++) used += !strncmp(g_rec[i].name, "param.", 6);
    TH_CHECK(used == m->ntensors, "the file has %d parameters, the model %d tensors", used, m->ntensors);
    for (int k = 0; k < m->ntensors; k++) {
        const tally__tensor *t = &m->tensor[k];
        char name[96];
        snprintf(name, sizeof name, "param.%s", t->name);
        const rec *r = find(name);
        if (!r) continue;
        int same = r->ndim == t->ndim && r->count == t->count;
        for (int d = 0; same && d < t->ndim; d++) same = (int)r->shape[d] == t->shape[d];
        TH_CHECK(same, "%s: the file's shape differs from the model's", t->name);
        if (same) memcpy(t->param, r->data, t->count * sizeof(float));
    }
}

static void check_forward_backward(tally__model *m, const int32_t *tok, const int32_t *tgt, int B) {
    memset(m->grads, 0, m->nparams * sizeof(float));
    float loss;
    TH_CHECK(tally__model_forward(m, tok, tgt, NULL, B, NULL, &loss) == 0, "forward: %s", tally_last_error());
    TH_CHECK(tally__model_backward(m, tgt, NULL, B, NULL) == 0, "backward: %s", tally_last_error());
    const rec *lg = find("logits"), *ls = find("loss");
    if (!lg || !ls) return;
    const float *want_loss = ls->data;
    double e_logits = worst_rel(m->act[m->nvalues - 1], lg->data, lg->count);
    double e_loss = fabs(loss - *want_loss) / fabs(*want_loss);
    TH_CHECK(e_logits <= TOL_FORWARD, "logits: worst relative difference %.3g > %g", e_logits, TOL_FORWARD);
    TH_CHECK(e_loss <= TOL_FORWARD, "loss %.7f, PyTorch's %.7f (relative %.3g)", loss, *want_loss, e_loss);
    double e_grad = 0;
    const char *worst = "";
    for (int k = 0; k < m->ntensors; k++) {
        char name[96];
        snprintf(name, sizeof name, "grad.%s", m->tensor[k].name);
        const rec *g = find(name);
        if (!g) continue;
        double e = worst_rel(m->tensor[k].grad, g->data, g->count);
        TH_CHECK(e <= TOL_GRAD, "%s: worst relative difference %.3g > %g", name, e, TOL_GRAD);
        if (e > e_grad) e_grad = e, worst = m->tensor[k].name;
    }
    printf("  logits %.2g, loss %.7f vs %.7f (%.2g), gradients %.2g (worst: %s)\n", e_logits, loss, *want_loss, e_loss,
           e_grad, worst);
}

/* PyTorch's clip_grad_norm_(1.0), then AdamW per tensor: weight decay 0.1 on 2-D weights only. */
static void check_steps(tally__model *m, const int32_t *tok, const int32_t *tgt, int B, int steps) {
    tally_optim opt[TALLY__MODEL_MAX_TENSORS];
    for (int k = 0; k < m->ntensors; k++) {
        tally_optim_cfg oc;
        tally_optim_cfg_default(&oc, TALLY_OPTIM_ADAMW);
        oc.beta2 = 0.95f;
        oc.weight_decay = m->tensor[k].ndim == 2 ? 0.1f : 0.0f;
        TH_CHECK(tally_optim_init(&opt[k], &oc, m->tensor[k].count) == 0, "optim: %s", tally_last_error());
    }
    const rec *lr = find("losses");
    if (!lr || (int)lr->count != steps) return;
    const float *want = lr->data;
    double worst = 0;
    for (int s = 0; s < steps; s++) {
        memset(m->grads, 0, m->nparams * sizeof(float));
        float loss;
        TH_CHECK(tally__model_forward(m, tok, tgt, NULL, B, NULL, &loss) == 0, "step %d: forward", s);
        TH_CHECK(tally__model_backward(m, tgt, NULL, B, NULL) == 0, "step %d: backward", s);
        double norm = 0;
        for (size_t i = 0; i < m->nparams; i++) norm += (double)m->grads[i] * m->grads[i];
        double coef = 1.0 / (sqrt(norm) + 1e-6);
        if (coef < 1)
            for (size_t i = 0; i < m->nparams; i++) m->grads[i] = (float)(m->grads[i] * coef);
        for (int k = 0; k < m->ntensors; k++) tally_optim_step(&opt[k], m->tensor[k].param, m->tensor[k].grad, 1e-3f);
        worst = fmax(worst, fabs(loss - want[s]) / fabs(want[s]));
        TH_CHECK(fabs(loss - want[s]) <= TOL_STEPS * fabs(want[s]), "step %d: loss %.7f, PyTorch's %.7f", s, loss,
                 want[s]);
    }
    printf("  %d AdamW steps: losses %.4f -> %.4f, worst relative difference %.2g\n", steps, want[0], want[steps - 1],
           worst);
    for (int k = 0; k < m->ntensors; k++) tally_optim_free(&opt[k]);
}

int main(void) {
    const char *src = getenv("TALLY_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/gpt_ref.bin", src ? src : ".");
    if (load(path)) {
        TH_CHECK(0, "cannot read the reference %s (scripts/gpt_reference.py writes it)", path);
        return th_verdict("test_gpt_ref");
    }
    int L = (int)g_hdr[0], C = (int)g_hdr[1], H = (int)g_hdr[2], T = (int)g_hdr[3], B = (int)g_hdr[4];
    int V = (int)g_hdr[5], steps = (int)g_hdr[6];
    tally__model_cfg cfg = {.in_dim = T, .outputs = V, .layers = L, .embd = C, .heads = H, .build = tally__build_gpt};
    tally__model m;
    if (tally__model_init(&m, &cfg, B, 1, NULL, 0)) {
        TH_CHECK(0, "gpt: %s", tally_last_error());
        return th_verdict("test_gpt_ref");
    }
    printf("  gpt L%d C%d H%d T%d B%d: %zu parameters in %d tensors\n", L, C, H, T, B, m.nparams, m.ntensors);
    load_params(&m);
    const rec *tok = find("tokens"), *tgt = find("targets");
    if (tok && tgt) {
        check_forward_backward(&m, tok->data, tgt->data, B);
        check_steps(&m, tok->data, tgt->data, B, steps);
    }
    tally__model_free(&m);
    for (int i = 0; i < g_nrec; i++) free((void *)g_rec[i].data);
    free(g_file);
    return th_verdict("test_gpt_ref");
}
