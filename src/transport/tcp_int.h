/* tcp_int.h - what tcp.c (framing, exchange) and tcp_setup.c (the authenticated mesh) share:
 * the wire header, one connection per peer with its read-ahead buffer, and the transport object. */
#ifndef TALLY_TRANSPORT_TCP_INT_H
#define TALLY_TRANSPORT_TCP_INT_H

#include <stddef.h>
#include <stdint.h>

#include "../core/cpus.h"
#include "../core/sig.h"
#include "transport.h"

#define TALLY__TCP_MAGIC_DATA  0x314c4154u /* "TAL1" little-endian: a framed message */
#define TALLY__TCP_MAGIC_BYE   0x454c4154u /* "TALE": the peer freed its transport on purpose */
#define TALLY__TCP_MAGIC_HELLO 0x484c4154u /* "TALH": first bytes after authentication */
#define TALLY__TCP_MAGIC_WAIT  0x574c4154u /* "TALW": the sender is stalled in sig's collective (no payload) */
#define TALLY__TCP_MAGIC_FAULT 0x464c4154u /* "TALF": the sender's fault: code i32, culprit i32, message */
#define TALLY__TCP_FAULT_MAX   (8 + sizeof(((tally__fault *)0)->msg) - 1)

/* Every message on a data connection: this header, then exactly `len` payload bytes. Control frames
 * may come between messages (tcp_ctl.c): WAIT (len 0), the sender has made no progress for a while and
 * waits for rank `aux` - 1 (aux 0: it no longer waits), see tally__stall; FAULT, the fault that ended
 * the sender's collective, so a peer learns the cause even when the relay through rank 0 cannot run. */
typedef struct tally__tcp_hdr {
    uint32_t magic;
    uint32_t aux;   /* DATA: the sender's CPU + 1 (0 unknown), TALLY__TCP_AUX_SOLO; WAIT: see above; keeps sig
                     * 8-aligned */
    tally__sig sig; /* the sender's collective fingerprint */
    uint64_t len;   /* payload bytes that follow */
} tally__tcp_hdr;
_Static_assert(sizeof(tally__tcp_hdr) == 40, "the header is sent as is");
/* In a DATA header's aux: the payload follows on the pair's solo connection, not after this header. */
#define TALLY__TCP_AUX_SOLO (1u << 31)

/* Read-ahead buffer per connection: headers and small payloads arrive in one recv(); reducing
 * receives are staged here in cache-sized pieces. Sized so a piece stays in L2. */
#define TALLY__TCP_RB (256u * 1024u)

typedef struct tally__tcp_conn {
    int fd;                   /* -1 for ourselves */
    int bye;                  /* the peer said goodbye: its EOF is not a death */
    int broken;               /* an exchange failed mid-message: the stream is out of frame, say no goodbye */
    unsigned char *rb;        /* TALLY__TCP_RB bytes, allocated at setup */
    size_t rb_head;           /* first unconsumed byte */
    size_t rb_tail;           /* end of buffered bytes */
    uint64_t w_seq;           /* the peer's latest WAIT: the collective it waits in, */
    int w_peer;               /* whom it waits for (-1: none), */
    uint64_t w_at;            /* and when we read it (tally__now_ns) */
    int mid;                  /* a message of ours to this peer is partly sent: no control frame may cut in */
    unsigned char cout[1024]; /* control frames of ours the socket has not taken yet: they go out first */
    uint16_t cout_off, cout_len;
    int local;    /* the peer is on our host (the CPU it sends from means something here) */
    uint32_t cpu; /* the CPU + 1 the peer's latest message came from (header's aux), 0 unknown */
} tally__tcp_conn;

typedef struct tally__tcp_tp {
    tally__tp base;
    tally__tcp_conn *conns;    /* [size], indexed by peer rank */
    tally__tcp_conn *solo;     /* [size] or NULL: a second mesh that carries the higher rank's large payloads
                                * (their headers stay on conns); see tally__tcp_solo_mesh */
    struct tally__tcp_op *ops; /* scratch for one exchange: 2 * size entries */
    struct pollfd *pfds;       /* scratch: 2 * size + 1 entries */
    int *pfd_op;               /* which op (or -1 - peer for a watched idle peer) each pollfd serves */
    uint64_t spin_ns;          /* busy-poll time before sleeping in poll() */
    char *awaited;             /* scratch: [size], peers with a receive pending in this exchange */
    int stalled;               /* this exchange told the peers it waits (they must hear when it stops) */
    int fault_told;            /* our fault went out as FAULT frames */
    uint32_t mycpu;            /* our CPU + 1 at the start of this exchange (0 unknown): sent in aux */
    tally__crowding crowding;  /* yielding to a peer on our CPU since we last moved */
} tally__tcp_tp;

/* What a receiver expecting a `want`-byte message of the collective `mine` makes of the next header
 * on a data connection, decided before any of its payload is read (pure: the frame fuzzer calls it). */
enum {
    TALLY__TCP_HDR_OK,
    TALLY__TCP_HDR_BYE,
    TALLY__TCP_HDR_BAD_MAGIC,
    TALLY__TCP_HDR_MISMATCH,
    TALLY__TCP_HDR_BAD_LEN
};
int tally__tcp_hdr_judge(const tally__tcp_hdr *h, const tally__sig *mine, size_t want);
/* Where local peers run (tcp_cpu.c): 1 when `peer`, which we wait for, last sent from our CPU, so
 * spinning would keep it off; after 0.1 ms of that the higher rank moves to a CPU no peer uses. */
int tally__tcp_peer_here(tally__tcp_tp *t, int peer);
/* Control frames (tcp_ctl.c). Each goes only where our stream is between messages. */
int tally__tcp_ctl_flush(tally__tcp_conn *c);          /* 1 when no control bytes wait to go out */
void tally__tcp_tell_wait(tally__tcp_tp *t, int peer); /* we wait for `peer` (-1: for nobody any more) */
void tally__tcp_tell_fault(tally__tcp_tp *t);          /* our fault, once, if there is one */
/* Consumes the control frames at the head of peer's buffer. Returns the code of a FAULT adopted from
 * it (or of a malformed one), else 0. */
int tally__tcp_take_ctl(tally__tcp_tp *t, int peer);
/* 1 when peer's buffer starts with a control frame whose rest has not arrived. */
int tally__tcp_ctl_partial(const tally__tcp_conn *c);
/* Adopts a FAULT buffered from peer anywhere among its complete frames: why a peer that left, left.
 * Returns its code, or 0. */
int tally__tcp_scan_fault(tally__tcp_tp *t, int peer);
/* 1 if the frames buffered from a peer whose stream ended finish with a goodbye. */
int tally__tcp_ends_with_bye(const tally__tcp_conn *c);
/* tally__stall's view of rank r: whom its latest WAIT names, while fresh. */
int tally__tcp_awaits(void *arg, int r, uint64_t *seq);

/* The first bytes on a mesh connection after authentication: who the connector is. */
typedef struct tally__tcp_hello {
    uint32_t magic, rank, size, reserved;
} tally__tcp_hello;

/* A connector that does not finish authenticating within this long is dropped, so a stranger that
 * stalls cannot hold the mesh until the whole setup deadline. */
#define TALLY__TCP_AUTH_S 10.0

/* The accepting half of the mesh (tcp_accept.c): takes connections on lfd until every rank above ours
 * has authenticated with tok and named itself, into conns[rank].fd; strangers, wrong tokens and
 * duplicates are refused and logged without delaying the others. Every rank still expected has room
 * whatever the world size; strangers share a fixed number of slots more. TALLY_E_TIMEOUT past deadline,
 * TALLY_E_SYSTEM naming RLIMIT_NOFILE when accept() finds no descriptor for a rank, or the code of a
 * setup failure another rank reported (ctx->boot's watch; ctx->boot may be NULL). */
int tally__tcp_accept_peers(const tally__tp_ctx *ctx, const void *tok, size_t tlen, int lfd, tally__tcp_conn *conns,
                            uint64_t deadline);

/* A connection per rank (ours unused): no socket yet, a read-ahead buffer each; NULL when out of memory.
 * tally__tcp_conns_free frees the buffers and the array (the sockets are the caller's to close). */
tally__tcp_conn *tally__tcp_conns_new(const tally__tp_ctx *ctx);
void tally__tcp_conns_free(tally__tcp_conn *conns, int n);

/* Builds the mesh: one authenticated, non-blocking, TCP_NODELAY connection per pair of ranks, in
 * conns[peer].fd. Collective, ending when every rank has built its part; bounded by ctx->timeout_s. A
 * rank that fails tells the others, whose setup then fails at once with its message. On failure every
 * fd it opened is closed. */
int tally__tcp_mesh(const tally__tp_ctx *ctx, tally__tcp_conn *conns);

/* A payload of at least this many bytes that the higher rank of a pair on one host sends in an exchange
 * that also receives from that peer travels apart from its header, on the pair's solo connection (its
 * header says so: TALLY__TCP_AUX_SOLO). */
#define TALLY__TCP_SOLO_MIN (64u * 1024u)

/* When every rank is on this host, and they are few: a second mesh, into solo[peer] (allocated here,
 * buffers included), that carries only the higher rank's large payloads to the lower one in a swap,
 * where both send to each other at once; the lower rank's go on the first mesh with every header. On
 * loopback the kernel hands a segment to its receiver on the sender's CPU, but one that arrives while
 * the receiver holds the socket in its own send waits for that send to end and is processed there
 * (measured: a 2-rank 1 MiB allreduce 14% faster at the median with a connection each way).
 * Collective; *solo stays NULL (and 0 is returned) where the world spans hosts, is larger, or some rank
 * has no descriptors to spare. */
int tally__tcp_solo_mesh(const tally__tp_ctx *ctx, tally__tcp_conn **solo);

#endif
