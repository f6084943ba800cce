/* po_in.c - the connections peers opened to this rank: accepted from the listener, each authenticated and
 * named step by step (a stranger or a slow handshake holds up no other), then its frames read: a header
 * judged before any payload, the payload straight into the receive's buffer or kept until one is posted. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../boot/fdlimit.h"
#include "../boot/net.h"
#include "../core/clock.h"
#include "../core/log.h"
#include "po_int.h"

/* An accepted connection that has not proved the token and named itself within this long is dropped. */
#define PO_AUTH_S 10.0
/* Accepted connections not yet named, beyond one per rank: strangers share these and no more. */
#define PO_STRANGERS 64
/* Payload bytes one connection's event reads at most before the others get their turn. */
#define PO_READ_BUDGET ((size_t)16 << 20)

void tally__po_accept(tally__po *po) {
    uint64_t now = tally__now_ns();
    for (;;) {
        int fd = -1;
        if (tally__net_accept(po->lfd, &fd)) {
            char why[256];
            tally__fd_explain(errno, why, sizeof why);
            tally__log_warn("rank %d: point-to-point: cannot accept a connection: %s", po->rank, why);
            po->accept_pause_until = now + 100000000u; /* the backlog keeps it meanwhile */
            return;
        }
        if (fd < 0) return;
        tally__po_in *in = po->n_ins < po->size + PO_STRANGERS ? calloc(1, sizeof *in) : NULL;
        if (!in) {
            tally__log_debug(1, "rank %d: point-to-point: %d connections wait to authenticate: one more refused",
                             po->rank, po->n_ins);
            close(fd);
            continue;
        }
        double limit = PO_AUTH_S < po->timeout_s ? PO_AUTH_S : po->timeout_s;
        *in = (tally__po_in){.fd = fd, .rank = -1, .state = PO_IN_NONCE, .hs_len = TALLY__AUTH_IN};
        in->auth_deadline = now + (uint64_t)(limit * 1e9);
        in->next = po->ins;
        po->ins = in;
        po->n_ins++;
    }
}

void tally__po_in_close(tally__po *po, tally__po_in *in, int rc, const char *why) {
    if (in->cur) tally__po_msg_lost(po, in->cur, rc, why);
    in->cur = NULL;
    tally__po_forget_from(po, in);
    if (in->rank >= 0 && po->in_of[in->rank] == in) {
        po->in_of[in->rank] = NULL;
        po->lost[in->rank] = rc;
        free(po->lost_why[in->rank]);
        po->lost_why[in->rank] = why ? strdup(why) : NULL;
        tally__po_fail_from(po, in->rank, rc, why);
    }
    close(in->fd);
    for (tally__po_in **at = &po->ins; *at; at = &(*at)->next)
        if (*at == in) {
            *at = in->next;
            break;
        }
    po->n_ins--;
    tally__po_changed(po);
    free(in->acks);
    free(in);
}

/* A connection that never became a rank's goes without a word to any request. */
static void po_in_drop(tally__po *po, tally__po_in *in, const char *what) {
    char peer[TALLY__NET_ADDRSTR];
    tally__net_peer_str(in->fd, peer, sizeof peer);
    tally__log_warn("rank %d: point-to-point: a connection from %s %s: closed", po->rank, peer, what);
    tally__po_in_close(po, in, TALLY_E_PROTOCOL, what);
}

/* The hello names the dialer: a rank of this communicator not connected yet. 0, or -1 (dropped). */
static int po_in_hello(tally__po *po, tally__po_in *in) {
    tally__po_hello h;
    memcpy(&h, in->hs, sizeof h);
    if (h.magic != TALLY__PO_MAGIC_HELLO || h.size != (uint32_t)po->size || h.rank >= (uint32_t)po->size ||
        h.rank == (uint32_t)po->rank) {
        po_in_drop(po, in, "named no other rank of this communicator");
        return -1;
    }
    if (po->in_of[h.rank]) {
        po_in_drop(po, in, "named a rank that is connected already");
        return -1;
    }
    in->rank = (int)h.rank;
    in->pid = (pid_t)h.pid;
    in->cma = tally__po_cma_probe(po, &h);
    in->hs[0] = (unsigned char)in->cma;
    return 0;
}

/* The handshake's next step: 1 when it went on, 0 when it waits for the socket, -1 when it ended (in is
 * freed). */
static int po_in_step(tally__po *po, tally__po_in *in) {
    int out = in->state == PO_IN_REPLY || in->state == PO_IN_VERDICT || in->state == PO_IN_WELCOME;
    int r = tally__po_io(in->fd, in->hs, in->hs_len, &in->hs_off, out);
    if (r < 0) {
        po_in_drop(po, in, "ended during its handshake");
        return -1;
    }
    if (r == 0) return 0;
    size_t tlen;
    const void *tok = tally__boot_token(po->boot, &tlen);
    in->hs_off = 0;
    switch (in->state) {
    case PO_IN_NONCE:
        if (tally__auth_accept_begin(&in->acc, tok, tlen, TALLY__PO_ROLE, in->hs)) {
            po_in_drop(po, in, "could not be answered (OpenSSL failed)");
            return -1;
        }
        memcpy(in->hs, in->acc.reply, TALLY__AUTH_REPLY);
        in->state = PO_IN_REPLY, in->hs_len = TALLY__AUTH_REPLY;
        return 1;
    case PO_IN_REPLY: in->state = PO_IN_PROOF, in->hs_len = TALLY__AUTH_PROOF; return 1;
    case PO_IN_PROOF:
        in->proved = tally__auth_accept_check(&in->acc, in->hs);
        in->hs[0] = (unsigned char)in->proved;
        in->state = PO_IN_VERDICT, in->hs_len = 1;
        return 1;
    case PO_IN_VERDICT:
        if (!in->proved) {
            po_in_drop(po, in, "did not prove it knows this job's token (another TALLY_TOKEN, or not tally)");
            return -1;
        }
        in->state = PO_IN_HELLO, in->hs_len = sizeof(tally__po_hello);
        return 1;
    case PO_IN_HELLO:
        if (po_in_hello(po, in)) return -1;
        in->state = PO_IN_WELCOME, in->hs_len = 1;
        return 1;
    default: /* the welcome went */
        in->state = PO_IN_READY;
        po->in_of[in->rank] = in;
        po->lost[in->rank] = 0;
        tally__po_changed(po);
        return 1;
    }
}

void tally__po_in_ended(tally__po *po, tally__po_in *in, int rc, int err) {
    char why[384];
    int mid = in->cur || in->hdr_got;
    if (rc == TALLY_E_PEER_LOST)
        snprintf(why, sizeof why, "rank %d closed its point-to-point connection%s (it %s)", in->rank,
                 mid ? " in the middle of a message" : "",
                 mid ? "died, or aborted the communicator" : "exited, or freed or aborted the communicator");
    else if (rc == TALLY_E_NOMEM)
        snprintf(why, sizeof why, "no memory for the connection from rank %d", in->rank);
    else
        snprintf(why, sizeof why, "the connection from rank %d failed: %s", in->rank, strerror(err));
    tally__po_in_close(po, in, rc, why);
}

/* A whole header: judged, then its message matched or kept. 1 when the connection was closed. */
static int po_in_header(tally__po *po, tally__po_in *in) {
    char why[384];
    int v = tally__po_hdr_judge(&in->hdr, in->rank, in->cma);
    if (v != TALLY__PO_HDR_OK) {
        snprintf(why, sizeof why,
                 "rank %d sent %s (tag %d, %llu elements of dtype %u, %llu bytes): its connection is "
                 "closed",
                 in->rank, tally__po_hdr_why(v), (int)in->hdr.tag, (unsigned long long)in->hdr.count,
                 (unsigned)in->hdr.dtype, (unsigned long long)in->hdr.bytes);
        tally__po_in_close(po, in, TALLY_E_PROTOCOL, why);
        return 1;
    }
    tally__po_msg *m = tally__po_arrive(po, in);
    if (!m) {
        snprintf(why, sizeof why, "no memory for a message from rank %d", in->rank);
        tally__po_in_close(po, in, TALLY_E_NOMEM, why);
        return 1;
    }
    if (m->cma && !m->to && !m->discard) { /* its receive may come in a moment: it reads in place then */
        m->unread = 1;
        m->from = in;
        uint64_t keep_ns = m->bytes * TALLY__PO_CMA_GRACE_NS_PER_BYTE;
        m->grace = tally__now_ns() + (keep_ns > TALLY__PO_CMA_GRACE_NS ? keep_ns : TALLY__PO_CMA_GRACE_NS);
        return 0;
    }
    if (m->cma) { /* read now (m is gone after) */
        int rc = tally__po_cma_read(po, in, m, 1);
        if (rc) tally__po_in_ended(po, in, rc, errno);
        return rc != 0;
    }
    if (!m->bytes)
        tally__po_msg_grew(po, m, 0);
    else
        in->cur = m;
    return 0;
}

/* Frames as they come, a bounded amount per turn. */
static void po_in_read(tally__po *po, tally__po_in *in) {
    size_t budget = PO_READ_BUDGET;
    while (budget > 0) {
        if (!in->cur) {
            int r = tally__po_io(in->fd, &in->hdr, sizeof in->hdr, &in->hdr_got, 0);
            if (r < 0) tally__po_in_ended(po, in, r, errno);
            if (r <= 0) return;
            in->hdr_got = 0;
            if (po_in_header(po, in)) return;
            continue;
        }
        size_t room;
        unsigned char *dst = tally__po_msg_dst(in->cur, &room, po->scratch, sizeof po->scratch);
        if (!dst) {
            char why[256];
            snprintf(why, sizeof why, "no memory to keep a message of %zu bytes from rank %d until its receive",
                     in->cur->bytes, in->rank);
            tally__po_in_close(po, in, TALLY_E_NOMEM, why);
            return;
        }
        ssize_t k = recv(in->fd, dst, room < budget ? room : budget, MSG_DONTWAIT);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (k <= 0) {
            int lost = k == 0 || errno == ECONNRESET || errno == EPIPE || errno == ENOTCONN;
            tally__po_in_ended(po, in, lost ? TALLY_E_PEER_LOST : TALLY_E_SYSTEM, errno);
            return;
        }
        budget -= (size_t)k;
        if (tally__po_msg_grew(po, in->cur, (size_t)k)) in->cur = NULL;
    }
}

void tally__po_in_event(tally__po *po, tally__po_in *in, short revents) {
    (void)revents; /* each state knows what it waits for; a read that finds nothing costs one call */
    while (in->state != PO_IN_READY)
        if (po_in_step(po, in) <= 0) return;
    int rc = in->n_acks ? tally__po_cma_flush(po, in) : 0;
    if (rc) {
        tally__po_in_ended(po, in, rc, errno);
        return;
    }
    po_in_read(po, in);
}

short tally__po_in_events(const tally__po_in *in) {
    switch (in->state) {
    case PO_IN_REPLY:
    case PO_IN_VERDICT:
    case PO_IN_WELCOME: return POLLOUT;
    case PO_IN_READY: return (short)(POLLIN | (in->n_acks ? POLLOUT : 0));
    default: return POLLIN;
    }
}

void tally__po_in_expire(tally__po *po, uint64_t now, uint64_t *next) {
    tally__po_in *in = po->ins, *after;
    for (; in; in = after) {
        after = in->next;
        if (in->state == PO_IN_READY) continue;
        if (in->auth_deadline > now) {
            if (in->auth_deadline < *next) *next = in->auth_deadline;
            continue;
        }
        po_in_drop(po, in, "did not finish its handshake in time");
    }
}
