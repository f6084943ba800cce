/* zero.c - ZeRO stages 1-3: per-layer reduce-scatter of gradients into the rank's piece, the optimizer
 * on that piece alone, all-gather of parameters (stages 1-2 after the step, stage 3 before each use). */
#include "zero.h"

#include <stdlib.h>
#include <string.h>

#include "../core/clock.h"
#include "../core/err.h"
#include "memory.h"
#include "rng.h"

static float *zero_alloc(size_t n) { return tally__mem_zalloc(n * sizeof(float)); }

/* Timed collectives, so the trainer can report the time spent communicating. */
static int zero_rs(tally__zero *z, float *buf, size_t piece, tally_op op) {
    if (!piece) return 0; /* every rank has the same geometry: all skip alike */
    uint64_t t0 = tally__now_ns();
    int rc = tally_reduce_scatter(z->comm, buf, buf + (size_t)z->rank * piece, piece, TALLY_F32, op);
    z->comm_s += (double)(tally__now_ns() - t0) * 1e-9;
    return rc;
}

static int zero_ar(tally__zero *z, float *buf, size_t n, tally_op op) {
    if (!n) return 0;
    uint64_t t0 = tally__now_ns();
    int rc = tally_allreduce(z->comm, buf, buf, n, TALLY_F32, op);
    z->comm_s += (double)(tally__now_ns() - t0) * 1e-9;
    return rc;
}

static int zero_ag(tally__zero *z, float *buf, size_t piece) {
    if (!piece) return 0;
    uint64_t t0 = tally__now_ns();
    int rc = tally_allgather(z->comm, buf + (size_t)z->rank * piece, buf, piece, TALLY_F32);
    z->comm_s += (double)(tally__now_ns() - t0) * 1e-9;
    return rc;
}

/* One micro-batch: a plain sum; the division by N*K comes once, at the step. One reduction per step
 * averages in the collective itself, as the data-parallel engine does. */
static tally_op zero_op(const tally__zero *z) { return z->accum == 1 ? TALLY_AVG : TALLY_SUM; }

static int zero_layout(tally__zero *z, const tally_optim_cfg *ocfg) {
    tally__model *m = z->m;
    z->layer = calloc((size_t)m->nlayers, sizeof *z->layer);
    if (!z->layer) return tally__seterr(TALLY_E_NOMEM, "zero: out of memory");
    z->nlayers = m->nlayers;
    for (int l = 0; l < m->nlayers; l++) {
        tally__zero_layer *L = &z->layer[l];
        L->off = m->offsets[l];
        L->n = m->offsets[l + 1] - m->offsets[l];
        L->piece = L->n / (size_t)z->size;
        L->tail = L->n - L->piece * (size_t)z->size;
        L->shard_off = z->shard_len;
        z->shard_len += L->piece + L->tail;
        if (L->n > z->largest) z->largest = L->n;
        int rc = tally_optim_init(&L->opt_piece, ocfg, L->piece);
        if (!rc) rc = tally_optim_init(&L->opt_tail, ocfg, L->tail);
        if (rc) return rc;
    }
    return 0;
}

/* Stage 3 never holds the whole model: each layer is drawn into the gather buffer, as the model would
 * draw it, and this rank keeps its piece and tail. */
static void zero_draw_params(tally__zero *z, uint64_t seed) {
    tally__rng r;
    tally__model_init_rng(&r, seed);
    for (int l = 0; l < z->nlayers; l++) {
        const tally__zero_layer *L = &z->layer[l];
        tally__model_init_layer(z->m, l, z->gathered, &r);
        memcpy(z->pshard + L->shard_off, z->gathered + (size_t)z->rank * L->piece, L->piece * sizeof(float));
        memcpy(z->pshard + L->shard_off + L->piece, z->gathered + (size_t)z->size * L->piece, L->tail * sizeof(float));
    }
    z->gathered_layer = -1;
}

int tally__zero_init(tally__zero *z, tally_comm *comm, tally__model *m, int stage, int accum,
                     const tally_optim_cfg *ocfg, uint64_t seed) {
    memset(z, 0, sizeof *z);
    z->stage = stage;
    z->comm = comm;
    z->m = m;
    z->rank = tally_comm_rank(comm);
    z->size = tally_comm_size(comm);
    z->accum = accum;
    z->gathered_layer = -1;
    int rc = zero_layout(z, ocfg);
    if (rc) goto fail;
    if (stage >= 2 && (!(z->gshard = zero_alloc(z->shard_len)) || !(z->staging = zero_alloc(z->largest)))) goto nomem;
    if (stage == 3) {
        if (!(z->pshard = zero_alloc(z->shard_len)) || !(z->gathered = zero_alloc(z->largest))) goto nomem;
        zero_draw_params(z, seed);
    }
    return 0;
nomem:
    rc = tally__seterr(TALLY_E_NOMEM, "rank %d: zero stage %d: out of memory for a shard of %zu parameters",
                       z->rank, stage, z->shard_len);
fail:
    tally__zero_free(z);
    return rc;
}

void tally__zero_free(tally__zero *z) {
    for (int l = 0; l < z->nlayers; l++) {
        tally_optim_free(&z->layer[l].opt_piece);
        tally_optim_free(&z->layer[l].opt_tail);
    }
    free(z->layer);
    free(z->gshard);
    free(z->pshard);
    free(z->staging);
    free(z->gathered);
    memset(z, 0, sizeof *z);
}

/* Stage 3: layer l's parameters, whole, in the gather buffer; the layer's op points at them. */
static int zero_gather(tally__zero *z, int l) {
    const tally__zero_layer *L = &z->layer[l];
    tally__op *op = &z->m->op[tally__model_layer_op(z->m, l)];
    op->w = z->gathered;
    op->b = z->gathered + (op->b_off - op->w_off);
    if (z->gathered_layer == l) return 0; /* the last layer's forward left it there for its backward */
    memcpy(z->gathered + (size_t)z->rank * L->piece, z->pshard + L->shard_off, L->piece * sizeof(float));
    memcpy(z->gathered + (size_t)z->size * L->piece, z->pshard + L->shard_off + L->piece, L->tail * sizeof(float));
    int rc = zero_ag(z, z->gathered, L->piece);
    z->gathered_layer = rc ? -1 : l;
    return rc;
}

static int zero_before_forward(void *arg, int l) {
    tally__zero *z = arg;
    return z->stage == 3 ? zero_gather(z, l) : 0;
}

/* Backward adds into the staging buffer, which therefore starts at zero for every layer. */
static int zero_before_backward(void *arg, int l) {
    tally__zero *z = arg;
    int rc = z->stage == 3 ? zero_gather(z, l) : 0;
    if (rc || z->stage < 2) return rc;
    const tally__zero_layer *L = &z->layer[l];
    tally__op *op = &z->m->op[tally__model_layer_op(z->m, l)];
    memset(z->staging, 0, L->n * sizeof(float));
    op->dw = z->staging;
    op->db = z->staging + (op->b_off - op->w_off);
    return 0;
}

static void add_into(float *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

/* Stage >= 2: the layer's gradients are summed over the ranks into their owners' pieces at once, and
 * only this rank's piece and the tail are kept. */
static int zero_after_backward(void *arg, int l) {
    tally__zero *z = arg;
    if (z->stage < 2) return 0;
    const tally__zero_layer *L = &z->layer[l];
    float *tail = z->staging + (size_t)z->size * L->piece;
    int rc = zero_rs(z, z->staging, L->piece, zero_op(z));
    if (!rc) rc = zero_ar(z, tail, L->tail, zero_op(z));
    if (rc) return rc;
    add_into(z->gshard + L->shard_off, z->staging + (size_t)z->rank * L->piece, L->piece);
    add_into(z->gshard + L->shard_off + L->piece, tail, L->tail);
    return 0;
}

tally__model_hooks tally__zero_hooks(tally__zero *z) {
    return (tally__model_hooks){.arg = z,
                                .before_forward = zero_before_forward,
                                .before_backward = zero_before_backward,
                                .after_backward = zero_after_backward};
}

/* Where this rank's piece and tail of layer l live, for the optimizer. */
typedef struct zero_view {
    float *p_piece, *p_tail, *g_piece, *g_tail;
} zero_view;

static zero_view zero_view_of(const tally__zero *z, int l) {
    const tally__zero_layer *L = &z->layer[l];
    zero_view v;
    size_t mine = L->off + (size_t)z->rank * L->piece, tail = L->off + (size_t)z->size * L->piece;
    if (z->stage == 3) {
        v.p_piece = z->pshard + L->shard_off;
        v.p_tail = v.p_piece + L->piece;
    } else {
        v.p_piece = z->m->params + mine;
        v.p_tail = z->m->params + tail;
    }
    if (z->stage >= 2) {
        v.g_piece = z->gshard + L->shard_off;
        v.g_tail = v.g_piece + L->piece;
    } else {
        v.g_piece = z->m->grads + mine;
        v.g_tail = z->m->grads + tail;
    }
    return v;
}

static void scale(float *x, size_t n, float denom) {
    for (size_t i = 0; i < n; i++) x[i] /= denom;
}

int tally__zero_step(tally__zero *z, float lr) {
    int rc = 0;
    if (z->stage == 1) /* the whole gradient was kept: reduce it now, layer by layer from the last */
        for (int l = z->nlayers - 1; l >= 0 && !rc; l--) {
            const tally__zero_layer *L = &z->layer[l];
            rc = zero_rs(z, z->m->grads + L->off, L->piece, zero_op(z));
            if (!rc) rc = zero_ar(z, z->m->grads + L->off + (size_t)z->size * L->piece, L->tail, zero_op(z));
        }
    const float denom = (float)z->size * (float)z->accum;
    for (int l = z->nlayers - 1; l >= 0 && !rc; l--) {
        tally__zero_layer *L = &z->layer[l];
        zero_view v = zero_view_of(z, l);
        if (z->accum > 1) {
            scale(v.g_piece, L->piece, denom);
            scale(v.g_tail, L->tail, denom);
        }
        tally_optim_step(&L->opt_piece, v.p_piece, v.g_piece, lr);
        tally_optim_step(&L->opt_tail, v.p_tail, v.g_tail, lr);
        if (z->stage < 3) rc = zero_ag(z, z->m->params + L->off, L->piece);
    }
    if (z->stage >= 2)
        memset(z->gshard, 0, z->shard_len * sizeof(float));
    else
        memset(z->m->grads, 0, z->m->nparams * sizeof(float));
    z->gathered_layer = -1; /* the parameters just changed */
    return rc;
}

int tally__zero_each_layer(tally__zero *z, void (*fn)(void *arg, int layer, const float *p, size_t n), void *arg) {
    for (int l = 0; l < z->nlayers; l++) {
        const float *p = z->m->params ? z->m->params + z->layer[l].off : NULL;
        if (z->stage == 3) {
            int rc = zero_gather(z, l);
            if (rc) return rc;
            p = z->gathered;
        }
        fn(arg, l, p, z->layer[l].n);
    }
    return 0;
}

tally__zero_bytes tally__zero_memory(const tally__zero *z) {
    tally__zero_bytes b = {0};
    size_t f = sizeof(float);
    b.params = z->stage == 3 ? z->shard_len * f : z->m->params_bytes;
    b.grads = z->stage >= 2 ? z->shard_len * f : z->m->grads_bytes;
    for (int l = 0; l < z->nlayers; l++)
        b.optim += tally_optim_state_bytes(&z->layer[l].opt_piece) + tally_optim_state_bytes(&z->layer[l].opt_tail);
    b.buffers = (z->staging ? z->largest * f : 0) + (z->gathered ? z->largest * f : 0);
    return b;
}
