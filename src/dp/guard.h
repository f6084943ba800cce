/* guard.h - numerical guards of a training run: non-finite gradients caught where backward makes them
 * and agreed on by every rank before the update, and the replica check that compares parameter hashes. */
#ifndef TALLY_DP_GUARD_H
#define TALLY_DP_GUARD_H

#include <tally.h>

#include "../nn/model.h"

typedef enum { TALLY__NAN_SKIP, TALLY__NAN_ERROR, TALLY__NAN_IGNORE } tally__nan_policy;

/* "skip" / "error" / "ignore", and the reverse (-1 when unknown). */
const char *tally__nan_policy_name(tally__nan_policy p);
int tally__nan_policy_parse(const char *name);

typedef struct tally__guard {
    tally__nan_policy policy;
    tally__model *m;
    tally__model_hooks inner; /* the engine's hooks, called after the check */
    int bad;                  /* this rank made a non-finite gradient in the step so far */
    int rank, size;
    unsigned char *flags; /* [size]: the agreement's allreduce */
    long skipped;         /* steps skipped so far */
    char bad_ranks[160];  /* the last skipped step's ranks, "1, 3" */
} tally__guard;

/* Sets the guard up over model m; *hooks (the engine's) becomes hooks that check each layer's
 * gradients as backward completes them and then call the engine's. */
int tally__guard_init(tally__guard *g, tally_comm *comm, tally__model *m, tally__nan_policy policy,
                      tally__model_hooks *hooks);
void tally__guard_free(tally__guard *g);
/* Before a step's first micro-batch. */
static inline void tally__guard_begin(tally__guard *g) { g->bad = 0; }
/* After the step's gradients are reduced and before the update (the communicator must be idle):
 * one allreduce of every rank's flag. *skip is 1 when some rank made a non-finite gradient and the
 * policy skips; with --nan error that is an error naming the ranks and the step. */
int tally__guard_agree(tally__guard *g, tally_comm *comm, long step, int *skip);

/* Every rank hashes each parameter tensor of its full replica and all compare: a rank that differs
 * is named with the tensor (TALLY_E_CORRUPT). For models whose parameters each rank holds whole. */
int tally__guard_check_replicas(tally_comm *comm, const tally__model *m, long step);

/* 1 when every one of p[0..n) is finite. */
int tally__all_finite(const float *p, size_t n);

#endif
