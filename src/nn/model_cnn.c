/* model_cnn.c - LeNet-5 as the PyTorch peer builds it: conv 6@5x5 pad 2, ReLU, 2x2 max-pool, conv 16@5x5,
 * ReLU, pool, then linear 120, 84 and the classes, with ReLU between them. */
#include <stdio.h>

#include "../core/err.h"
#include "model_build.h"

/* conv + relu + 2x2 max-pool on the latest value; returns the pooled geometry through c/h/w. */
static void cnn_conv_block(tally__model *m, int *c, int *h, int *w, int k, int r, int pad) {
    tally_conv2d_shape s = {.C = *c, .H = *h, .W = *w, .K = k, .R = r, .stride = 1, .pad = pad};
    int oh = tally_conv2d_out_h(&s), ow = tally_conv2d_out_w(&s);
    size_t out = (size_t)k * oh * ow;
    tally__op *op = tally__graph_node(m, TALLY__OP_CONV, tally__graph_last(m), -1, out);
    op->conv = s;
    op->fan_in = *c * r * r;
    char name[16];
    tally__graph_layer_name(m, op, "conv", name, sizeof name);
    tally__graph_params(m, op, name, 4, (int[]){k, *c, r, r});
    m->flops_per_sample += tally__graph_flops(op, (double)k * *c * r * r * oh * ow);
    tally__graph_node(m, TALLY__OP_RELU, tally__graph_last(m), -1, out);
    tally__op *pool = tally__graph_node(m, TALLY__OP_POOL, tally__graph_last(m), -1, (size_t)k * (oh / 2) * (ow / 2));
    pool->pool_c = k;
    pool->pool_h = oh;
    pool->pool_w = ow;
    pool->pool_k = 2;
    *c = k;
    *h = oh / 2;
    *w = ow / 2;
}

int tally__build_cnn(tally__model *m, const tally__model_cfg *cfg) {
    int c = cfg->channels, h = cfg->height, w = cfg->width;
    if (c < 1 || h < 12 || w < 12)
        return tally__seterr(TALLY_E_INVALID, "model cnn: needs images of at least 12x12 (got %dx%dx%d)", c, h, w);
    cnn_conv_block(m, &c, &h, &w, 6, 5, 2);
    cnn_conv_block(m, &c, &h, &w, 16, 5, 0);
    tally__graph_linear(m, c * h * w, 120, 1, NULL);
    tally__graph_linear(m, 120, 84, 1, NULL);
    tally__graph_linear(m, 84, cfg->outputs, 0, NULL);
    return 0;
}

void tally__cnn_arch(const tally__model_cfg *mc, char *buf, size_t n) { snprintf(buf, n, "LeNet-5"); }
