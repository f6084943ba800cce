/* accept.c - one acceptor for every listening socket of a job: connections authenticate (the token's
 * challenge) and then go through their user's stages, each fed as its bytes arrive, strangers capped. */
#include "accept.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../core/clock.h"
#include "../core/err.h"
#include "fdlimit.h"

int tally__acc_init(tally__acceptor *a, int lfd, const void *tok, size_t tlen, int strangers, int cap, double auth_s,
                    const tally__acc_user *u) {
    memset(a, 0, sizeof *a);
    a->lfd = lfd;
    a->tok = tok;
    a->tlen = tlen;
    a->strangers = strangers;
    a->cap = cap;
    a->auth_s = auth_s;
    a->u = *u;
    a->pend = calloc((size_t)cap, sizeof *a->pend);
    return a->pend ? 0 : TALLY_E_NOMEM;
}

void tally__acc_free(tally__acceptor *a) {
    for (int i = 0; a->pend && i < a->npend; i++) close(a->pend[i].fd);
    free(a->pend);
    a->pend = NULL;
    a->npend = 0;
}

void tally__acc_drop(tally__acceptor *a, tally__acc_conn *c, const char *fmt, ...) {
    char why[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    a->u.note(a->u.arg, c->from, why);
    close(c->fd);
    c->fd = -1;
}

int tally__acc_put(int fd, const void *p, size_t n) {
    ssize_t k;
    do k = send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    while (k < 0 && errno == EINTR);
    return k == (ssize_t)n ? 0 : -1;
}

static size_t acc_need(const tally__acceptor *a, int stage) {
    return stage == 0 ? TALLY__AUTH_IN : stage == 1 ? TALLY__AUTH_PROOF : a->u.need(a->u.arg, stage);
}

static const char *acc_what(const tally__acceptor *a, int stage) {
    return stage == 0 ? "its nonce" : stage == 1 ? "its proof of the token" : a->u.what(a->u.arg, stage);
}

/* Reads what the stage still lacks, without waiting. 1 complete, 0 not yet, -1 closed or failed. */
static int acc_fill(const tally__acceptor *a, tally__acc_conn *c) {
    size_t need = acc_need(a, c->stage);
    if (need > sizeof c->buf) return -1;
    while (c->got < need) {
        ssize_t n = recv(c->fd, c->buf + c->got, need - c->got, MSG_DONTWAIT);
        if (n > 0) {
            c->got += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -1;
    }
    return 1;
}

/* Completes one stage. 0 on to the next, 1 joined, -1 dropped. */
static int acc_stage(tally__acceptor *a, tally__acc_conn *c) {
    unsigned char ok;
    switch (c->stage) {
    case 0:
        if (tally__auth_accept_begin(&c->auth, a->tok, a->tlen, a->u.role, c->buf) ||
            tally__acc_put(c->fd, c->auth.reply, sizeof c->auth.reply))
            return tally__acc_drop(a, c, "could not answer its handshake (%s)", tally_last_error()), -1;
        break;
    case 1:
        ok = (unsigned char)tally__auth_accept_check(&c->auth, c->buf);
        if (tally__acc_put(c->fd, &ok, 1) || !ok)
            return tally__acc_drop(a, c,
                                   "wrong TALLY_TOKEN or not a tally process (its proof does not match "
                                   "this job's token)"),
                   -1;
        break;
    default: {
        int rc = a->u.stage(a->u.arg, c);
        if (rc) return rc;
    }
    }
    c->stage++;
    c->got = 0;
    return 0;
}

/* Advances a connection as far as the bytes that arrived allow. 1 joined, 0 pending, -1 dropped. */
static int acc_advance(tally__acceptor *a, tally__acc_conn *c) {
    for (;;) {
        int rc = acc_fill(a, c);
        if (rc == 0) return 0;
        if (rc < 0) {
            if (c->stage == 0 && c->got == 0)
                tally__acc_drop(a, c, "it closed without a byte of the handshake (a port probe?)");
            else
                tally__acc_drop(a, c, "it closed the connection after %zu bytes of %s (not a tally rank?)", c->got,
                                acc_what(a, c->stage));
            return -1;
        }
        if ((rc = acc_stage(a, c))) return rc;
    }
}

/* Makes room by refusing the oldest connection that has not proved the token; 0 when none is left. */
static int acc_evict(tally__acceptor *a, const char *why) {
    for (int i = 0; i < a->npend; i++) {
        if (a->pend[i].stage > 1) continue; /* it proved the token: one of the job's, never evicted */
        tally__acc_drop(a, &a->pend[i], "%s", why);
        memmove(a->pend + i, a->pend + i + 1, sizeof a->pend[0] * (size_t)(a->npend - i - 1));
        a->npend--;
        return 1;
    }
    return 0;
}

/* accept() failed. Out of descriptors while more connections are pending than ranks are missing, a
 * stranger gives way; else the user decides. */
static void acc_accept_failed(tally__acceptor *a, int err) {
    if (!tally__fd_exhausted(err)) { /* e.g. ENOBUFS: let pending ones finish, not spin */
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
        return;
    }
    int missing = a->u.missing(a->u.arg);
    if (a->npend > missing && acc_evict(a, "out of file descriptors, and the ranks still expected come first")) return;
    if (a->u.out_of_fds(a->u.arg, err)) a->listen_off = 1;
}

static void acc_accept(tally__acceptor *a) {
    while (!a->listen_off && a->npend < a->cap) {
        if (a->npend >= a->strangers + a->u.missing(a->u.arg) &&
            !acc_evict(a, "too many connections were authenticating at once (a flood?); the oldest gave way")) {
            a->listen_off = 1; /* all pending are the job's: they finish within a round or two */
            return;
        }
        int fd;
        if (tally__net_accept(a->lfd, &fd) != 0) {
            acc_accept_failed(a, errno);
            return;
        }
        if (fd < 0) return;
        tally__acc_conn *c = &a->pend[a->npend++];
        memset(c, 0, sizeof *c);
        c->fd = fd;
        c->until = tally__deadline(a->auth_s);
        tally__net_peer_str(fd, c->from, sizeof c->from);
    }
}

int tally__acc_poll_fill(const tally__acceptor *a, struct pollfd *pfd) {
    int n = 0;
    pfd[n++] = (struct pollfd){.fd = a->listen_off ? -1 : a->lfd, .events = POLLIN}; /* -1: poll skips it */
    for (int i = 0; i < a->npend; i++) pfd[n++] = (struct pollfd){.fd = a->pend[i].fd, .events = POLLIN};
    return n;
}

uint64_t tally__acc_wake(const tally__acceptor *a, uint64_t deadline) {
    for (int i = 0; i < a->npend; i++)
        if (a->pend[i].until < deadline) deadline = a->pend[i].until;
    return deadline;
}

int tally__acc_handle(tally__acceptor *a, const struct pollfd *pfd) {
    uint64_t now = tally__now_ns();
    int keep = 0, joined = 0;
    for (int i = 0; i < a->npend; i++) {
        tally__acc_conn *c = &a->pend[i];
        int st = pfd[1 + i].revents ? acc_advance(a, c) : 0;
        if (st == 0 && now >= c->until) {
            tally__acc_drop(a, c, "it sent %zu bytes of %s and then nothing for %g s (not a tally rank?)", c->got,
                            acc_what(a, c->stage), a->auth_s);
            st = -1;
        }
        joined += st > 0;
        if (st == 0 && keep != i) a->pend[keep] = *c;
        keep += st == 0;
    }
    if (keep < a->npend) a->listen_off = 0; /* a slot, and maybe a descriptor, came free */
    a->npend = keep;
    if (pfd[0].revents) acc_accept(a);
    return joined;
}
