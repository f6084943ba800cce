/* tcp_int.h - what tcp.c (framing, exchange) and tcp_setup.c (the authenticated mesh) share:
 * the wire header, one connection per peer with its read-ahead buffer, and the transport object. */
#ifndef TALLY_TRANSPORT_TCP_INT_H
#define TALLY_TRANSPORT_TCP_INT_H

#include <stddef.h>
#include <stdint.h>

#include "../core/sig.h"
#include "transport.h"

#define TALLY__TCP_MAGIC_DATA 0x314c4154u /* "TAL1" little-endian: a framed message */
#define TALLY__TCP_MAGIC_BYE 0x454c4154u  /* "TALE": the peer freed its transport on purpose */
#define TALLY__TCP_MAGIC_HELLO 0x484c4154u /* "TALH": first bytes after authentication */
#define TALLY__TCP_MAGIC_WAIT 0x574c4154u  /* "TALW": the sender is stalled in sig's collective (no payload) */

/* Every message on a data connection: this header, then exactly `len` payload bytes. A WAIT header
 * (len 0) may come between messages: the sender has made no progress for a while and waits for rank
 * `aux` - 1 (aux 0: it no longer waits); see tally__stall. */
typedef struct tally__tcp_hdr {
    uint32_t magic;
    uint32_t aux;      /* 0 except in WAIT; keeps sig 8-aligned */
    tally__sig sig;    /* the sender's collective fingerprint */
    uint64_t len;      /* payload bytes that follow */
} tally__tcp_hdr;
_Static_assert(sizeof(tally__tcp_hdr) == 40, "the header is sent as is");

/* Read-ahead buffer per connection: headers and small payloads arrive in one recv(); reducing
 * receives are staged here in cache-sized pieces. Sized so a piece stays in L2. */
#define TALLY__TCP_RB (256u * 1024u)

typedef struct tally__tcp_conn {
    int fd;             /* -1 for ourselves */
    int bye;            /* the peer said goodbye: its EOF is not a death */
    int broken;         /* an exchange failed mid-message: the stream is out of frame, say no goodbye */
    unsigned char *rb;  /* TALLY__TCP_RB bytes, allocated at setup */
    size_t rb_head;     /* first unconsumed byte */
    size_t rb_tail;     /* end of buffered bytes */
    uint64_t w_seq;     /* the peer's latest WAIT: the collective it waits in, */
    int w_peer;         /* whom it waits for (-1: none), */
    uint64_t w_at;      /* and when we read it (tally__now_ns) */
    unsigned char wout[40]; /* a WAIT of ours the socket took only part of: the rest goes out first */
    unsigned char wout_off, wout_len;
} tally__tcp_conn;

typedef struct tally__tcp_tp {
    tally__tp base;
    tally__tcp_conn *conns; /* [size], indexed by peer rank */
    struct tally__tcp_op *ops; /* scratch for one exchange: 2 * size entries */
    struct pollfd *pfds;       /* scratch: 2 * size + 1 entries */
    int *pfd_op;               /* which op (or -1 - peer for a watched idle peer) each pollfd serves */
    uint64_t spin_ns;          /* busy-poll time before sleeping in poll() */
    char *awaited;             /* scratch: [size], peers with a receive pending in this exchange */
    int stalled;               /* this exchange told the peers it waits (they must hear when it stops) */
} tally__tcp_tp;

/* Builds the mesh: one authenticated, non-blocking, TCP_NODELAY connection per pair of ranks, in
 * conns[peer].fd. Collective; bounded by ctx->timeout_s. On failure every fd it opened is closed. */
int tally__tcp_mesh(const tally__tp_ctx *ctx, tally__tcp_conn *conns);

#endif
