/* codec.h - gradient compression for the data-parallel engine (--compress): the codec spec, per-bucket
 * state (error-feedback residuals, PowerSGD's factors) and the bucket reducer that replaces an allreduce. */
#ifndef TALLY_DP_CODEC_H
#define TALLY_DP_CODEC_H

#include <stddef.h>
#include <stdint.h>
#include <tally.h>

#include "../nn/model.h"

typedef enum {
    TALLY__CODEC_NONE,
    TALLY__CODEC_FP16,     /* cast to IEEE half (round to nearest even), reduced in 16 bits */
    TALLY__CODEC_BF16,     /* cast to bfloat16, reduced in 16 bits */
    TALLY__CODEC_TOPK,     /* the fraction `ratio` of largest magnitudes per bucket, sparse all-gather */
    TALLY__CODEC_POWERSGD, /* rank-`rank` factors of each weight matrix, allreduced */
    TALLY__CODEC_INT8,     /* int8 with a scale per TALLY__INT8_BLOCK values (tally__codec_int8_mean) */
    TALLY__CODEC_DGC       /* top-k with Deep Gradient Compression's momentum correction, local clipping and
                            * density warm-up (Lin et al., 2018) */
} tally__codec_kind;

typedef struct tally__codec_cfg {
    int kind;           /* tally__codec_kind */
    double ratio;       /* topk: fraction kept, in (0, 1] */
    int rank;           /* powersgd: r >= 1 */
    int error_feedback; /* topk, powersgd, int8: keep what was not sent for the next step (default 1) */
    /* dgc (set by the engine's user, not parsed): the momentum it applies before selecting (the
     * optimizer's, which then runs without), the clipping norm of the whole gradient (0: none; each
     * rank clips its own), and the steps over which the density falls from TALLY__DGC_WARMUP_DENSITY to
     * ratio (0: none) */
    double momentum, clip;
    long warmup_steps;
} tally__codec_cfg;
#define TALLY__DGC_WARMUP_DENSITY 0.25

/* "none", "fp16", "bf16", "int8", "topk:R", "dgc:R", "powersgd:r" into *out (error_feedback left as it is). Returns 0,
 * or TALLY_E_INVALID with a message saying what is accepted. */
int tally__codec_parse(const char *spec, tally__codec_cfg *out);
/* The canonical spec ("topk:0.01", "powersgd:4", with "+no-ef" when error feedback is off). */
void tally__codec_spec(const tally__codec_cfg *c, char *buf, size_t n);
/* The combinations a run refuses (--no-error-feedback without an error-feedback codec; top-k, PowerSGD
 * and int8 with a ZeRO stage), as TALLY_E_INVALID naming the rank. */
int tally__codec_check(const tally__codec_cfg *c, int zero, int rank);
/* The codec reduces 16-bit casts (fp16/bf16): the dtype on the wire, else -1. */
int tally__codec_half_dtype(const tally__codec_cfg *c);

typedef struct tally__codec tally__codec;

/* A codec for model m on comm (buckets given later); seed draws PowerSGD's first factors. */
int tally__codec_create(const tally__codec_cfg *cfg, tally_comm *comm, const tally__model *m, uint64_t seed,
                        tally__codec **out);
/* The engine's buckets: bucket i covers elements [begin[i], end[i]) of the flat gradients, whole
 * tensors each. Allocates the per-bucket state. */
int tally__codec_set_buckets(tally__codec *c, int nbuckets, const size_t *begin, const size_t *end);
void tally__codec_free(tally__codec *c);

/* The engine's reducer (tally_ddp_opts.reduce; arg is the codec). */
int tally__codec_reduce(void *arg, tally_comm *comm, int bucket, float *grad, size_t count, float denom);

/* Step bookkeeping, on the training thread between steps: begin before the step's first micro-batch;
 * end once every rank agreed to take the step (taken = 1: its residuals become the codec's) or to skip
 * it (taken = 0: the state stays as the step found it, as its averaged gradient was thrown away). */
void tally__codec_step_begin(tally__codec *c);
void tally__codec_step_end(tally__codec *c, int taken);
/* The first bucket whose reduced 16-bit sum came out non-finite from finite inputs this step (an fp16
 * overflow), or -1. Reset by step_begin. */
int tally__codec_overflow(const tally__codec *c);

/* dgc: the density of the step the codec is at (warm-up, then ratio), and the steps taken so far (a
 * resumed run sets them: the warm-up goes on where it stopped). */
double tally__codec_density(const tally__codec *c);
void tally__codec_set_steps(tally__codec *c, long steps);

/* State a checkpoint keeps. The residual (NULL without error feedback) is [nparams] in the flat layout,
 * this rank's own (dgc: its accumulated velocity); dgc's momentum buffer (the velocity, NULL for the other
 * codecs) too. PowerSGD's factor Q of tensor t (NULL when that tensor is sent whole), the same on
 * every rank, is *rows x *cols = [the matrix's columns x rank], row-major. */
float *tally__codec_residual(tally__codec *c);
float *tally__codec_velocity(tally__codec *c);
float *tally__codec_q(tally__codec *c, int tensor, int *rows, int *cols);

/* Bulk casts (codec_cast.c): f32 -> 16 bits (round to nearest even, NaN stays NaN, past the range
 * gives Inf) and back. dt is TALLY_F16 or TALLY_BF16. */
void tally__codec_to_half(const float *src, uint16_t *dst, size_t n, tally_dtype dt);
void tally__codec_from_half(const uint16_t *src, float *dst, size_t n, tally_dtype dt);

/* fp16 reductions keep small gradients: x[n] is multiplied in place by a power of two that every rank
 * agrees on (one allreduce of their largest finite magnitudes) so that the sum over the ranks stays
 * below 2^15, and *scale says which, for the division after the reduction; 1 (and no collective) for
 * bf16, whose range is f32's. Never below 1: what overflows at 1 is left to the --nan policy.
 * Collective. */
int tally__codec_half_scale(tally_comm *comm, float *x, size_t n, tally_dtype dt, float *scale);

/* The 16-bit reduction every engine uses (stage 0's fp16/bf16 buckets, the other stages' layers): x[n]
 * scaled (fp16, as tally__codec_half_scale says), cast into half[n] (dt TALLY_F16 or TALLY_BF16; the
 * kernels add in f32), reduced with op (an allreduce; with scatter a reduce-scatter, len each, this rank's
 * at mine), this rank's part x[mine .. mine + len) cast back and divided by denom times the scale (no
 * division when that is 1). *overflowed: finite inputs came back non-finite there (fp16's range).
 * Collective. */
int tally__codec_half_reduce(tally_comm *comm, float *x, size_t n, size_t mine, size_t len, tally_dtype dt, tally_op op,
                             int scatter, float denom, uint16_t *half, int *overflowed);

/* int8 with one f32 scale per block of TALLY__INT8_BLOCK values (codec_int8.c). A block's scale is its
 * largest magnitude over 127 and its values round to the nearest step; a block holding a NaN or an infinity
 * has scale NaN (it comes back NaN, never as some number). Returns the scale. */
#define TALLY__INT8_BLOCK 256
float tally__int8_quantize(const float *x, size_t len, int8_t *q);
void tally__int8_dequantize(const int8_t *q, size_t len, float scale, float *x);
/* x[n] replaced, on every rank, by the mean over the ranks, sent in int8: each rank's piece of the sum
 * reaches it by an all-to-all of the quantized inputs and is summed in f32, divided, quantized again
 * and shared by an all-gather, so every rank ends with the same bytes. A rank sends about 2 (N-1)/N x n x
 * (1 + 4/TALLY__INT8_BLOCK) bytes, a quarter of an f32 ring allreduce; each value carries two
 * quantizations' error (at most half a step of each). err (NULL: not wanted) gets x minus what this rank's
 * own quantization sent, for error feedback. One rank: x as it is (err zero). Collective. */
int tally__codec_int8_mean(tally_comm *comm, float *x, size_t n, float *err);

/* Top-k selection (codec_topk.c): the indices of the k largest |x| (a NaN counts as an Inf; ties go to
 * the lower index), ascending, into idx[k]. key is scratch of n floats. */
void tally__topk_select(const float *x, size_t n, size_t k, uint32_t *idx, float *key);

/* PowerSGD's orthonormalisation (codec_powersgd.c): the columns of p[rows x r] (row-major) in place by
 * Gram-Schmidt; a column with nothing left after the others are taken out becomes zero. */
void tally__powersgd_orthonormalize(float *p, int rows, int r);

#endif
