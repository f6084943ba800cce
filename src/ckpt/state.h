/* state.h - a component's state dict: named entries with whole shapes, saved collectively (rank 0
 * writes) and loaded back by each rank, its own part; the checkpoint code only iterates over them. */
#ifndef TALLY_CKPT_STATE_H
#define TALLY_CKPT_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"

/* Where saved bytes go: entry `index` (of the whole table), in order; nowhere on ranks other than 0. A
 * writing error is the sink's to keep: the collectives of a save go on regardless, on every rank. */
typedef struct tally__state_sink {
    void (*put)(void *arg, int index, const void *p, size_t bytes);
    void *arg;
} tally__state_sink;

typedef struct tally__state {
    void *arg;
    /* Its entries: how many, and entry i's name (into name, cap bytes), dtype and shape (t->name is set
     * by the caller to that name). */
    int (*count)(void *arg);
    void (*entry)(void *arg, int i, char *name, size_t cap, tally__ckpt_tensor *t);
    /* Every entry's bytes, as entries first + i. Every rank calls it. */
    int (*save)(void *arg, int first, const tally__state_sink *out);
    /* Its part of every entry from ck: a refusal (another model, optimizer, codec) or a missing entry is
     * an error with a message. */
    int (*load)(void *arg, const tally__ckpt *ck);
} tally__state;

/* For loads: entry `name` must be a string equal to want (this run's model, optimizer, codec), else
 * TALLY_E_INVALID saying what differs (`what`: "the optimizer") and what to do. */
int tally__state_string_is(const tally__ckpt *ck, const char *name, const char *want, int rank, const char *what);
/* A one-element I64 entry. */
int tally__state_i64(const tally__ckpt *ck, const char *name, int64_t *v);
/* The F32 entry `name` of exactly this shape (as tally__ckpt_get), with elements [first, first + count)
 * of it (the part a rank loads) finite: *data points at its first element. A NaN or an infinity there is
 * TALLY_E_NONFINITE naming the checkpoint, the tensor, the first such element (its index in each
 * dimension and in the whole) and its value: parameters or optimizer state that are no longer numbers
 * would be trained on, or sampled from, without a word. */
int tally__state_f32(const tally__ckpt *ck, const char *name, int ndim, const uint64_t *shape, size_t first,
                     size_t count, const float **data);

/* Vectors that each rank of the job that wrote ck saved as prefix<k>suffix (k = 0 .. saved - 1), each F32
 * [n] and finite (tally__state_f32): into dst, this rank's own when that job had as many ranks as this one
 * (saved == size: exact), else their mean (what carries every rank's part into a job of another size). */
int tally__state_f32_per_rank(const tally__ckpt *ck, const char *prefix, const char *suffix, int saved, int rank,
                              int size, size_t n, float *dst);

#endif
