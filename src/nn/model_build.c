/* model_build.c - the pieces every model's layout is made of: nodes over values, parameter layers and
 * their named tensors in the flat buffers, embeddings of token inputs, and FLOP counts. */
#include <stdio.h>
#include <string.h>

#include "../core/err.h"
#include "model_build.h"

int tally__graph_last(const tally__model *m) { return m->nvalues - 1; }

tally__op *tally__graph_node(tally__model *m, tally__op_kind kind, int src0, int src1, size_t out) {
    if (m->nops == TALLY__MODEL_MAX_OPS) { /* refused at the end of the layout; the builder goes on harmlessly */
        static __thread tally__op spill;
        if (!m->layout_rc)
            m->layout_rc = tally__seterr(TALLY_E_INVALID,
                                         "model: more than %d nodes; a smaller model, or a build "
                                         "with a larger TALLY__MODEL_MAX_OPS",
                                         TALLY__MODEL_MAX_OPS);
        memset(&spill, 0, sizeof spill);
        spill.layer = spill.tied_to = -1;
        return &spill;
    }
    tally__op *op = &m->op[m->nops++];
    memset(op, 0, sizeof *op);
    op->kind = kind;
    op->src[0] = src0;
    op->src[1] = src1;
    op->dst = m->nvalues++;
    op->in = m->value_n[src0];
    op->out = out;
    op->layer = -1;
    op->tied_to = -1;
    m->value_n[op->dst] = out;
    m->readers[src0]++;
    if (src1 >= 0) m->readers[src1]++;
    return op;
}

static void graph_add_tensor(tally__model *m, const char *layer, const char *what, size_t offset, int ndim,
                             const int *shape) {
    tally__tensor *t = &m->tensor[m->ntensors++];
    int len = snprintf(t->name, sizeof t->name, "%s.%s", layer, what);
    if (len >= (int)sizeof t->name && !m->layout_rc) /* cut short, it could name another tensor */
        m->layout_rc = tally__seterr(TALLY_E_INVALID,
                                     "model: the tensor name '%s.%s' has %d characters, more "
                                     "than %d; give the layer a shorter name",
                                     layer, what, len, (int)sizeof t->name - 1);
    t->ndim = ndim;
    t->offset = offset;
    t->count = 1;
    for (int i = 0; i < ndim; i++) t->count *= (size_t)(t->shape[i] = shape[i]);
}

/* A parameter layer of a weight [wshape] and, when bias, a bias [wshape[0]] after it. */
static void graph_layer(tally__model *m, tally__op *op, const char *name, int wdim, const int *wshape, int bias) {
    if (m->layout_rc) return; /* past the node limit (the spill op) or already refused: nothing more to lay out */
    op->layer = m->nlayers;
    op->w_off = m->nparams;
    graph_add_tensor(m, name, "weight", m->nparams, wdim, wshape);
    op->b_off = m->nparams + m->tensor[m->ntensors - 1].count;
    if (bias) graph_add_tensor(m, name, "bias", op->b_off, 1, wshape);
    m->offsets[m->nlayers++] = m->nparams;
    m->nparams = op->b_off + (bias ? (size_t)wshape[0] : 0);
    m->offsets[m->nlayers] = m->nparams;
}

void tally__graph_params(tally__model *m, tally__op *op, const char *name, int wdim, const int *wshape) {
    graph_layer(m, op, name, wdim, wshape, 1);
}

void tally__graph_layer_name(const tally__model *m, const tally__op *op, const char *prefix, char *buf, size_t n) {
    int k = 1;
    for (const tally__op *o = m->op; o < op; o++) k += o->layer >= 0 && o->kind == op->kind;
    snprintf(buf, n, "%s%d", prefix, k);
}

double tally__graph_flops(const tally__op *op, double macs) { return (op->src[0] == 0 ? 4.0 : 6.0) * macs; }

void tally__graph_linear(tally__model *m, int in, int out, int relu, const char *fixed_name) {
    int src = tally__graph_last(m);
    int rows = (int)(m->value_n[src] / (size_t)in); /* a sequence's positions, each of `in` features */
    tally__op *op = tally__graph_node(m, TALLY__OP_LINEAR, src, -1, (size_t)rows * out);
    op->fan_in = in;
    op->fan_out = out;
    op->rows = rows;
    char numbered[16];
    if (!fixed_name) tally__graph_layer_name(m, op, "fc", numbered, sizeof numbered);
    tally__graph_params(m, op, fixed_name ? fixed_name : numbered, 2, (int[]){out, in});
    m->flops_per_sample += tally__graph_flops(op, (double)rows * in * out);
    if (relu) tally__graph_node(m, TALLY__OP_RELU, tally__graph_last(m), -1, (size_t)rows * out);
}

int tally__graph_embedding(tally__model *m, int vocab, int width, const char *name) {
    if (!m->token_input)
        return tally__seterr(TALLY_E_INVALID,
                             "model: the embedding %s reads token indices, and this model's "
                             "input is floats; set token_input before laying it out",
                             name);
    if (vocab < 1 || width < 1)
        return tally__seterr(TALLY_E_INVALID,
                             "model: the embedding %s needs a vocabulary and a width of at "
                             "least 1 (got %d and %d)",
                             name, vocab, width);
    tally__op *op = tally__graph_node(m, TALLY__OP_EMBED, 0, -1, m->value_n[0] * (size_t)width);
    op->fan_in = vocab;
    op->fan_out = width;
    graph_layer(m, op, name, 2, (int[]){vocab, width}, 0); /* nn.Embedding: a weight, no bias */
    return 0;
}

int tally__graph_position(tally__model *m, int positions, int width, const char *name) {
    int src = tally__graph_last(m);
    if (m->value_n[src] != (size_t)positions * width)
        return tally__seterr(TALLY_E_INVALID,
                             "model: the position table %s is %d x %d and its input has %zu floats "
                             "per sample",
                             name, positions, width, m->value_n[src]);
    tally__op *op = tally__graph_node(m, TALLY__OP_POSITION, src, -1, m->value_n[src]);
    op->fan_in = positions;
    op->fan_out = width;
    graph_layer(m, op, name, 2, (int[]){positions, width}, 0); /* nn.Embedding(T, C): a weight, no bias */
    return 0;
}

void tally__graph_layernorm(tally__model *m, int width, const char *name) {
    int src = tally__graph_last(m);
    tally__op *op = tally__graph_node(m, TALLY__OP_LAYERNORM, src, -1, m->value_n[src]);
    op->fan_in = width;
    op->rows = (int)(m->value_n[src] / (size_t)width);
    tally__graph_params(m, op, name, 1, (int[]){width});
}

void tally__graph_gelu(tally__model *m) {
    int src = tally__graph_last(m);
    tally__graph_node(m, TALLY__OP_GELU, src, -1, m->value_n[src]);
}

int tally__graph_attention(tally__model *m, int seq, int width, int heads) {
    int src = tally__graph_last(m);
    if (heads < 1 || width % heads || m->value_n[src] != (size_t)seq * 3 * width)
        return tally__seterr(TALLY_E_INVALID,
                             "model: attention over %d positions of width %d needs a multiple of "
                             "its %d heads and 3 x that width per position (got %zu floats)",
                             seq, width, heads, m->value_n[src]);
    tally__op *op = tally__graph_node(m, TALLY__OP_ATTENTION, src, -1, (size_t)seq * width);
    op->fan_in = width;
    op->seq = seq;
    op->heads = heads;
    m->flops_per_sample += tally__graph_flops(op, 2.0 * seq * seq * width); /* q k^T and att v, in full */
    return 0;
}

void tally__graph_tied_linear(tally__model *m, int owner, int in, int out) {
    int src = tally__graph_last(m);
    int rows = (int)(m->value_n[src] / (size_t)in);
    tally__op *op = tally__graph_node(m, TALLY__OP_LINEAR, src, -1, (size_t)rows * out);
    op->fan_in = in;
    op->fan_out = out;
    op->rows = rows;
    op->tied_to = owner;
    m->tied_owner = owner;
    m->flops_per_sample += tally__graph_flops(op, (double)rows * in * out);
}
