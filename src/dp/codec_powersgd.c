/* codec_powersgd.c - PowerSGD with error feedback and warm start: each weight matrix M of a bucket sent
 * as factors P = M Q (orthonormalised) and Q = M^T P, both allreduced; biases and small tensors whole. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/err.h"
#include "codec_int.h"
#include "../core/rng.h"

#define PSGD_NONE ((size_t)-1)

void tally__powersgd_orthonormalize(float *p, int rows, int r) {
    for (int j = 0; j < r; j++) {
        double before = 0, norm = 0;
        for (int i = 0; i < rows; i++) before += (double)p[(size_t)i * r + j] * p[(size_t)i * r + j];
        for (int c = 0; c < j; c++) {
            double dot = 0;
            for (int i = 0; i < rows; i++) dot += (double)p[(size_t)i * r + c] * p[(size_t)i * r + j];
            for (int i = 0; i < rows; i++) p[(size_t)i * r + j] -= (float)dot * p[(size_t)i * r + c];
        }
        for (int i = 0; i < rows; i++) norm += (double)p[(size_t)i * r + j] * p[(size_t)i * r + j];
        norm = sqrt(norm);
        /* What is left of a column already spanned by the others is rounding: a zero column sends
         * nothing rather than a direction made of noise. */
        double scale = norm > 1e-4 * sqrt(before) && norm > 1e-30 ? 1.0 / norm : 0.0;
        for (int i = 0; i < rows; i++) p[(size_t)i * r + j] = (float)(p[(size_t)i * r + j] * scale);
    }
}

/* A tensor is sent as factors when it is a matrix ([shape[0], rest]) and the factors are smaller. */
static int psgd_compressed(const tally__tensor *T, int r, int *rows, int *cols) {
    if (T->ndim < 2) return 0;
    *rows = T->shape[0];
    *cols = (int)(T->count / (size_t)T->shape[0]);
    return (double)r * ((double)*rows + *cols) < (double)*rows * *cols;
}

int tally__codec_powersgd_alloc(tally__codec *c) {
    const tally__model *m = c->m;
    int r = c->cfg.rank;
    size_t most = 0;
    for (int t = 0; t < m->ntensors; t++) {
        c->q_off[t] = PSGD_NONE;
        if (!psgd_compressed(&m->tensor[t], r, &c->rows[t], &c->cols[t])) continue;
        c->q_off[t] = c->q_len;
        c->q_len += (size_t)c->cols[t] * r;
    }
    for (int b = 0; b < c->nbuckets; b++) { /* P factors plus the whole values of a bucket */
        size_t need = 0;
        for (int t = c->bucket[b].first_tensor; t < c->bucket[b].first_tensor + c->bucket[b].ntensors; t++)
            need += c->q_off[t] == PSGD_NONE ? m->tensor[t].count : (size_t)c->rows[t] * r;
        if (need > most) most = need;
    }
    c->q = malloc((c->q_len + 1) * sizeof(float));
    c->q_saved = malloc((c->q_len + 1) * sizeof(float));
    c->qnew = malloc((c->q_len + 1) * sizeof(float));
    c->pbuf = malloc((most + 1) * sizeof(float));
    if (!c->q || !c->q_saved || !c->qnew || !c->pbuf)
        return tally__seterr(TALLY_E_NOMEM, "rank %d: codec powersgd: out of memory", c->rank);
    /* The first Q, drawn from the run's seed: the same on every rank without a message. */
    tally__rng g;
    tally__rng_seed(&g, c->seed, 0x5053474451ull);
    for (size_t i = 0; i < c->q_len; i++) c->q[i] = tally__rng_normal(&g);
    return 0;
}

/* The tensors of bucket b in order; fn sees each with its place in pbuf. */
typedef struct psgd_walk {
    int t;
    float *m;  /* the tensor's gradient + residual, in c->acc */
    size_t at; /* its P (or whole values) in pbuf */
    int compressed;
} psgd_walk;

static int psgd_next(const tally__codec *c, const codec_bucket *b, psgd_walk *w, int first) {
    if (first) {
        w->t = b->first_tensor;
        w->at = 0;
    } else {
        w->at += w->compressed ? (size_t)c->rows[w->t] * c->cfg.rank : c->m->tensor[w->t].count;
        w->t++;
    }
    if (w->t >= b->first_tensor + b->ntensors) return 0;
    w->m = c->acc + (c->m->tensor[w->t].offset - b->begin);
    w->compressed = c->q_off[w->t] != PSGD_NONE;
    return 1;
}

/* P = M Q for every matrix, the whole values of the rest, all into pbuf; one allreduce. */
static int psgd_round_p(tally__codec *c, const codec_bucket *b, size_t *len) {
    int r = c->cfg.rank;
    psgd_walk w;
    for (int more = psgd_next(c, b, &w, 1); more; more = psgd_next(c, b, &w, 0)) {
        if (w.compressed)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, c->rows[w.t], r, c->cols[w.t], 1.0f, w.m,
                        c->cols[w.t], c->q + c->q_off[w.t], r, 0.0f, c->pbuf + w.at, r);
        else
            memcpy(c->pbuf + w.at, w.m, c->m->tensor[w.t].count * sizeof(float));
        *len = w.at + (w.compressed ? (size_t)c->rows[w.t] * r : c->m->tensor[w.t].count);
    }
    return tally_allreduce(c->comm, c->pbuf, c->pbuf, *len, TALLY_F32, TALLY_SUM);
}

/* P orthonormalised (the sum's scale does not matter to its span, so it is not divided by N), then
 * Q = M^T P for every matrix into qnew; one allreduce of them all. */
static int psgd_round_q(tally__codec *c, const codec_bucket *b, size_t *q0, size_t *q1) {
    int r = c->cfg.rank;
    psgd_walk w;
    *q0 = PSGD_NONE;
    for (int more = psgd_next(c, b, &w, 1); more; more = psgd_next(c, b, &w, 0)) {
        if (!w.compressed) continue;
        float *p = c->pbuf + w.at, *q = c->qnew + c->q_off[w.t];
        tally__powersgd_orthonormalize(p, c->rows[w.t], r);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c->cols[w.t], r, c->rows[w.t], 1.0f, w.m, c->cols[w.t], p,
                    r, 0.0f, q, r);
        if (*q0 == PSGD_NONE) *q0 = c->q_off[w.t];
        *q1 = c->q_off[w.t] + (size_t)c->cols[w.t] * r;
    }
    if (*q0 == PSGD_NONE) return 0; /* the same tensors on every rank: all skip alike */
    return tally_allreduce(c->comm, c->qnew + *q0, c->qnew + *q0, *q1 - *q0, TALLY_F32, TALLY_SUM);
}

/* A Q column that came back zero (its P column was) keeps the previous one for the next warm start:
 * a zero Q would make every later P zero. */
static void psgd_keep_q(tally__codec *c, int t) {
    int r = c->cfg.rank, cols = c->cols[t];
    float *q = c->q + c->q_off[t], *qn = c->qnew + c->q_off[t];
    for (int j = 0; j < r; j++) {
        int zero = 1;
        for (int i = 0; i < cols && zero; i++) zero = qn[(size_t)i * r + j] == 0.0f;
        for (int i = 0; i < cols && !zero; i++) q[(size_t)i * r + j] = qn[(size_t)i * r + j];
    }
}

int tally__codec_powersgd_reduce(tally__codec *c, const codec_bucket *b, float *grad, float denom) {
    size_t n = b->end - b->begin, len = 0, q0, q1;
    if (!n) return 0;
    float *res = c->residual ? c->residual + b->begin : NULL, *next = c->residual ? c->next + b->begin : NULL;
    for (size_t i = 0; i < n; i++) c->acc[i] = res ? grad[i] + res[i] : grad[i];
    int rc = psgd_round_p(c, b, &len);
    if (!rc) rc = psgd_round_q(c, b, &q0, &q1);
    if (rc) return rc;
    /* M_hat = P Q^T / N is the mean of the ranks' M in local units; the residual is what this rank's M
     * keeps beyond it; the division by accum makes the step's mean gradient. */
    float n_ranks = (float)c->size, accum = denom / n_ranks;
    int r = c->cfg.rank;
    psgd_walk w;
    for (int more = psgd_next(c, b, &w, 1); more; more = psgd_next(c, b, &w, 0)) {
        const tally__tensor *T = &c->m->tensor[w.t];
        float *g = grad + (T->offset - b->begin), *rs = next ? next + (T->offset - b->begin) : NULL;
        if (!w.compressed) {
            for (size_t i = 0; i < T->count; i++) g[i] = c->pbuf[w.at + i] / denom;
            if (rs) memset(rs, 0, T->count * sizeof(float));
            continue;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, c->rows[w.t], c->cols[w.t], r, 1.0f / n_ranks,
                    c->pbuf + w.at, r, c->qnew + c->q_off[w.t], r, 0.0f, g, c->cols[w.t]);
        for (size_t i = 0; rs && i < T->count; i++) rs[i] = w.m[i] - g[i];
        if (accum != 1.0f)
            for (size_t i = 0; i < T->count; i++) g[i] /= accum;
        psgd_keep_q(c, w.t);
    }
    return 0;
}
