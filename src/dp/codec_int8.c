/* codec_int8.c - int8 with an f32 scale per block: quantizing a block, and the mean over the ranks sent
 * that way (an all-to-all of the quantized inputs, sums in f32, an all-gather of the quantized sums). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/err.h"
#include "codec.h"

float tally__int8_quantize(const float *x, size_t len, int8_t *q) {
    float top = 0;
    int finite = 1;
    for (size_t i = 0; i < len; i++) {
        float a = fabsf(x[i]);
        finite &= isfinite(a) != 0;
        top = a > top ? a : top;
    }
    if (!finite) { /* no scale represents it: the block comes back NaN rather than as some number */
        memset(q, 0, len);
        return NAN;
    }
    float scale = top / 127.0f, inv = top > 0 ? 127.0f / top : 0;
    for (size_t i = 0; i < len; i++) {
        float v = nearbyintf(x[i] * inv); /* |x| <= top: within -127..127, up to the last bit */
        q[i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
    }
    return scale;
}

void tally__int8_dequantize(const int8_t *q, size_t len, float scale, float *x) {
    for (size_t i = 0; i < len; i++) x[i] = (float)q[i] * scale;
}

/* The flat vector cut into one piece per rank, each a whole number of blocks (the last padded with
 * zeros), and a piece on the wire: its blocks' scales, then its int8 values. */
typedef struct int8_plan {
    size_t n, blocks, elems; /* the piece's blocks and values */
    size_t bytes;            /* on the wire */
} int8_plan;

static int8_plan plan_of(size_t n, int size) {
    size_t all = (n + TALLY__INT8_BLOCK - 1) / TALLY__INT8_BLOCK, blocks = (all + (size_t)size - 1) / (size_t)size;
    return (int8_plan){.n = n,
                       .blocks = blocks,
                       .elems = blocks * TALLY__INT8_BLOCK,
                       .bytes = blocks * (sizeof(float) + TALLY__INT8_BLOCK)};
}

/* Values [from, from + p->elems) of x (zeros past n) quantized into the wire form at out; err (NULL: not
 * wanted) gets x minus what was sent for them. */
static void pack_piece(const int8_plan *p, const float *x, size_t from, unsigned char *out, float *err) {
    float block[TALLY__INT8_BLOCK], sent[TALLY__INT8_BLOCK];
    int8_t *q = (int8_t *)(out + p->blocks * sizeof(float));
    for (size_t b = 0; b < p->blocks; b++) {
        size_t at = from + b * TALLY__INT8_BLOCK, have = at < p->n ? p->n - at : 0;
        if (have > TALLY__INT8_BLOCK) have = TALLY__INT8_BLOCK;
        memset(block, 0, sizeof block);
        if (have) memcpy(block, x + at, have * sizeof(float));
        int8_t *bq = q + b * TALLY__INT8_BLOCK;
        float scale = tally__int8_quantize(block, TALLY__INT8_BLOCK, bq);
        memcpy(out + b * sizeof(float), &scale, sizeof scale);
        if (!err || !have) continue;
        tally__int8_dequantize(bq, have, scale, sent);
        for (size_t i = 0; i < have; i++) err[at + i] = block[i] - sent[i];
    }
}

/* The wire form at in, dequantized: added into acc[p->elems] (add) or stored there. */
static void unpack_piece(const int8_plan *p, const unsigned char *in, float *acc, int add) {
    float block[TALLY__INT8_BLOCK];
    const int8_t *q = (const int8_t *)(in + p->blocks * sizeof(float));
    for (size_t b = 0; b < p->blocks; b++) {
        float scale;
        memcpy(&scale, in + b * sizeof(float), sizeof scale);
        float *dst = acc + b * TALLY__INT8_BLOCK;
        tally__int8_dequantize(q + b * TALLY__INT8_BLOCK, TALLY__INT8_BLOCK, scale, add ? block : dst);
        if (add)
            for (size_t i = 0; i < TALLY__INT8_BLOCK; i++) dst[i] += block[i];
    }
}

int tally__codec_int8_mean(tally_comm *comm, float *x, size_t n, float *err) {
    int size = tally_comm_size(comm), rank = tally_comm_rank(comm);
    if (err) memset(err, 0, n * sizeof(float));
    if (size == 1 || n == 0) return 0; /* every rank has the same n: none makes a call */
    int8_plan p = plan_of(n, size);
    unsigned char *send = malloc(p.bytes * (size_t)size), *recv = malloc(p.bytes * (size_t)size);
    float *acc = malloc(p.elems * sizeof(float));
    int rc = send && recv && acc ? 0 : tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory", rank);
    for (int j = 0; j < size && !rc; j++) pack_piece(&p, x, (size_t)j * p.elems, send + (size_t)j * p.bytes, err);
    if (!rc) rc = tally_alltoall(comm, send, recv, p.bytes, TALLY_U8);
    if (!rc) {
        memset(acc, 0, p.elems * sizeof(float));
        for (int i = 0; i < size; i++) unpack_piece(&p, recv + (size_t)i * p.bytes, acc, 1);
        for (size_t i = 0; i < p.elems; i++) acc[i] /= (float)size;
        pack_piece(&(int8_plan){.n = p.elems, .blocks = p.blocks, .elems = p.elems, .bytes = p.bytes}, acc, 0, send,
                   NULL);
        rc = tally_allgather(comm, send, recv, p.bytes, TALLY_U8);
    }
    /* Every rank, its own piece included, takes the gathered bytes: the replicas stay identical. */
    for (int j = 0; j < size && !rc; j++) {
        size_t from = (size_t)j * p.elems;
        if (from >= n) break;
        unpack_piece(&p, recv + (size_t)j * p.bytes, acc, 0);
        memcpy(x + from, acc, (n - from < p.elems ? n - from : p.elems) * sizeof(float));
    }
    free(send);
    free(recv);
    free(acc);
    return rc;
}
