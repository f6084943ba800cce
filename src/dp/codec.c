/* codec.c - gradient compression: the spec and what a run refuses, the per-bucket state, the dispatch
 * of a bucket to its codec, the fp16/bf16 reduction itself, and the step bookkeeping (taken or skipped). */
#include "codec_int.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/err.h"
#include "../core/parse.h"
#include "../core/alloc.h"
#include "guard.h"

int tally__codec_parse(const char *spec, tally__codec_cfg *out) {
    static const char accepts[] = "it takes none, fp16, bf16, int8, topk:R (0 < R <= 1: topk:0.01 keeps 1% of "
                                  "each bucket), dgc:R (top-k with momentum correction) or powersgd:r (a rank "
                                  "from 1 to 1024: powersgd:4)";
    if (!spec) return tally__parse_fail("--compress", spec, "", accepts);
    static const struct {
        const char *name;
        int kind;
    } plain[] = {{"none", TALLY__CODEC_NONE},
                 {"fp16", TALLY__CODEC_FP16},
                 {"bf16", TALLY__CODEC_BF16},
                 {"int8", TALLY__CODEC_INT8}};
    for (size_t i = 0; i < sizeof plain / sizeof *plain; i++)
        if (!strcmp(spec, plain[i].name)) return out->kind = plain[i].kind, 0;
    if (!strncmp(spec, "topk:", 5) || !strncmp(spec, "dgc:", 4)) {
        double r;
        const char *at = strchr(spec, ':') + 1;
        if (tally__parse_real("--compress", at, 0, 1, 1, &r))
            return tally__parse_fail("--compress", spec, "keeps no fraction in (0, 1]", accepts);
        out->kind = spec[0] == 't' ? TALLY__CODEC_TOPK : TALLY__CODEC_DGC;
        out->ratio = r;
        return 0;
    }
    if (!strncmp(spec, "powersgd:", 9)) {
        long long r;
        if (tally__parse_int("--compress", spec + 9, 1, 1024, &r))
            return tally__parse_fail("--compress", spec, "has no rank from 1 to 1024", accepts);
        out->kind = TALLY__CODEC_POWERSGD;
        out->rank = (int)r;
        return 0;
    }
    return tally__parse_fail("--compress", spec, "is an unknown codec", accepts);
}

/* The codecs that send less than the gradient and may keep the rest (error feedback). */
static int codec_lossy(const tally__codec_cfg *c) {
    return c->kind == TALLY__CODEC_TOPK || c->kind == TALLY__CODEC_POWERSGD || c->kind == TALLY__CODEC_INT8 ||
           c->kind == TALLY__CODEC_DGC;
}

/* dgc's accumulation is its residual: always kept. */
static int codec_has_ef(const tally__codec_cfg *c) {
    return c->kind == TALLY__CODEC_DGC || (c->error_feedback && codec_lossy(c));
}

void tally__codec_spec(const tally__codec_cfg *c, char *buf, size_t n) {
    const char *ef = codec_lossy(c) && !c->error_feedback ? "+no-ef" : "";
    switch (c->kind) {
    case TALLY__CODEC_FP16: snprintf(buf, n, "fp16"); break;
    case TALLY__CODEC_BF16: snprintf(buf, n, "bf16"); break;
    case TALLY__CODEC_INT8: snprintf(buf, n, "int8%s", ef); break;
    case TALLY__CODEC_DGC: snprintf(buf, n, "dgc:%g", c->ratio); break;
    case TALLY__CODEC_TOPK: snprintf(buf, n, "topk:%g%s", c->ratio, ef); break;
    case TALLY__CODEC_POWERSGD: snprintf(buf, n, "powersgd:%d%s", c->rank, ef); break;
    default: snprintf(buf, n, "none");
    }
}

int tally__codec_check(const tally__codec_cfg *c, int zero, int rank) {
    int lossy = codec_lossy(c);
    if (!c->error_feedback && c->kind == TALLY__CODEC_DGC)
        return tally__seterr(TALLY_E_INVALID,
                             "rank %d: --compress dgc:R accumulates what it did not send by design; "
                             "--no-error-feedback goes with topk:R, powersgd:r and int8",
                             rank);
    if (!c->error_feedback && !lossy)
        return tally__seterr(TALLY_E_INVALID,
                             "rank %d: --no-error-feedback applies to --compress topk:R, powersgd:r and "
                             "int8 only (fp16, bf16 and none keep no residual)",
                             rank);
    /* With ZeRO the gradients are reduce-scattered layer by layer into their owners' pieces: a sparse,
     * low-rank or block-quantized exchange would need whole buckets on every rank (stage 1 has them until
     * the step, but its reduction is the same per-layer reduce-scatter), so these codecs stay with
     * stage 0. */
    if (lossy && zero)
        return tally__seterr(TALLY_E_INVALID,
                             "rank %d: --compress %s works with --zero 0 only (ZeRO reduce-scatters "
                             "each layer into its owners' pieces); use fp16 or bf16 with --zero %d",
                             rank,
                             c->kind == TALLY__CODEC_TOPK       ? "topk"
                             : c->kind == TALLY__CODEC_DGC      ? "dgc"
                             : c->kind == TALLY__CODEC_POWERSGD ? "powersgd"
                                                                : "int8",
                             zero);
    return 0;
}

int tally__codec_half_dtype(const tally__codec_cfg *c) {
    return c->kind == TALLY__CODEC_FP16 ? TALLY_F16 : c->kind == TALLY__CODEC_BF16 ? TALLY_BF16 : -1;
}

int tally__codec_create(const tally__codec_cfg *cfg, tally_comm *comm, const tally__model *m, uint64_t seed,
                        tally__codec **out) {
    tally__codec *c = calloc(1, sizeof *c);
    if (!c) return tally__seterr(TALLY_E_NOMEM, "codec: out of memory");
    c->cfg = *cfg;
    c->comm = comm;
    c->m = m;
    c->rank = tally_comm_rank(comm);
    c->size = tally_comm_size(comm);
    c->seed = seed;
    c->overflow = -1;
    size_t bytes = m->nparams * sizeof(float) + 4;
    int dgc = cfg->kind == TALLY__CODEC_DGC;
    if ((codec_has_ef(cfg) &&
         (!(c->residual = tally__alloc_zeroed(bytes)) || !(c->next = tally__alloc_zeroed(bytes)))) ||
        (dgc && (!(c->u = tally__alloc_zeroed(bytes)) || !(c->u_next = tally__alloc_zeroed(bytes))))) {
        tally__codec_free(c);
        return tally__seterr(TALLY_E_NOMEM, "rank %d: codec: out of memory for the residual", c->rank);
    }
    *out = c;
    return 0;
}

/* The tensors of each bucket (buckets hold whole layers, so whole tensors). */
static void codec_map_tensors(tally__codec *c, codec_bucket *b) {
    b->first_tensor = -1;
    for (int t = 0; t < c->m->ntensors; t++) {
        size_t off = c->m->tensor[t].offset;
        if (off < b->begin || off >= b->end) continue;
        if (b->first_tensor < 0) b->first_tensor = t;
        b->ntensors++;
    }
    if (b->first_tensor < 0) b->first_tensor = 0;
}

int tally__codec_set_buckets(tally__codec *c, int nbuckets, const size_t *begin, const size_t *end) {
    if (!(c->bucket = calloc((size_t)nbuckets, sizeof *c->bucket)))
        return tally__seterr(TALLY_E_NOMEM, "rank %d: codec: out of memory", c->rank);
    c->nbuckets = nbuckets;
    for (int i = 0; i < nbuckets; i++) {
        c->bucket[i].begin = begin[i];
        c->bucket[i].end = end[i];
        codec_map_tensors(c, &c->bucket[i]);
        if (end[i] - begin[i] > c->largest) c->largest = end[i] - begin[i];
    }
    size_t n = c->largest + 1;
    int rc = 0;
    if (!(c->acc = malloc(n * sizeof(float)))) rc = -1;
    if (!rc && tally__codec_half_dtype(&c->cfg) >= 0 && !(c->half = malloc(n * sizeof(uint16_t)))) rc = -1;
    if (rc) return tally__seterr(TALLY_E_NOMEM, "rank %d: codec: out of memory", c->rank);
    if (c->cfg.kind == TALLY__CODEC_TOPK || c->cfg.kind == TALLY__CODEC_DGC) return tally__codec_topk_alloc(c);
    if (c->cfg.kind == TALLY__CODEC_POWERSGD) return tally__codec_powersgd_alloc(c);
    return 0;
}

void tally__codec_free(tally__codec *c) {
    if (!c) return;
    free(c->bucket);
    free(c->residual);
    free(c->next);
    free(c->u);
    free(c->u_next);
    free(c->acc);
    free(c->half);
    free(c->key);
    free(c->idx);
    free(c->pairs);
    free(c->gathered);
    free(c->q);
    free(c->q_saved);
    free(c->qnew);
    free(c->pbuf);
    free(c);
}

/* fp16 keeps 11 bits down to 6e-5 and fewer below, while a mean gradient is often 1e-5 to 1e-7: scaled
 * up before the cast (a power of two, exact both ways), such gradients keep their bits, as loss scaling
 * keeps them in mixed precision; the bound 2^15 / N leaves the sum of N ranks a factor 2 below 65504. */
#define HALF_SCALE_MAX_EXP 40 /* 2^40: gradients down to 1e-12 brought into fp16's normal range */

int tally__codec_half_scale(tally_comm *comm, float *x, size_t n, tally_dtype dt, float *scale) {
    *scale = 1.0f;
    if (dt != TALLY_F16) return 0;
    float m = 0;
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > m && a <= FLT_MAX) m = a;
    }
    int rc = tally_allreduce(comm, &m, &m, 1, TALLY_F32, TALLY_MAX);
    if (rc || m == 0) return rc;
    float room = 32768.0f / ((float)tally_comm_size(comm) * m); /* Inf when m is near FLT_MIN */
    int e = HALF_SCALE_MAX_EXP + 1;
    if (room <= FLT_MAX) (void)frexpf(room, &e); /* 2^(e-1) <= room < 2^e */
    e = e - 1 < 0 ? 0 : e - 1 > HALF_SCALE_MAX_EXP ? HALF_SCALE_MAX_EXP : e - 1;
    if (!e) return 0;
    *scale = ldexpf(1.0f, e);
    for (size_t i = 0; i < n; i++) x[i] *= *scale;
    return 0;
}

int tally__codec_half_reduce(tally_comm *comm, float *x, size_t n, size_t mine, size_t len, tally_dtype dt, tally_op op,
                             int scatter, float denom, uint16_t *half, int *overflowed) {
    int finite_in = tally__all_finite(x, n);
    float scale;
    int rc = tally__codec_half_scale(comm, x, n, dt, &scale);
    if (rc) return rc;
    tally__codec_to_half(x, half, n, dt);
    rc = scatter ? tally_reduce_scatter(comm, half, half + mine, len, dt, op)
                 : tally_allreduce(comm, half, half, n, dt, op);
    if (rc) return rc;
    tally__codec_from_half(half + mine, x + mine, len, dt);
    const float div = denom * scale; /* exact: scale is a power of two */
    if (div != 1.0f)
        for (size_t i = mine; i < mine + len; i++) x[i] /= div;
    *overflowed = finite_in && !tally__all_finite(x + mine, len);
    return 0;
}

/* fp16/bf16: the bucket cast, summed in 16 bits on the wire (the kernels add in f32), cast back. A
 * value past fp16's range becomes Inf, so the mean is Inf: recorded as an overflow of this bucket
 * for the trainer, which treats it as its NaN/Inf policy says (skip the step by default), as mixed
 * precision training skips an overflowed step. */
static int codec_reduce_half(tally__codec *c, int k, float *grad, size_t n, float denom) {
    tally_dtype dt = (tally_dtype)tally__codec_half_dtype(&c->cfg);
    int overflowed = 0;
    int rc = tally__codec_half_reduce(c->comm, grad, n, 0, n, dt, TALLY_SUM, 0, denom, c->half, &overflowed);
    if (!rc && overflowed && c->overflow < 0) c->overflow = k;
    return rc;
}

/* int8: gradient plus residual quantized per block and averaged (tally__codec_int8_mean); what this
 * rank's quantization did not send waits in its residual. The mean over the ranks is rescaled to the
 * engine's divisor (ranks x micro-batches). */
static int codec_reduce_int8(tally__codec *c, const codec_bucket *b, float *grad, float denom) {
    size_t n = b->end - b->begin;
    float *res = c->residual ? c->residual + b->begin : NULL, *next = c->residual ? c->next + b->begin : NULL;
    if (res)
        for (size_t i = 0; i < n; i++) grad[i] += res[i];
    int rc = tally__codec_int8_mean(c->comm, grad, n, next);
    const float to_denom = (float)c->size / denom;
    for (size_t i = 0; i < n && !rc && to_denom != 1.0f; i++) grad[i] *= to_denom;
    return rc;
}

int tally__codec_reduce(void *arg, tally_comm *comm, int bucket, float *grad, size_t count, float denom) {
    tally__codec *c = arg;
    (void)comm; /* the codec's own: the same communicator */
    if (bucket < 0 || bucket >= c->nbuckets || c->bucket[bucket].end - c->bucket[bucket].begin != count)
        return tally__seterr(TALLY_E_INVALID,
                             "rank %d: codec: bucket %d of %zu elements does not match the layout "
                             "it was given",
                             c->rank, bucket, count);
    const codec_bucket *b = &c->bucket[bucket];
    switch (c->cfg.kind) {
    case TALLY__CODEC_FP16:
    case TALLY__CODEC_BF16: return codec_reduce_half(c, bucket, grad, count, denom);
    case TALLY__CODEC_TOPK: return tally__codec_topk_reduce(c, b, grad, denom);
    case TALLY__CODEC_POWERSGD: return tally__codec_powersgd_reduce(c, b, grad, denom);
    case TALLY__CODEC_INT8: return codec_reduce_int8(c, b, grad, denom);
    case TALLY__CODEC_DGC: return tally__codec_dgc_reduce(c, b, grad, denom);
    default: {
        int rc = tally_allreduce(c->comm, grad, grad, count, TALLY_F32, TALLY_SUM);
        for (size_t i = 0; i < count && !rc; i++) grad[i] /= denom;
        return rc;
    }
    }
}

void tally__codec_step_begin(tally__codec *c) {
    if (!c) return;
    c->overflow = -1;
    if (c->q) memcpy(c->q_saved, c->q, c->q_len * sizeof(float));
}

void tally__codec_step_end(tally__codec *c, int taken) {
    if (!c) return;
    if (taken) {
        float *t = c->residual;
        c->residual = c->next;
        c->next = t;
        t = c->u;
        c->u = c->u_next;
        c->u_next = t;
        c->steps++;
    } else if (c->q) {
        memcpy(c->q, c->q_saved, c->q_len * sizeof(float));
    }
}

int tally__codec_overflow(const tally__codec *c) { return c ? c->overflow : -1; }

float *tally__codec_residual(tally__codec *c) { return c ? c->residual : NULL; }

float *tally__codec_velocity(tally__codec *c) { return c ? c->u : NULL; }

void tally__codec_set_steps(tally__codec *c, long steps) {
    if (c) c->steps = steps;
}

float *tally__codec_q(tally__codec *c, int tensor, int *rows, int *cols) {
    if (!c || !c->q || tensor < 0 || tensor >= c->m->ntensors || c->q_off[tensor] == (size_t)-1) return NULL;
    if (rows) *rows = c->cols[tensor];
    if (cols) *cols = c->cfg.rank;
    return c->q + c->q_off[tensor];
}
