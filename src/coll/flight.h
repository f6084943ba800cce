/* flight.h - the flight recorder: each communicator's last K collectives (fingerprint, times, how each
 * ended, the peer it waited for), written to a directory when a collective fails for a peer, and the reader
 * that merges every rank's records into a verdict (the first sequence number where ranks diverge, the
 * rank that holds the job up). */
#ifndef TALLY_COLL_FLIGHT_H
#define TALLY_COLL_FLIGHT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/err.h"
#include "../core/sig.h"

#define TALLY__FLIGHT_MAX  65536 /* tally_config.flight_depth's upper bound (TALLY_FLIGHT) */
#define TALLY__FLIGHT_PATH 512

enum { TALLY__FL_RUNNING, TALLY__FL_DONE, TALLY__FL_FAILED };

typedef struct tally__flight_entry {
    tally__sig sig;
    uint64_t begin_ns, end_ns; /* CLOCK_REALTIME, so ranks' records line up (end 0: still running) */
    int32_t state;             /* TALLY__FL_* */
    int32_t rc;                /* the call's code when it failed */
    int32_t peer;              /* the peer the transport last waited for in this call, -1 none */
    int32_t culprit;           /* the rank the failure named, -1 none */
} tally__flight_entry;

typedef struct tally__flight {
    int on;                     /* 0: TALLY_FLIGHT=0 */
    tally__flight_entry *ring;  /* [cap] */
    size_t cap;                 /* entries kept */
    uint64_t n;                 /* entries written since init */
    int open;                   /* the newest entry is a call in flight */
    _Atomic int awaited;        /* the transports' slow wait path says whom it waits for (tp_ctx.awaited) */
    _Atomic int dumped;         /* written once: the first failure's records are the ones that explain it */
    _Atomic int written;        /* 0 not yet, 1 written, 1 + errno when the write failed */
    int rank, world_rank, size; /* world_rank: this rank in the world (a split's files name it so) */
    char label[48];             /* "world", or "comm<K>-<world rank of its rank 0>" for a split */
    char host[64];
    const char *transport;
    char path[TALLY__FLIGHT_PATH + 96]; /* the file it writes */
    char dir[TALLY__FLIGHT_PATH];
} tally__flight;

/* Sets f up for a communicator (rank of size; world_rank, first_world: this rank's and rank 0's rank in
 * the world; job: rank 0's host name and pid, the same on every rank, for the default directory; world:
 * 1 for a world communicator, whose default directory the process's later communicators share; depth:
 * entries kept, 0 none; dir: where to write, "" for the default). Out of memory leaves it off. Registers
 * it for the fatal-signal dump. */
void tally__flight_init(tally__flight *f, int rank, int size, int world_rank, int first_world, int world,
                        const char *job_host, int job_pid, int depth, const char *dir);
void tally__flight_set_transport(tally__flight *f, const char *name);
void tally__flight_fini(tally__flight *f);
/* A collective starts (its fingerprint stamped) and ends (rc 0, or its failure and the rank named). */
void tally__flight_begin(tally__flight *f, const tally__sig *sig);
void tally__flight_end(tally__flight *f, int rc, int culprit);
/* 1 for the codes whose records are written: a timeout, a lost peer, a mismatch, an abort. */
int tally__flight_wants(int rc);
/* "TIMEOUT", "PEER_LOST", "MISMATCH", "ABORTED", or "error" for another code. */
const char *tally__flight_reason(int rc);
/* Writes f's records (once: later calls do nothing) with why (a tally__flight_reason), the rank the
 * failure named and its message. 0, or -1 when the file could not be written (errno says why). */
int tally__flight_dump(tally__flight *f, const char *reason, int culprit, const char *msg);

/* ---- reading (tally flight) ---- */

typedef struct tally__flight_rank {
    int rank, world_rank, size;
    char label[48], host[64], transport[16], reason[32];
    int pid, culprit;
    char msg[768];
    uint64_t dumped_ns;
    tally__flight_entry *e; /* [n], in sequence order */
    size_t n;
} tally__flight_rank;

typedef struct tally__flight_set {
    tally__flight_rank *r; /* [n], by label then rank */
    size_t n;
} tally__flight_set;

/* Loads every *.flight file in dir. TALLY_E_INVALID naming a malformed file, TALLY_E_SYSTEM naming
 * the directory when it cannot be read; a directory with no records is an empty set. */
int tally__flight_load(const char *dir, tally__flight_set *s);
void tally__flight_set_free(tally__flight_set *s);

/* What the records of one communicator (a set's run of one label, in rank order as loaded) say. */
typedef struct tally__flight_verdict {
    int size;              /* the communicator's ranks */
    int missing;           /* ranks that left no record */
    uint64_t diverge_seq;  /* the first collective not every rank completed alike; 0: none found */
    int mismatch;          /* ranks called different collectives there */
    int holder;            /* the rank that holds the job up, -1 when the records cannot tell */
    int holder_recorded;   /* it left a record */
    int waiting_on_holder; /* ranks whose wait led to it */
    double holder_late_s;  /* how long after the first rank it began the collective (-1: it never did) */
} tally__flight_verdict;

void tally__flight_analyze(const tally__flight_rank *r, size_t n, tally__flight_verdict *v);
/* The entry of rank record r for sequence seq, or NULL. */
const tally__flight_entry *tally__flight_find(const tally__flight_rank *r, uint64_t seq);
const char *tally__flight_state_name(int state);

#endif
