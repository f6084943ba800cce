/* sync_comm.c - the gradient-sync engine's collectives, posted in order to the communicator's engine: a
 * bucket's reduction (stage 0's allreduce or codec; a layer's reduce-scatter at stages 1-3), stage 3's
 * gathers, stages 1-2's parameter all-gathers, and the hooks that post them as the passes run. */
#include <stdlib.h>
#include <string.h>

#include "../core/alloc.h"
#include "../core/err.h"
#include "sync_int.h"

/* ---- operations, run in order by the communication thread (or inline) ---- */

/* One micro-batch: a plain sum; the division by N*K comes once, at the step. One reduction per step
 * averages in the collective itself, as stage 0's buckets do. */
static tally_op layer_op(const tally__sync *s) { return s->accum == 1 ? TALLY_AVG : TALLY_SUM; }

/* A layer's pieces reduce-scattered (their owners get the sums), in 16 bits when asked; every rank
 * has the same geometry, so an empty one is skipped alike. */
static int layer_rs(tally__sync *s, float *buf, size_t piece, tally_op op) {
    if (!piece) return 0;
    size_t mine = (size_t)s->rank * piece;
    if (s->half < 0) return tally_reduce_scatter(s->comm, buf, buf + mine, piece, TALLY_F32, op);
    int over = 0, rc = tally__codec_half_reduce(s->comm, buf, piece * (size_t)s->size, mine, piece,
                                                (tally_dtype)s->half, op, 1, 1.0f, s->hbuf, &over);
    s->overflow |= over;
    return rc;
}

/* A layer's tail, which every rank keeps: allreduced. */
static int layer_ar(tally__sync *s, float *buf, size_t n, tally_op op) {
    if (!n) return 0;
    if (s->half < 0) return tally_allreduce(s->comm, buf, buf, n, TALLY_F32, op);
    int over = 0,
        rc = tally__codec_half_reduce(s->comm, buf, n, 0, n, (tally_dtype)s->half, op, 0, 1.0f, s->hbuf, &over);
    s->overflow |= over;
    return rc;
}

/* Layer l's whole parameters into gathered[b]. pshard changes only between steps, after a drain. */
static int op_gather(void *ctx, int l, int b) {
    tally__sync *s = ctx;
    const tally__sync_layer *L = &s->layer[l];
    float *g = s->gathered[b];
    memcpy(g + (size_t)s->rank * L->piece, s->pshard + L->shard_off, L->piece * sizeof(float));
    memcpy(g + (size_t)s->size * L->piece, s->pshard + L->shard_off + L->piece, L->tail * sizeof(float));
    return L->piece ? tally_allgather(s->comm, g + (size_t)s->rank * L->piece, g, L->piece, TALLY_F32) : 0;
}

static void add_into(float *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

/* Where layer l's gradients are made: stage 1 the full gradient buffer, stage 2 staging[b], stage 3
 * the gathered buffer its parameters came in (backward takes the input's gradient first). */
static float *grads_of(tally__sync *s, int l, int b) {
    return s->stage == 3 ? s->gathered[b] : s->stage == 2 ? s->staging[b] : s->m->grads + s->layer[l].off;
}

/* Layer l's gradients summed over the ranks into their owners' pieces: stage 1 in the full gradient
 * buffer, in place; stage >= 2 keeping only this rank's piece and the tail. */
static int op_reduce_layer(void *ctx, int l, int b) {
    tally__sync *s = ctx;
    const tally__sync_layer *L = &s->layer[l];
    float *src = grads_of(s, l, b), *tail = src + (size_t)s->size * L->piece;
    int rc = layer_rs(s, src, L->piece, layer_op(s));
    if (!rc) rc = layer_ar(s, tail, L->tail, layer_op(s));
    if (rc || s->stage < 2) return rc;
    add_into(s->gshard + L->shard_off, src + (size_t)s->rank * L->piece, L->piece);
    add_into(s->gshard + L->shard_off + L->piece, tail, L->tail);
    return 0;
}

long tally__sync_share_params(tally__sync *s, int l) {
    const tally__sync_layer *L = &s->layer[l];
    float *p = s->m->params + L->off;
    tally__call a = {.coll = TALLY__ALLGATHER,
                     .send = p + (size_t)s->rank * L->piece,
                     .recv = p,
                     .count = L->piece,
                     .t = TALLY_F32,
                     .op = TALLY_SUM,
                     .root = -1};
    return L->piece ? tally__post_call(&s->q, &a, TALLY__POST_PARAM) : 0;
}

/* Bucket k's reduction: stage 0's over its run of layers; else its one layer's, from the buffer of its
 * parity (which stage 2's backward may refill once this is done). */
static long post_bucket(tally__sync *s, int k) {
    if (!s->stage) return tally__buckets_post(&s->q, &s->bucket, k);
    int l = s->buckets.b[k].last, b = tally__sync_buf_of(s, l);
    long t = tally__post_fn(&s->q, op_reduce_layer, s, l, b, TALLY__POST_GRAD);
    if (t >= 0 && s->stage == 2) s->staging_ticket[b] = t;
    return t;
}

int tally__sync_post_ready(tally__sync *s) {
    for (int k; (k = tally__buckets_next(&s->buckets)) >= 0;) {
        long t = post_bucket(s, k);
        if (t < 0) return (int)t;
    }
    return 0;
}

/* ---- hooks, on the training thread ---- */

/* Queues the gather of layer l into its buffer unless the buffer already holds (or receives) it. */
static long zero_want(tally__sync *s, int l) {
    int b = tally__sync_buf_of(s, l);
    if (s->held[b] == l) return s->gather_ticket[b];
    s->held[b] = l;
    long t = tally__post_fn(&s->q, op_gather, s, l, b, TALLY__POST_PARAM);
    if (t < 0) s->held[b] = -1;
    return s->gather_ticket[b] = t;
}

int tally__sync_use_params(tally__sync *s, int l, int next) {
    long t = zero_want(s, l);
    int rc = t < 0 ? (int)t : tally__post_wait(&s->q, t);
    if (rc) return rc;
    tally__op *op = &s->m->op[tally__model_layer_op(s->m, l)];
    op->w = s->gathered[tally__sync_buf_of(s, l)];
    op->b = op->w + (op->b_off - op->w_off);
    if (s->overlap && next >= 0 && next < s->nlayers && (t = zero_want(s, next)) < 0) return (int)t;
    return 0;
}

static int sync_before_forward(void *arg, int l) {
    tally__sync *s = arg;
    return s->stage == 3 ? tally__sync_use_params(s, l, l + 1) : 0;
}

/* Stage 2: backward adds into a staging buffer, which starts at zero for every layer, once the
 * reduction that last read it is done. Stage 3: into the layer's gathered parameters, which the model
 * clears once it has the input's gradient (the buffer's next gather is queued after this reduction). */
static int sync_before_backward(void *arg, int l) {
    tally__sync *s = arg;
    int rc = s->stage == 3 ? tally__sync_use_params(s, l, l - 1) : 0;
    if (rc || s->stage < 2) return rc;
    int b = tally__sync_buf_of(s, l);
    tally__op *op = &s->m->op[tally__model_layer_op(s->m, l)];
    if (s->stage == 3) {
        s->held[b] = -1; /* gradients, once backward is done */
        op->dw = op->w;
        op->db = op->b;
        return 0;
    }
    if ((rc = tally__post_wait(&s->q, s->staging_ticket[b]))) return rc;
    memset(s->staging[b], 0, s->layer[l].n * sizeof(float));
    op->dw = s->staging[b];
    op->db = s->staging[b] + (op->b_off - op->w_off);
    return 0;
}

/* The layer's gradients are complete: its bucket may go. Gradients kept whole (stages 0-1) are reduced
 * once, on the step's last micro-batch, and without overlap wait for the end of backward; stages 2-3
 * reduce every micro-batch's as it comes (their gradients live in a reused layer-sized buffer). */
static int sync_after_backward(void *arg, int l) {
    tally__sync *s = arg;
    if (s->stage < 2 && (!s->last_micro || !s->overlap)) return 0;
    tally__buckets_ready(&s->buckets, l);
    return tally__sync_post_ready(s);
}

tally__model_hooks tally__sync_hooks(tally__sync *s) {
    return (tally__model_hooks){.arg = s,
                                .before_forward = sync_before_forward,
                                .before_backward = sync_before_backward,
                                .after_backward = sync_after_backward};
}

/* ---- opening ---- */

/* One step's gradient reductions run once in f32 on zeros, counted: the bytes it would send uncompressed
 * (stages 2-3 reduce every micro-batch's, stage 1 and 0 only the step's sum). Collective, nothing queued. */
static int sync_measure_f32(tally__sync *s) {
    size_t most = s->largest;
    for (int k = 0; k < s->buckets.n; k++)
        if (s->buckets.b[k].end - s->buckets.b[k].begin > most) most = s->buckets.b[k].end - s->buckets.b[k].begin;
    float *zeros = tally__alloc_zeroed((most + 1) * sizeof(float));
    if (!zeros) return tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory", s->rank);
    int half = s->half, rc = 0;
    s->half = -1;
    unsigned long long sent0 = tally_comm_bytes_sent(s->comm);
    for (int k = 0; k < s->buckets.n && !rc; k++) {
        const tally__bucket *b = &s->buckets.b[k];
        const tally__sync_layer *L = &s->layer[b->last];
        if (!s->stage) {
            rc = tally_allreduce(s->comm, zeros, zeros, b->end - b->begin, TALLY_F32, TALLY_SUM);
        } else if (!(rc = layer_rs(s, zeros, L->piece, TALLY_SUM))) {
            rc = layer_ar(s, zeros, L->tail, TALLY_SUM);
        }
    }
    s->half = half;
    s->f32_bytes_step = (tally_comm_bytes_sent(s->comm) - sent0) * (unsigned long long)(s->stage >= 2 ? s->accum : 1);
    free(zeros);
    return rc;
}

/* Stage 0's codec takes the buckets; the other stages reduce their layers in 16 bits. */
static int sync_open_codec(tally__sync *s, const tally__sync_cfg *cfg) {
    int rc;
    if (s->stage) {
        if (!(s->hbuf = malloc((s->largest + 1) * sizeof(uint16_t))))
            return tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory for the 16-bit gradients", s->rank);
        s->half = tally__codec_half_dtype(&cfg->codec);
        return 0;
    }
    if ((rc = tally__codec_create(&cfg->codec, s->comm, s->m, s->seed, &s->codec))) return rc;
    size_t *begin = malloc(2 * (size_t)s->buckets.n * sizeof *begin), *end = begin + s->buckets.n;
    if (!begin) return tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory", s->rank);
    for (int k = 0; k < s->buckets.n; k++) {
        begin[k] = s->buckets.b[k].begin;
        end[k] = s->buckets.b[k].end;
    }
    rc = tally__codec_set_buckets(s->codec, s->buckets.n, begin, end);
    free(begin);
    s->bucket.reduce = tally__codec_reduce;
    s->bucket.reduce_arg = s->codec;
    return rc;
}

int tally__sync_open_comm(tally__sync *s, const tally__sync_cfg *cfg) {
    double mb = cfg->bucket_mb > 0 ? cfg->bucket_mb : TALLY__SYNC_BUCKET_MB_DEFAULT;
    size_t bytes = (size_t)(mb * 1048576.0);
    if (!bytes) bytes = (size_t)(TALLY__SYNC_BUCKET_MB_DEFAULT * 1048576.0); /* as tally_ddp_opts takes 0 */
    size_t elems = s->stage ? 0 : (bytes + sizeof(float) - 1) / sizeof(float);
    tally__post_init(&s->q, s->comm, s->overlap);
    int rc = tally__buckets_init(&s->buckets, s->m->offsets, s->nlayers, elems);
    if (rc) return rc;
    s->bucket = (tally__bucket_reducer){.comm = s->comm,
                                        .grad = s->m->grads,
                                        .B = &s->buckets,
                                        .denom = (float)s->size * (float)s->accum,
                                        .accum = s->accum};
    if (cfg->codec.kind == TALLY__CODEC_NONE) return 0;
    if ((rc = sync_open_codec(s, cfg))) return rc;
    return sync_measure_f32(s);
}
