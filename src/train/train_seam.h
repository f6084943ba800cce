/* train_seam.h - the trainer's test seam: faults at fixed points of a step (a NaN in one rank's data, a bit
 * flipped in its parameters, the rank killed, every rank halted), armed by the tests and --inject-*. */
#ifndef TALLY_TRAIN_TRAIN_SEAM_H
#define TALLY_TRAIN_TRAIN_SEAM_H

#include <stddef.h>

/* Faults at a step of a rank (steps counted from 1, the step just done or the one about to be; 0: none). */
typedef struct tally__train_faults {
    int nan_rank; /* feeds a NaN into its first input of step nan_step */
    long nan_step;
    int flip_rank; /* flips a bit of a parameter in the middle of its buffer after step flip_step */
    long flip_step;
    int kill_rank; /* SIGKILL after step kill_step (after its checkpoint, if any) */
    long kill_step;
    long halt_after; /* every rank stops after this many steps as a killed run would: no final checkpoint,
                      * no evaluation (a synchronous run; an asynchronous one does not stop) */
} tally__train_faults;

/* Only a test build (TALLY_TEST_SEAMS: CMake's TALLY_TESTS) has the seam (train_seam.c). Elsewhere every
 * call below is empty and arming does nothing: the CLI refuses --inject-* there (TALLY__TRAIN_SEAMS). */
#ifdef TALLY_TEST_SEAMS
#define TALLY__TRAIN_SEAMS 1
/* Arms f for the runs this process makes from now on (copied; NULL disarms); a forked rank inherits it. */
void tally__train_faults_arm(const tally__train_faults *f);
/* What the trainer calls. A micro-batch's inputs (n floats) before forward; for a model that reads
 * tokens, what backward starts from instead (the softmax's probabilities), after forward. */
void tally__train_seam_batch(int rank, long step, int micro, float *x, size_t n);
/* After the optimizer's update of `step`: params (n floats; NULL when the rank holds only a shard). */
void tally__train_seam_updated(int rank, long step, float *params, size_t n);
/* After step's checkpoint, if any: may kill the process; 1 stops a synchronous run there. */
int tally__train_seam_halt(int rank, long step);
/* Whether data or parameters are to be corrupted (the asynchronous run refuses that). */
int tally__train_seam_corrupts(void);
#else
#define TALLY__TRAIN_SEAMS 0
static inline void tally__train_faults_arm(const tally__train_faults *f) { (void)f; }
static inline void tally__train_seam_batch(int rank, long step, int micro, float *x, size_t n) {
    (void)rank, (void)step, (void)micro, (void)x, (void)n;
}
static inline void tally__train_seam_updated(int rank, long step, float *params, size_t n) {
    (void)rank, (void)step, (void)params, (void)n;
}
static inline int tally__train_seam_halt(int rank, long step) { return (void)rank, (void)step, 0; }
static inline int tally__train_seam_corrupts(void) { return 0; }
#endif

#endif
