/* model.c - runs a model's graph over its flat buffers: allocation, initialisation, the forward pass,
 * the backward pass (gradients of values read twice summed; layers marked ready for the engine), scoring. */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/err.h"
#include "../core/alloc.h"
#include "../core/rng.h"
#include "../core/trace.h"
#include "../core/numeric/reduce.h"
#include "model_build.h"

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

/* Bytes model_alloc_buffers allocates for activations at batch B (both passes, pool winners, softmax,
 * the shared im2col scratch), without allocating. */
/* Floats of the scratch the ops share at batch B: conv's im2col, attention's scores' gradient. */
static size_t model_scratch_floats(const tally__model *m, int B) {
    size_t scratch = 0;
    for (int i = 0; i < m->nops; i++) {
        const tally__op *op = &m->op[i];
        size_t sc = op->kind == TALLY__OP_CONV        ? tally_conv2d_scratch_floats(&op->conv, B)
                    : op->kind == TALLY__OP_ATTENTION ? (size_t)op->seq * op->seq
                                                      : 0;
        if (sc > scratch) scratch = sc;
    }
    return scratch;
}

/* Floats per sample of dtmp: the largest value read by more than one node (0: none is). */
static size_t model_dtmp_floats(const tally__model *m) {
    size_t tmp = 0;
    for (int v = 1; v < m->nvalues; v++)
        if (m->readers[v] > 1 && m->value_n[v] > tmp) tmp = m->value_n[v];
    return tmp;
}

/* Bytes op keeps from forward for its backward at batch B (model->saved). */
static size_t op_saved_bytes(const tally__model *m, const tally__op *op, int B) {
    switch (op->kind) {
    case TALLY__OP_POOL: return (size_t)B * m->value_n[op->dst] * sizeof(int32_t);
    case TALLY__OP_LAYERNORM: return 2 * (size_t)B * op->rows * sizeof(float); /* mean, rstd */
    case TALLY__OP_ATTENTION: return (size_t)B * op->heads * op->seq * op->seq * sizeof(float);
    default: return 0;
    }
}

size_t tally__model_tied_floats(const tally__model *m) {
    if (m->tied_owner < 0) return 0;
    const tally__op *o = &m->op[m->tied_owner];
    return o->b_off - o->w_off;
}

static size_t model_activation_bytes(const tally__model *m, int B) {
    size_t bytes = tally__model_tied_floats(m) * sizeof(float); /* the tied op's gradient of the shared weight */
    for (int i = 0; i < m->nops; i++) {
        const tally__op *op = &m->op[i];
        size_t out = (size_t)B * m->value_n[op->dst];
        bytes += 2 * out * sizeof(float) + op_saved_bytes(m, op, B);
    }
    return bytes + (size_t)B * m->value_n[m->nvalues - 1] * sizeof(float) +
           (model_scratch_floats(m, B) + (size_t)B * model_dtmp_floats(m)) * sizeof(float);
}

/* An upper bound, in double so it cannot overflow whatever the layout, of model_activation_bytes(m, B):
 * each op's values and saved state per sample (at most 2^58 bytes an op within the fields' bounds) times
 * B, and the shared scratch. */
static double model_activation_bound(const tally__model *m, int B) {
    double bytes = (double)tally__model_tied_floats(m) * sizeof(float), scratch = 0;
    for (int i = 0; i < m->nops; i++) {
        const tally__op *op = &m->op[i];
        bytes += (double)B * (2.0 * (double)m->value_n[op->dst] * sizeof(float) + (double)op_saved_bytes(m, op, 1));
        double sc = op->kind == TALLY__OP_CONV        ? (double)B * (double)tally_conv2d_scratch_floats(&op->conv, 1)
                    : op->kind == TALLY__OP_ATTENTION ? (double)op->seq * op->seq
                                                      : 0;
        if (sc > scratch) scratch = sc;
    }
    return bytes + (double)B * (double)(m->value_n[m->nvalues - 1] + model_dtmp_floats(m)) * sizeof(float) +
           scratch * sizeof(float);
}

/* The sizes a laid-out model comes to at batch B, against what may be allocated (alloc) or, for a model
 * only described, what a size_t holds. */
static int model_check_sizes(const tally__model *m, int B, int alloc) {
    const char *name = m->cfg.build ? "of its own" : tally__model_name(m->cfg.kind);
    if (alloc && m->nparams > TALLY__MODEL_MAX_PARAMS)
        return tally__seterr(TALLY_E_INVALID,
                             "model %s: %zu parameters, more than the %llu a model trained here may have; give it "
                             "fewer layers or smaller widths",
                             name, m->nparams, (unsigned long long)TALLY__MODEL_MAX_PARAMS);
    double act = model_activation_bound(m, B),
           most = alloc ? (double)TALLY__MODEL_MAX_ACTIVATION_BYTES : (double)(SIZE_MAX / 4);
    if (act > most)
        return tally__seterr(TALLY_E_INVALID,
                             "model %s: its activations at batch %d come to %.3g bytes, more than the %.3g %s; give "
                             "it a smaller batch, context or width",
                             name, B, act, most, alloc ? "a model trained here may take" : "that can be counted");
    return 0;
}

/* The tied op's own gradient of the shared weight, and with parameters in shards (ZeRO-3, whose gathered
 * layers are reused), a copy of the weight the owner's forward saw. */
static int model_alloc_tied(tally__model *m, int flags) {
    size_t n = tally__model_tied_floats(m);
    if (!n) return 0;
    m->tied_dw = tally__alloc_zeroed(n * sizeof(float));
    if (flags & TALLY__MODEL_NO_PARAMS) m->tied_copy = tally__alloc_zeroed(n * sizeof(float));
    if (!m->tied_dw || ((flags & TALLY__MODEL_NO_PARAMS) && !m->tied_copy))
        return tally__seterr(TALLY_E_NOMEM, "model: out of memory for the tied weight's gradient");
    return 0;
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
    m->act[0] = NULL; /* the caller's input batch */
    for (int i = 0; i < m->nops; i++) {
        const tally__op *op = &m->op[i];
        size_t out = (size_t)B * m->value_n[op->dst];
        m->act[op->dst] = tally__alloc_zeroed(out * sizeof(float));
        m->dact[op->dst] = tally__alloc_zeroed(out * sizeof(float));
        if (!m->act[op->dst] || !m->dact[op->dst])
            return tally__seterr(TALLY_E_NOMEM, "model: out of memory for activations");
        size_t saved = op_saved_bytes(m, op, B);
        if (saved && !(m->saved[i] = tally__alloc_zeroed(saved)))
            return tally__seterr(TALLY_E_NOMEM, "model: out of memory for activations");
    }
    size_t scratch = model_scratch_floats(m, B), tmp = model_dtmp_floats(m);
    m->probs = tally__alloc_zeroed((size_t)B * m->value_n[m->nvalues - 1] * sizeof(float));
    m->scratch = scratch ? tally__alloc_zeroed(scratch * sizeof(float)) : NULL;
    m->dtmp = tmp ? tally__alloc_zeroed((size_t)B * tmp * sizeof(float)) : NULL;
    m->activation_bytes = model_activation_bytes(m, B);
    if (!m->probs || (scratch && !m->scratch) || (tmp && !m->dtmp))
        return tally__seterr(TALLY_E_NOMEM, "model: out of memory for activations");
    return 0;
}

void tally__model_init_rng(tally__rng *r, uint64_t seed) { tally__rng_seed(r, seed, 0x6d6f64656cull); }

/* PyTorch's defaults: Linear and Conv2d weights and biases uniform in +-1/sqrt(fan_in), Embedding
 * standard normal, LayerNorm 1 and 0; or, where the builder set init_std (GPT-2), weights normal with
 * that deviation and biases 0. */
void tally__model_init_layer(const tally__model *m, int layer, float *dst, tally__rng *r) {
    const tally__op *op = &m->op[tally__model_layer_op(m, layer)];
    size_t n = m->offsets[layer + 1] - m->offsets[layer], nw = op->b_off - op->w_off;
    if (op->kind == TALLY__OP_LAYERNORM) { /* PyTorch's and GPT-2's alike */
        for (size_t j = 0; j < n; j++) dst[j] = j < nw ? 1.0f : 0.0f;
        return;
    }
    if (op->init_std > 0 || op->kind == TALLY__OP_EMBED || op->kind == TALLY__OP_POSITION) {
        float std = op->init_std > 0 ? op->init_std : 1.0f;
        for (size_t j = 0; j < n; j++) dst[j] = j < nw ? std * tally__rng_normal(r) : 0.0f;
        return;
    }
    float bound = 1.0f / sqrtf((float)op->fan_in);
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
                 ? tally__seterr(TALLY_E_INVALID, "model: batch %d, inputs %d, outputs %d must all be positive", batch,
                                 cfg->in_dim, cfg->outputs)
                 : tally__model_layout(m, cfg);
    if (!rc) rc = model_check_sizes(m, batch, 0);
    if (!rc) {
        memset(out, 0, sizeof *out);
        out->nparams = m->nparams;
        out->nlayers = m->nlayers;
        for (int l = 0; l < m->nlayers; l++)
            if (m->offsets[l + 1] - m->offsets[l] > out->largest_layer)
                out->largest_layer = m->offsets[l + 1] - m->offsets[l];
        out->tied_floats = tally__model_tied_floats(m);
        out->activation_bytes = model_activation_bytes(m, batch);
        out->flops_per_sample = m->flops_per_sample;
        out->bf16_bytes = tally__model_bf16_bytes(m, batch);
    }
    free(m);
    return rc;
}

int tally__model_init(tally__model *m, const tally__model_cfg *cfg, int max_batch, uint64_t seed,
                      const tally__mem_source *grads_src, int flags) {
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    m->max_batch = max_batch;
    if (max_batch < 1 || cfg->in_dim < 1 || cfg->outputs < 1)
        return tally__seterr(TALLY_E_INVALID, "model: batch %d, inputs %d, outputs %d must all be positive", max_batch,
                             cfg->in_dim, cfg->outputs);
    int rc = tally__model_layout(m, cfg);
    if (!rc) rc = model_check_sizes(m, max_batch, 1);
    if (!rc) rc = model_alloc_flat(m, grads_src, flags);
    if (!rc) rc = model_alloc_tied(m, flags);
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
    for (int v = 1; v < m->nvalues; v++) {
        free(m->act[v]);
        free(m->dact[v]);
    }
    for (int i = 0; i < m->nops; i++) free(m->saved[i]);
    free(m->probs);
    free(m->scratch);
    free(m->tied_dw);
    free(m->tied_copy);
    free(m->dtmp);
    tally__model_bf16_free(m);
    memset(m, 0, sizeof *m);
}

/* An embedding's lookup; a token outside its table is the data's error, named with where it is. */
static int model_embed_forward(tally__model *m, const tally__op *op, int B) {
    const int32_t *tokens = (const int32_t *)m->act[op->src[0]];
    long bad = tally_embedding_forward(m->act[op->dst], tokens, op->w, (size_t)B * op->in, op->fan_in, op->fan_out);
    if (bad < 0) return 0;
    return tally__seterr(TALLY_E_INVALID,
                         "model: token %d (sample %ld, position %ld) is outside the vocabulary "
                         "0..%d; the data must be tokenized for this model",
                         (int)tokens[bad], bad / (long)op->in, bad % (long)op->in, op->fan_in - 1);
}

/* y = a + b, element by element (y may be a): the collectives' own f32 sum, on the CPU's widest lanes. */
static void add_arrays(float *y, const float *a, const float *b, size_t n) {
    tally__reduce(y, a, b, n, TALLY_F32, TALLY_SUM);
}

static int model_op_forward(tally__model *m, int i, int B) {
    const tally__op *op = &m->op[i];
    const float *x = m->act[op->src[0]];
    float *y = m->act[op->dst];
    const float *w = op->w, *b = op->b;
    switch (op->kind) {
    case TALLY__OP_LINEAR:
        if (op->tied_to >= 0) w = m->tied_w, b = NULL;
        if (m->bf16) return tally__model_bf16_linear_forward(m, i, B * op->rows, x, w, b, y);
        tally_linear_forward(y, x, w, b, B * op->rows, op->fan_in, op->fan_out);
        break;
    case TALLY__OP_RELU: tally_relu_forward(y, x, (size_t)B * op->out); break;
    case TALLY__OP_CONV: tally_conv2d_forward(y, x, w, b, &op->conv, B, m->scratch); break;
    case TALLY__OP_POOL:
        tally_maxpool_forward(y, m->saved[i], x, B, op->pool_c, op->pool_h, op->pool_w, op->pool_k);
        break;
    case TALLY__OP_ADD: {
        add_arrays(y, x, m->act[op->src[1]], (size_t)B * op->out);
        break;
    }
    case TALLY__OP_EMBED: return model_embed_forward(m, op, B);
    case TALLY__OP_POSITION:
        for (int s = 0; s < B; s++) add_arrays(y + (size_t)s * op->out, x + (size_t)s * op->out, w, op->out);
        break;
    case TALLY__OP_LAYERNORM: {
        size_t n = (size_t)B * op->rows;
        float *mean = m->saved[i];
        tally_layernorm_forward(y, mean, mean + n, x, w, b, n, op->fan_in);
        break;
    }
    case TALLY__OP_GELU: tally_gelu_forward(y, x, (size_t)B * op->out); break;
    case TALLY__OP_ATTENTION: tally_attention_forward(y, m->saved[i], x, B, op->seq, op->fan_in, op->heads); break;
    }
    return 0;
}

/* Rows and classes of the loss: each sample's outputs are `positions` rows of classes. */
static void model_loss_shape(const tally__model *m, int B, int *rows, int *C) {
    int P = m->positions > 0 ? m->positions : 1;
    *rows = B * P;
    *C = (int)(m->value_n[m->nvalues - 1] / (size_t)P);
}

/* The timeline's span of op i's pass ("linear 3"), when it records. */
static void model_trace_op(const tally__model *m, const char *pass, int i, uint64_t t0) {
    static const char *kinds[] = {"linear", "relu",     "conv",      "pool", "add",
                                  "embed",  "position", "layernorm", "gelu", "attention"};
    const tally__op *op = &m->op[i];
    char name[40];
    unsigned k = (unsigned)op->kind;
    snprintf(name, sizeof name, "%s %d", k < sizeof kinds / sizeof *kinds ? kinds[k] : "op", i);
    tally__trace_arg args[] = {{"op", NULL, i}, {"layer", NULL, op->layer}};
    tally__trace_span(pass, name, t0, tally__trace_now(), args, 2);
}

int tally__model_forward(tally__model *m, const void *x, const int32_t *y, const float *t, int B,
                         const tally__model_hooks *h, float *loss) {
    m->act[0] = (float *)x; /* token indices when m->token_input: only an embedding reads them */
    for (int i = 0; i < m->nops; i++) {
        int rc = h && h->before_forward && m->op[i].layer >= 0 ? h->before_forward(h->arg, m->op[i].layer) : 0;
        uint64_t t0 = tally__trace_on ? tally__trace_now() : 0;
        if (!rc) rc = model_op_forward(m, i, B);
        if (rc) return rc;
        if (tally__trace_on) model_trace_op(m, "forward", i, t0);
        if (i == m->tied_owner) { /* where the tied op will find the weight, later in this pass */
            if (m->tied_copy) memcpy(m->tied_copy, m->op[i].w, tally__model_tied_floats(m) * sizeof(float));
            m->tied_w = m->tied_copy ? m->tied_copy : m->op[i].w;
        }
    }
    const float *out = m->act[m->nvalues - 1];
    int rows, C;
    model_loss_shape(m, B, &rows, &C);
    *loss = m->regression ? tally_mse_forward(out, t, rows, C) : tally_softmax_xent_forward(m->probs, out, y, rows, C);
    return 0;
}

/* Where input k of op i gets its gradient: nowhere for the batch (nobody needs it), straight into the
 * value's gradient when op i is its only reader, else into dtmp, which model_grad_add then adds in. */
static float *model_grad_dst(tally__model *m, const tally__op *op, int k) {
    int v = op->src[k];
    if (v <= 0) return NULL;
    return m->readers[v] == 1 ? m->dact[v] : m->dtmp;
}

static void model_grad_add(tally__model *m, const tally__op *op, int k, int B) {
    int v = op->src[k];
    if (v <= 0 || m->readers[v] == 1) return;
    add_arrays(m->dact[v], m->dact[v], m->dtmp, (size_t)B * m->value_n[v]);
}

/* dy as value v's gradient from one of its readers: the whole of it when that is v's only reader, else
 * added to the other readers' (what model_grad_add does through dtmp, without the copy there). */
static void model_grad_give(tally__model *m, int v, const float *dy, size_t n) {
    if (v <= 0) return;
    float *d = m->dact[v];
    if (m->readers[v] == 1)
        memcpy(d, dy, n * sizeof(float));
    else
        add_arrays(d, d, dy, n);
}

/* What of an op's backward to run: its input's gradient, its parameters' gradients, or both. */
enum { GRAD_INPUT = 1, GRAD_PARAMS = 2, GRAD_BOTH = 3 };

static void model_op_backward(tally__model *m, int i, int B, int parts) {
    const tally__op *op = &m->op[i];
    float *dx = parts & GRAD_INPUT ? model_grad_dst(m, op, 0) : NULL;
    const float *dy = m->dact[op->dst], *x = m->act[op->src[0]];
    const float *w = op->w;
    float *dw = parts & GRAD_PARAMS ? op->dw : NULL, *db = parts & GRAD_PARAMS ? op->db : NULL;
    switch (op->kind) {
    case TALLY__OP_LINEAR:
        if (op->tied_to >= 0) w = m->tied_w, dw = m->tied_dw, db = NULL;
        if (m->bf16) {
            int rc = tally__model_bf16_linear_backward(m, i, B * op->rows, dy, dx, dw, db);
            if (rc && !m->bf16_rc) m->bf16_rc = rc;
            break;
        }
        tally_linear_backward(dx, dw, db, dy, x, w, B * op->rows, op->fan_in, op->fan_out);
        break;
    case TALLY__OP_EMBED: /* the tokens need no gradient */
        if (dw) tally_embedding_backward(dw, dy, (const int32_t *)x, (size_t)B * op->in, op->fan_out);
        return;
    case TALLY__OP_POSITION:
        for (int s = 0; s < B && dw; s++)
            for (size_t k = 0; k < op->out; k++) dw[k] += dy[(size_t)s * op->out + k];
        if (dx) memcpy(dx, dy, (size_t)B * op->out * sizeof(float));
        break;
    case TALLY__OP_LAYERNORM: {
        size_t n = (size_t)B * op->rows;
        const float *mean = m->saved[i];
        tally_layernorm_backward(dx, dw, db, dy, x, w, mean, mean + n, n, op->fan_in);
        break;
    }
    case TALLY__OP_GELU:
        if (dx) tally_gelu_backward(dx, dy, x, (size_t)B * op->out);
        break;
    case TALLY__OP_ATTENTION:
        if (dx) tally_attention_backward(dx, m->scratch, dy, x, m->saved[i], B, op->seq, op->fan_in, op->heads);
        break;
    case TALLY__OP_RELU:
        if (dx) tally_relu_backward(dx, dy, m->act[op->dst], (size_t)B * op->out);
        break;
    case TALLY__OP_CONV: tally_conv2d_backward(dx, dw, db, dy, x, w, &op->conv, B, m->scratch); break;
    case TALLY__OP_POOL:
        if (dx) tally_maxpool_backward(dx, dy, m->saved[i], B, op->pool_c, op->pool_h, op->pool_w, op->pool_k);
        break;
    case TALLY__OP_ADD: /* both inputs get dy: copied to a sole reader's gradient, added to a shared one */
        for (int k = 0; k < 2; k++) model_grad_give(m, op->src[k], dy, (size_t)B * op->out);
        return;
    }
    if (parts & GRAD_INPUT) model_grad_add(m, op, 0, B);
}

/* The tied op's share of the owner's weight gradient, into wherever the engine points it now. */
static void model_add_tied(tally__model *m, int i) {
    if (i != m->tied_owner) return;
    float *dw = m->op[i].dw;
    for (size_t k = 0, n = tally__model_tied_floats(m); k < n; k++) dw[k] += m->tied_dw[k];
}

/* ZeRO-3 may point a layer's gradients at its gathered parameters (dw == w), so one buffer holds
 * both in turn: the input's gradient, the last reader of w, comes first; then the buffer is cleared
 * and the parameters' gradients added in. The sums are the same, in the same order, as with a
 * buffer of their own. */
static void model_op_backward_over_params(tally__model *m, int i, int B) {
    const tally__op *op = &m->op[i];
    model_op_backward(m, i, B, GRAD_INPUT);
    memset(op->dw, 0, (m->offsets[op->layer + 1] - m->offsets[op->layer]) * sizeof(float));
    model_add_tied(m, i);
    model_op_backward(m, i, B, GRAD_PARAMS);
}

int tally__model_backward(tally__model *m, const int32_t *y, const float *t, int B, const tally__model_hooks *h) {
    const float *out = m->act[m->nvalues - 1];
    int rows, C;
    model_loss_shape(m, B, &rows, &C);
    if (m->regression)
        tally_mse_backward(m->dact[m->nvalues - 1], out, t, rows, C);
    else
        tally_softmax_xent_backward(m->dact[m->nvalues - 1], m->probs, y, rows, C);
    for (int v = 1; v < m->nvalues - 1; v++) /* values read more than once collect a sum */
        if (m->readers[v] > 1) memset(m->dact[v], 0, (size_t)B * m->value_n[v] * sizeof(float));
    if (m->tied_dw) memset(m->tied_dw, 0, tally__model_tied_floats(m) * sizeof(float));
    for (int i = m->nops - 1; i >= 0; i--) {
        const tally__op *op = &m->op[i];
        int rc = 0;
        if (op->layer >= 0 && h && h->before_backward && (rc = h->before_backward(h->arg, op->layer))) return rc;
        uint64_t t0 = tally__trace_on ? tally__trace_now() : 0;
        if (op->layer >= 0 && op->dw && op->dw == op->w) {
            model_op_backward_over_params(m, i, B);
        } else {
            model_add_tied(m, i);
            model_op_backward(m, i, B, GRAD_BOTH);
        }
        if (tally__trace_on) model_trace_op(m, "backward", i, t0);
        if (m->bf16_rc) return m->bf16_rc;
        if (op->layer >= 0 && h && h->after_backward && (rc = h->after_backward(h->arg, op->layer))) return rc;
    }
    return 0;
}

double tally__model_score(const tally__model *m, const int32_t *y, const float *t, int B) {
    const float *out = m->act[m->nvalues - 1];
    int rows, C;
    model_loss_shape(m, B, &rows, &C);
    double score = 0;
    for (int s = 0; s < rows; s++) {
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
