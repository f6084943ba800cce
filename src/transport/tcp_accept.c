/* tcp_accept.c - the TCP mesh's accepting side, on the job's one acceptor (boot/accept.c): every higher
 * rank's connection proves the token, then its hello names the rank; strangers cannot hold the mesh up. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../boot/accept.h"
#include "../boot/fdlimit.h"
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

typedef struct mesh_acc {
    const tally__tp_ctx *ctx;
    tally__tcp_conn *conns;
    int refused;
    int failed; /* an error that ends the mesh, in this thread's message */
    tally__acceptor a;
} mesh_acc;

static int mesh_missing(void *arg) {
    const mesh_acc *s = arg;
    int m = 0;
    for (int r = s->ctx->rank + 1; r < s->ctx->size; r++) m += s->conns[r].fd < 0;
    return m;
}

static void mesh_note(void *arg, const char *from, const char *why) {
    mesh_acc *s = arg;
    if (++s->refused <= ACC_LOG_MAX)
        tally__log_warn("rank %d: tcp transport: refused a connection from %s: %s", s->ctx->rank, from, why);
}

static size_t mesh_need(void *arg, int stage) { return sizeof(tally__tcp_hello); }
static const char *mesh_what(void *arg, int stage) { return "the hello"; }

/* The hello names a higher rank of this world not yet connected: the connection becomes that rank's. */
static int mesh_hello(void *arg, tally__acc_conn *c) {
    mesh_acc *s = arg;
    tally__tcp_hello h;
    memcpy(&h, c->buf, sizeof h);
    int me = s->ctx->rank, n = s->ctx->size;
    if (h.magic != TALLY__TCP_MAGIC_HELLO || h.size != (uint32_t)n)
        return tally__acc_drop(&s->a, c,
                               "its hello (magic %08x, world size %u) is not one of this job's tcp transport "
                               "(%08x, %d)",
                               h.magic, h.size, TALLY__TCP_MAGIC_HELLO, n),
               -1;
    if (h.rank >= (uint32_t)n || (int)h.rank <= me || s->conns[h.rank].fd >= 0)
        return tally__acc_drop(&s->a, c,
                               "it names rank %u, which is not a rank above %d still to connect "
                               "(unexpected or duplicate)",
                               h.rank, me),
               -1;
    s->conns[h.rank].fd = c->fd;
    c->fd = -1;
    return 1;
}

/* Out of descriptors and no stranger to give way: the job's own (duplicates?) hold them and finish or
 * expire; else the limit cannot hold this rank's peers and the mesh fails, naming it. */
static int mesh_out_of_fds(void *arg, int err) {
    mesh_acc *s = arg;
    if (s->a.npend > mesh_missing(s)) return 1;
    char why[600];
    tally__fd_explain(err, why, sizeof why);
    s->failed = tally__seterr(TALLY_E_SYSTEM,
                              "rank %d: tcp transport: accepting the connections of the %d ranks "
                              "above it (%d still to come): %s",
                              s->ctx->rank, s->ctx->size - 1 - s->ctx->rank, mesh_missing(s), why);
    return 1;
}

/* One round: waits for activity (or the first pending connection to expire) and handles it. */
static void mesh_round(mesh_acc *s, struct pollfd *pfd, uint64_t deadline) {
    uint64_t wake = tally__acc_wake(&s->a, deadline), soon = tally__deadline(ACC_WATCH_MS * 1e-3);
    if (wake > soon && tally__boot_watch_max(s->ctx->boot)) wake = soon;
    int n = tally__acc_poll_fill(&s->a, pfd);
    int nw = tally__boot_watch_fill(s->ctx->boot, pfd + n);
    if (poll(pfd, (nfds_t)(n + nw), tally__net_poll_ms(wake)) < 0) return; /* EINTR: next round */
    tally__acc_handle(&s->a, pfd);
}

int tally__tcp_accept_peers(const tally__tp_ctx *ctx, const void *tok, size_t tlen, int lfd, tally__tcp_conn *conns,
                            uint64_t deadline) {
    mesh_acc s = {.ctx = ctx, .conns = conns};
    tally__acc_user u = {.arg = &s,
                         .role = "tcp",
                         .need = mesh_need,
                         .what = mesh_what,
                         .stage = mesh_hello,
                         .missing = mesh_missing,
                         .out_of_fds = mesh_out_of_fds,
                         .note = mesh_note};
    int cap = ACC_PEND_MAX + ctx->size - ctx->rank;
    struct pollfd *pfd = calloc((size_t)(1 + cap + tally__boot_watch_max(ctx->boot)), sizeof *pfd);
    int rc = !pfd || tally__acc_init(&s.a, lfd, tok, tlen, ACC_PEND_MAX, cap, TALLY__TCP_AUTH_S, &u)
                 ? tally__seterr(TALLY_E_NOMEM, "rank %d: tcp transport: out of memory", ctx->rank)
                 : 0;
    while (!rc && mesh_missing(&s) > 0) {
        /* A rank that failed elsewhere (rank 0 relays its report) ends our wait now, not at the deadline. */
        if ((rc = tally__boot_watch_check(ctx->boot)) || (rc = s.failed)) break;
        if (tally__now_ns() >= deadline) {
            rc = tally__seterr(TALLY_E_TIMEOUT,
                               "rank %d: tcp transport: %d rank(s) above us did not connect within "
                               "%.0f s%s",
                               ctx->rank, mesh_missing(&s), ctx->timeout_s,
                               s.refused ? " (connections were refused meanwhile: see the log)" : "");
            break;
        }
        mesh_round(&s, pfd, deadline);
    }
    tally__acc_free(&s.a);
    if (s.refused > ACC_LOG_MAX)
        tally__log_warn("rank %d: tcp transport: refused %d connections in all while the mesh was built", ctx->rank,
                        s.refused);
    free(pfd);
    return rc;
}
