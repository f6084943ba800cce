/* coll.h - what the collective algorithms see: a rank, a size, a transport; their ids and names, and the
 * cost model that picks one (each algorithm itself is a descriptor in its own file: algo.h). */
#ifndef TALLY_COLL_COLL_H
#define TALLY_COLL_COLL_H

#include <stddef.h>
#include <stdint.h>
#include <tally.h>
#include "../transport/transport.h"
#include "../core/alloc.h"

/* Algorithm ids, as fingerprints carry them (sig.algo; every rank runs one build, so ids agree) and
 * TALLY_ALGO names them. The flat algorithms are algos.c's table (algo.h): id k is its k-th line, so the
 * first four keep the numbers named here, which code and tests use; a new one needs no constant. Auto
 * and hier stand outside the table. Records (flight.c) and flags store names, never ids. */
enum {
    TALLY__ALGO_AUTO = 0, /* the cost model picks */
    TALLY__ALGO_RING = 1,
    TALLY__ALGO_TREE = 2,
    TALLY__ALGO_RHD = 3,
    TALLY__ALGO_DIRECT = 4,
    TALLY__ALGO_HIER = 255 /* by level, over the hosts' and the links' communicators (hier.h); past every id */
};

typedef struct tally__ctx {
    int rank, size;
    tally__tp *tp;
    uint64_t *sent;          /* payload bytes this rank has sent, or NULL: what tally_comm_bytes_sent reports */
    tally__scratch *scratch; /* the communicator's, kept between calls (NULL: malloc's each time) */
} tally__ctx;

/* One exchange on the context's transport (see transport.h for the rules). */
static inline int tally__xchg(const tally__ctx *c, const tally__send *s, int ns, const tally__recv *r, int nr) {
    if (c->sent)
        for (int i = 0; i < ns; i++) *c->sent += s[i].len;
    return c->tp->ops->exchange(c->tp, s, ns, r, nr);
}

/* An exchange of a single send, or of a single (optionally reducing) receive. */
static inline int tally__send_one(const tally__ctx *c, int peer, const void *buf, size_t len) {
    tally__send s = {.peer = peer, .buf = buf, .len = len};
    return tally__xchg(c, &s, 1, NULL, 0);
}
static inline int tally__recv_one(const tally__ctx *c, int peer, void *dst, const void *src, size_t len, tally_dtype t,
                                  tally_op op) {
    tally__recv r = {.peer = peer, .dst = dst, .src = src, .len = len, .dtype = t, .op = op};
    return tally__xchg(c, NULL, 0, &r, 1);
}

/* Rank 0 receives every rank's `bytes`-long block into recv, rank-major (its own copied from send
 * unless in place); the other ranks send theirs. */
int tally__gather_to_root(const tally__ctx *c, const void *send, void *recv, size_t bytes);

/* ceil(log2 n) rounds after which every rank has heard from every other in this collective (agree.c):
 * the dissemination barrier, and what a broadcast, whose data flows one way, adds so that no rank returns
 * 0 while another called something else. With bytes > 0 the root's `bytes` at buf reach every rank in the
 * same rounds (a binomial broadcast); bytes 0 moves no data (buf may be NULL). */
int tally__agree(const tally__ctx *c, void *buf, size_t bytes, tally_dtype t, int root);
/* The same rounds with data of the caller's riding in them: before the exchange of the round of distance
 * m, ride may point s at what this rank sends to rank + m (give: it is a binomial parent of that rank,
 * virtual rank a multiple of 2m) and r at where it takes what rank - m sends (take: virtual rank is m
 * modulo 2m, the round its subtree [v, v + m) of virtual ranks arrives). Both start as empty messages. */
typedef void (*tally__ride_fn)(void *arg, int m, int give, int take, tally__send *s, tally__recv *r);
int tally__agree_ride(const tally__ctx *c, tally__ride_fn ride, void *arg, tally_dtype t, int root);

/* The alpha-beta-gamma model of DESIGN.md, with parameters measured on the links in use. */
typedef struct tally__cost {
    double alpha; /* seconds per message */
    double beta;  /* seconds per byte on a link */
    double gamma; /* seconds per byte reduced */
    /* Ranks of a host that cross its one link to other hosts at once (0 or 1: none share it). rhd and
     * the tree pair each rank with ranks of other hosts in the same rounds, so their bytes there go that
     * many to the link; the ring, in world order, crosses each host boundary once a step. tally sim
     * found the flat model blind to it: flat rhd picked over hier at 16 x 8 took 7.5x as long. */
    int share;
    /* Receivers of one rank's blocks of pull_min bytes or more copy them side by side, up to `pull` at
     * once (the transport's: shm reading in place); 0 or 1: a root's blocks move one after another. */
    int pull;
    size_t pull_min;
    /* The CPUs every rank shares when they are all on one host and outnumber them (0: not crowded): the
     * copies of all ranks then take turns on these, so an algorithm that moves more bytes in all takes
     * longer even where its rounds are fewer. */
    int cpus;
} tally__cost;

/* The model's parameters as this communicator measured them at init (for tally plan --calibrate). */
const tally__cost *tally__comm_cost(const tally_comm *c);
/* Its config's timeout (TALLY_TIMEOUT): what the parts built on it wait at most. */
double tally__comm_timeout_s(const tally_comm *c);
/* Point-to-point (p2p.c): the communicator's post office, and a call in flight holding the communicator
 * (so an abort on another thread frees it only once the call has left; release returns rc, its message
 * naming world ranks in a split). */
struct tally__po;
struct tally__po *tally__comm_po(const tally_comm *c);
void tally__comm_hold(tally_comm *c);
int tally__comm_release(tally_comm *c, int rc);

/* The process a communicator or request was made in: a forked child inherits both, but their threads,
 * connections and shared segments are the parent's, and a child that used them would take the parent's
 * place in its collectives. Every public call on one checks it first (one load, no system call) and a
 * child gets TALLY_E_INVALID at once, the parent's state left untouched. */
typedef struct tally__proc {
    unsigned gen; /* the process's fork generation, bumped in each child (pthread_atfork) */
    int pid;      /* for the message */
} tally__proc;
/* Stamps p with this process (the first stamp installs the fork handler). */
void tally__proc_stamp(tally__proc *p);
/* 0 in the process p was stamped in; else TALLY_E_INVALID, its message naming fn, what ("communicator",
 * "request") and both processes. */
int tally__proc_foreign(const tally__proc *p, const char *fn, const char *what);
/* tally__proc_foreign for c (0 when c is NULL). */
int tally__comm_foreign(const tally_comm *c, const char *fn);

/* A communicator from a rendezvous described by env rather than by a config (tally_comm_split), with
 * parent's config; world (malloc'd, taken over, freed with it even on failure) holds each rank's rank in
 * the world, which its error messages name beside its own. Collective over env's ranks. */
struct tally__boot_env;
int tally__comm_create(const tally_comm *parent, const struct tally__boot_env *env, int *world, tally_comm **out);
/* The config c was made with (checked; a split's is its parent's). */
const tally_config *tally__comm_config(const tally_comm *c);
const struct tally__boot *tally__comm_boot(const tally_comm *c);
/* 1 when c's waiters yield rather than spin (this rank's kernel has more ranks than CPUs). */
int tally__comm_crowded(const tally_comm *c);
/* The world rank of c's rank `rank` (rank itself for a communicator of the world). */
int tally__comm_world_rank(const tally_comm *c, int rank);

/* A communicator's levels (hier.c) as its dispatch calls them. The world's init (world.c), above both,
 * makes and installs them, so comm.c names none of hier.c's symbols. */
typedef struct tally__levels {
    void *h;
    double (*cost)(const void *h, int coll, size_t bytes); /* HUGE_VAL: the collective has no levels */
    void (*explain)(const void *h, int coll, size_t bytes, char *buf, size_t n);
    int (*allreduce)(void *h, const void *send, void *recv, size_t count, tally_dtype t, tally_op op);
    int (*reduce_scatter)(void *h, const void *send, void *recv, size_t recvcount, tally_dtype t, tally_op op);
    int (*allgather)(void *h, const void *send, void *recv, size_t sendcount, tally_dtype t);
    void (*release)(void *h, int abandon); /* abandon: the world was aborted, so are they (no goodbyes) */
} tally__levels;
/* The world communicator without levels, from a checked config: tally_comm_init_config's first part
 * (collective). */
int tally__comm_make_world(const tally_config *cfg, tally_comm **out);
/* Gives c its levels (released with c); c's faults are recorded in the two level communicators' too,
 * and the flat model takes the link between hosts' alpha and beta where they are the larger, shared by
 * the `share` ranks of each host (tally__cost's share). */
void tally__comm_set_levels(tally_comm *c, const tally__levels *l, tally_comm *host, tally_comm *cross, double alpha,
                            double beta, int share);
/* c keeps host (its host communicator, a split of c) and frees it with itself, after its monitor and
 * levels; c's faults are recorded in host's too, so host's waits end with them. */
void tally__comm_keep_host(tally_comm *c, tally_comm *host);
/* Replaces c's tcp transport by shm+tcp: shm (the kept host communicator's) to the ranks with
 * local_of[r] >= 0, tcp to the others. Not collective. */
int tally__comm_mix_transport(tally_comm *c, const int *local_of);
/* The algorithm c's config forces (TALLY_ALGO; TALLY__ALGO_AUTO when none). */
int tally__comm_forced_algo(const tally_comm *c);
/* What the bodies of the rooted and all-to-all calls (rooted.c) share with comm.c's: c's context; the
 * checks of the arguments every collective takes and of the communicator's health (fn names the call);
 * a buffer NULL with count > 0 refused; the fingerprint stamped and the algorithm chosen (returned) for
 * the call about to start, on `bytes` as tally__algo_cost counts them; a call with nothing to move meeting
 * its peers through the chosen algorithm's barrier; the error of an algorithm without the collective. */
const tally__ctx *tally__comm_ctx(const tally_comm *c);
int tally__comm_check(tally_comm *c, const char *fn, size_t count, int dtype, int op);
int tally__comm_need_buf(const tally_comm *c, const char *fn, const char *what, const void *p, size_t count);
int tally__comm_begin(tally_comm *c, int coll, size_t count, int dtype, int op, int root, size_t bytes);
int tally__comm_empty(tally_comm *c, int algo);
int tally__comm_no_algo(const tally_comm *c, int coll);

/* The flat algorithms' ids run from 1 to tally__algo_count(), in the table's order (algos.c). */
int tally__algo_count(void);
/* The id after algo in the order auto, the flat ones, hier (-1 after hier): every algorithm but auto is
 * for (a = tally__algo_next(TALLY__ALGO_AUTO); a >= 0; a = tally__algo_next(a)). */
int tally__algo_next(int algo);
/* An id's name ("auto", a flat algorithm's, "hier"; "unknown" for others) and back (any case; -1 when
 * unknown). */
const char *tally__algo_name(int algo);
int tally__algo_parse(const char *name);
/* The names, for a message or a usage line: auto first and hier last where `with` says so, sep between
 * two and `last` before the final one: "auto, ring, tree, rhd, direct or hier". ALLREDUCE_ONLY leaves out
 * the flat algorithms without an allreduce (pairwise, bruck: all-to-all), for what weighs allreduces
 * (the planner). Returns buf. */
enum { TALLY__ALGO_WITH_AUTO = 1, TALLY__ALGO_WITH_HIER = 2, TALLY__ALGO_ALLREDUCE_ONLY = 4 };
const char *tally__algo_names(char *buf, size_t cap, int with, const char *sep, const char *last);
/* Predicted seconds for a collective of `bytes` (the full vector for allreduce, broadcast and reduce; the
 * per-rank block times size for reduce_scatter, allgather, gather, scatter and alltoall; 0 for alltoallv)
 * on n ranks. */
double tally__algo_cost(const tally__cost *m, int algo, int coll, int n, size_t bytes);
/* The cheapest algorithm by the model (never AUTO). Deterministic: equal inputs, equal choice. */
int tally__algo_choose(const tally__cost *m, int coll, int n, size_t bytes);
/* The same where the ranks also have levels whose collective is predicted to take by_level seconds
 * (HUGE_VAL: none): TALLY__ALGO_HIER when that is less than the cheapest flat algorithm's. */
int tally__algo_choose_levels(const tally__cost *m, double by_level, int coll, int n, size_t bytes);

#endif
