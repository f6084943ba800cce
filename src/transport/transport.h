/* transport.h - the one interface every backend implements: an exchange of point-to-point sends and
 * receives (optionally reducing on arrival), progressed together, bounded by the timeout. */
#ifndef TALLY_TRANSPORT_TRANSPORT_H
#define TALLY_TRANSPORT_TRANSPORT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <tally.h>
#include "../core/err.h"
#include "../core/sig.h"

struct tally__boot;

typedef struct tally__send {
    int peer;
    const void *buf;
    size_t len; /* bytes; 0 is a valid (header-only) message */
} tally__send;

typedef struct tally__recv {
    int peer;
    void *dst;
    const void *src; /* NULL: dst = incoming bytes. Else dst = src (op) incoming, elementwise. */
    size_t len;      /* bytes; must equal the matching send's len (else TALLY_E_PROTOCOL) */
    tally_dtype dtype;
    tally_op op; /* SUM, PROD, MIN or MAX when src != NULL */
} tally__recv;

/* What every backend is created with. `sig` points at the communicator's current collective
 * fingerprint: each message carries a copy and the receiver compares it with its own; when the
 * sequence numbers match and anything else differs, it raises TALLY_E_MISMATCH naming both sides. */
/* A stalled tcp wait, told to the ranks that share this host (shm+tcp): they cannot see tcp's WAIT
 * frames, and without it would take a host-mate that waits on another host for the one that holds
 * them up. tcp calls tell with the awaited rank as it tells its peers, and with -1 when the wait
 * ends; tell NULL: nobody listens. Set by mixed.c once the world's shm half exists. */
typedef struct tally__wait_note {
    void (*tell)(void *arg, int peer);
    void *arg;
} tally__wait_note;

typedef struct tally__tp_ctx {
    int rank, size;
    struct tally__boot *boot;
    tally__fault *fault;
    double timeout_s;
    const tally__sig *sig;
    int crowded;             /* this host's ranks outnumber the CPUs their sets cover: waiters yield, not spin */
    int cpus;                /* the CPUs this host's ranks' sets cover together (0: unknown) */
    tally__wait_note *note;  /* NULL, or the communicator's: see tally__wait_note */
    _Atomic int *awaited;    /* NULL, or where the slow wait path leaves the peer it waits for (the flight
                             * recorder's; the communicator resets it at each collective) */
    const tally_config *cfg; /* the communicator's (shm reads shm_large and shm_cma); NULL: the defaults */
} tally__tp_ctx;

#define TALLY__TP_LARGE_MAX 200
typedef struct tally__tp tally__tp;

typedef struct tally__tp_ops {
    const char *name;
    /* Posts every send and receive and progresses them together; returns when all are complete (send
     * buffers reusable, receive buffers final). Messages between two ranks match in FIFO order.
     * Rules for callers: at most one send and one receive per peer in one exchange; no two reducing
     * receives of one exchange may write overlapping bytes; a recv's dst may equal its src (in place).
     * Returns 0, or the fault code (TALLY_E_PEER_LOST, _TIMEOUT, _MISMATCH, ...) once one is raised. */
    int (*exchange)(tally__tp *tp, const tally__send *s, int ns, const tally__recv *r, int nr);
    void (*destroy)(tally__tp *tp);
    /* Optional (NULL: comm.c hands out plain aligned memory): memory peers on this host can read in
     * place, 64-byte aligned, released by mem_free or destroy. mem_free returns TALLY_E_INVALID for a
     * pointer mem_alloc did not return. */
    void *(*mem_alloc)(tally__tp *tp, size_t bytes);
    int (*mem_free)(tally__tp *tp, void *ptr);
    /* With mem_alloc: marks ptr kept, so destroy leaves it mapped (tally_mem_keep; released then through
     * the registry of core/alloc.h). TALLY_E_INVALID for a pointer mem_alloc did not return. */
    int (*mem_keep)(tally__tp *tp, void *ptr);
} tally__tp_ops;

struct tally__tp {
    const tally__tp_ops *ops;
    tally__tp_ctx ctx;
    /* Set by tally_comm_abort before destroy: close at once, with no goodbye that could wait on a peer
     * (the peers learn of the abort from its fault). */
    int abandon;
    /* Messages to several peers in one exchange move side by side, each pair through channels of its
     * own with nothing to poll (shm): on a crowded host an algorithm's rounds may then go as one
     * exchange, which a rank progresses with whichever peer is running (pairwise.c). 0: one round at a
     * time is better (tcp: every extra socket costs the poll loop). */
    int fan_out;
    /* Receivers copy one sender's messages of pull_min bytes or more themselves, up to `pull` of them at
     * once (shm reading in place: the host's CPUs, the sender idle meanwhile); pull <= 1: a sender's
     * messages to several peers move one after another. The cost model reads it (tally__cost). */
    int pull;
    size_t pull_min;
    /* What large messages do on this transport and why, in words for summaries (tally_comm_large_path):
     * shm says which buffers are read in place and, where single-copy is off, what stopped it; "" where
     * there is nothing to choose (tcp, self). */
    char large[TALLY__TP_LARGE_MAX];
    /* Messages of mem_min bytes or more from mem_alloc's memory are read in place by the peers
     * (tally_comm_mem_min); 0 where none are (no mem_alloc, or in-place reads off). */
    size_t mem_min;
};

/* The rules above, checked (rules.c): TALLY_E_INVALID naming the backend and the bad send or receive. */
int tally__tp_check_rules(const tally__tp_ctx *ctx, const char *name, const tally__send *s, int ns,
                          const tally__recv *r, int nr);

/* A wait that lasted TALLY_TIMEOUT. The awaited rank may be waiting too, for a rank that waits in turn:
 * blaming the first one would name a bystander, and each rank would name another. Each backend tells,
 * from what the others published (shm: the segment; tcp: frames sent while stalled), whom a rank waits
 * for (in this collective, or in an earlier one it has not finished); the chain is followed to the rank
 * that is not waiting, which every rank then names. Published waits count while fresher than
 * TALLY__STALL_FRESH of the timeout: a rank stopped while it waited is then taken for not waiting. */
#define TALLY__STALL_MAX   1024 /* world sizes above this blame the awaited rank without following */
#define TALLY__STALL_FRESH 0.5  /* of the timeout: a wait published longer ago than this is over */
typedef struct tally__stall {
    int me, awaited, size;
    double timeout_s;
    const tally__sig *sig;
    const char *detail; /* what the awaited rank did not do: "did not send its part of <coll> to rank 0" */
    /* Whom `rank` waits for now (it published so within the freshness bound), and in which collective
     * (*seq; it may be behind or ahead of ours), or -1. NULL: unknown, blame the awaited rank. */
    int (*awaits)(void *arg, int rank, uint64_t *seq);
    void (*label)(void *arg, int rank, char *buf, size_t n); /* " (pid 123, host h)", or NULL */
    /* 1 when `rank` may wait on a link this backend cannot see (tcp: a rank of its host, over shm, in a
     * shm+tcp world; shm: a host-mate that said it waits over tcp): a rank there sees more, so its
     * verdict is awaited a moment first. NULL: never. */
    int (*hidden)(void *arg, int rank);
    void *arg;
} tally__stall;
/* Raises TALLY_E_TIMEOUT blaming the end of the chain (or the awaited rank when the chain loops) and
 * returns the fault's code. The message names the blamed rank first, then the collective. */
int tally__stall_raise(tally__fault *f, const tally__stall *s);

/* Backends. Each is collective over all ranks (uses the boot layer's bootstrap collectives). */
int tally__shm_create(const tally__tp_ctx *ctx, tally__tp **out);
int tally__tcp_create(const tally__tp_ctx *ctx, tally__tp **out);
/* The world across hosts (mixed.c): peers with local_of[peer] >= 0 share this host and are reached
 * through shm (rank = that local index; borrowed, its owner destroys it after this transport), the
 * others through tcp (taken over on success). The result has tcp's ctx (its fault, fingerprint and
 * world ranks); a fault shm meets is raised there, naming the world rank. shm NULL: no rank shares
 * this host. Not collective. */
int tally__mixed_create(tally__tp *tcp, tally__tp *shm, const int *local_of, tally__tp **out);
/* The shm half of a shm+tcp world: this rank waits over tcp (elsewhere 1, in the collective `seq`) or
 * no longer does (0), as its host-mates' stall reads it (tally__stall's hidden). */
void tally__shm_wait_elsewhere(tally__tp *shm, int elsewhere, uint64_t seq);
/* k tcp meshes (stripe.c), named "tcp" too: messages of 256 KiB and more to peers on other hosts go in k
 * stripes at once, one per mesh; k = 1 is the plain tcp transport. */
int tally__stripe_create(const tally__tp_ctx *ctx, int k, tally__tp **out);
#define TALLY__TCP_STREAMS_MAX 16 /* tally_config.tcp_streams' upper bound (TALLY_TCP_STREAMS) */
/* The world of one rank: exchanges are never called (every algorithm returns early for size 1). */
int tally__self_create(const tally__tp_ctx *ctx, tally__tp **out);

#endif
