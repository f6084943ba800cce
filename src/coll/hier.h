/* hier.h - collectives by level when ranks span hosts: a reduce-scatter inside each host (its own
 * communicator: shm), an allreduce of each shard with the same local rank on the other hosts (tcp), an
 * all-gather inside the host; as NCCL, Horovod's hierarchical allreduce and Open MPI's han do. */
#ifndef TALLY_COLL_HIER_H
#define TALLY_COLL_HIER_H

#include <stddef.h>
#include <tally.h>

#include "coll.h"

typedef struct tally__hier {
    tally_comm *host;  /* this rank's host: rank = local index (the world's: freed with it) */
    tally_comm *cross; /* the ranks of this local index on every host: rank = host index */
    int hosts, per_host, local, host_index;
    int *world_of;                     /* [hosts * per_host]: the world rank of (host h, local i) at h * per_host + i */
    tally__cost host_cost, cross_cost; /* agreed over the world: the slowest host's, the slowest link's */
    tally__cost cross_busy;            /* cross_cost as the shards meet it: all per_host of them at once on the
                                        * host's one link, so its beta per_host times over */
    void *tmp;                         /* scratch for the shard and the reordered blocks */
    size_t tmp_bytes;
} tally__hier;

/* Sets h->cross_busy from h->cross_cost (after either is set). */
void tally__hier_share_link(tally__hier *h);
/* Each rank's host index and local index from the peer table (hosts in order of their first rank,
 * local ranks in world order); the number of hosts (-1 out of memory), and the ranks per host when
 * every host has the same number (else 0). The layout has levels with two or more hosts and two or
 * more ranks per host. */
struct tally__peer;
int tally__hier_layout(const struct tally__peer *p, int size, int *host, int *local, int *per_host);
/* Takes the world's host communicator (host: a split of world by host, ranked in world order; the
 * world frees it), makes the cross communicators (collective over world) and agrees the two levels'
 * cost figures; *out NULL when the layout has no levels. */
int tally__hier_init(tally_comm *world, const struct tally__boot *boot, tally_comm *host, tally__hier **out);
void tally__hier_free(tally__hier *h);
/* h as the world's dispatch calls it (coll.h's tally__levels). */
tally__levels tally__hier_levels(tally__hier *h);
/* Predicted seconds (tally__algo_cost's convention for bytes) with each level's cheapest algorithm, a
 * pipelined allreduce's levels overlapped chunk by chunk as hier.c runs them; HUGE_VAL for what has no
 * hierarchical form (broadcast, barrier). */
double tally__hier_cost(const tally__hier *h, int coll, size_t bytes);
/* One step of a hierarchical collective as the model sees it: which collective on which level, its
 * ranks and bytes (tally__algo_cost's convention), the cheapest algorithm there and its seconds (all 0
 * and AUTO for a step the collective does not take). */
typedef struct tally__hier_step {
    int coll, n, algo;
    size_t bytes;
    const tally__cost *cost;
    double seconds;
} tally__hier_step;
/* The steps of coll on `bytes`: [0] in each host, [1] between hosts, [2] in each host again. */
void tally__hier_steps(const tally__hier *h, int coll, size_t bytes, tally__hier_step s[3]);
/* The level costs behind tally__hier_cost, for TALLY_DEBUG: "host rs 12.0 us + hosts allreduce ...", a
 * pipelined allreduce's for one chunk after the number of chunks. */
void tally__hier_explain(const tally__hier *h, int coll, size_t bytes, char *buf, size_t n);

/* How an allreduce is cut, shared by hier.c and the simulator (src/sim) so both run one schedule: a
 * vector of M x q elements (M ranks per host) of TALLY__HIER_PIPE_MIN_BYTES or more goes in
 * tally__hier_chunks chunks of M x shard elements (shard = ceil(q / chunks), the last shorter). The host
 * level's calls then run in the order tally__hier_pipe_step gives (step k of 2 x chunks: chunk *chunk's
 * reduce-scatter, or with *gather its all-gather, which waits for that chunk's allreduce between hosts);
 * the level between hosts allreduces chunk j once the host has reduce-scattered it, in chunk order. */
#define TALLY__HIER_PIPE_MIN_BYTES  ((size_t)4 << 20)
#define TALLY__HIER_CHUNK_MIN_BYTES ((size_t)1 << 20)
#define TALLY__HIER_CHUNK_SECONDS   0.020
#define TALLY__HIER_CHUNKS_MIN      4
#define TALLY__HIER_CHUNKS_MAX      32
/* The chunks of an allreduce of `bytes` (0: not pipelined). Enough that each chunk's crossing takes about
 * TALLY__HIER_CHUNK_SECONDS by the model: the link waits for the first reduce-scatter and the last
 * all-gather, so on a slow link more chunks leave it idle less, while each chunk costs a call on both
 * levels and a hand-off between threads, which a fast link's short crossings would not hide. Every rank
 * agrees on the levels' costs, so every rank cuts alike. */
int tally__hier_chunks(const tally__hier *h, size_t bytes);
void tally__hier_pipe_step(int k, int chunks, int *gather, int *chunk);
/* Elements of chunk j's shard when q elements per rank are cut in chunks of `shard` (0 past the end). */
static inline size_t tally__hier_chunk_len(size_t q, size_t shard, int j) {
    size_t first = (size_t)j * shard;
    return first >= q ? 0 : q - first < shard ? q - first : shard;
}

/* The collectives, with the public calls' meaning (op AVG finished here: sums at both levels, one
 * division by the world's size). */
int tally__hier_allreduce(tally__hier *h, const void *send, void *recv, size_t count, tally_dtype t, tally_op op);
int tally__hier_reduce_scatter(tally__hier *h, const void *send, void *recv, size_t recvcount, tally_dtype t,
                               tally_op op);
int tally__hier_allgather(tally__hier *h, const void *send, void *recv, size_t sendcount, tally_dtype t);

#endif
