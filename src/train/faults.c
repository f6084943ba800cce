/* faults.c - the stock test faults on the trainer's hook: a NaN in one rank's data, a bit flipped in one
 * rank's parameters, one rank killed, every rank halted as if killed. */
#include "faults.h"

#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>

static void faults_batch(void *arg, int rank, long step, int micro, float *x, size_t n) {
    const tally__train_faults *f = arg;
    if (micro == 0 && n > 0 && f->nan_step == step && f->nan_rank == rank) x[0] = NAN;
}

static void faults_updated(void *arg, int rank, long step, float *params, size_t n) {
    const tally__train_faults *f = arg;
    if (f->flip_step != step || f->flip_rank != rank || !params) return;
    uint32_t bits;
    memcpy(&bits, params + n / 2, sizeof bits);
    bits ^= 1u << 20;
    memcpy(params + n / 2, &bits, sizeof bits);
}

static int faults_done(void *arg, int rank, long step) {
    const tally__train_faults *f = arg;
    if (f->kill_step == step && f->kill_rank == rank) raise(SIGKILL);
    return f->halt_after > 0 && step == f->halt_after;
}

tally__train_hook tally__train_faults_hook(tally__train_faults *f) {
    return (tally__train_hook){.arg = f,
                               .batch = f->nan_step > 0 ? faults_batch : NULL,
                               .updated = f->flip_step > 0 ? faults_updated : NULL,
                               .done = f->kill_step > 0 || f->halt_after > 0 ? faults_done : NULL};
}
