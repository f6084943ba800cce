/* zero.c - ZeRO stages 1-3: per-layer reduce-scatter of gradients into the rank's piece, the optimizer
 * on that piece alone, all-gather of parameters (stages 1-2 after the step, stage 3 before each use). */
#include "zero.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/clock.h"
#include "../core/err.h"
#include "../core/alloc.h"
#include "codec.h"
#include "guard.h"
#include "norm.h"
#include "../optim/optim_int.h"
#include "../core/rng.h"

static float *zero_alloc(size_t n) { return tally__alloc_zeroed(n * sizeof(float)); }

/* A layer's gradients in 16 bits when asked: scaled (fp16), cast, reduced, this rank's part cast back.
 * A finite input that comes back non-finite overflowed fp16's range: flagged for the trainer's NaN/Inf
 * policy. */
static int zero_half_op(tally__zero *z, float *buf, size_t n, size_t mine, size_t len, tally_op op, int scatter) {
    tally_dtype dt = (tally_dtype)z->half;
    int finite_in = tally__all_finite(buf, n);
    float scale;
    int rc = tally__codec_half_scale(z->comm, buf, n, dt, &scale);
    if (rc) return rc;
    tally__codec_to_half(buf, z->hbuf, n, dt);
    rc = scatter ? tally_reduce_scatter(z->comm, z->hbuf, z->hbuf + mine, len, dt, op)
                 : tally_allreduce(z->comm, z->hbuf, z->hbuf, n, dt, op);
    if (rc) return rc;
    tally__codec_from_half(z->hbuf + mine, buf + mine, len, dt);
    if (scale != 1.0f)
        for (size_t i = mine; i < mine + len; i++) buf[i] /= scale;
    if (finite_in && !tally__all_finite(buf + mine, len)) z->overflow = 1;
    return 0;
}

/* A layer's reductions (run by one thread at a time: the communication thread with overlap, else the
 * training thread; post.c counts their time and bytes). */
static int zero_rs(tally__zero *z, float *buf, size_t piece, tally_op op) {
    if (!piece) return 0; /* every rank has the same geometry: all skip alike */
    size_t mine = (size_t)z->rank * piece;
    return z->half >= 0 ? zero_half_op(z, buf, piece * (size_t)z->size, mine, piece, op, 1)
                        : tally_reduce_scatter(z->comm, buf, buf + mine, piece, TALLY_F32, op);
}

static int zero_ar(tally__zero *z, float *buf, size_t n, tally_op op) {
    if (!n) return 0;
    return z->half >= 0 ? zero_half_op(z, buf, n, 0, n, op, 0) : tally_allreduce(z->comm, buf, buf, n, TALLY_F32, op);
}

static int zero_ag(tally__zero *z, float *buf, size_t piece) {
    if (!piece) return 0;
    return tally_allgather(z->comm, buf + (size_t)z->rank * piece, buf, piece, TALLY_F32);
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
        L->decay_n = L->n;
        z->shard_len += L->piece + L->tail;
        if (L->n > z->largest) z->largest = L->n;
        int rc = tally_optim_init(&L->opt_piece, ocfg, L->piece);
        if (!rc) rc = tally_optim_init(&L->opt_tail, ocfg, L->tail);
        if (rc) return rc;
    }
    return 0;
}

/* Which of the two buffers layer l uses: by parity with overlap, the only one without. */
static int buf_of(const tally__zero *z, int l) { return z->overlap ? l & 1 : 0; }

/* Stage 3 never holds the whole model: each layer is drawn into a gather buffer, as the model would
 * draw it, and this rank keeps its piece and tail. */
static void zero_draw_params(tally__zero *z, uint64_t seed) {
    tally__rng r;
    tally__model_init_rng(&r, seed);
    for (int l = 0; l < z->nlayers; l++) {
        const tally__zero_layer *L = &z->layer[l];
        tally__model_init_layer(z->m, l, z->gathered[0], &r);
        memcpy(z->pshard + L->shard_off, z->gathered[0] + (size_t)z->rank * L->piece, L->piece * sizeof(float));
        memcpy(z->pshard + L->shard_off + L->piece, z->gathered[0] + (size_t)z->size * L->piece,
               L->tail * sizeof(float));
    }
}

static int zero_alloc_buffers(tally__zero *z) {
    int copies = z->overlap ? 2 : 1;
    if (z->stage >= 2 && !(z->gshard = zero_alloc(z->shard_len))) return -1;
    for (int i = 0; i < copies && z->stage == 2; i++) /* stage 3's gradients go where its parameters were */
        if (!(z->staging[i] = zero_alloc(z->largest))) return -1;
    if (z->stage == 3 && !(z->pshard = zero_alloc(z->shard_len))) return -1;
    for (int i = 0; i < copies && z->stage == 3; i++)
        if (!(z->gathered[i] = zero_alloc(z->largest))) return -1;
    return 0;
}

int tally__zero_init(tally__zero *z, tally_comm *comm, tally__model *m, int stage, int accum,
                     const tally_optim_cfg *ocfg, uint64_t seed, int overlap) {
    memset(z, 0, sizeof *z);
    z->stage = stage;
    z->comm = comm;
    z->m = m;
    z->rank = tally_comm_rank(comm);
    z->size = tally_comm_size(comm);
    z->accum = accum;
    z->overlap = overlap && z->size > 1;
    z->half = -1;
    z->held[0] = z->held[1] = -1;
    z->gather_ticket[0] = z->gather_ticket[1] = z->staging_ticket[0] = z->staging_ticket[1] = -1;
    z->last_micro = accum == 1;
    tally__post_init(&z->q, comm, z, z->overlap);
    int rc = zero_layout(z, ocfg);
    if (!rc && zero_alloc_buffers(z))
        rc = tally__seterr(TALLY_E_NOMEM, "rank %d: zero stage %d: out of memory for a shard of %zu parameters",
                           z->rank, stage, z->shard_len);
    if (!rc && stage == 3) zero_draw_params(z, seed);
    if (rc) tally__zero_free(z);
    return rc;
}

int tally__zero_set_half(tally__zero *z, tally_dtype dt) {
    if (!(z->hbuf = malloc((z->largest + 1) * sizeof(uint16_t))))
        return tally__seterr(TALLY_E_NOMEM, "rank %d: zero: out of memory for the 16-bit gradients", z->rank);
    z->half = dt;
    return 0;
}

int tally__zero_measure_f32(tally__zero *z, unsigned long long *bytes) {
    float *zeros = zero_alloc(z->largest + 1);
    if (!zeros) return tally__seterr(TALLY_E_NOMEM, "rank %d: zero: out of memory", z->rank);
    int half = z->half, rc = 0;
    unsigned long long before = tally_comm_bytes_sent(z->comm);
    z->half = -1;
    for (int l = 0; l < z->nlayers && !rc; l++) {
        rc = zero_rs(z, zeros, z->layer[l].piece, TALLY_SUM);
        if (!rc) rc = zero_ar(z, zeros, z->layer[l].tail, TALLY_SUM);
    }
    z->half = half;
    /* Stages 2-3 reduce every micro-batch's gradients (stage 1 only the step's sum). */
    *bytes = (tally_comm_bytes_sent(z->comm) - before) * (unsigned long long)(z->stage >= 2 ? z->accum : 1);
    free(zeros);
    return rc;
}

int tally__zero_drain(tally__zero *z) { return tally__post_drain(&z->q); }

void tally__zero_free(tally__zero *z) {
    tally__post_free(&z->q);
    for (int l = 0; l < z->nlayers; l++) {
        tally_optim_free(&z->layer[l].opt_piece);
        tally_optim_free(&z->layer[l].opt_tail);
    }
    free(z->layer);
    free(z->hbuf);
    free(z->gshard);
    free(z->pshard);
    for (int i = 0; i < 2; i++) {
        free(z->staging[i]);
        free(z->gathered[i]);
    }
    memset(z, 0, sizeof *z);
}

void tally__zero_micro(tally__zero *z, int k) { z->last_micro = k == z->accum - 1; }

double tally__zero_blocked(const tally__zero *z) { return z->overlap ? z->q.wait_s : z->q.comm_s; }

/* ---- operations, run in order by the communication thread (or inline) ---- */

/* Layer l's whole parameters into gathered[b]. pshard changes only between steps, after a drain. */
static int op_gather(void *ctx, int l, int b) {
    tally__zero *z = ctx;
    const tally__zero_layer *L = &z->layer[l];
    float *g = z->gathered[b];
    memcpy(g + (size_t)z->rank * L->piece, z->pshard + L->shard_off, L->piece * sizeof(float));
    memcpy(g + (size_t)z->size * L->piece, z->pshard + L->shard_off + L->piece, L->tail * sizeof(float));
    return zero_ag(z, g, L->piece);
}

static void add_into(float *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

/* Where layer l's gradients are made: stage 1 the full gradient buffer, stage 2 staging[b], stage 3
 * the gathered buffer its parameters came in (backward takes the input's gradient first). */
static float *grads_of(tally__zero *z, int l, int b) {
    return z->stage == 3 ? z->gathered[b] : z->stage == 2 ? z->staging[b] : z->m->grads + z->layer[l].off;
}

/* Layer l's gradients summed over the ranks into their owners' pieces: stage 1 in the full gradient
 * buffer, in place; stage >= 2 keeping only this rank's piece and the tail. */
static int op_reduce(void *ctx, int l, int b) {
    tally__zero *z = ctx;
    const tally__zero_layer *L = &z->layer[l];
    float *src = grads_of(z, l, b), *tail = src + (size_t)z->size * L->piece;
    int rc = zero_rs(z, src, L->piece, zero_op(z));
    if (!rc) rc = zero_ar(z, tail, L->tail, zero_op(z));
    if (rc || z->stage < 2) return rc;
    add_into(z->gshard + L->shard_off, src + (size_t)z->rank * L->piece, L->piece);
    add_into(z->gshard + L->shard_off + L->piece, tail, L->tail);
    return 0;
}

/* Stages 1-2, after the update: every rank's new piece of layer l to everyone. */
static long post_share_params(tally__zero *z, int l) {
    const tally__zero_layer *L = &z->layer[l];
    float *p = z->m->params + L->off;
    tally__call a = {TALLY__ALLGATHER, p + (size_t)z->rank * L->piece, p, L->piece, TALLY_F32, TALLY_SUM, -1};
    return L->piece ? tally__post_call(&z->q, &a, TALLY__POST_PARAM) : 0;
}

/* ---- hooks, on the training thread ---- */

/* Queues the gather of layer l into its buffer unless the buffer already holds (or receives) it. */
static long zero_want(tally__zero *z, int l) {
    int b = buf_of(z, l);
    if (z->held[b] == l) return z->gather_ticket[b];
    z->held[b] = l;
    long t = tally__post_fn(&z->q, op_gather, l, b, TALLY__POST_PARAM);
    if (t < 0) z->held[b] = -1;
    return z->gather_ticket[b] = t;
}

/* Stage 3: layer l's parameters in place for its op; with overlap the next layer's are sent for. */
static int zero_use_params(tally__zero *z, int l, int next) {
    long t = zero_want(z, l);
    int rc = t < 0 ? (int)t : tally__post_wait(&z->q, t);
    if (rc) return rc;
    tally__op *op = &z->m->op[tally__model_layer_op(z->m, l)];
    op->w = z->gathered[buf_of(z, l)];
    op->b = op->w + (op->b_off - op->w_off);
    if (z->overlap && next >= 0 && next < z->nlayers && (t = zero_want(z, next)) < 0) return (int)t;
    return 0;
}

static int zero_before_forward(void *arg, int l) {
    tally__zero *z = arg;
    return z->stage == 3 ? zero_use_params(z, l, l + 1) : 0;
}

/* Stage 2: backward adds into a staging buffer, which starts at zero for every layer, once the
 * reduction that last read it is done. Stage 3: into the layer's gathered parameters, which the model
 * clears once it has the input's gradient (the buffer's next gather is queued after this reduction). */
static int zero_before_backward(void *arg, int l) {
    tally__zero *z = arg;
    int rc = z->stage == 3 ? zero_use_params(z, l, l - 1) : 0;
    if (rc || z->stage < 2) return rc;
    int b = buf_of(z, l);
    tally__op *op = &z->m->op[tally__model_layer_op(z->m, l)];
    if (z->stage == 3) {
        z->held[b] = -1; /* gradients, once backward is done */
        op->dw = op->w;
        op->db = op->b;
        return 0;
    }
    if ((rc = tally__post_wait(&z->q, z->staging_ticket[b]))) return rc;
    memset(z->staging[b], 0, z->layer[l].n * sizeof(float));
    op->dw = z->staging[b];
    op->db = z->staging[b] + (op->b_off - op->w_off);
    return 0;
}

/* The layer's gradients are complete: stage >= 2 reduces them now; stage 1 once the step's last
 * micro-batch has made them (the layer's part of the full buffer is no longer written). */
static int zero_after_backward(void *arg, int l) {
    tally__zero *z = arg;
    if (z->stage == 1 && !z->last_micro) return 0;
    int b = buf_of(z, l);
    long t = tally__post_fn(&z->q, op_reduce, l, b, TALLY__POST_GRAD);
    if (t < 0) return (int)t;
    if (z->stage == 2) z->staging_ticket[b] = t;
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

/* Every reduction done, each layer's piece is updated and (stages 1-2) sent out while the next layer
 * is updated. */
/* What every step ends with, whether it updated or not. */
static void zero_clear_step(tally__zero *z) {
    if (z->stage >= 2)
        memset(z->gshard, 0, z->shard_len * sizeof(float));
    else
        memset(z->m->grads, 0, z->m->nparams * sizeof(float));
    z->held[0] = z->held[1] = -1; /* the parameters may have changed */
    z->last_micro = z->accum == 1;
    z->averaged = 0;
}

void tally__zero_decay_matrices(tally__zero *z) {
    for (int l = 0; l < z->nlayers; l++) {
        const tally__op *op = &z->m->op[tally__model_layer_op(z->m, l)];
        int t = 0; /* the layer's weight tensor: the first whose offset is the layer's */
        while (t < z->m->ntensors && z->m->tensor[t].offset != op->w_off) t++;
        z->layer[l].decay_n = t < z->m->ntensors && z->m->tensor[t].ndim >= 2 ? op->b_off - op->w_off : 0;
    }
}

/* With accumulation the reductions summed micro-batches: divide once, before clipping or updating. */
static void zero_average(tally__zero *z) {
    const float denom = (float)z->size * (float)z->accum;
    for (int l = 0; l < z->nlayers && z->accum > 1 && !z->averaged; l++) {
        zero_view v = zero_view_of(z, l);
        scale(v.g_piece, z->layer[l].piece, denom);
        scale(v.g_tail, z->layer[l].tail, denom);
    }
    z->averaged = 1;
}

int tally__zero_clip(tally__zero *z, float max_norm, double *norm) {
    int rc = tally__post_drain(&z->q);
    if (rc) return rc;
    zero_average(z);
    double part = 0;
    for (int l = 0; l < z->nlayers; l++) {
        zero_view v = zero_view_of(z, l);
        part += tally__grad_sumsq(v.g_piece, z->layer[l].piece);
        if (z->rank == 0) part += tally__grad_sumsq(v.g_tail, z->layer[l].tail);
    }
    if ((rc = tally_allreduce(z->comm, &part, &part, 1, TALLY_F64, TALLY_SUM))) return rc;
    *norm = sqrt(part);
    for (int l = 0; l < z->nlayers; l++) {
        zero_view v = zero_view_of(z, l);
        tally__grad_clip_to(v.g_piece, z->layer[l].piece, part, max_norm);
        tally__grad_clip_to(v.g_tail, z->layer[l].tail, part, max_norm);
    }
    return 0;
}

/* A piece or tail starting at flat element `first` of layer L: the part before L's decay boundary
 * decays, the rest not (bit for bit tally_optim_step when all of it decays). */
static void zero_update(tally_optim *o, float *p, const float *g, size_t n, size_t first, const tally__zero_layer *L,
                        float lr) {
    size_t bound = L->off + L->decay_n, k = bound <= first ? 0 : bound - first < n ? bound - first : n;
    if (k == n) {
        tally_optim_step(o, p, g, lr);
        return;
    }
    tally__optim_step_range(o, p, g, 0, k, lr, 1);
    tally__optim_step_range(o, p, g, k, n, lr, 0);
    tally__optim_count_step(o);
}

int tally__zero_step(tally__zero *z, float lr) {
    int rc = tally__post_drain(&z->q);
    if (!rc) zero_average(z);
    for (int l = z->nlayers - 1; l >= 0 && !rc; l--) {
        tally__zero_layer *L = &z->layer[l];
        zero_view v = zero_view_of(z, l);
        zero_update(&L->opt_piece, v.p_piece, v.g_piece, L->piece, L->off + (size_t)z->rank * L->piece, L, lr);
        zero_update(&L->opt_tail, v.p_tail, v.g_tail, L->tail, L->off + (size_t)z->size * L->piece, L, lr);
        long t = z->stage < 3 ? post_share_params(z, l) : 0;
        if (t < 0) rc = (int)t;
    }
    if (!rc) rc = tally__post_drain(&z->q);
    zero_clear_step(z);
    return rc;
}

void tally__zero_params_changed(tally__zero *z) { z->held[0] = z->held[1] = -1; }

int tally__zero_skip(tally__zero *z) {
    int rc = tally__post_drain(&z->q);
    zero_clear_step(z);
    return rc;
}

int tally__zero_each_layer(tally__zero *z, void (*fn)(void *arg, int layer, const float *p, size_t n), void *arg) {
    for (int l = 0; l < z->nlayers; l++) {
        const float *p = z->m->params ? z->m->params + z->layer[l].off : NULL;
        if (z->stage == 3) {
            int rc = zero_use_params(z, l, -1);
            if (rc) return rc;
            p = z->gathered[buf_of(z, l)];
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
    for (int i = 0; i < 2; i++) b.buffers += ((z->staging[i] ? 1 : 0) + (z->gathered[i] ? 1 : 0)) * z->largest * f;
    if (z->m->tied_copy) b.buffers += tally__model_tied_floats(z->m) * f;
    return b;
}
