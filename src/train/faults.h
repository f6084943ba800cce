/* faults.h - the trainer's test hook (called at fixed points of every step, NULL in a real run), and the
 * stock faults behind --inject-nan, --inject-flip and --inject-kill that tests and the CLI hang on it. */
#ifndef TALLY_TRAIN_FAULTS_H
#define TALLY_TRAIN_FAULTS_H

#include <stddef.h>

/* Steps are counted from 1 (the step just done, or the one about to be). Any call may be NULL. */
typedef struct tally__train_hook {
    void *arg;
    /* A micro-batch's inputs (n floats), before forward: it may corrupt them. For a model that reads
     * tokens, what backward starts from instead (the softmax's probabilities), after forward. */
    void (*batch)(void *arg, int rank, long step, int micro, float *x, size_t n);
    /* After the optimizer's update of `step`: params (n floats; NULL when the rank holds only a shard). */
    void (*updated)(void *arg, int rank, long step, float *params, size_t n);
    /* After step's checkpoint, if any: 1 stops a synchronous run there as a killed one would (no final
     * checkpoint, no evaluation; an asynchronous run does not stop); it may also kill the process. */
    int (*done)(void *arg, int rank, long step);
} tally__train_hook;

/* Faults at a step of a rank (step 0: none). */
typedef struct tally__train_faults {
    int nan_rank; /* feeds a NaN into its first input of step nan_step */
    long nan_step;
    int flip_rank; /* flips a bit of a parameter in the middle of its buffer after step flip_step */
    long flip_step;
    int kill_rank; /* SIGKILL after step kill_step */
    long kill_step;
    long halt_after; /* every rank stops after this many steps as a killed run would */
} tally__train_faults;

/* The hook that carries out f (which must outlive the run); only the calls f needs are set. */
tally__train_hook tally__train_faults_hook(tally__train_faults *f);

#endif
