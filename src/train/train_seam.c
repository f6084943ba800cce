/* train_seam.c - the trainer's test seam (test builds only): a NaN in one rank's data, a bit flipped in one
 * rank's parameters, one rank killed, every rank halted as if killed, at the steps armed. */
#include "train_seam.h"

#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>

static tally__train_faults armed; /* process-wide: the ranks a test forks inherit it */

void tally__train_faults_arm(const tally__train_faults *f) {
    if (f)
        armed = *f;
    else
        memset(&armed, 0, sizeof armed);
}

void tally__train_seam_batch(int rank, long step, int micro, float *x, size_t n) {
    if (micro == 0 && n > 0 && armed.nan_step > 0 && armed.nan_step == step && armed.nan_rank == rank) x[0] = NAN;
}

void tally__train_seam_updated(int rank, long step, float *params, size_t n) {
    if (armed.flip_step <= 0 || armed.flip_step != step || armed.flip_rank != rank || !params) return;
    uint32_t bits;
    memcpy(&bits, params + n / 2, sizeof bits);
    bits ^= 1u << 20;
    memcpy(params + n / 2, &bits, sizeof bits);
}

int tally__train_seam_halt(int rank, long step) {
    if (armed.kill_step > 0 && armed.kill_step == step && armed.kill_rank == rank) raise(SIGKILL);
    return armed.halt_after > 0 && step == armed.halt_after;
}

int tally__train_seam_corrupts(void) { return armed.nan_step > 0 || armed.flip_step > 0; }
