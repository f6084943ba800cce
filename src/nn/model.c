/* model.c - builds the linear, mlp and cnn models as op sequences over flat buffers, and runs their
 * forward pass, backward pass (marking layers ready for the engine) and scoring. */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/err.h"
#include "../core/alloc.h"
#include "../core/rng.h"

static const char *const model_names[] = {"linear", "mlp", "cnn"};

const char *tally__model_name(tally__model_kind k) {
    return (unsigned)k < sizeof model_names / sizeof *model_names ? model_names[k] : "?";
}

int tally__model_parse(const char *name) {
    for (int i = 0; i < (int)(sizeof model_names / sizeof *model_names); i++)
        if (name && !strcmp(name, model_names[i])) return i;
    return -1;
}

int tally__model_parse_hidden(const char *s, int *hidden, int *n) {
    for (*n = 0;;) {
        size_t digits = strspn(s, "0123456789");
        if (digits == 0 || digits > 7 || (s[digits] && s[digits] != ',') || *n == TALLY__MODEL_MAX_HIDDEN) return -1;
        long w = strtol(s, NULL, 10);
        if (w < 1 || w > (1 << 20)) return -1;
        hidden[(*n)++] = (int)w;
        if (s[digits] == 0) return 0;
        s += digits + 1;
    }
}

static tally__op *model_push(tally__model *m, tally__op_kind kind, size_t in, size_t out) {
    tally__op *op = &m->op[m->nops++];
    memset(op, 0, sizeof *op);
    op->kind = kind;
    op->in = in;
    op->out = out;
    op->layer = -1;
    return op;
}

static void model_add_tensor(tally__model *m, const char *layer, const char *what, size_t offset, int ndim,
                             const int *shape) {
    tally__tensor *t = &m->tensor[m->ntensors++];
    snprintf(t->name, sizeof t->name, "%s.%s", layer, what);
    t->ndim = ndim;
    t->offset = offset;
    t->count = 1;
    for (int i = 0; i < ndim; i++) t->count *= (size_t)(t->shape[i] = shape[i]);
}

/* A layer with parameters: weight [wshape] then bias [wshape[0]], appended to the flat buffer. */
static void model_add_params(tally__model *m, tally__op *op, const char *name, int wdim, const int *wshape) {
    op->layer = m->nlayers;
    op->w_off = m->nparams;
    model_add_tensor(m, name, "weight", m->nparams, wdim, wshape);
    op->b_off = m->nparams + m->tensor[m->ntensors - 1].count;
    model_add_tensor(m, name, "bias", op->b_off, 1, wshape);
    m->offsets[m->nlayers++] = m->nparams;
    m->nparams = op->b_off + (size_t)wshape[0];
    m->offsets[m->nlayers] = m->nparams;
}

/* Names as PyTorch's modules would have them: fc1, fc2, ... and conv1, conv2, ... */
static void model_layer_name(const tally__model *m, const char *prefix, char *buf, size_t n) {
    int k = 1;
    for (int i = 0; i < m->nops - 1; i++) k += m->op[i].layer >= 0 && m->op[i].kind == m->op[m->nops - 1].kind;
    snprintf(buf, n, "%s%d", prefix, k);
}

/* FLOPs a layer of `macs` multiply-adds per sample costs in forward and backward: 2 for the forward,
 * 2 for the weight gradient, 2 for the input gradient, which the first layer does not compute. */
static double model_flops(const tally__model *m, double macs) { return (m->nops == 1 ? 4.0 : 6.0) * macs; }

static void model_linear(tally__model *m, int in, int out, int relu) {
    tally__op *op = model_push(m, TALLY__OP_LINEAR, (size_t)in, (size_t)out);
    op->fan_in = in;
    op->fan_out = out;
    char name[16] = "linear"; /* the linear model's one layer */
    if (m->cfg.kind != TALLY__MODEL_LINEAR) model_layer_name(m, "fc", name, sizeof name);
    model_add_params(m, op, name, 2, (int[]){out, in});
    m->flops_per_sample += model_flops(m, (double)in * out);
    if (relu) model_push(m, TALLY__OP_RELU, (size_t)out, (size_t)out);
}

/* conv + relu + 2x2 max-pool; returns the pooled geometry through c/h/w. */
static void model_conv_block(tally__model *m, int *c, int *h, int *w, int k, int r, int pad) {
    tally_conv2d_shape s = {.C = *c, .H = *h, .W = *w, .K = k, .R = r, .stride = 1, .pad = pad};
    int oh = tally_conv2d_out_h(&s), ow = tally_conv2d_out_w(&s);
    size_t in = (size_t)*c * *h * *w, out = (size_t)k * oh * ow;
    tally__op *op = model_push(m, TALLY__OP_CONV, in, out);
    op->conv = s;
    op->fan_in = *c * r * r;
    char name[16];
    model_layer_name(m, "conv", name, sizeof name);
    model_add_params(m, op, name, 4, (int[]){k, *c, r, r});
    m->flops_per_sample += model_flops(m, (double)k * *c * r * r * oh * ow);
    model_push(m, TALLY__OP_RELU, out, out);
    tally__op *pool = model_push(m, TALLY__OP_POOL, out, (size_t)k * (oh / 2) * (ow / 2));
    pool->pool_c = k;
    pool->pool_h = oh;
    pool->pool_w = ow;
    pool->pool_k = 2;
    *c = k;
    *h = oh / 2;
    *w = ow / 2;
}

static int model_layout(tally__model *m, const tally__model_cfg *cfg) {
    switch (cfg->kind) {
    case TALLY__MODEL_LINEAR:
        model_linear(m, cfg->in_dim, cfg->outputs, 0);
        return 0;
    case TALLY__MODEL_MLP: {
        int in = cfg->in_dim;
        for (int i = 0; i < cfg->nhidden; i++) {
            if (cfg->hidden[i] < 1)
                return tally__seterr(TALLY_E_INVALID, "model: hidden layer %d has width %d", i, cfg->hidden[i]);
            model_linear(m, in, cfg->hidden[i], 1);
            in = cfg->hidden[i];
        }
        model_linear(m, in, cfg->outputs, 0);
        return 0;
    }
    case TALLY__MODEL_CNN: {
        /* LeNet-5 as the PyTorch peer builds it: conv 6@5x5 pad 2, pool, conv 16@5x5, pool, 120, 84. */
        int c = cfg->channels, h = cfg->height, w = cfg->width;
        if (c < 1 || h < 12 || w < 12)
            return tally__seterr(TALLY_E_INVALID, "model cnn: needs images of at least 12x12 (got %dx%dx%d)", c,
                                 h, w);
        model_conv_block(m, &c, &h, &w, 6, 5, 2);
        model_conv_block(m, &c, &h, &w, 16, 5, 0);
        model_linear(m, c * h * w, 120, 1);
        model_linear(m, 120, 84, 1);
        model_linear(m, 84, cfg->outputs, 0);
        return 0;
    }
    }
    return tally__seterr(TALLY_E_INVALID, "model: unknown kind %d", (int)cfg->kind);
}


/* Bytes model_alloc_buffers allocates for activations at batch B (both passes, pool winners, softmax,
 * the shared im2col scratch), without allocating. */
static size_t model_activation_bytes(const tally__model *m, int B) {
    size_t bytes = 0, scratch = 0;
    for (int i = 0; i < m->nops; i++) {
        const tally__op *op = &m->op[i];
        size_t out = (size_t)B * op->out;
        bytes += 2 * out * sizeof(float) + (op->kind == TALLY__OP_POOL ? out * sizeof(int32_t) : 0);
        if (op->kind == TALLY__OP_CONV) {
            size_t sc = tally_conv2d_scratch_floats(&op->conv, B);
            if (sc > scratch) scratch = sc;
        }
    }
    return bytes + (size_t)B * m->op[m->nops - 1].out * sizeof(float) + scratch * sizeof(float);
}

static int model_alloc_flat(tally__model *m, const tally__mem_source *src, int flags) {
    size_t pbytes = m->nparams * sizeof(float);
    if (!(flags & TALLY__MODEL_NO_PARAMS)) {
        if (!(m->params = tally__alloc_zeroed(pbytes))) goto nomem;
        m->params_bytes = pbytes;
    }
    if (!(flags & TALLY__MODEL_NO_GRADS)) {
        m->grads = src ? src->alloc(src->ctx, pbytes ? pbytes : 64) : tally__alloc_zeroed(pbytes);
        if (!m->grads) goto nomem;
        if (src) {
            m->grads_src = *src;
            memset(m->grads, 0, pbytes);
        }
        m->grads_bytes = pbytes;
    }
    for (int i = 0; i < m->nops; i++) {
        tally__op *op = &m->op[i];
        if (op->layer < 0) continue;
        op->w = m->params ? m->params + op->w_off : NULL;
        op->b = m->params ? m->params + op->b_off : NULL;
        op->dw = m->grads ? m->grads + op->w_off : NULL;
        op->db = m->grads ? m->grads + op->b_off : NULL;
    }
    return 0;
nomem:
    return tally__seterr(TALLY_E_NOMEM, "model: out of memory for %zu parameters (%zu bytes)", m->nparams, pbytes);
}

static int model_alloc_buffers(tally__model *m, int B) {
    size_t scratch = 0;
    m->act[0] = NULL; /* the caller's input batch */
    for (int i = 0; i < m->nops; i++) {
        const tally__op *op = &m->op[i];
        size_t out = (size_t)B * op->out;
        m->act[i + 1] = tally__alloc_zeroed(out * sizeof(float));
        m->dact[i + 1] = tally__alloc_zeroed(out * sizeof(float));
        if (!m->act[i + 1] || !m->dact[i + 1]) return tally__seterr(TALLY_E_NOMEM, "model: out of memory for activations");
        if (op->kind == TALLY__OP_POOL) {
            m->argmax[i] = tally__alloc_zeroed(out * sizeof(int32_t));
            if (!m->argmax[i]) return tally__seterr(TALLY_E_NOMEM, "model: out of memory for activations");
        }
        if (op->kind == TALLY__OP_CONV) {
            size_t s = tally_conv2d_scratch_floats(&op->conv, B);
            if (s > scratch) scratch = s;
        }
    }
    m->probs = tally__alloc_zeroed((size_t)B * m->op[m->nops - 1].out * sizeof(float));
    m->scratch = scratch ? tally__alloc_zeroed(scratch * sizeof(float)) : NULL;
    m->activation_bytes = model_activation_bytes(m, B);
    if (!m->probs || (scratch && !m->scratch)) return tally__seterr(TALLY_E_NOMEM, "model: out of memory for activations");
    return 0;
}

void tally__model_init_rng(tally__rng *r, uint64_t seed) { tally__rng_seed(r, seed, 0x6d6f64656cull); }

/* PyTorch's default for Linear and Conv2d: weights and biases uniform in +-1/sqrt(fan_in). */
void tally__model_init_layer(const tally__model *m, int layer, float *dst, tally__rng *r) {
    const tally__op *op = &m->op[tally__model_layer_op(m, layer)];
    float bound = 1.0f / sqrtf((float)op->fan_in);
    size_t n = m->offsets[layer + 1] - m->offsets[layer];
    for (size_t j = 0; j < n; j++) dst[j] = (2.0f * tally__rng_uniform(r) - 1.0f) * bound;
}

int tally__model_layer_op(const tally__model *m, int layer) {
    for (int i = 0; i < m->nops; i++)
        if (m->op[i].layer == layer) return i;
    return -1;
}

static void model_init_params(tally__model *m, uint64_t seed) {
    tally__rng r;
    tally__model_init_rng(&r, seed);
    for (int l = 0; l < m->nlayers; l++) tally__model_init_layer(m, l, m->params + m->offsets[l], &r);
}

int tally__model_describe(const tally__model_cfg *cfg, int batch, tally__model_desc *out) {
    tally__model *m = calloc(1, sizeof *m);
    if (!m) return tally__seterr(TALLY_E_NOMEM, "model: out of memory");
    m->cfg = *cfg;
    int rc = batch < 1 || cfg->in_dim < 1 || cfg->outputs < 1
                 ? tally__seterr(TALLY_E_INVALID, "model: batch %d, inputs %d, outputs %d must all be positive",
                                 batch, cfg->in_dim, cfg->outputs)
                 : model_layout(m, cfg);
    if (!rc) {
        memset(out, 0, sizeof *out);
        out->nparams = m->nparams;
        out->nlayers = m->nlayers;
        for (int l = 0; l < m->nlayers; l++)
            if (m->offsets[l + 1] - m->offsets[l] > out->largest_layer) out->largest_layer = m->offsets[l + 1] - m->offsets[l];
        out->activation_bytes = model_activation_bytes(m, batch);
        out->flops_per_sample = m->flops_per_sample;
    }
    free(m);
    return rc;
}

int tally__model_init(tally__model *m, const tally__model_cfg *cfg, int max_batch, uint64_t seed,
                      const tally__mem_source *grads_src, int flags) {
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    m->regression = cfg->kind == TALLY__MODEL_LINEAR;
    m->max_batch = max_batch;
    if (max_batch < 1 || cfg->in_dim < 1 || cfg->outputs < 1)
        return tally__seterr(TALLY_E_INVALID, "model: batch %d, inputs %d, outputs %d must all be positive",
                             max_batch, cfg->in_dim, cfg->outputs);
    int rc = model_layout(m, cfg);
    if (!rc) rc = model_alloc_flat(m, grads_src, flags);
    if (!rc) rc = model_alloc_buffers(m, max_batch);
    if (rc) {
        tally__model_free(m);
        return rc;
    }
    for (int i = 0; i < m->ntensors; i++) {
        m->tensor[i].param = m->params ? m->params + m->tensor[i].offset : NULL;
        m->tensor[i].grad = m->grads ? m->grads + m->tensor[i].offset : NULL;
    }
    if (m->params) model_init_params(m, seed);
    return 0;
}

void tally__model_free(tally__model *m) {
    free(m->params);
    if (m->grads_src.alloc)
        m->grads_src.release(m->grads_src.ctx, m->grads);
    else
        free(m->grads);
    for (int i = 1; i <= m->nops; i++) {
        free(m->act[i]);
        free(m->dact[i]);
    }
    for (int i = 0; i < m->nops; i++) free(m->argmax[i]);
    free(m->probs);
    free(m->scratch);
    memset(m, 0, sizeof *m);
}

static void model_op_forward(tally__model *m, int i, int B) {
    const tally__op *op = &m->op[i];
    const float *x = m->act[i];
    float *y = m->act[i + 1];
    const float *w = op->w, *b = op->b;
    switch (op->kind) {
    case TALLY__OP_LINEAR: tally_linear_forward(y, x, w, b, B, op->fan_in, op->fan_out); break;
    case TALLY__OP_RELU: tally_relu_forward(y, x, (size_t)B * op->out); break;
    case TALLY__OP_CONV: tally_conv2d_forward(y, x, w, b, &op->conv, B, m->scratch); break;
    case TALLY__OP_POOL:
        tally_maxpool_forward(y, m->argmax[i], x, B, op->pool_c, op->pool_h, op->pool_w, op->pool_k);
        break;
    }
}

int tally__model_forward(tally__model *m, const float *x, const int32_t *y, const float *t, int B,
                         const tally__model_hooks *h, float *loss) {
    m->act[0] = (float *)x;
    for (int i = 0; i < m->nops; i++) {
        int rc = h && h->before_forward && m->op[i].layer >= 0 ? h->before_forward(h->arg, m->op[i].layer) : 0;
        if (rc) return rc;
        model_op_forward(m, i, B);
    }
    const float *out = m->act[m->nops];
    int C = (int)m->op[m->nops - 1].out;
    *loss = m->regression ? tally_mse_forward(out, t, B, C) : tally_softmax_xent_forward(m->probs, out, y, B, C);
    return 0;
}

/* dx is NULL for the first op: nobody needs the gradient of the input batch. */
static void model_op_backward(tally__model *m, int i, int B) {
    const tally__op *op = &m->op[i];
    float *dx = i ? m->dact[i] : NULL;
    const float *dy = m->dact[i + 1], *x = m->act[i];
    const float *w = op->w;
    float *dw = op->dw, *db = op->db;
    switch (op->kind) {
    case TALLY__OP_LINEAR: tally_linear_backward(dx, dw, db, dy, x, w, B, op->fan_in, op->fan_out); break;
    case TALLY__OP_RELU:
        if (dx) tally_relu_backward(dx, dy, m->act[i + 1], (size_t)B * op->out);
        break;
    case TALLY__OP_CONV: tally_conv2d_backward(dx, dw, db, dy, x, w, &op->conv, B, m->scratch); break;
    case TALLY__OP_POOL:
        if (dx) tally_maxpool_backward(dx, dy, m->argmax[i], B, op->pool_c, op->pool_h, op->pool_w, op->pool_k);
        break;
    }
}

int tally__model_backward(tally__model *m, const int32_t *y, const float *t, int B, const tally__model_hooks *h) {
    const float *out = m->act[m->nops];
    int C = (int)m->op[m->nops - 1].out;
    if (m->regression)
        tally_mse_backward(m->dact[m->nops], out, t, B, C);
    else
        tally_softmax_xent_backward(m->dact[m->nops], m->probs, y, B, C);
    for (int i = m->nops - 1; i >= 0; i--) {
        int layer = m->op[i].layer, rc = 0;
        if (layer >= 0 && h && h->before_backward && (rc = h->before_backward(h->arg, layer))) return rc;
        model_op_backward(m, i, B);
        if (layer >= 0 && h && h->after_backward && (rc = h->after_backward(h->arg, layer))) return rc;
    }
    return 0;
}

double tally__model_score(const tally__model *m, const int32_t *y, const float *t, int B) {
    const float *out = m->act[m->nops];
    int C = (int)m->op[m->nops - 1].out;
    double score = 0;
    for (int s = 0; s < B; s++) {
        const float *row = out + (size_t)s * C;
        if (m->regression) {
            for (int j = 0; j < C; j++) {
                double e = (double)row[j] - t[(size_t)s * C + j];
                score += e * e;
            }
            continue;
        }
        int best = 0;
        for (int j = 1; j < C; j++)
            if (row[j] > row[best]) best = j;
        score += best == y[s];
    }
    return score;
}
