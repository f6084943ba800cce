/* watch.c - the setup watch: while a transport connects outside the bootstrap collectives, a rank still
 * hears at once, through the control connections, that another rank failed its setup or died. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>

#include "../core/clock.h"
#include "boot_int.h"
#include "net.h"

/* What the watch saw on a control connection: nothing unread (poll it); unread frames it peeks at again
 * each look (not polled, or poll would never sleep); or the peer is past setup (no longer watched). */
enum { W_QUIET = 0, W_PEEK, W_DONE };
#define W_PEEK_MAX 4096 /* holds the few fault reports that may come before a setup failure */

/* The ranks whose control connections this rank watches: rank 0 every other one, the others rank 0. */
static int watch_lo(const tally__boot *b) { return b->rank == 0 ? 1 : 0; }
static int watch_hi(const tally__boot *b) { return b->rank == 0 ? b->size : 1; }

int tally__boot_watch_max(const tally__boot *b) {
    return b && !b->monitor_on && b->size > 1 ? watch_hi(b) - watch_lo(b) : 0;
}

int tally__boot_watch_fill(const tally__boot *b, struct pollfd *pfd) {
    int n = 0;
    for (int k = 0; tally__boot_watch_max(b) && k < b->size; k++)
        if (k >= watch_lo(b) && k < watch_hi(b) && b->ctl[k] >= 0 && b->watch[k] == W_QUIET)
            pfd[n++] = (struct pollfd){.fd = b->ctl[k], .events = POLLIN};
    return n;
}

/* A rank whose control connection ended without a goodbye died (a rank that fails its setup reports it
 * first, and one that leaves says goodbye): every rank still in setup is told. */
static int watch_left(tally__boot *b, int k) {
    char who[160];
    tally__ctl_who(b, k, who, sizeof who);
    b->watch_ended = 1;
    return tally__fault_raise(b->fault, TALLY_E_PEER_LOST, k,
                              "%s exited during setup (its control connection "
                              "closed without a goodbye), so rank %d cannot complete it; check that rank's output "
                              "for the cause",
                              who, b->rank);
}

/* A setup failure reported by rank k (or relayed by rank 0): adopted, and this rank's setup ends with
 * it, in its words even where another fault came first. */
static int watch_setup_fault(tally__boot *b, int k, const ctl_frame *f, const unsigned char *p) {
    int code, culprit;
    char msg[CTL_MSG_MAX + 1];
    if (tally__ctl_fault_parse(b, p, f->len, &code, &culprit, msg)) return 0;
    tally__ctl_on_fault_aux(b, k, f->aux, p, f->len);
    b->watch_ended = 1;
    return tally__seterr(code, "%s", msg);
}

/* Walks the frames peeked from rank k. A setup failure ends this rank's setup; any other fault is
 * adopted (the first collective reports it); the next step's data or a goodbye means k is past this step,
 * so nothing it sends later concerns the watch (later steps read it). */
static int watch_walk(tally__boot *b, int k, const unsigned char *p, size_t n) {
    size_t at = 0;
    while (at + CTL_HDR <= n) {
        ctl_frame f;
        int ok = tally__ctl_hdr_get(p + at, &f) == 0;
        if (!ok || f.type != CTL_FAULT || f.len < 8 || f.len > CTL_FAULT_MAX) {
            b->watch[k] = W_DONE;
            return 0;
        }
        if (at + CTL_HDR + f.len > n) return 0; /* the rest is on its way */
        if (f.aux & CTL_FAULT_SETUP) return watch_setup_fault(b, k, &f, p + at + CTL_HDR);
        tally__ctl_on_fault_aux(b, k, f.aux, p + at + CTL_HDR, f.len); /* again on a later look: a no-op */
        at += CTL_HDR + f.len;
    }
    return 0;
}

static int watch_peek(tally__boot *b, int k) {
    unsigned char buf[W_PEEK_MAX];
    ssize_t n = recv(b->ctl[k], buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        b->watch[k] = W_QUIET;
        return 0;
    }
    if (n <= 0) return watch_left(b, k); /* end of stream without a goodbye, or reset: it died */
    b->watch[k] = W_PEEK;
    return watch_walk(b, k, buf, (size_t)n);
}

int tally__boot_watch_check(tally__boot *b) {
    for (int k = 0; tally__boot_watch_max(b) && k < b->size; k++) {
        if (k < watch_lo(b) || k >= watch_hi(b) || b->ctl[k] < 0 || b->watch[k] == W_DONE) continue;
        int rc = watch_peek(b, k);
        if (rc) return rc;
    }
    return 0;
}

int tally__boot_setup_failed_elsewhere(const tally__boot *b) { return b && b->watch_ended; }

/* 1 when a whole frame header waits on fd: its sender has moved on to the next bootstrap step. */
static int watch_has_frame(int fd) {
    unsigned char h[CTL_HDR];
    return recv(fd, h, sizeof h, MSG_PEEK | MSG_DONTWAIT) == (ssize_t)sizeof h;
}

/* The first rank whose control connection holds no frame yet, or -1. */
static int watch_first_busy(const tally__boot *b) {
    for (int k = 1; k < b->size; k++)
        if (b->ctl[k] >= 0 && !watch_has_frame(b->ctl[k])) return k;
    return -1;
}

int tally__boot_watch_all_done(tally__boot *b, uint64_t deadline) {
    if (!tally__boot_watch_max(b) || b->rank != 0) return 0;
    struct pollfd *pfd = calloc((size_t)b->size, sizeof *pfd);
    if (!pfd) return tally__seterr(TALLY_E_NOMEM, "rank 0: out of memory waiting for the other ranks' setup");
    int rc = 0, busy;
    while (!(rc = tally__boot_watch_check(b)) && (busy = watch_first_busy(b)) >= 0) {
        if (tally__now_ns() >= deadline) {
            char who[160];
            tally__ctl_who(b, busy, who, sizeof who);
            rc = tally__fault_raise(b->fault, TALLY_E_TIMEOUT, busy,
                                    "rank 0: %s did not finish its setup (the "
                                    "transport's connections) in time: it is hung or much slower; raise TALLY_TIMEOUT "
                                    "if that is expected",
                                    who);
            break;
        }
        uint64_t soon = tally__deadline(0.2); /* connections holding unread frames are looked at again */
        int n = tally__boot_watch_fill(b, pfd);
        poll(pfd, (nfds_t)n, tally__net_poll_ms(soon < deadline ? soon : deadline));
    }
    free(pfd);
    return rc;
}
