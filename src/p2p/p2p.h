/* p2p.h - the post office: a communicator's point-to-point messages (tagged, matched by source or any,
 * in order per source and tag) over connections of its own, apart from the collectives' transport. */
#ifndef TALLY_P2P_P2P_H
#define TALLY_P2P_P2P_H

#include <stddef.h>
#include <tally.h>

#include "../core/err.h"

struct tally__boot;
typedef struct tally__po tally__po;

/* What a post office takes from its communicator. */
typedef struct tally__po_cfg {
    int rank, size;
    struct tally__boot *boot; /* the peer table, the token, and the bootstrap allgather of the ports */
    tally__fault *fault;      /* the communicator's: a fault fails every pending request */
    double timeout_s;         /* what a receive waits, and a send may take to hand its bytes off */
    int cma;                  /* large payloads to a peer on this host are read in place (process_vm_readv) */
} tally__po_cfg;

/* A request's end: rc 0 or a TALLY_E_* code, msg its message ("" on success), source the sender's rank
 * for a receive that succeeded (-1 otherwise). Called once per posted request, with no lock held, on the
 * post office's thread or on the thread that posted or freed. */
typedef void (*tally__po_done_fn)(void *arg, int rc, const char *msg, int source);

/* Opens the post office: listens on this rank's address and publishes the port (a bootstrap allgather:
 * collective, before the monitor starts). No thread yet: tally__po_start, once the monitor runs (the
 * thread polls the fault's wake-up, which the monitor makes). */
int tally__po_open(const tally__po_cfg *cfg, tally__po **out);
/* Starts the thread, which accepts and authenticates the peers' connections from then on: at creation,
 * not at the first point-to-point call, so a rank's send never waits for its peer's first call (rank 0
 * sends then meets rank 1 in a collective, before rank 1's receive). This rank's own connections are
 * made at its first message to each peer. 0, or TALLY_E_SYSTEM. */
int tally__po_start(tally__po *po);

/* Posts a send of count elements of t at buf (bytes handed off before done is called) to dst, or a
 * receive into buf from src (TALLY_ANY_SOURCE: any rank). Arguments are the caller's to check (ranks in
 * range, tag 0..TALLY_TAG_MAX, buf for count > 0, a valid dtype and count). 0: done will be called
 * (perhaps already has been); else the code, with this thread's message set, and done is never called. */
int tally__po_send(tally__po *po, const void *buf, size_t count, tally_dtype t, int dst, int tag,
                   tally__po_done_fn done, void *arg);
int tally__po_recv(tally__po *po, void *buf, size_t count, tally_dtype t, int src, int tag, tally__po_done_fn done,
                   void *arg);

/* The calling thread, which waits for a receive to set *done, reads the peers' messages itself until it
 * does (the thread's switch saved; one such driver at a time). 1 when *done was set or the post office is
 * shutting down, 0 when another thread drives or nothing runs: wait as usual then. */
int tally__po_drive(tally__po *po, _Atomic int *done);

/* Ends the traffic: abandon 0 (free) lets the pending sends finish, each within its timeout, and fails
 * the receives; abandon 1 (abort) fails them all at once. Then stops the thread and closes every
 * connection; later posts fail. Every done has been called when it returns. po may be NULL. */
void tally__po_shutdown(tally__po *po, int abandon);
/* Frees it (shut down first if it was not). po may be NULL. */
void tally__po_free(tally__po *po);

/* The port this rank's post office listens on (for tests that speak its protocol). */
int tally__po_port(const tally__po *po);

#endif
