/* po_out.c - this rank's connections to the peers it sends to: dialed without blocking by the first send,
 * authenticated and named step by step on the post office's thread, then the sends written in order (at
 * once on the poster's thread when the connection is idle, else by the thread as the socket takes them). */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "../boot/fdlimit.h"
#include "../boot/net.h"
#include "po_int.h"

/* Bytes a poster writes itself at most (a small message goes at once, without waking the thread), and
 * what one connection's event writes before the others get their turn. */
#define PO_POSTER_BYTES ((size_t)256 << 10)
#define PO_WRITE_BUDGET ((size_t)16 << 20)

static void po_out_append(tally__po_op **head, tally__po_op **tail, tally__po_op *op) {
    op->next = NULL;
    if (*tail)
        (*tail)->next = op;
    else
        *head = op;
    *tail = op;
}

void tally__po_out_break(tally__po *po, int peer, int rc, const char *why) {
    tally__po_out *o = &po->out[peer];
    if (o->state == PO_OUT_BROKEN) return;
    o->state = PO_OUT_BROKEN;
    o->err = rc;
    free(o->why);
    o->why = strdup(why);
    if (o->fd >= 0) {
        if (o->dead_fd >= 0) close(o->dead_fd); /* never polled: a connection breaks only once */
        o->dead_fd = o->fd;
        o->fd = -1;
    }
    while (o->head) {
        tally__po_op *op = o->head;
        o->head = op->next;
        tally__po_fail(po, op, rc, why);
    }
    o->tail = NULL;
    while (o->acking) {
        tally__po_op *op = o->acking;
        o->acking = op->next;
        tally__po_fail(po, op, rc, why);
    }
}

/* Words for a connection that failed at the socket: the peer gone, or the system. */
static void po_out_io_failed(tally__po *po, int peer, int rc, int err, const char *when) {
    char why[384];
    if (rc == TALLY_E_PEER_LOST)
        snprintf(why, sizeof why,
                 "rank %d closed its point-to-point connection %s (it exited, or freed or aborted the communicator)",
                 peer, when);
    else
        snprintf(why, sizeof why, "the point-to-point connection to rank %d failed %s: %s", peer, when, strerror(err));
    tally__po_out_break(po, peer, rc, why);
}

static void po_connect_failed(tally__po *po, int peer, int err) {
    char why[384], fds[256];
    int rc = TALLY_E_SYSTEM;
    if (err == ECONNREFUSED) {
        rc = TALLY_E_PEER_LOST;
        snprintf(why, sizeof why,
                 "rank %d's point-to-point listener refused the connection: its communicator is gone (it exited, or "
                 "freed or aborted it)",
                 peer);
    } else if (tally__fd_exhausted(err)) {
        tally__fd_explain(err, fds, sizeof fds);
        snprintf(why, sizeof why, "cannot open a connection to rank %d: %s", peer, fds);
    } else {
        snprintf(why, sizeof why, "cannot connect to rank %d at %s:%d: %s", peer, tally__boot_peers(po->boot)[peer].ip,
                 (int)po->ports[peer], strerror(err));
    }
    tally__po_out_break(po, peer, rc, why);
}

/* The first send to peer opens the connection: a non-blocking connect the thread then follows. */
static void po_dial(tally__po *po, int peer) {
    tally__po_out *o = &po->out[peer];
    const char *ip = tally__boot_peers(po->boot)[peer].ip;
    char port[16], why[384];
    snprintf(port, sizeof port, "%d", (int)po->ports[peer]);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV}, *ai = NULL;
    int gai = getaddrinfo(ip, port, &hints, &ai);
    if (gai) {
        snprintf(why, sizeof why, "cannot use rank %d's address %s: %s", peer, ip, gai_strerror(gai));
        tally__po_out_break(po, peer, TALLY_E_SYSTEM, why);
        return;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), err = errno;
    if (fd >= 0 && (tally__net_tune(fd) || (connect(fd, ai->ai_addr, ai->ai_addrlen) && errno != EINPROGRESS)))
        err = errno;
    else if (fd >= 0)
        err = 0;
    freeaddrinfo(ai);
    o->fd = fd;
    o->state = PO_OUT_CONNECTING;
    if (err) po_connect_failed(po, peer, err);
}

/* Payloads this long and more, to a peer that reads them in place, stay here until it acks. */
static int po_out_cma(const tally__po *po, const tally__po_out *o, size_t bytes) {
    return o->cma && bytes >= TALLY__PO_CMA_MIN && po->cma_wanted;
}

/* Writes the queued sends while the socket takes them, up to `budget` bytes (the others' turn, or the
 * poster's: a non-blocking send must not stream a large payload on its caller's time); a CMA send then
 * waits for its ack. Whether a send goes CMA is decided as its header is first written: the welcome,
 * which says whether the peer reads in place, may come after the first sends were queued. */
static void po_out_write(tally__po *po, int peer, size_t budget) {
    tally__po_out *o = &po->out[peer];
    while (o->state == PO_OUT_READY && o->head && budget > 0) {
        tally__po_op *op = o->head;
        if (op->off == 0 && po_out_cma(po, o, op->bytes)) {
            op->hdr.flags = TALLY__PO_CMA;
            op->hdr.addr = (uint64_t)(uintptr_t)op->sbuf;
        }
        size_t hl = sizeof op->hdr, pl = (op->hdr.flags & TALLY__PO_CMA) ? 0 : op->bytes;
        size_t poff = op->off > hl ? op->off - hl : 0;
        struct iovec iov[2];
        int n = 0;
        if (op->off < hl) iov[n++] = (struct iovec){(unsigned char *)&op->hdr + op->off, hl - op->off};
        if (pl > poff) iov[n++] = (struct iovec){(void *)(op->sbuf + poff), pl - poff < budget ? pl - poff : budget};
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t k = sendmsg(o->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (k < 0) {
            int err = errno;
            int lost = err == ECONNRESET || err == EPIPE || err == ENOTCONN;
            po_out_io_failed(po, peer, lost ? TALLY_E_PEER_LOST : TALLY_E_SYSTEM, err, "while this rank sent");
            return;
        }
        op->off += (size_t)k;
        budget -= (size_t)k < budget ? (size_t)k : budget;
        if (op->off < hl + pl) continue;
        o->head = op->next;
        if (!o->head) o->tail = NULL;
        if (op->hdr.flags & TALLY__PO_CMA) {
            tally__po_op **at = &o->acking;
            while (*at) at = &(*at)->next;
            op->next = NULL;
            op->acking = 1;
            *at = op;
        } else {
            tally__po_finish(po, op, 0, -1, NULL);
        }
    }
}

void tally__po_out_post(tally__po *po, tally__po_op *op) {
    tally__po_out *o = &po->out[op->peer];
    if (o->state == PO_OUT_BROKEN) {
        tally__po_fail(po, op, o->err, o->why ? o->why : "its connection broke earlier");
        return;
    }
    op->id = ++po->next_id;
    op->hdr = (tally__po_hdr){.magic = TALLY__PO_MAGIC_MSG,
                              .src = po->rank,
                              .tag = op->tag,
                              .dtype = (uint32_t)op->dtype,
                              .count = op->count,
                              .bytes = op->bytes,
                              .id = op->id};
    po_out_append(&o->head, &o->tail, op);
    if (o->state == PO_OUT_IDLE) {
        po_dial(po, op->peer);
        tally__po_wake(po); /* the thread follows the connection from here */
        return;
    }
    if (o->state != PO_OUT_READY || o->head != op) return; /* the thread writes it in its turn */
    po_out_write(po, op->peer, PO_POSTER_BYTES);
    if (o->head) tally__po_wake(po); /* the rest is the thread's */
}

/* Reads the acks of CMA sends; an end of stream is the peer gone. */
static void po_out_read(tally__po *po, int peer) {
    tally__po_out *o = &po->out[peer];
    for (;;) {
        int r = tally__po_io(o->fd, &o->ack, sizeof o->ack, &o->ack_got, 0);
        if (r == 0) return;
        if (r < 0) {
            po_out_io_failed(po, peer, r, errno, "");
            return;
        }
        o->ack_got = 0;
        tally__po_op *op = o->acking;
        if (o->ack.magic != TALLY__PO_MAGIC_ACK || !op || op->id != o->ack.id) {
            char why[256];
            snprintf(why, sizeof why, "rank %d sent a malformed acknowledgement on its point-to-point connection",
                     peer);
            tally__po_out_break(po, peer, TALLY_E_PROTOCOL, why);
            return;
        }
        o->acking = op->next;
        if (!o->ack.rc) {
            tally__po_finish(po, op, 0, -1, NULL);
            continue;
        }
        char why[256];
        snprintf(why, sizeof why, "rank %d could not read the payload in place: %s", peer, tally_strerror(o->ack.rc));
        tally__po_fail(po, op, o->ack.rc, why);
    }
}

/* The handshake's next step: 1 when it went on, 0 when it waits for the socket, -1 when it failed. */
static int po_out_step(tally__po *po, int peer) {
    tally__po_out *o = &po->out[peer];
    int out = o->state == PO_OUT_NONCE || o->state == PO_OUT_PROOF || o->state == PO_OUT_HELLO;
    int r = tally__po_io(o->fd, o->hs, o->hs_len, &o->hs_off, out);
    if (r <= 0) {
        if (r < 0) po_out_io_failed(po, peer, r, errno, "during its handshake");
        return r < 0 ? -1 : 0;
    }
    char why[384];
    size_t tlen;
    const void *tok = tally__boot_token(po->boot, &tlen);
    o->hs_off = 0;
    switch (o->state) {
    case PO_OUT_NONCE: o->state = PO_OUT_REPLY, o->hs_len = TALLY__AUTH_REPLY; return 1;
    case PO_OUT_REPLY:
        o->proved = tally__auth_connect_answer(&o->con, tok, tlen, TALLY__PO_ROLE, o->hs);
        if (o->proved < 0) {
            snprintf(why, sizeof why, "OpenSSL's HMAC failed authenticating rank %d", peer);
            tally__po_out_break(po, peer, TALLY_E_SYSTEM, why);
            return -1;
        }
        memcpy(o->hs, o->con.proof, TALLY__AUTH_PROOF);
        o->state = PO_OUT_PROOF, o->hs_len = TALLY__AUTH_PROOF;
        return 1;
    case PO_OUT_PROOF:
        if (!o->proved) {
            snprintf(why, sizeof why,
                     "rank %d's point-to-point listener did not prove it knows this job's token: every rank must "
                     "have the same TALLY_TOKEN",
                     peer);
            tally__po_out_break(po, peer, TALLY_E_AUTH, why);
            return -1;
        }
        o->state = PO_OUT_VERDICT, o->hs_len = 1;
        return 1;
    case PO_OUT_VERDICT:
        if (o->hs[0] != 1) {
            snprintf(why, sizeof why,
                     "rank %d refused this rank's proof of the token: every rank must have the same "
                     "TALLY_TOKEN",
                     peer);
            tally__po_out_break(po, peer, TALLY_E_AUTH, why);
            return -1;
        }
        tally__po_hello h = {.magic = TALLY__PO_MAGIC_HELLO,
                             .rank = (uint32_t)po->rank,
                             .size = (uint32_t)po->size,
                             .pid = (uint32_t)getpid(),
                             .pidns = po->pidns,
                             .probe_addr = (uint64_t)(uintptr_t)&po->probe,
                             .probe = po->probe};
        memcpy(o->hs, &h, sizeof h);
        o->state = PO_OUT_HELLO, o->hs_len = sizeof h;
        return 1;
    case PO_OUT_HELLO: o->state = PO_OUT_WELCOME, o->hs_len = 1; return 1;
    default: /* the welcome */
        o->cma = o->hs[0] & 1;
        o->state = PO_OUT_READY;
        return 1;
    }
}

/* The connection is up: the handshake's first step. */
static int po_out_connected(tally__po *po, int peer) {
    tally__po_out *o = &po->out[peer];
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(o->fd, SOL_SOCKET, SO_ERROR, &err, &len)) err = errno;
    if (err) {
        po_connect_failed(po, peer, err);
        return -1;
    }
    if (tally__auth_connect_begin(&o->con)) {
        tally__po_out_break(po, peer, TALLY_E_SYSTEM, "OpenSSL's RAND_bytes failed");
        return -1;
    }
    memcpy(o->hs, o->con.nonce, TALLY__AUTH_IN);
    o->state = PO_OUT_NONCE, o->hs_len = TALLY__AUTH_IN, o->hs_off = 0;
    return 0;
}

void tally__po_out_event(tally__po *po, int peer, short revents) {
    tally__po_out *o = &po->out[peer];
    if (o->state == PO_OUT_CONNECTING && po_out_connected(po, peer)) return;
    while (o->state > PO_OUT_CONNECTING && o->state < PO_OUT_READY)
        if (po_out_step(po, peer) <= 0) return;
    if (o->state != PO_OUT_READY) return;
    if (revents & (POLLIN | POLLHUP | POLLERR)) po_out_read(po, peer);
    po_out_write(po, peer, PO_WRITE_BUDGET);
}

short tally__po_out_events(const tally__po_out *o) {
    switch (o->state) {
    case PO_OUT_CONNECTING:
    case PO_OUT_NONCE:
    case PO_OUT_PROOF:
    case PO_OUT_HELLO: return POLLOUT;
    case PO_OUT_REPLY:
    case PO_OUT_VERDICT:
    case PO_OUT_WELCOME: return POLLIN;
    case PO_OUT_READY: return (short)(POLLIN | (o->head ? POLLOUT : 0));
    default: return 0;
    }
}

/* Why a send could not hand its bytes off in time. */
static void po_out_late(tally__po *po, int peer, const tally__po_op *op, char *why, size_t n) {
    const tally__po_out *o = &po->out[peer];
    size_t sent = op->off > sizeof op->hdr ? op->off - sizeof op->hdr : 0;
    if (o->state < PO_OUT_READY)
        snprintf(why, n,
                 "could not hand off its %zu bytes within %g s (TALLY_TIMEOUT): rank %d has not taken the "
                 "connection: its post office's thread did not answer (the process is hung or stopped)",
                 op->bytes, po->timeout_s, peer);
    else if (op->acking)
        snprintf(why, n, "rank %d did not read its %zu bytes within %g s (TALLY_TIMEOUT): it is hung or stopped", peer,
                 op->bytes, po->timeout_s);
    else
        snprintf(why, n,
                 "could not hand off its %zu bytes within %g s (TALLY_TIMEOUT): rank %d is not reading (hung or "
                 "stopped); %zu went",
                 op->bytes, po->timeout_s, peer, sent);
}

static void po_out_expire_one(tally__po *po, int peer, uint64_t now, uint64_t *next) {
    tally__po_out *o = &po->out[peer];
    char why[512];
    for (tally__po_op *a = o->acking; a; a = a->next) {
        if (a->deadline > now) {
            if (a->deadline < *next) *next = a->deadline;
            continue;
        }
        po_out_late(po, peer, a, why, sizeof why);
        tally__po_out_break(po, peer, TALLY_E_TIMEOUT, why); /* its payload may be being read */
        return;
    }
    tally__po_op *prev = NULL, *op = o->head, *after;
    for (; op; op = after) {
        after = op->next;
        if (op->deadline > now) {
            if (op->deadline < *next) *next = op->deadline;
            prev = op;
            continue;
        }
        po_out_late(po, peer, op, why, sizeof why);
        if (op->off > 0) { /* the stream is mid-message: it cannot carry another */
            tally__po_out_break(po, peer, TALLY_E_TIMEOUT, why);
            return;
        }
        if (prev)
            prev->next = after;
        else
            o->head = after;
        if (o->tail == op) o->tail = prev;
        tally__po_fail(po, op, TALLY_E_TIMEOUT, why);
    }
}

void tally__po_out_expire(tally__po *po, uint64_t now, uint64_t *next) {
    for (int r = 0; r < po->size; r++)
        if (po->out[r].head || po->out[r].acking) po_out_expire_one(po, r, now, next);
}

void tally__po_fail_sends(tally__po *po, int rc, const char *why) {
    for (int r = 0; r < po->size; r++)
        if (po->out[r].state != PO_OUT_IDLE) tally__po_out_break(po, r, rc, why);
}

int tally__po_sends_pending(const tally__po *po) {
    for (int r = 0; r < po->size; r++)
        if (po->out[r].head || po->out[r].acking) return 1;
    return 0;
}

void tally__po_out_reap(tally__po *po) {
    for (int r = 0; r < po->size; r++)
        if (po->out[r].dead_fd >= 0) {
            close(po->out[r].dead_fd);
            po->out[r].dead_fd = -1;
        }
}
