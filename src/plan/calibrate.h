/* calibrate.h - what `tally plan --calibrate` measures on this machine, as the library does it: an
 * allreduce of the plan's gradients, the model's forward + backward, the optimizer update, sgemm. */
#ifndef TALLY_PLAN_CALIBRATE_H
#define TALLY_PLAN_CALIBRATE_H

#include <tally.h>

#include "../nn/model.h"
#include "plan.h"

/* What --calibrate measured on this machine. */
typedef struct tally__plan_calib {
    double sgemm_gflops, update_s_per_param;
    double model_gflops; /* --model: its forward + backward, timed (0 without --model) */
    tally__cost shm, tcp;
    double shm_allreduce_s, tcp_allreduce_s; /* an allreduce of S on 2 ranks, timed: beta is fitted to it */
    double shm_ping_beta, tcp_ping_beta;     /* beta as the ping-pong measured it, before the fit */
    long cpus;
    const char *used; /* the transport whose figures the plan uses */
} tally__plan_calib;

/* Median seconds of an allreduce of `bytes` (at most 256 MiB, scaled up past it) on comm, in a buffer
 * from tally_mem_alloc as the trainer's gradients are; 0 when it could not run. Collective. op: AVG as
 * the trainer averages (its division is one more pass over the vector: 20-25% of a 64 MiB allreduce
 * here), SUM for the collective alone, as `tally sim` models it. */
double tally__plan_time_allreduce(tally_comm *comm, double bytes, tally_op op);
/* With k's links measured (shm, tcp and their allreduce times, filled by the caller, which starts the
 * ranks): times sgemm, the model (mcfg; NULL for none: then the update alone), fits each link's beta to
 * its allreduce, and sets cfg's cost, gflops and update rate from them. 0, or an error with a message. */
int tally__plan_calibrate(tally__plan_cfg *cfg, const tally__model_cfg *mcfg, tally__plan_calib *k);
/* Single-thread sgemm rate of this machine in GFLOP/s (about 0.2 s of measuring; peak.c). */
double tally__sgemm_peak_gflops(void);

#endif
