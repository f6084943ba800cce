/* train_runner.h - runs the trainer on N forked ranks for the trainer's tests, and brings back what
 * each rank ended with (parameters, hash, memory, bytes) through shared memory. */
#ifndef TALLY_TEST_TRAIN_RUNNER_H
#define TALLY_TEST_TRAIN_RUNNER_H

#include "train/train_seam.h"
#include "train/trainer.h"

#define TR_MAX_PARAMS 70000
#define TR_MAX_RANKS  4

typedef struct tr_out {
    float params[TR_MAX_RANKS][TR_MAX_PARAMS];
    unsigned char hash[TR_MAX_RANKS][32];
    int identical[TR_MAX_RANKS];
    tally__train_result res[TR_MAX_RANKS]; /* as returned (its params pointer is not valid here) */
} tr_out;

/* Shared with the ranks; allocated on first use. */
extern tr_out *tr;

/* Runs cfg (keep_params is forced on) on n ranks over transport; checks every rank succeeded and that
 * all hold bit-identical parameters (naming `what` in failures; past TR_MAX_PARAMS by their hashes).
 * On success copies rank 0's parameters to out (when not NULL; then at most TR_MAX_PARAMS) and
 * returns 0. */
int tr_train_on(const char *transport, int n, const tally__train_cfg *cfg, float *out, const char *what);
/* The same with faults armed in the trainer's test seam of every rank (the ranks' processes only). */
int tr_train_faulty(const char *transport, int n, const tally__train_cfg *cfg, const tally__train_faults *faults,
                    float *out, const char *what);

/* max_i |a_i - b_i| / max(|b_i|, 1% of max_j |b_j|): a relative difference that judges parameters
 * near zero against 1% of the largest (their own relative error is rounding noise around zero). */
double tr_max_rel_diff(const float *a, const float *b, size_t n);
/* ||a - b|| / ||b||: how far a run's parameters moved from the reference's as a whole (an element-wise
 * bound judges the parameters near zero, where rounding noise or 16-bit codecs send a few anywhere). */
double tr_rel_l2(const float *a, const float *b, size_t n);

/* The tests' small run: defaults, then an MLP 20-21 on `ntrain` synthetic samples (ntrain / 16 to
 * test, not evaluated), batch 8, quiet, stopping after `steps` steps, drawn from `seed`. */
tally__train_cfg tr_small_cfg(size_t ntrain, long steps, uint64_t seed);

/* Runs $TALLY_BIN with args (args[0] is its name); returns its exit code, stderr in err. */
int tr_run_tally(char *const args[], char *err, size_t errlen);
/* The same, with stdout and stderr both in out (what a user at a terminal reads). */
int tr_run_tally_all(char *const args[], char *out, size_t outlen);
/* tr_run_tally with `--json FILE` appended to args (at most 28 of them): the summary it wrote in json
 * (empty when none), stderr in err. */
int tr_run_tally_json(char *const args[], char *json, size_t jsonlen, char *err, size_t errlen);

#endif
