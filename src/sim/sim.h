/* sim.h - the cluster simulator behind `tally sim` and the planner's layouts that have no closed form: the
 * library's own algorithms traced message by message, played out on described links and ranks. */
#ifndef TALLY_SIM_SIM_H
#define TALLY_SIM_SIM_H

#include <stddef.h>
#include <tally.h>

#include "../coll/coll.h"

enum { TALLY__SIM_FULL, TALLY__SIM_FAT_TREE };               /* fabric between the hosts */
enum { TALLY__SIM_AUTO, TALLY__SIM_EVENT, TALLY__SIM_FAST }; /* how a collective is played out */

/* The links a flow can share: a host's CPUs (its ranks' shm copies and reductions), its NIC each way,
 * a leaf switch's uplinks each way (fat tree). */
enum { TALLY__SIM_CPU, TALLY__SIM_NIC_TX, TALLY__SIM_NIC_RX, TALLY__SIM_UP, TALLY__SIM_DOWN, TALLY__SIM_KINDS };
const char *tally__sim_kind_name(int kind); /* "cpu", "nic tx", ... */

#define TALLY__SIM_MAX_SLOW 64
typedef struct tally__sim_slow {
    int rank;
    double factor; /* its compute takes this many times the others' */
} tally__sim_slow;

/* A cluster on paper. Ranks fill hosts in turn (rank = host x per_host + local), as `tally run` and
 * Slurm's block distribution place them. */
typedef struct tally__sim_cluster {
    int hosts, per_host;
    int cores;       /* CPUs per host, shared by its ranks' shm copies and reductions (0: one per rank) */
    tally__cost shm; /* inside a host: alpha per message, beta per byte copied, gamma per byte reduced */
    /* shm's beta above is a large vector's, measured at beta_bytes (its bytes going through memory);
     * vectors of at most cache_bytes copy at cache_beta (cache-resident), and sizes between take beta
     * interpolated in log size. cache_bytes 0: beta for every size. */
    double beta_bytes, cache_beta, cache_bytes;
    double call_s;        /* what a collective call costs a rank before its first message (the library's
                           * entry: fingerprint, choice, bookkeeping), each level's call too */
    double crowded_alpha; /* where a host's ranks outnumber its cores, waiters sleep (the library's crowded
                           * policy): a message waits this long for a wake-up per rank more than the cores */
    double nic_rate;      /* bytes/s of each host's NIC, each way */
    double nic_payload;   /* the share of that rate a collective's bytes get: frames' headers take the rest
                           * (TCP over Ethernet at MTU 1500: 1448 of 1538 bytes on the wire) */
    double nic_alpha;     /* seconds per message between hosts: wire, switches and the tcp stack */
    double tcp_cpu;       /* core-seconds the tcp stack spends per byte at each end (0: none, as RDMA) */
    int shared_cores;     /* 1: every host's ranks share one pool of `cores` (test hosts: namespaces on
                           * one kernel); 0: each host has its own */
    int fabric;           /* TALLY__SIM_FULL (full bisection) or TALLY__SIM_FAT_TREE */
    int hosts_per_leaf;   /* fat tree: hosts under one leaf switch */
    double oversub;       /* fat tree: a leaf's host links over its uplinks (1: full bisection) */
    double compute_sd;    /* training: each rank's compute per step varies by this fraction (normal) */
    int nslow;
    tally__sim_slow slow[TALLY__SIM_MAX_SLOW];
    unsigned long long seed; /* of the compute draws */
} tally__sim_cluster;

/* 1 host of 2 ranks with the library's default links, 25 Gbit/s NICs, full bisection. */
void tally__sim_cluster_default(tally__sim_cluster *c);
/* One setting by the name of its flag without "--": hosts, ranks-per-host, cores, shared-cores,
 * shm-latency, shm-bandwidth, shm-bandwidth-bytes, cache-bandwidth, cache-bytes, reduce-bandwidth,
 * call-overhead, crowded-latency, tcp-bandwidth, nic, nic-latency, fabric, hosts-per-leaf, oversub,
 * compute-sd, slow (RANK:FACTOR, once per slow rank), seed. 0, 1 when the key is not a cluster's, or
 * TALLY_E_INVALID naming key and value. */
int tally__sim_cluster_set(tally__sim_cluster *c, const char *key, const char *value);
/* A file of "key = value" lines (# starts a comment) through tally__sim_cluster_set, read whole (at most
 * 1 MiB, checked before it is read); TALLY_E_INVALID naming the file, the line and the key for a line it
 * cannot take; the open's own error (tally__file_open_read) when it cannot be opened. */
int tally__sim_cluster_read(tally__sim_cluster *c, const char *path);
/* Told each setting a cluster file made, in the file's order (key and value last only for the call), so
 * that a caller can set them again without reading the file again; nonzero when it has no memory for them. */
typedef int (*tally__sim_seen)(void *ctx, const char *key, const char *value);
/* tally__sim_cluster_read, handing each setting it made to seen; TALLY_E_NOMEM naming the line where seen
 * fails. */
int tally__sim_cluster_read_seen(tally__sim_cluster *c, const char *path, tally__sim_seen seen, void *ctx);
/* 0, or TALLY_E_INVALID naming the setting out of range (the layout, a slow rank past the world). */
int tally__sim_cluster_check(const tally__sim_cluster *c);
/* c as it plays a collective of `bytes`: shm's beta at that size (beta_bytes, cache_bytes). */
tally__sim_cluster tally__sim_at_size(const tally__sim_cluster *c, double bytes);
/* Bytes/s of data through one NIC each way: its rate less the frames' headers (nic_payload). */
double tally__sim_nic_bytes(const tally__sim_cluster *c);
/* The link costs the library would measure and pick algorithms by: inside a host, and between hosts
 * (the NIC's latency and data rate; reductions on the ranks). */
tally__cost tally__sim_net_cost(const tally__sim_cluster *c);

typedef struct tally__sim_coll {
    int coll;          /* TALLY__ALLREDUCE, _REDUCE_SCATTER, _ALLGATHER, _BROADCAST, _BARRIER */
    int algo;          /* TALLY__ALGO_* ; AUTO picks as the library does (HIER where the layout has levels) */
    size_t bytes;      /* allreduce, broadcast: the vector; reduce-scatter, all-gather: all blocks together */
    tally_dtype dtype; /* of the elements the algorithms cut at */
    int root;
    int method; /* TALLY__SIM_AUTO: event level while it stays under TALLY__SIM_EVENT_MAX messages */
} tally__sim_coll;

#define TALLY__SIM_EVENT_MAX 2000000L

typedef struct tally__sim_result {
    double seconds;
    double algbw, busbw; /* bytes/s: bytes / seconds, and NCCL's bus bandwidth (x 2(n-1)/n for allreduce) */
    int algo, method;    /* what was played out and how */
    int level_algo[2];   /* hier: the algorithm in each host and between hosts */
    /* Of each kind of link, the busiest one: the part of the collective's time x capacity it carried,
     * and which (host or leaf); -1 when no flow used that kind. */
    double util[TALLY__SIM_KINDS];
    int util_at[TALLY__SIM_KINDS];
    /* The critical path: the chain of messages and waits that ends last. The link it spent most time
     * on, the rank it waited for most (-1: every rank alike), and their shares of the time. */
    int crit_kind, crit_at, crit_rank;
    double crit_link_share, crit_rank_share;
    long messages, steps; /* messages played out (all ranks), steps of the busiest rank */
} tally__sim_result;

/* Plays one collective on the cluster. 0, or TALLY_E_INVALID saying why it cannot (an algorithm the
 * layout has not, a layout too large for the event level and not symmetric for the fast path). */
int tally__sim_collective(const tally__sim_cluster *c, const tally__sim_coll *q, tally__sim_result *r);

/* A training step: compute (one micro-batch's forward and backward: a third forward), the gradient's
 * collectives as the engines post them, the update; sync (stage 0-3) or async (a parameter server). */
typedef struct tally__sim_train {
    double grad_bytes;   /* S: the gradient (fp32: 4 x parameters) */
    double bucket_bytes; /* stage 0's buckets (the last shorter) */
    int nlayers;         /* ZeRO 2-3 run their collectives per layer (all alike here) */
    int zero, accum;
    double compute_s;   /* forward + backward of one micro-batch on a rank at factor 1 */
    double update_s;    /* the optimizer over the whole model on one rank (ZeRO 1-3 update a 1/N shard) */
    int async;          /* parameter server on rank 0's host, the other ranks working */
    int staleness;      /* async: SSP bound */
    int local_steps;    /* > 0: local SGD, each rank steps alone and every H steps all average the parameters */
    double outer_ratio; /* local SGD: the averaged change's bytes over f32's (1, fp16 0.5, int8 0.25; 0: 1) */
    int steps;          /* played out; the result is their mean */
    int algo, method;   /* of the collectives */
} tally__sim_train;

typedef struct tally__sim_step {
    double step_s;                  /* mean over the steps */
    double compute_s;               /* the slowest rank's compute, mean */
    double comm_s;                  /* all collectives of a step, back to back */
    double exposed_s;               /* what the step waited on communication beyond compute */
    double samples_per_step_factor; /* async: gradients applied per step time, over N (1 for sync) */
    int pace_rank;                  /* the rank whose compute set the pace most often (-1: none slower) */
    double pace_share;              /* of the steps */
    int colls;                      /* collectives per step */
    tally__sim_result big;          /* the step's largest collective */
    size_t big_bytes;               /* and its bytes */
} tally__sim_step;

int tally__sim_train_step(const tally__sim_cluster *c, const tally__sim_train *t, tally__sim_step *r);

#endif
