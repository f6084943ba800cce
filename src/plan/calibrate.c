/* calibrate.c - the measurements behind `tally plan --calibrate`: an allreduce of the plan's gradients,
 * the real model's forward + backward and optimizer update, and the beta fitted to the allreduce. */
#include "calibrate.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <tally/optim.h>
#include <unistd.h>

#include "../core/clock.h"
#include "../core/err.h"

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median call, not the mean: on a shared machine one preempted call would move a mean by its whole
 * stall, and what is fitted to it is every later prediction. */
double tally__plan_time_allreduce(tally_comm *comm, double bytes, tally_op op) {
    enum { MANY = 301, SOME = 51, FEW = 11 };
    size_t count = (size_t)(fmin(bytes, 256.0 * 1048576.0) / sizeof(float));
    float *buf = count ? tally_mem_alloc(comm, count * sizeof(float)) : NULL;
    if (!buf) return 0;
    memset(buf, 0, count * sizeof(float));
    double t[MANY];
    /* a small one takes microseconds: many; a large one milliseconds: a few */
    int iters = bytes < 1048576 ? MANY : bytes < 16.0 * 1048576 ? SOME : FEW, done = 0;
    for (int i = -2; i < iters; i++) { /* two to warm up */
        double t0 = tally__now_s();
        if (tally_allreduce(comm, buf, buf, count, TALLY_F32, op)) break;
        if (i >= 0) t[done++] = tally__now_s() - t0;
    }
    tally_mem_free(comm, buf);
    if (done < iters) return 0;
    qsort(t, (size_t)done, sizeof *t, by_value);
    return t[done / 2] * (bytes / (count * sizeof(float))); /* scaled up when capped */
}

/* Seconds per parameter of the optimizer update as the trainer does it (step, then clear the
 * gradients), on the plan's parameter count (at most 16 M: the rate is per parameter). */
static double calibrate_update(const tally__plan_cfg *c) {
    size_t n = c->params < (16u << 20) ? (size_t)c->params : (16u << 20);
    float *p = calloc(n, sizeof *p), *g = calloc(n, sizeof *g);
    tally_optim_cfg oc;
    tally_optim_cfg_default(&oc, (tally_optim_kind)c->optimizer);
    tally_optim opt;
    double best = 0;
    if (p && g && !tally_optim_init(&opt, &oc, n)) {
        for (int i = 0; i < 3; i++) tally_optim_step(&opt, p, g, 1e-3f);
        double t_end = tally__now_s() + 0.2;
        while (tally__now_s() < t_end) {
            double t0 = tally__now_s();
            tally_optim_step(&opt, p, g, 1e-3f);
            memset(g, 0, n * sizeof *g);
            double t = (tally__now_s() - t0) / (double)n;
            if (best == 0 || t < best) best = t;
        }
        tally_optim_free(&opt);
    }
    free(p);
    free(g);
    return best;
}

/* A deterministic batch of inputs, labels and targets for timing a model. */
typedef struct calib_batch {
    float *x, *t;
    int32_t *y;
} calib_batch;

/* Features in [0, 1), or for a model that reads tokens, token indices (as wide as floats) and a target
 * at every position. */
static int batch_alloc(calib_batch *b, const tally__model_cfg *m, int B) {
    const tally__model_info *info = tally__model_info_of(m->kind);
    int tokens = info && info->data == TALLY__DATA_TOKENS;
    size_t n = (size_t)B * m->in_dim, labels = tokens ? n : (size_t)B;
    b->x = malloc(n * sizeof(float));
    b->t = calloc((size_t)B * m->outputs, sizeof(float));
    b->y = malloc(labels * sizeof(int32_t));
    if (!b->x || !b->t || !b->y) return -1;
    for (size_t i = 0; i < n; i++) {
        uint32_t h = (uint32_t)(i * 2654435761u);
        if (tokens)
            ((int32_t *)b->x)[i] = (int32_t)(h % (uint32_t)m->outputs);
        else
            b->x[i] = (float)(h % 1000) / 1000.0f;
    }
    for (size_t i = 0; i < labels; i++) b->y[i] = (int32_t)(i % (size_t)m->outputs);
    return 0;
}

static void batch_free(calib_batch *b) {
    free(b->x);
    free(b->t);
    free(b->y);
}

/* Times forward + backward of the real model at the batch, and the optimizer update right after it
 * (caches as a training step leaves them), on one BLAS thread as a rank of tally train runs. */
static int calibrate_model(const tally__plan_cfg *c, const tally__model_cfg *mcfg, tally__plan_calib *k) {
    tally__model m;
    calib_batch b = {0};
    tally_optim opt = {0};
    tally_optim_cfg oc;
    tally_optim_cfg_default(&oc, (tally_optim_kind)c->optimizer);
    int rc = tally__model_init(&m, mcfg, c->batch, 1, NULL, 0);
    if (!rc) rc = batch_alloc(&b, mcfg, c->batch) || tally_optim_init(&opt, &oc, m.nparams);
    int threads = openblas_get_num_threads(), iters = 0;
    openblas_set_num_threads(1);
    double fb = 0, up = 0, t_end = tally__now_s() + 0.3;
    for (int i = -3; !rc && (i < 10 || tally__now_s() < t_end); i++) { /* three to warm up */
        float loss;
        double t0 = tally__now_s();
        rc = tally__model_forward(&m, b.x, b.y, b.t, c->batch, NULL, &loss) ||
             tally__model_backward(&m, b.y, b.t, c->batch, NULL);
        double t1 = tally__now_s();
        tally_optim_step(&opt, m.params, m.grads, 1e-6f);
        memset(m.grads, 0, m.nparams * sizeof(float));
        if (i >= 0) fb += t1 - t0, up += tally__now_s() - t1, iters++;
    }
    openblas_set_num_threads(threads);
    tally_optim_free(&opt);
    batch_free(&b);
    tally__model_free(&m);
    if (rc || !iters)
        return tally__seterr(rc < 0 ? rc : TALLY_E_NOMEM, "timing the model's forward and backward failed%s%s",
                             rc < 0 ? ": " : "", rc < 0 ? tally_last_error() : "");
    k->model_gflops = c->flops_per_sample * c->batch / (fb / iters) * 1e-9;
    k->update_s_per_param = up / iters / (double)c->params;
    return 0;
}

int tally__plan_calibrate(tally__plan_cfg *cfg, const tally__model_cfg *mcfg, tally__plan_calib *k) {
    double S = tally__plan_grad_bytes(cfg);
    k->sgemm_gflops = tally__sgemm_peak_gflops();
    if (mcfg && calibrate_model(cfg, mcfg, k)) return TALLY_E_NOMEM;
    if (!mcfg) k->update_s_per_param = calibrate_update(cfg);
    k->cpus = sysconf(_SC_NPROCESSORS_ONLN);
    k->used = cfg->workers <= k->cpus ? "shm" : "tcp";
    /* The ping-pong's beta misses the memory traffic of a real allreduce of the gradient: fit it. */
    k->shm_ping_beta = k->shm.beta;
    k->tcp_ping_beta = k->tcp.beta;
    if (k->shm_allreduce_s > 0) k->shm.beta = tally__plan_fit_beta(&k->shm, 2, S, k->shm_allreduce_s);
    if (k->tcp_allreduce_s > 0) k->tcp.beta = tally__plan_fit_beta(&k->tcp, 2, S, k->tcp_allreduce_s);
    cfg->cost = cfg->workers <= k->cpus ? k->shm : k->tcp;
    cfg->gflops = k->model_gflops > 0 ? k->model_gflops : k->sgemm_gflops;
    cfg->update_s_per_param = k->update_s_per_param;
    return 0;
}
