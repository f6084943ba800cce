/* sim_int.h - what the simulator's files share: a rank's traced schedule (trace.c), the programs the event
 * level plays (engine.c), the symmetric fast path (fast.c) and where each rank and link sits. */
#ifndef TALLY_SIM_SIM_INT_H
#define TALLY_SIM_SIM_INT_H

#include <stddef.h>
#include <stdint.h>

#include "sim.h"

/* One message of a traced step. */
typedef struct tally__sim_msg {
    int peer;
    unsigned char send, reduce;
    size_t bytes;
} tally__sim_msg;

/* One rank's schedule of a collective, as the algorithm's code ran it: step s is one exchange, its
 * messages msg[first[s] .. first[s+1]). */
typedef struct tally__sim_sched {
    tally__sim_msg *msg;
    int *first; /* nstep + 1 entries */
    long nmsg, nstep, cap_msg, cap_step;
} tally__sim_sched;

/* Runs the library's algorithm `algo` (flat) for rank `rank` of n over a recording transport. 0, or
 * TALLY_E_NOMEM / the algorithm's own error. */
int tally__sim_trace(int algo, int coll, int rank, int n, size_t bytes, tally_dtype t, int root, tally__sim_sched *out);
void tally__sim_sched_free(tally__sim_sched *s);

/* ---- programs of the event level ---- */

#define TALLY__SIM_LANES 2 /* a rank's threads: the caller's and hier's thread between hosts */

typedef struct tally__sim_pstep {
    long first, count; /* into the program's messages */
    double compute;    /* seconds of work before the step's messages are posted */
    int dep_lane;      /* -1, or this step also waits for step dep_step of that lane of the same rank */
    long dep_step;
} tally__sim_pstep;

typedef struct tally__sim_pmsg {
    int peer; /* world rank */
    unsigned char send, reduce;
    size_t bytes;
    uint32_t seq; /* this message's place among those from sender to receiver */
} tally__sim_pmsg;

typedef struct tally__sim_lane {
    tally__sim_pstep *step;
    long nstep, cap;
} tally__sim_lane;

typedef struct tally__sim_prog {
    int n;
    tally__sim_lane *lane; /* [n * TALLY__SIM_LANES] */
    tally__sim_pmsg *msg;
    long nmsg, cap;
} tally__sim_prog;

/* Makes room for `need` elements of `each` bytes in *buf (capacity *cap, doubled as it grows); 0, or
 * -1 out of memory (*buf untouched). */
int tally__sim_grow(void **buf, long *cap, long need, size_t each);

int tally__sim_prog_init(tally__sim_prog *p, int n);
void tally__sim_prog_free(tally__sim_prog *p);
/* Appends sched's steps to rank's lane, each peer k mapped to world rank map_base + k x map_stride; the
 * first appended step also waits for (dep_lane, dep_step) when dep_lane >= 0 and computes `lead`
 * seconds first (a call's overhead). Returns the index of the last step appended (-1 when sched had
 * none), or -2 out of memory. */
long tally__sim_prog_append(tally__sim_prog *p, int rank, int lane, const tally__sim_sched *s, int map_base,
                            int map_stride, int dep_lane, long dep_step, double lead);
/* Numbers the messages of every pair in program order (seq); call once, after the last append. */
int tally__sim_prog_seal(tally__sim_prog *p);
/* Plays the program; r's seconds, utilisation, critical path and counts are set. */
int tally__sim_event_run(const tally__sim_cluster *c, const tally__sim_prog *p, tally__sim_result *r);

/* ---- the symmetric fast path ---- */

/* A level of the layout: its rank k of copy i is world rank k x stride_k + i x stride_i. */
typedef struct tally__sim_level {
    int n, copies, stride_k, stride_i;
} tally__sim_level;

/* Seconds of a collective whose traced schedule every rank of the level runs alike (each rank's peers
 * at the same offset, or the same xor distance), all copies at once, step by step; r's utilisation
 * (summed: divide by the time) and steps are added to. TALLY_E_INVALID when the schedule is not
 * symmetric. */
int tally__sim_fast(const tally__sim_cluster *c, const tally__sim_level *lv, int algo, int coll, size_t bytes,
                    tally_dtype t, double *seconds, tally__sim_result *r);

/* ---- where things sit ---- */

static inline int tally__sim_host(const tally__sim_cluster *c, int rank) { return rank / c->per_host; }
static inline int tally__sim_leaf(const tally__sim_cluster *c, int host) {
    return c->fabric == TALLY__SIM_FAT_TREE ? host / c->hosts_per_leaf : 0;
}
static inline int tally__sim_leaves(const tally__sim_cluster *c) {
    return c->fabric == TALLY__SIM_FAT_TREE ? (c->hosts + c->hosts_per_leaf - 1) / c->hosts_per_leaf : 1;
}
static inline int tally__sim_cores(const tally__sim_cluster *c) {
    if (c->cores > 0) return c->cores;
    return c->shared_cores ? c->per_host * c->hosts : c->per_host;
}
/* Seconds from both sides' posts to the first byte of a message inside a host. Crowded, the awaited rank
 * may be asleep behind the ranks its core runs besides: the wake-up measured with two ranks on one CPU
 * (one rank too many) comes once per rank more than the cores (this machine: 3, 4 and 8 ranks on 2
 * CPUs wait 1.0, 2.1 and 5.5 wake-ups a round, bench/sim_validate.sh). */
static inline double tally__sim_wake(const tally__sim_cluster *c) {
    int cores = tally__sim_cores(c), ranks = c->shared_cores ? c->per_host * c->hosts : c->per_host;
    return ranks > cores ? c->crowded_alpha * (ranks - cores) : 0;
}
static inline double tally__sim_shm_alpha(const tally__sim_cluster *c) {
    double wake = tally__sim_wake(c);
    return wake > c->shm.alpha ? wake : c->shm.alpha;
}
/* A message inside a host: `own` seconds its copy takes a core alone, `shared` what it takes with the
 * copies that share its cores. Crowded, a waiter sleeps through the wake-up and then copies on a core the
 * ranks it waited for have left, while those cores run the other ranks' copies: the message ends at the
 * later of the wake-up and its own copy, or of the shared copies after shm's latency. Adding the wake-up
 * to the shared copies predicted 4 and 8 ranks on 2 CPUs 1.3-1.7x too slow from 16 to 256 KiB
 * (bench/sim_validate.sh); uncrowded, the shared copies end last and this is latency plus copy. */
static inline double tally__sim_shm_time(const tally__sim_cluster *c, double own, double shared) {
    double woken = tally__sim_shm_alpha(c) + own, flowed = c->shm.alpha + shared;
    return woken > flowed ? woken : flowed;
}
/* The same between hosts: the wire's latency, and the wake-up where the ranks are crowded. */
static inline double tally__sim_net_alpha(const tally__sim_cluster *c) { return c->nic_alpha + tally__sim_wake(c); }
/* The CPU link of a host's ranks (all hosts share one with shared_cores). */
static inline int tally__sim_cpu_of(const tally__sim_cluster *c, int host) { return c->shared_cores ? 0 : host; }
/* Capacity of a link of this kind: cores for CPU, bytes/s for the others. */
double tally__sim_capacity(const tally__sim_cluster *c, int kind);

#endif
