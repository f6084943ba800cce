/* tcp.c - the TCP transport: framed messages (header with the collective's fingerprint, then payload)
 * on one connection per peer, sends and receives progressed together, reducing as bytes arrive. */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "../boot/boot.h"
#include "../core/clock.h"
#include "../core/cpus.h"
#include "../core/numeric/copy.h"
#include "../core/numeric/reduce.h"
#include "tcp_int.h"

/* Busy-poll this long after the last progress before sleeping in poll(): a small message's reply
 * usually lands within it, and a poll() wake-up would cost more than the message. With more ranks on
 * this host than CPUs a spinner steals the CPU its peer needs, so then we barely spin. */
#define TCP_SPIN_NS         50000u
#define TCP_SPIN_CROWDED_NS 2000u
/* Longest single poll() sleep: bounds how late a fault raised without a wake fd is noticed. */
#define TCP_POLL_MS 50
/* Bytes one receive consumes before the loop gives the sends a turn, so both directions stream. */
#define TCP_RECV_BUDGET (1024u * 1024u)

enum { TCP_WAIT = 0, TCP_MOVED = 1, TCP_DONE = 2 }; /* progress results; errors are negative */

typedef struct tally__tcp_op {
    int peer;
    int is_recv;
    int done;
    int apart;          /* the payload travels on the pair's solo connection (TALLY__TCP_AUX_SOLO) */
    int have_hdr;       /* recv: the header was read and checked */
    size_t hdr_off;     /* send: header bytes sent */
    size_t len, off;    /* payload bytes in all, and done */
    size_t esize;       /* recv: element size when reducing, else 0 */
    tally__tcp_hdr hdr; /* send: the header to send */
    const unsigned char *sbuf;
    unsigned char *dst;
    const unsigned char *src;
    tally_dtype dtype;
    tally_op op;
} tally__tcp_op;

static const tally__tp_ops tally__tcp_ops;

/* ---- messages that name peers ---- */

static void tcp_sigstr(const tally__sig *s, char *buf, size_t n) { tally__sig_format(s, buf, n); }

static int tcp_peer_lost(tally__tcp_tp *t, int peer, int bye) {
    const tally__peer *p = &tally__boot_peers(t->base.ctx.boot)[peer];
    char sig[160];
    tcp_sigstr(t->base.ctx.sig, sig, sizeof sig);
    int cause = tally__tcp_scan_fault(t, peer); /* it left after a fault, and said which */
    if (!cause) cause = tally__fault_await(t->base.ctx.fault, TALLY__LOST_GRACE_S);
    if (cause) return cause;
    if (bye)
        return tally__fault_raise(t->base.ctx.fault, TALLY_E_PEER_LOST, peer,
                                  "rank %d (pid %d, host %s) freed its communicator while rank %d still expected "
                                  "data from it in %s: it left early (after an error?); check its output",
                                  peer, p->pid, p->hostname, t->base.ctx.rank, sig);
    return tally__fault_raise(t->base.ctx.fault, TALLY_E_PEER_LOST, peer,
                              "rank %d (pid %d, host %s) closed its connection during %s: it probably died; "
                              "check its output",
                              peer, p->pid, p->hostname, sig);
}

static int tcp_mismatch(tally__tcp_tp *t, int peer, const tally__sig *theirs) {
    char a[160], b[160];
    tcp_sigstr(t->base.ctx.sig, a, sizeof a);
    tcp_sigstr(theirs, b, sizeof b);
    return tally__fault_raise(t->base.ctx.fault, TALLY_E_MISMATCH, peer,
                              "collective mismatch: rank %d called %s but rank %d called %s", t->base.ctx.rank, a, peer,
                              b);
}

static int tcp_protocol(tally__tcp_tp *t, int peer, const char *what, size_t got, size_t want) {
    char sig[160];
    tcp_sigstr(t->base.ctx.sig, sig, sizeof sig);
    return tally__fault_raise(t->base.ctx.fault, TALLY_E_PROTOCOL, peer,
                              "rank %d: %s from rank %d in %s (got %zu, expected %zu)", t->base.ctx.rank, what, peer,
                              sig, got, want);
}

static int tcp_bad_solo(tally__tcp_tp *t, int peer) {
    char sig[160];
    tcp_sigstr(t->base.ctx.sig, sig, sizeof sig);
    return tally__fault_raise(t->base.ctx.fault, TALLY_E_PROTOCOL, peer,
                              "rank %d: rank %d's header in %s says its payload follows on the pair's solo "
                              "connection, which only the higher rank of a pair on one host writes: a corrupt "
                              "stream, or a peer of another tally build",
                              t->base.ctx.rank, peer, sig);
}

static void tcp_label(void *arg, int r, char *buf, size_t n) {
    const tally__tcp_tp *t = arg;
    const tally__peer *p = &tally__boot_peers(t->base.ctx.boot)[r];
    snprintf(buf, n, " (pid %d, host %s)", p->pid, p->hostname);
}

/* A rank on another host that shares it with others may wait for one of them over shm (shm+tcp), which
 * sends us no WAIT frames. */
static int tcp_hidden(void *arg, int r) {
    const tally__tcp_tp *t = arg;
    const tally__peer *p = tally__boot_peers(t->base.ctx.boot);
    if (!p || t->conns[r].local) return 0;
    for (int q = 0; q < t->base.ctx.size; q++)
        if (q != r && p[q].hostid == p[r].hostid) return 1;
    return 0;
}

static int tcp_timeout(tally__tcp_tp *t, const tally__tcp_op *o) {
    char sig[160], detail[300];
    int me = t->base.ctx.rank;
    tcp_sigstr(t->base.ctx.sig, sig, sizeof sig);
    if (!o->is_recv)
        snprintf(detail, sizeof detail, "did not take rank %d's %zu-byte message of %s (it took %zu bytes)", me, o->len,
                 sig, o->off);
    else if (!o->have_hdr)
        snprintf(detail, sizeof detail, "did not send its %zu-byte message of %s to rank %d (nothing of it arrived)",
                 o->len, sig, me);
    else
        snprintf(detail, sizeof detail,
                 "did not send the rest of its %zu-byte message of %s to rank %d (%zu bytes "
                 "arrived)",
                 o->len, sig, me, o->off);
    tally__stall st = {.me = me,
                       .awaited = o->peer,
                       .size = t->base.ctx.size,
                       .timeout_s = t->base.ctx.timeout_s,
                       .sig = t->base.ctx.sig,
                       .detail = detail,
                       .awaits = tally__tcp_awaits,
                       .label = tcp_label,
                       .hidden = tcp_hidden,
                       .arg = t};
    return tally__stall_raise(t->base.ctx.fault, &st);
}

/* ---- where a payload travels ---- */

/* The connection a message's payload takes: the one its header took, or the pair's solo one where the
 * header says so (tcp_int.h). */
static tally__tcp_conn *tcp_payload_conn(tally__tcp_tp *t, const tally__tcp_op *o) {
    return o->apart ? &t->solo[o->peer] : &t->conns[o->peer];
}

/* The sender's choice, which its header carries: a large payload from the higher rank of a swap. */
static int tcp_goes_apart(const tally__tcp_tp *t, int peer, size_t len, int swap) {
    return t->solo && swap && len >= TALLY__TCP_SOLO_MIN && t->base.ctx.rank > peer;
}

/* ---- the read-ahead buffer ---- */

/* Reads what the socket has into the connection's buffer, at most `max` bytes. Returns bytes read,
 * 0 if none are ready, or -1 on EOF / a reset (the peer is gone), with errno kept for the caller. */
static ssize_t tcp_fill(tally__tcp_conn *c, size_t max) {
    if (c->rb_head == c->rb_tail) c->rb_head = c->rb_tail = 0;
    if (c->rb_tail == TALLY__TCP_RB && c->rb_head > 0) { /* room at the front: slide the leftover down */
        memmove(c->rb, c->rb + c->rb_head, c->rb_tail - c->rb_head);
        c->rb_tail -= c->rb_head;
        c->rb_head = 0;
    }
    size_t room = TALLY__TCP_RB - c->rb_tail;
    if (room > max) room = max;
    if (room == 0) return 0;
    for (;;) {
        ssize_t k = recv(c->fd, c->rb + c->rb_tail, room, MSG_DONTWAIT);
        if (k > 0) {
            c->rb_tail += (size_t)k;
            return k;
        }
        if (k == 0) return -1;
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        return -1;
    }
}

/* A reducing receive reads elements from the buffer: start them 8-aligned so no kernel sees a
 * misaligned element (headers and odd payloads shift the stream). */
static void tcp_align(tally__tcp_conn *c) {
    if (c->rb_head % 8 == 0) return;
    memmove(c->rb, c->rb + c->rb_head, c->rb_tail - c->rb_head);
    c->rb_tail -= c->rb_head;
    c->rb_head = 0;
}

/* ---- one receive ---- */

int tally__tcp_hdr_judge(const tally__tcp_hdr *h, const tally__sig *mine, size_t want) {
    if (h->magic == TALLY__TCP_MAGIC_BYE) return TALLY__TCP_HDR_BYE;
    if (h->magic != TALLY__TCP_MAGIC_DATA) return TALLY__TCP_HDR_BAD_MAGIC;
    if (!tally__sig_equal(&h->sig, mine)) return TALLY__TCP_HDR_MISMATCH;
    return h->len == want ? TALLY__TCP_HDR_OK : TALLY__TCP_HDR_BAD_LEN;
}

/* Takes the control frames before a message, then checks its header before any of its payload is read.
 * Returns 0 with o->have_hdr still 0 when more bytes must arrive first. */
static int tcp_check_hdr(tally__tcp_tp *t, tally__tcp_op *o, tally__tcp_conn *c) {
    int rc = tally__tcp_take_ctl(t, o->peer);
    if (rc) return rc;
    if (c->rb_tail - c->rb_head < sizeof(tally__tcp_hdr) || tally__tcp_ctl_partial(c)) return 0;
    tally__tcp_hdr h;
    memcpy(&h, c->rb + c->rb_head, sizeof h);
    switch (tally__tcp_hdr_judge(&h, t->base.ctx.sig, o->len)) {
    case TALLY__TCP_HDR_BYE: c->bye = 1; return tcp_peer_lost(t, o->peer, 1);
    case TALLY__TCP_HDR_BAD_MAGIC:
        return tcp_protocol(t, o->peer, "malformed message header", h.magic, TALLY__TCP_MAGIC_DATA);
    case TALLY__TCP_HDR_MISMATCH: return tcp_mismatch(t, o->peer, &h.sig);
    case TALLY__TCP_HDR_BAD_LEN: return tcp_protocol(t, o->peer, "message of the wrong length", (size_t)h.len, o->len);
    }
    o->apart = (h.aux & TALLY__TCP_AUX_SOLO) != 0;
    if (o->apart && (!t->solo || o->peer < t->base.ctx.rank)) return tcp_bad_solo(t, o->peer);
    c->rb_head += sizeof h;
    c->cpu = h.aux & ~TALLY__TCP_AUX_SOLO;
    o->have_hdr = 1;
    if (o->esize) tcp_align(c);
    return 0;
}

/* A message this large goes to its destination with non-temporal stores: the destination would leave
 * the caches before it is read again anyway, and its lines need not be read in first. */
static int tcp_streams_out(const tally__tcp_op *o) { return o->len >= TALLY__COPY_STREAM_MIN; }

/* Moves buffered payload bytes into the destination: copied, or reduced in whole elements (a
 * partial element waits in the buffer for its remaining bytes). Returns bytes consumed. */
static size_t tcp_drain(tally__tcp_op *o, tally__tcp_conn *c) {
    size_t n = c->rb_tail - c->rb_head;
    if (n > o->len - o->off) n = o->len - o->off;
    if (o->esize) n -= n % o->esize;
    if (!n) return 0;
    unsigned char *dst = o->dst + o->off, *rb = c->rb + c->rb_head;
    if (o->esize && tcp_streams_out(o))
        tally__reduce_stream(dst, o->src + o->off, rb, n / o->esize, o->dtype, o->op);
    else if (o->esize)
        tally__reduce(dst, o->src + o->off, rb, n / o->esize, o->dtype, o->op);
    else if (tcp_streams_out(o))
        tally__copy_stream(dst, rb, n);
    else
        memcpy(dst, rb, n);
    c->rb_head += n;
    o->off += n;
    return n;
}

/* Reads a plain payload straight into the destination, bypassing the buffer. */
static ssize_t tcp_recv_direct(tally__tcp_op *o, tally__tcp_conn *c) {
    for (;;) {
        ssize_t k = recv(c->fd, o->dst + o->off, o->len - o->off, MSG_DONTWAIT);
        if (k > 0) {
            o->off += (size_t)k;
            return k;
        }
        if (k == 0) return -1;
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
    }
}

static size_t tcp_buffered(const tally__tcp_conn *c) { return c->rb_tail - c->rb_head; }

static int tcp_recv_progress(tally__tcp_tp *t, tally__tcp_op *o) {
    tally__tcp_conn *hc = &t->conns[o->peer], *c = o->have_hdr ? tcp_payload_conn(t, o) : hc;
    size_t moved = 0, off0 = o->off, h0 = tcp_buffered(hc), p0 = tcp_buffered(c);
    int hdr0 = o->have_hdr;
    while (moved < TCP_RECV_BUDGET) {
        if (!o->have_hdr) {
            int rc = tcp_check_hdr(t, o, c);
            if (rc) return rc;
            if (o->have_hdr) {
                c = tcp_payload_conn(t, o); /* the header's own, or a solo one that carries payloads only */
                p0 = tcp_buffered(c);
                continue;
            }
            /* Greedy: a small message's payload arrives with its header in this one recv(). */
            ssize_t k = tcp_fill(c, (size_t)-1);
            if (k < 0) return tcp_peer_lost(t, o->peer, hc->bye);
            if (k == 0) break;
            moved += (size_t)k;
            continue;
        }
        if (o->off == o->len) {
            o->done = 1;
            return TCP_DONE;
        }
        if (tcp_drain(o, c)) continue;
        /* The buffer holds no usable bytes of this message: read more (a large copy through the buffer
         * too, so that it reaches the destination streamed). */
        ssize_t k =
            o->esize || tcp_streams_out(o) ? tcp_fill(c, o->len - o->off - tcp_buffered(c)) : tcp_recv_direct(o, c);
        if (k < 0) return tcp_peer_lost(t, o->peer, hc->bye);
        if (k == 0) break;
        moved += (size_t)k;
    }
    /* Progress is the message's, not the bytes': a peer's WAIT read here is news, not progress, and must
     * not make this exchange look busy (it would stop telling its own peers that it is stalled). */
    int grew = tcp_buffered(hc) > h0 || (c != hc && tcp_buffered(c) > p0);
    return o->off != off0 || o->have_hdr != hdr0 || grew ? TCP_MOVED : TCP_WAIT;
}

/* ---- one send ---- */

/* One sendmsg() without waiting: bytes taken, 0 when the socket has no room, -1 when the peer is gone
 * (EPIPE, ECONNRESET). */
static ssize_t tcp_sendv(int fd, struct iovec *iov, int n) {
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    for (;;) {
        ssize_t k = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k >= 0) return k;
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
    }
}

static int tcp_send_progress(tally__tcp_tp *t, tally__tcp_op *o) {
    tally__tcp_conn *c = &t->conns[o->peer], *pc = tcp_payload_conn(t, o);
    int apart = o->apart; /* the header goes alone */
    size_t moved = 0;
    /* Queued control frames go before our message. */
    if (o->hdr_off < sizeof o->hdr && !tally__tcp_ctl_flush(c)) return TCP_WAIT;
    while (o->hdr_off < sizeof o->hdr || (!apart && o->off < o->len)) {
        struct iovec iov[2];
        int n = 0;
        if (o->hdr_off < sizeof o->hdr)
            iov[n++] = (struct iovec){(unsigned char *)&o->hdr + o->hdr_off, sizeof o->hdr - o->hdr_off};
        if (!apart && o->off < o->len) iov[n++] = (struct iovec){(void *)(o->sbuf + o->off), o->len - o->off};
        ssize_t k = tcp_sendv(c->fd, iov, n);
        if (k < 0) return tcp_peer_lost(t, o->peer, c->bye);
        if (k == 0) return moved ? TCP_MOVED : TCP_WAIT;
        size_t h = sizeof o->hdr - o->hdr_off;
        if ((size_t)k < h) h = (size_t)k;
        o->hdr_off += h;
        o->off += (size_t)k - h;
        moved += (size_t)k;
        c->mid = 1;
    }
    c->mid = 0; /* the message is whole on c (apart: its header), so control frames may follow */
    while (o->off < o->len) {
        struct iovec iov = {(void *)(o->sbuf + o->off), o->len - o->off};
        ssize_t k = tcp_sendv(pc->fd, &iov, 1);
        if (k < 0) return tcp_peer_lost(t, o->peer, c->bye);
        if (k == 0) return moved ? TCP_MOVED : TCP_WAIT;
        o->off += (size_t)k;
        moved += (size_t)k;
    }
    o->done = 1;
    return TCP_DONE;
}

/* ---- peers not awaited in this exchange ---- */

/* Reads ahead from a peer we are not receiving from now, to notice early what would otherwise only
 * show as a timeout: the next message already belongs to a different call of this collective
 * (mismatch), or the peer died (EOF without a goodbye). Its bytes stay buffered for later. */
static int tcp_watch_idle(tally__tcp_tp *t, int peer) {
    tally__tcp_conn *c = &t->conns[peer];
    ssize_t k = tcp_fill(c, (size_t)-1);
    int rc = tally__tcp_take_ctl(t, peer);
    if (rc) return rc;
    if (k < 0) {
        if (tally__tcp_ends_with_bye(c)) {
            c->bye = 1; /* it finished and left: what it sent before leaving is still buffered */
            return 0;
        }
        return tcp_peer_lost(t, peer, 0);
    }
    if (c->rb_tail - c->rb_head < sizeof(tally__tcp_hdr)) return 0;
    tally__tcp_hdr h;
    memcpy(&h, c->rb + c->rb_head, sizeof h);
    if (h.magic == TALLY__TCP_MAGIC_BYE)
        c->bye = 1;
    else if (h.magic == TALLY__TCP_MAGIC_DATA && h.sig.seq == t->base.ctx.sig->seq &&
             !tally__sig_equal(&h.sig, t->base.ctx.sig))
        return tcp_mismatch(t, peer, &h.sig);
    return 0;
}

/* ---- the exchange ---- */

/* Sleeps in poll() on the exchange's sockets, the fault wake fd, and idle peers' sockets. */
static int tcp_sleep(tally__tcp_tp *t, int nops, uint64_t deadline) {
    int n = 0, size = t->base.ctx.size;
    char *awaited = t->awaited;
    memset(awaited, 0, (size_t)size);
    for (int i = 0; i < nops; i++) {
        tally__tcp_op *o = &t->ops[i];
        if (o->done) continue;
        if (o->is_recv) awaited[o->peer] = 1;
        int header = o->is_recv ? !o->have_hdr : o->hdr_off < sizeof o->hdr;
        int fd = header ? t->conns[o->peer].fd : tcp_payload_conn(t, o)->fd;
        t->pfds[n] = (struct pollfd){.fd = fd, .events = o->is_recv ? POLLIN : POLLOUT};
        t->pfd_op[n++] = i;
    }
    for (int p = 0; p < size; p++) {
        tally__tcp_conn *c = &t->conns[p];
        if (p == t->base.ctx.rank || awaited[p] || c->bye || c->fd < 0 || c->rb_tail - c->rb_head == TALLY__TCP_RB)
            continue;
        t->pfds[n] = (struct pollfd){.fd = c->fd, .events = POLLIN};
        t->pfd_op[n++] = -1 - p;
    }
    if (t->base.ctx.fault->wake_fd >= 0) {
        t->pfds[n] = (struct pollfd){.fd = t->base.ctx.fault->wake_fd, .events = POLLIN};
        t->pfd_op[n++] = nops; /* not an op: progress re-checks the fault anyway */
    }
    uint64_t now = tally__now_ns();
    int ms = now >= deadline ? 0 : (int)((deadline - now) / 1000000u) + 1;
    if (ms > TCP_POLL_MS) ms = TCP_POLL_MS;
    int rc = poll(t->pfds, (nfds_t)n, ms);
    if (rc < 0 && errno != EINTR)
        return tally__seterr(TALLY_E_SYSTEM, "rank %d: tcp transport: poll(): %s", t->base.ctx.rank, strerror(errno));
    for (int i = 0; rc > 0 && i < n; i++)
        if (t->pfd_op[i] < 0 && t->pfds[i].revents) {
            int e = tcp_watch_idle(t, -1 - t->pfd_op[i]);
            if (e) return e;
        }
    return 0;
}

static int tcp_post(tally__tcp_tp *t, const tally__send *s, int ns, const tally__recv *r, int nr) {
    int n = 0;
    for (int i = 0; i < nr; i++) t->awaited[r[i].peer] = 1; /* a send to one of these is half of a swap */
    for (int i = 0; i < ns; i++, n++) {
        int apart = tcp_goes_apart(t, s[i].peer, s[i].len, t->awaited[s[i].peer]);
        uint32_t aux = t->mycpu | (apart ? TALLY__TCP_AUX_SOLO : 0);
        t->ops[n] = (tally__tcp_op){
            .peer = s[i].peer,
            .apart = apart,
            .len = s[i].len,
            .sbuf = s[i].buf,
            .hdr = {.magic = TALLY__TCP_MAGIC_DATA, .aux = aux, .sig = *t->base.ctx.sig, .len = s[i].len}};
    }
    for (int i = 0; i < nr; i++) t->awaited[r[i].peer] = 0;
    for (int i = 0; i < nr; i++, n++)
        t->ops[n] = (tally__tcp_op){.peer = r[i].peer,
                                    .is_recv = 1,
                                    .len = r[i].len,
                                    .dst = r[i].dst,
                                    .src = r[i].src,
                                    .dtype = r[i].dtype,
                                    .op = r[i].op,
                                    .esize = r[i].src ? tally_dtype_size(r[i].dtype) : 0};
    return n;
}

static int tcp_first_pending(const tally__tcp_tp *t, int nops) {
    for (int i = 0; i < nops; i++)
        if (!t->ops[i].done && t->ops[i].is_recv) return i;
    for (int i = 0; i < nops; i++)
        if (!t->ops[i].done) return i;
    return 0;
}

/* After a failure, a connection left mid-message cannot carry frames any more (a goodbye would be
 * read as payload); the communicator is dead anyway, so just remember not to pretend otherwise. */
static int tcp_abort(tally__tcp_tp *t, int nops, int rc) {
    for (int i = 0; i < nops; i++) {
        tally__tcp_op *o = &t->ops[i];
        if (!o->done && (o->is_recv ? o->have_hdr : o->hdr_off > 0)) t->conns[o->peer].broken = 1;
    }
    /* The peers hear why from us at once, as the shm transport's peers read it in the segment: the
     * relay through rank 0 is slower, and does not run while rank 0 is hung. */
    tally__tcp_tell_fault(t);
    return rc;
}

/* Our peers hear it in WAIT frames; the ranks of our host in a shm+tcp world, through the note. */
static void tcp_tell(tally__tcp_tp *t, int peer) {
    tally__tcp_tell_wait(t, peer);
    if (peer >= 0 && t->base.ctx.awaited) atomic_store_explicit(t->base.ctx.awaited, peer, memory_order_relaxed);
    const tally__wait_note *n = t->base.ctx.note;
    if (n && n->tell) n->tell(n->arg, peer);
}

static int tcp_exchange(tally__tp *tp, const tally__send *s, int ns, const tally__recv *r, int nr) {
    tally__tcp_tp *t = (tally__tcp_tp *)tp;
    int rc = tally__fault_check(t->base.ctx.fault);
    if (rc) return rc;
    if ((rc = tally__tp_check_rules(&t->base.ctx, "tcp", s, ns, r, nr))) return rc;
    t->mycpu = tally__cpus_current();
    int nops = tcp_post(t, s, ns, r, nr), pending = nops;
    uint64_t now = tally__now_ns(), deadline = now + (uint64_t)(t->base.ctx.timeout_s * 1e9);
    uint64_t spin_ns = t->spin_ns, spin_until = now + spin_ns;
    /* Stalled this long, we tell the peers whom we wait for, and again as often while it lasts, so a
     * wait published at most this long ago is known to go on (TALLY__STALL_FRESH is twice as long). */
    uint64_t beat_ns = (uint64_t)(t->base.ctx.timeout_s * 1e9 / 4), next_beat = now + beat_ns;
    t->stalled = 0;
    while (pending > 0) {
        int moved = 0;
        for (int i = 0; i < nops; i++) {
            tally__tcp_op *o = &t->ops[i];
            if (o->done) continue;
            int p = o->is_recv ? tcp_recv_progress(t, o) : tcp_send_progress(t, o);
            if (p < 0) return tcp_abort(t, nops, p);
            moved |= p != TCP_WAIT;
            pending -= p == TCP_DONE;
        }
        if (pending == 0) break;
        if ((rc = tally__fault_check(t->base.ctx.fault))) return tcp_abort(t, nops, rc);
        now = tally__now_ns();
        if (moved) {
            spin_until = now + spin_ns;
            next_beat = now + beat_ns;
            if (t->stalled) {
                tcp_tell(t, -1);
                t->stalled = 0;
            }
        }
        if (now < spin_until) {
            /* A peer on our CPU cannot run while we spin: give it the CPU now. */
            if (!moved && tally__tcp_peer_here(t, t->ops[tcp_first_pending(t, nops)].peer)) sched_yield();
            continue;
        }
        if (now >= deadline) return tcp_abort(t, nops, tcp_timeout(t, &t->ops[tcp_first_pending(t, nops)]));
        if (now >= next_beat) {
            tcp_tell(t, t->ops[tcp_first_pending(t, nops)].peer);
            t->stalled = 1;
            next_beat = now + beat_ns;
        }
        if ((rc = tcp_sleep(t, nops, deadline))) return tcp_abort(t, nops, rc);
        spin_until = tally__now_ns() + spin_ns;
    }
    if (t->stalled) tcp_tell(t, -1);
    return 0;
}

/* ---- lifetime ---- */

/* Closes without discarding data a peer may still be reading (unread input at close() would make the
 * kernel send a reset). */
static void tcp_shut(tally__tcp_conn *c) {
    shutdown(c->fd, SHUT_WR);
    char sink[4096];
    while (recv(c->fd, sink, sizeof sink, MSG_DONTWAIT) > 0) {}
    close(c->fd);
    c->fd = -1;
}

/* Says goodbye so peers do not take our leaving for a death, then closes. */
static void tcp_close_conn(tally__tcp_conn *c) {
    tally__tcp_hdr bye = {.magic = TALLY__TCP_MAGIC_BYE};
    size_t off = c->broken || !tally__tcp_ctl_flush(c) ? sizeof bye : 0; /* out of frame: no goodbye */
    uint64_t deadline = tally__deadline(0.2);
    while (off < sizeof bye && tally__now_ns() < deadline) {
        ssize_t k = send(c->fd, (char *)&bye + off, sizeof bye - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0)
            off += (size_t)k;
        else if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            break;
        else
            poll(&(struct pollfd){.fd = c->fd, .events = POLLOUT}, 1, 10);
    }
    tcp_shut(c);
}

/* The solo connections carry payloads only: no goodbye, which the main connection says. */
static void tcp_close_solo(tally__tcp_tp *t) {
    for (int p = 0; t->solo && p < t->base.ctx.size; p++) {
        if (t->solo[p].fd >= 0 && t->base.abandon)
            close(t->solo[p].fd);
        else if (t->solo[p].fd >= 0)
            tcp_shut(&t->solo[p]);
    }
    tally__tcp_conns_free(t->solo, t->base.ctx.size);
}

static void tcp_destroy(tally__tp *tp) {
    tally__tcp_tp *t = (tally__tcp_tp *)tp;
    if (!t) return;
    if (t->conns) tally__tcp_tell_fault(t); /* a fault raised or adopted outside an exchange (an abort) */
    for (int p = 0; t->conns && p < t->base.ctx.size; p++) {
        if (t->conns[p].fd >= 0 && t->base.abandon) {
            close(t->conns[p].fd); /* unread input makes it a reset: the peer sees us gone at once */
            t->conns[p].fd = -1;
        }
        if (t->conns[p].fd >= 0) tcp_close_conn(&t->conns[p]);
    }
    tcp_close_solo(t);
    tally__tcp_conns_free(t->conns, t->base.ctx.size);
    free(t->ops);
    free(t->pfds);
    free(t->pfd_op);
    free(t->awaited);
    free(t);
}

static const tally__tp_ops tally__tcp_ops = {.name = "tcp", .exchange = tcp_exchange, .destroy = tcp_destroy};

static int tcp_alloc(const tally__tp_ctx *ctx, tally__tcp_tp **out) {
    int n = ctx->size;
    tally__tcp_tp *t = calloc(1, sizeof *t);
    if (!t) return TALLY_E_NOMEM;
    t->base.ops = &tally__tcp_ops;
    t->base.ctx = *ctx;
    *out = t;
    t->conns = tally__tcp_conns_new(ctx);
    t->ops = calloc(2 * (size_t)n, sizeof *t->ops);
    t->pfds = calloc(3 * (size_t)n + 1, sizeof *t->pfds);
    t->pfd_op = calloc(3 * (size_t)n + 1, sizeof *t->pfd_op);
    t->awaited = calloc((size_t)n, 1);
    if (!t->conns || !t->ops || !t->pfds || !t->pfd_op || !t->awaited) return TALLY_E_NOMEM;
    return 0;
}

int tally__tcp_create(const tally__tp_ctx *ctx, tally__tp **out) {
    *out = NULL;
    if (!ctx || ctx->size < 2 || ctx->rank < 0 || ctx->rank >= ctx->size || !ctx->boot || !ctx->fault || !ctx->sig)
        return tally__seterr(TALLY_E_INVALID, "tcp transport: bad context");
    tally__tcp_tp *t = NULL;
    int rc = tcp_alloc(ctx, &t);
    if (rc) {
        if (t) tcp_destroy(&t->base);
        return tally__seterr(rc, "rank %d: tcp transport: out of memory", ctx->rank);
    }
    t->spin_ns = ctx->crowded ? TCP_SPIN_CROWDED_NS : TCP_SPIN_NS;
    const tally__peer *peers = tally__boot_peers(ctx->boot);
    for (int p = 0; p < ctx->size; p++) t->conns[p].local = peers[p].hostid == peers[ctx->rank].hostid;
    if ((rc = tally__tcp_mesh(ctx, t->conns)) || (rc = tally__tcp_solo_mesh(ctx, &t->solo))) {
        tcp_destroy(&t->base);
        return rc;
    }
    *out = &t->base;
    return 0;
}
