/* codec_int.h - the codec's state as its files share it (dispatch in codec.c, top-k in codec_topk.c,
 * PowerSGD in codec_powersgd.c); not part of any interface. */
#ifndef TALLY_DP_CODEC_INT_H
#define TALLY_DP_CODEC_INT_H

#include "codec.h"

typedef struct codec_bucket {
    size_t begin, end;          /* elements of the flat gradients */
    int first_tensor, ntensors; /* the model's tensors it holds */
} codec_bucket;

struct tally__codec {
    tally__codec_cfg cfg;
    tally_comm *comm;
    const tally__model *m;
    int rank, size;
    uint64_t seed;
    int nbuckets;
    codec_bucket *bucket;
    size_t largest;    /* elements of the largest bucket */
    float *residual;   /* [nparams] error feedback, local units (before the division); NULL: off */
    float *next;       /* [nparams] the residual the step in flight leaves (swapped in by
                              * step_end when the step is taken: a skipped step leaves no trace) */
    int overflow;      /* first bucket whose 16-bit sum overflowed this step, or -1 */
    float *u, *u_next; /* dgc: [nparams] the momentum buffer, and the one the step in flight leaves */
    long steps;        /* steps taken (dgc's warm-up) */
    float *acc;        /* [largest]: gradient + residual */
    /* fp16/bf16 */
    uint16_t *half; /* [largest] */
    /* top-k */
    float *key;                      /* [largest] */
    uint32_t *idx;                   /* [k of the largest bucket] */
    unsigned char *pairs, *gathered; /* k (index, value) pairs; every rank's */
    /* PowerSGD: Q of tensor t at q + q_off[t] ([cols x rank]); q_off[t] == (size_t)-1 when sent whole */
    size_t q_off[TALLY__MODEL_MAX_TENSORS];
    int rows[TALLY__MODEL_MAX_TENSORS], cols[TALLY__MODEL_MAX_TENSORS];
    float *q, *q_saved, *qnew; /* [q_len] each */
    size_t q_len;
    float *pbuf; /* a bucket's P factors then its uncompressed values */
};

/* Per-codec parts of set_buckets and reduce. */
int tally__codec_topk_alloc(tally__codec *c);
int tally__codec_topk_reduce(tally__codec *c, const codec_bucket *b, float *grad, float denom);
int tally__codec_dgc_reduce(tally__codec *c, const codec_bucket *b, float *grad, float denom);
int tally__codec_powersgd_alloc(tally__codec *c);
int tally__codec_powersgd_reduce(tally__codec *c, const codec_bucket *b, float *grad, float denom);
/* k for a bucket of n elements: max(1, ceil(density * n)), the density dgc's warm-up has reached or ratio. */
size_t tally__codec_topk_k(const tally__codec *c, size_t n);

#endif
