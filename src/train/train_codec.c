/* train_codec.c - compression in a training run: the codec set up for the data-parallel engine (or
 * 16-bit reductions inside ZeRO), the honest f32 baseline of the bytes, overflow and skipped steps. */
#include <stdio.h>
#include <stdlib.h>

#include "../core/err.h"
#include "../core/log.h"
#include "trainer_int.h"

int tally__train_codec_setup(train_run *r, tally_ddp_opts *dopts) {
    const tally__codec_cfg *cc = &r->cfg->codec;
    if (cc->kind == TALLY__CODEC_NONE) return 0;
    int rc = tally__codec_create(cc, r->comm, &r->model, r->cfg->seed, &r->codec);
    if (rc) return rc;
    dopts->reduce = tally__codec_reduce;
    dopts->reduce_arg = r->codec;
    return 0;
}

/* The engine's buckets to the codec, and one plain f32 allreduce of each, on zeros, counted: the bytes
 * the step would send uncompressed. */
static int codec_attach_ddp(train_run *r, unsigned long long *bytes) {
    tally_ddp_stats s;
    tally_ddp_get_stats(r->ddp, &s);
    size_t *begin = malloc(2 * (size_t)s.buckets * sizeof *begin), *end = begin + s.buckets, most = 0;
    if (!begin) return tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory", r->rank);
    for (int i = 0; i < s.buckets; i++) {
        tally_ddp_bucket(r->ddp, i, &begin[i], &end[i]);
        if (end[i] - begin[i] > most) most = end[i] - begin[i];
    }
    int rc = tally__codec_set_buckets(r->codec, s.buckets, begin, end);
    float *zeros = rc ? NULL : calloc(most + 1, sizeof(float));
    if (!rc && !zeros) rc = tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory", r->rank);
    unsigned long long sent0 = tally_comm_bytes_sent(r->comm);
    for (int i = 0; i < s.buckets && !rc; i++)
        rc = tally_allreduce(r->comm, zeros, zeros, end[i] - begin[i], TALLY_F32, TALLY_SUM);
    *bytes = tally_comm_bytes_sent(r->comm) - sent0;
    free(zeros);
    free(begin);
    return rc;
}

int tally__train_codec_attach(train_run *r, tally__train_result *res) {
    const tally__codec_cfg *cc = &r->cfg->codec;
    tally__codec_spec(cc, res->codec, sizeof res->codec);
    if (cc->kind == TALLY__CODEC_NONE) return 0;
    if (!r->cfg->zero) return codec_attach_ddp(r, &res->grad_bytes_f32_step);
    int rc = tally__zero_set_half(&r->zero, (tally_dtype)tally__codec_half_dtype(cc));
    return rc ? rc : tally__zero_measure_f32(&r->zero, &res->grad_bytes_f32_step);
}

void tally__train_codec_step_begin(train_run *r) {
    tally__codec_step_begin(r->codec);
    r->zero.overflow = 0;
}

void tally__train_codec_check_overflow(train_run *r, long step) {
    int bucket = tally__codec_overflow(r->codec);
    if (bucket < 0 && !r->zero.overflow) return;
    r->guard.bad = 1;
    char where[48] = "a layer";
    if (bucket >= 0) snprintf(where, sizeof where, "bucket %d", bucket);
    if (bucket >= 0 && r->rank != 0) return; /* every rank has the same sums: one says so */
    tally__log_notice("step %ld: the %s sum of %s overflowed (a value past 65504): counted as a non-finite "
                    "gradient (--nan decides: skip the step, or stop); bf16 has f32's range",
                    step + 1, r->cfg->codec.kind == TALLY__CODEC_FP16 ? "fp16" : "16-bit", where);
}

void tally__train_codec_step_end(train_run *r, int taken) { tally__codec_step_end(r->codec, taken); }

unsigned long long tally__train_codec_grad_bytes(const train_run *r) {
    if (r->cfg->zero) return r->zero.grad_bytes;
    tally_ddp_stats s;
    tally_ddp_get_stats(r->ddp, &s);
    return s.bytes_sent;
}
