/* tcp_ctl.c - control frames between the TCP transport's messages: WAIT (we are stalled, waiting for a
 * rank; see tally__stall) and FAULT (why our collective ended), queued where the socket is full. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "../core/clock.h"
#include "tcp_int.h"

int tally__tcp_ctl_flush(tally__tcp_conn *c) {
    while (c->cout_off < c->cout_len) {
        ssize_t k =
            send(c->fd, c->cout + c->cout_off, (size_t)(c->cout_len - c->cout_off), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            c->cout_off += (uint16_t)k;
        } else if (k < 0 && errno == EINTR) {
            continue;
        } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return 0;
        } else { /* the data path meets the same error and reports it */
            c->cout_off = c->cout_len;
        }
    }
    return 1;
}

/* Queues a frame and sends what the socket takes now; 0 when there is no room for it. */
static int ctl_queue(tally__tcp_conn *c, const tally__tcp_hdr *h, const void *payload, size_t len) {
    if (c->cout_off == c->cout_len) c->cout_off = c->cout_len = 0;
    if (sizeof *h + len > sizeof c->cout - c->cout_len) return 0;
    memcpy(c->cout + c->cout_len, h, sizeof *h);
    if (len) memcpy(c->cout + c->cout_len + sizeof *h, payload, len);
    c->cout_len += (uint16_t)(sizeof *h + len);
    tally__tcp_ctl_flush(c);
    return 1;
}

/* Where a frame of ours may go now: a live connection whose stream is between messages. */
static int ctl_open(const tally__tcp_tp *t, int p) {
    const tally__tcp_conn *c = &t->conns[p];
    return p != t->base.ctx.rank && c->fd >= 0 && !c->broken && !c->mid;
}

void tally__tcp_tell_wait(tally__tcp_tp *t, int peer) {
    tally__tcp_hdr h = {.magic = TALLY__TCP_MAGIC_WAIT, .aux = (uint32_t)(peer + 1), .sig = *t->base.ctx.sig};
    for (int p = 0; p < t->base.ctx.size; p++) {
        tally__tcp_conn *c = &t->conns[p];
        if (ctl_open(t, p) && c->cout_off == c->cout_len) ctl_queue(c, &h, NULL, 0); /* none piles up */
    }
}

void tally__tcp_tell_fault(tally__tcp_tp *t) {
    tally__fault *f = t->base.ctx.fault;
    int32_t code = atomic_load_explicit(&f->code, memory_order_acquire), culprit = f->culprit;
    if (t->fault_told || code == 0) return;
    unsigned char p[TALLY__TCP_FAULT_MAX];
    size_t ml = strnlen(f->msg, TALLY__TCP_FAULT_MAX - 8);
    memcpy(p, &code, 4);
    memcpy(p + 4, &culprit, 4);
    memcpy(p + 8, f->msg, ml);
    tally__tcp_hdr h = {.magic = TALLY__TCP_MAGIC_FAULT, .sig = *t->base.ctx.sig, .len = 8 + ml};
    for (int q = 0; q < t->base.ctx.size; q++)
        if (ctl_open(t, q)) ctl_queue(&t->conns[q], &h, p, 8 + ml);
    t->fault_told = 1;
}

static void ctl_note_wait(tally__tcp_tp *t, int peer, const tally__tcp_hdr *h) {
    tally__tcp_conn *c = &t->conns[peer];
    c->w_seq = h->sig.seq;
    c->w_peer = h->aux >= 1 && h->aux <= (uint32_t)t->base.ctx.size ? (int)h->aux - 1 : -1;
    c->w_at = tally__now_ns();
}

static int ctl_malformed(tally__tcp_tp *t, int peer) {
    return tally__fault_raise(t->base.ctx.fault, TALLY_E_PROTOCOL, peer,
                              "rank %d: malformed fault report from rank %d on the tcp transport", t->base.ctx.rank,
                              peer);
}

/* Adopts the fault in a FAULT frame's payload; returns the communicator's fault code. */
static int ctl_adopt(tally__tcp_tp *t, int peer, const unsigned char *p, size_t len) {
    int32_t code, culprit;
    char msg[TALLY__TCP_FAULT_MAX - 8 + 1];
    memcpy(&code, p, 4);
    memcpy(&culprit, p + 4, 4);
    if (code >= 0 || code < -1000 || culprit < -1 || culprit >= t->base.ctx.size) return ctl_malformed(t, peer);
    memcpy(msg, p + 8, len - 8);
    msg[len - 8] = '\0';
    /* Relayed too: a rank whose stream from the faulty rank was mid-message got no FAULT frame, and
     * rank 0, had it taken the fault from this frame, would otherwise not relay the monitor's copy. */
    tally__fault_adopt_relay(t->base.ctx.fault, code, culprit, msg);
    return tally__fault_check(t->base.ctx.fault);
}

static int ctl_fault_len_ok(const tally__tcp_hdr *h) { return h->len >= 8 && h->len <= TALLY__TCP_FAULT_MAX; }

int tally__tcp_take_ctl(tally__tcp_tp *t, int peer) {
    tally__tcp_conn *c = &t->conns[peer];
    while (c->rb_tail - c->rb_head >= sizeof(tally__tcp_hdr)) {
        tally__tcp_hdr h;
        memcpy(&h, c->rb + c->rb_head, sizeof h);
        if (h.magic == TALLY__TCP_MAGIC_WAIT && h.len == 0) {
            ctl_note_wait(t, peer, &h);
            c->rb_head += sizeof h;
            continue;
        }
        if (h.magic != TALLY__TCP_MAGIC_FAULT) return 0;
        if (!ctl_fault_len_ok(&h)) return ctl_malformed(t, peer);
        if (c->rb_tail - c->rb_head < sizeof h + h.len) return 0; /* the rest comes later */
        c->rb_head += sizeof h + h.len;
        return ctl_adopt(t, peer, c->rb + c->rb_head - h.len, h.len);
    }
    return 0;
}

int tally__tcp_ctl_partial(const tally__tcp_conn *c) {
    tally__tcp_hdr h;
    if (c->rb_tail - c->rb_head < sizeof h) return 0;
    memcpy(&h, c->rb + c->rb_head, sizeof h);
    return h.magic == TALLY__TCP_MAGIC_FAULT && ctl_fault_len_ok(&h) && c->rb_tail - c->rb_head < sizeof h + h.len;
}

/* Walks the complete frames buffered from a peer, from offset `at`; stops at a goodbye, an incomplete
 * or unknown frame. Returns the offset of the first FAULT frame, or -1; *bye is set if the walk ended
 * at a goodbye. */
static long ctl_walk(const tally__tcp_conn *c, size_t at, int *bye) {
    *bye = 0;
    while (c->rb_tail - at >= sizeof(tally__tcp_hdr)) {
        tally__tcp_hdr h;
        memcpy(&h, c->rb + at, sizeof h);
        if (h.magic == TALLY__TCP_MAGIC_BYE) {
            *bye = 1;
            return -1;
        }
        int known = h.magic == TALLY__TCP_MAGIC_DATA || h.magic == TALLY__TCP_MAGIC_WAIT ||
                    (h.magic == TALLY__TCP_MAGIC_FAULT && ctl_fault_len_ok(&h));
        if (!known || h.len > c->rb_tail - at - sizeof h) return -1;
        if (h.magic == TALLY__TCP_MAGIC_FAULT) return (long)at;
        at += sizeof h + (size_t)h.len;
    }
    return -1;
}

int tally__tcp_scan_fault(tally__tcp_tp *t, int peer) {
    const tally__tcp_conn *c = &t->conns[peer];
    int bye;
    long at = ctl_walk(c, c->rb_head, &bye);
    if (at < 0) return 0;
    tally__tcp_hdr h;
    memcpy(&h, c->rb + at, sizeof h);
    return ctl_adopt(t, peer, c->rb + at + sizeof h, h.len);
}

int tally__tcp_ends_with_bye(const tally__tcp_conn *c) {
    int bye;
    size_t at = c->rb_head;
    for (long f; (f = ctl_walk(c, at, &bye)) >= 0;) { /* on past any FAULT, to the end */
        tally__tcp_hdr h;
        memcpy(&h, c->rb + f, sizeof h);
        at = (size_t)f + sizeof h + h.len;
    }
    return bye;
}

int tally__tcp_awaits(void *arg, int r, uint64_t *seq) {
    const tally__tcp_tp *t = arg;
    const tally__tcp_conn *c = &t->conns[r];
    uint64_t now = tally__now_ns();
    if (r == t->base.ctx.rank || c->w_peer < 0 || c->w_at > now ||
        (double)(now - c->w_at) * 1e-9 > TALLY__STALL_FRESH * t->base.ctx.timeout_s)
        return -1;
    *seq = c->w_seq;
    return c->w_peer;
}
