/* model_build.c - the pieces every model's layout is made of: nodes over values, parameter layers and
 * their named tensors in the flat buffers, and FLOP counts. */
#include <stdio.h>
#include <string.h>

#include "model_build.h"

int tally__graph_last(const tally__model *m) { return m->nvalues - 1; }

tally__op *tally__graph_node(tally__model *m, tally__op_kind kind, int src0, int src1, size_t out) {
    tally__op *op = &m->op[m->nops++];
    memset(op, 0, sizeof *op);
    op->kind = kind;
    op->src[0] = src0;
    op->src[1] = src1;
    op->dst = m->nvalues++;
    op->in = m->value_n[src0];
    op->out = out;
    op->layer = -1;
    m->value_n[op->dst] = out;
    m->readers[src0]++;
    if (src1 >= 0) m->readers[src1]++;
    return op;
}

static void graph_add_tensor(tally__model *m, const char *layer, const char *what, size_t offset, int ndim,
                             const int *shape) {
    tally__tensor *t = &m->tensor[m->ntensors++];
    snprintf(t->name, sizeof t->name, "%s.%s", layer, what);
    t->ndim = ndim;
    t->offset = offset;
    t->count = 1;
    for (int i = 0; i < ndim; i++) t->count *= (size_t)(t->shape[i] = shape[i]);
}

void tally__graph_params(tally__model *m, tally__op *op, const char *name, int wdim, const int *wshape) {
    op->layer = m->nlayers;
    op->w_off = m->nparams;
    graph_add_tensor(m, name, "weight", m->nparams, wdim, wshape);
    op->b_off = m->nparams + m->tensor[m->ntensors - 1].count;
    graph_add_tensor(m, name, "bias", op->b_off, 1, wshape);
    m->offsets[m->nlayers++] = m->nparams;
    m->nparams = op->b_off + (size_t)wshape[0];
    m->offsets[m->nlayers] = m->nparams;
}

void tally__graph_layer_name(const tally__model *m, const tally__op *op, const char *prefix, char *buf, size_t n) {
    int k = 1;
    for (const tally__op *o = m->op; o < op; o++) k += o->layer >= 0 && o->kind == op->kind;
    snprintf(buf, n, "%s%d", prefix, k);
}

double tally__graph_flops(const tally__op *op, double macs) { return (op->src[0] == 0 ? 4.0 : 6.0) * macs; }

void tally__graph_linear(tally__model *m, int in, int out, int relu, const char *fixed_name) {
    tally__op *op = tally__graph_node(m, TALLY__OP_LINEAR, tally__graph_last(m), -1, (size_t)out);
    op->fan_in = in;
    op->fan_out = out;
    char name[16];
    if (fixed_name)
        snprintf(name, sizeof name, "%s", fixed_name);
    else
        tally__graph_layer_name(m, op, "fc", name, sizeof name);
    tally__graph_params(m, op, name, 2, (int[]){out, in});
    m->flops_per_sample += tally__graph_flops(op, (double)in * out);
    if (relu) tally__graph_node(m, TALLY__OP_RELU, tally__graph_last(m), -1, (size_t)out);
}

