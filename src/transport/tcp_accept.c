/* tcp_accept.c - the TCP mesh's accepting side: every connection from a higher rank is advanced as
 * far as its bytes allow, none waited on, so a stranger that stalls or sends junk cannot hold up the mesh;
 * every rank still expected has room, however large the world, and strangers share a few slots more. */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../boot/boot.h"
#include "../boot/fdlimit.h"
#include "../boot/net.h"
#include "../core/clock.h"
#include "../core/err.h"
#include "../core/log.h"
#include "tcp_int.h"

/* Connections authenticating at once beyond one per rank still expected: strangers share these; past them
 * the oldest connection that has not proved the token gives way (a rank it was dials again). */
#define ACC_PEND_MAX 64
/* Longest poll() sleep: control connections holding unread frames are looked at again this often. */
#define ACC_WATCH_MS 200
/* Refusals logged one by one; the rest are counted in one line at the end. */
#define ACC_LOG_MAX 8

/* What a pending connection must send next. At ACC_HELLO it has proved the token: the job's own. */
enum { ACC_NONCE, ACC_PROOF, ACC_HELLO };
static const size_t acc_need[] = {TALLY__AUTH_IN, TALLY__AUTH_PROOF, sizeof(tally__tcp_hello)};
static const char *const acc_what[] = {"the handshake's nonce", "the handshake's proof", "the hello"};

typedef struct acc_pend {
    int fd, stage;
    size_t got;
    uint64_t until;           /* dropped if not through by then */
    unsigned char buf[64];
    tally__auth_acc auth;
    char from[TALLY__NET_ADDRSTR];
} acc_pend;

typedef struct acc_state {
    const tally__tp_ctx *ctx;
    const void *tok;
    size_t tlen;
    tally__tcp_conn *conns;
    int lfd, npend, cap, refused;
    int listen_off;     /* no room (or no descriptor) for another connection until a pending one finishes */
    int failed;         /* an error that ends the mesh, in this thread's message */
    acc_pend *pend;     /* [cap], oldest first */
    struct pollfd *pfd; /* [1 + cap + the boot watch's] */
} acc_state;

static void acc_drop(acc_state *s, acc_pend *p, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void acc_drop(acc_state *s, acc_pend *p, const char *fmt, ...) {
    if (++s->refused <= ACC_LOG_MAX) {
        char why[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, sizeof why, fmt, ap);
        va_end(ap);
        tally__log_warn("rank %d: tcp transport: refused a connection from %s: %s", s->ctx->rank, p->from, why);
    }
    close(p->fd);
    p->fd = -1;
}

/* A reply of a few bytes on a fresh socket: it goes out whole or the peer is not worth waiting for. */
static int acc_put(int fd, const void *p, size_t n) {
    ssize_t k;
    do k = send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    while (k < 0 && errno == EINTR);
    return k == (ssize_t)n ? 0 : -1;
}

/* Reads what the stage still lacks, without waiting. 1 complete, 0 not yet, -1 closed or failed. */
static int acc_fill(acc_pend *p) {
    while (p->got < acc_need[p->stage]) {
        ssize_t n = recv(p->fd, p->buf + p->got, acc_need[p->stage] - p->got, MSG_DONTWAIT);
        if (n > 0) {
            p->got += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -1;
    }
    return 1;
}

/* The hello names a higher rank of this world not yet connected: the connection becomes that rank's. */
static int acc_hello(acc_state *s, acc_pend *p) {
    tally__tcp_hello h;
    memcpy(&h, p->buf, sizeof h);
    int me = s->ctx->rank, n = s->ctx->size;
    if (h.magic != TALLY__TCP_MAGIC_HELLO || h.size != (uint32_t)n)
        return acc_drop(s, p, "its hello (magic %08x, world size %u) is not one of this job's tcp transport "
                              "(%08x, %d)", h.magic, h.size, TALLY__TCP_MAGIC_HELLO, n), -1;
    if (h.rank >= (uint32_t)n || (int)h.rank <= me || s->conns[h.rank].fd >= 0)
        return acc_drop(s, p, "it names rank %u, which is not a rank above %d still to connect (unexpected or "
                              "duplicate)", h.rank, me), -1;
    s->conns[h.rank].fd = p->fd;
    p->fd = -1;
    return 1;
}

/* Completes one stage. 0 on to the next, 1 joined, -1 dropped. */
static int acc_stage(acc_state *s, acc_pend *p) {
    unsigned char ok;
    switch (p->stage) {
    case ACC_NONCE:
        if (tally__auth_accept_begin(&p->auth, s->tok, s->tlen, "tcp", p->buf) ||
            acc_put(p->fd, p->auth.reply, sizeof p->auth.reply))
            return acc_drop(s, p, "could not answer its handshake"), -1;
        break;
    case ACC_PROOF:
        ok = (unsigned char)tally__auth_accept_check(&p->auth, p->buf);
        if (acc_put(p->fd, &ok, 1) || !ok)
            return acc_drop(s, p, "its proof does not match our TALLY_TOKEN (a process with a different token, "
                                  "or not a tally process)"), -1;
        break;
    default:
        return acc_hello(s, p);
    }
    p->stage++;
    p->got = 0;
    return 0;
}

/* Advances a connection as far as the bytes that arrived allow. 1 joined, 0 pending, -1 dropped. */
static int acc_advance(acc_state *s, acc_pend *p) {
    for (;;) {
        int rc = acc_fill(p);
        if (rc == 0) return 0;
        if (rc < 0)
            return acc_drop(s, p, "it closed the connection after %zu bytes of %s", p->got, acc_what[p->stage]), -1;
        if ((rc = acc_stage(s, p))) return rc;
    }
}

static int acc_missing(const acc_state *s) {
    int m = 0;
    for (int r = s->ctx->rank + 1; r < s->ctx->size; r++) m += s->conns[r].fd < 0;
    return m;
}

/* Makes room by dropping the oldest connection that has not proved the token; 0 when all pending ones
 * have (they are the job's own and name themselves at once). */
static int acc_evict(acc_state *s, const char *why) {
    for (int i = 0; i < s->npend; i++) {
        if (s->pend[i].stage == ACC_HELLO) continue;
        acc_drop(s, &s->pend[i], "%s", why);
        memmove(s->pend + i, s->pend + i + 1, sizeof s->pend[0] * (size_t)(s->npend - i - 1));
        s->npend--;
        return 1;
    }
    return 0;
}

/* accept() failed. Out of descriptors while more connections are pending than ranks are missing, a
 * stranger gives way; else the limit cannot hold this rank's peers: the mesh fails, naming it. */
static void acc_accept_failed(acc_state *s, int err) {
    if (!tally__fd_exhausted(err)) { /* e.g. ENOBUFS: let pending ones finish, not spin */
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
        return;
    }
    if (s->npend > acc_missing(s) && acc_evict(s, "this rank is out of file descriptors and the ranks still "
                                                 "expected come first"))
        return;
    if (s->npend > acc_missing(s)) { /* the job's own (duplicates?) hold them: they finish or expire */
        s->listen_off = 1;
        return;
    }
    char why[600];
    tally__fd_explain(err, why, sizeof why);
    s->failed = tally__seterr(TALLY_E_SYSTEM, "rank %d: tcp transport: accepting the connections of the %d ranks "
                              "above it (%d still to come): %s", s->ctx->rank, s->ctx->size - 1 - s->ctx->rank,
                              acc_missing(s), why);
}

static void acc_accept(acc_state *s) {
    while (!s->listen_off && !s->failed) {
        if (s->npend >= ACC_PEND_MAX + acc_missing(s) &&
            !acc_evict(s, "too many connections were authenticating at once (a flood?); the oldest gave way")) {
            s->listen_off = 1; /* all pending are the job's: they finish within a round or two */
            return;
        }
        int fd;
        if (tally__net_accept(s->lfd, &fd) != 0) {
            acc_accept_failed(s, errno);
            return;
        }
        if (fd < 0) return;
        acc_pend *p = &s->pend[s->npend++];
        memset(p, 0, sizeof *p);
        p->fd = fd;
        p->until = tally__deadline(TALLY__TCP_AUTH_S);
        tally__net_peer_str(fd, p->from, sizeof p->from);
    }
}

/* One round: waits for activity (or the first pending connection to expire) and handles it. */
static void acc_round(acc_state *s, uint64_t deadline) {
    int n = 0;
    uint64_t wake = deadline, soon = tally__deadline(ACC_WATCH_MS * 1e-3);
    if (wake > soon && tally__boot_watch_max(s->ctx->boot)) wake = soon;
    s->pfd[n++] = (struct pollfd){.fd = s->listen_off ? -1 : s->lfd, .events = POLLIN}; /* -1: poll skips it */
    for (int i = 0; i < s->npend; i++) {
        s->pfd[n++] = (struct pollfd){.fd = s->pend[i].fd, .events = POLLIN};
        if (s->pend[i].until < wake) wake = s->pend[i].until;
    }
    int nw = tally__boot_watch_fill(s->ctx->boot, s->pfd + n);
    if (poll(s->pfd, (nfds_t)(n + nw), tally__net_poll_ms(wake)) < 0) return; /* EINTR: next round */
    uint64_t now = tally__now_ns();
    int keep = 0;
    for (int i = 0; i < s->npend; i++) {
        acc_pend *p = &s->pend[i];
        int st = s->pfd[1 + i].revents ? acc_advance(s, p) : 0;
        if (st == 0 && now >= p->until) {
            acc_drop(s, p, "it sent %zu bytes of %s and then nothing for %g s", p->got, acc_what[p->stage],
                     TALLY__TCP_AUTH_S);
            st = -1;
        }
        if (st == 0 && keep != i) s->pend[keep] = *p;
        keep += st == 0;
    }
    if (keep < s->npend) s->listen_off = 0; /* a slot, and maybe a descriptor, came free */
    s->npend = keep;
    if (s->pfd[0].revents) acc_accept(s);
}

static int acc_alloc(acc_state *s) {
    s->cap = ACC_PEND_MAX + s->ctx->size - s->ctx->rank;
    s->pend = calloc((size_t)s->cap, sizeof *s->pend);
    s->pfd = calloc((size_t)(1 + s->cap + tally__boot_watch_max(s->ctx->boot)), sizeof *s->pfd);
    return s->pend && s->pfd ? 0 : -1;
}

int tally__tcp_accept_peers(const tally__tp_ctx *ctx, const void *tok, size_t tlen, int lfd, tally__tcp_conn *conns,
                            uint64_t deadline) {
    acc_state s = {.ctx = ctx, .tok = tok, .tlen = tlen, .conns = conns, .lfd = lfd};
    int rc = acc_alloc(&s) ? tally__seterr(TALLY_E_NOMEM, "rank %d: tcp transport: out of memory", ctx->rank) : 0;
    while (!rc && acc_missing(&s) > 0) {
        /* A rank that failed elsewhere (rank 0 relays its report) ends our wait now, not at the deadline. */
        if ((rc = tally__boot_watch_check(ctx->boot)) || (rc = s.failed)) break;
        if (tally__now_ns() >= deadline) {
            rc = tally__seterr(TALLY_E_TIMEOUT, "rank %d: tcp transport: %d rank(s) above us did not connect within "
                               "%.0f s%s", ctx->rank, acc_missing(&s), ctx->timeout_s,
                               s.refused ? " (connections were refused meanwhile: see the log)" : "");
            break;
        }
        acc_round(&s, deadline);
    }
    for (int i = 0; i < s.npend; i++) close(s.pend[i].fd);
    if (s.refused > ACC_LOG_MAX)
        tally__log_warn("rank %d: tcp transport: refused %d connections in all while the mesh was built", ctx->rank,
                        s.refused);
    free(s.pend);
    free(s.pfd);
    return rc;
}
