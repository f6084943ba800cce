/* model_mlp.c - the linear model (one layer: least squares) and the multi-layer perceptron (linear
 * layers with ReLU between them), as PyTorch's nn.Linear stacks name and lay them out. */
#include <stdio.h>

#include "../core/err.h"
#include "model_build.h"

int tally__build_linear(tally__model *m, const tally__model_cfg *cfg) {
    m->regression = 1; /* least squares: mean squared error against targets */
    tally__graph_linear(m, cfg->in_dim, cfg->outputs, 0, "linear");
    return 0;
}

int tally__build_mlp(tally__model *m, const tally__model_cfg *cfg) {
    int in = cfg->in_dim;
    for (int i = 0; i < cfg->nhidden; i++) {
        if (cfg->hidden[i] < 1)
            return tally__seterr(TALLY_E_INVALID, "model: hidden layer %d has width %d", i, cfg->hidden[i]);
        tally__graph_linear(m, in, cfg->hidden[i], 1, NULL);
        in = cfg->hidden[i];
    }
    tally__graph_linear(m, in, cfg->outputs, 0, NULL);
    return 0;
}

/* With no --hidden, the MLP of the benchmarks: two hidden layers of 512. */
void tally__mlp_defaults(tally__model_cfg *mc) {
    if (mc->nhidden) return;
    mc->nhidden = 2;
    mc->hidden[0] = mc->hidden[1] = 512;
}

/* "784-512-512-10": the widths in order (the linear model is "8-1"). */
void tally__mlp_arch(const tally__model_cfg *mc, char *buf, size_t n) {
    int len = snprintf(buf, n, "%d", mc->in_dim);
    for (int i = 0; i < mc->nhidden && len < (int)n; i++)
        len += snprintf(buf + len, n - (size_t)len, "-%d", mc->hidden[i]);
    if (len < (int)n) snprintf(buf + len, n - (size_t)len, "-%d", mc->outputs);
}
