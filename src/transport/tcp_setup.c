/* tcp_setup.c - the TCP mesh: every rank listens on its own address, the addresses are allgathered,
 * rank i connects to each j < i, and each connection is authenticated and names its rank once. */
#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../boot/boot.h"
#include "../boot/net.h"
#include "../core/clock.h"
#include "../core/log.h"
#include "tcp_int.h"

/* Socket buffers are left to the kernel's autotuning (net.ipv4.tcp_rmem, tcp_wmem). Fixing SO_RCVBUF
 * (4 MiB, as we once did) turns autotuning off, and on loopback the receive queue then overflowed now
 * and then: a dropped segment waited for the 200 ms retransmission timeout, and one start in six ran
 * 64 MiB allreduces at half speed (0.74-0.84 against 1.6-1.7 GB/s; 5 TCPTimeouts in 12 starts, none
 * in 12 without it). */
/* A dial's waits are cut into slices this long, between which the control connections are looked at:
 * a rank that failed elsewhere ends the mesh on every rank at once, not at the timeout. */
#define TCP_SLICE_S 0.2
/* Pause before dialing again when the acceptor dropped a connection that had not proved the token yet
 * (its slots were full of strangers, or it was not accepting yet). */
#define TCP_REDIAL_MS 20

typedef struct tcp_addr {
    char ip[64];
    uint32_t port;
    uint32_t reserved;
} tcp_addr;

/* Prefixes the helper's message (already in this thread's error) with our rank and layer. */
static int tcp_reword(int rc, int rank, const char *what) {
    char why[512];
    snprintf(why, sizeof why, "%s", tally_last_error());
    return tally__seterr(rc, "rank %d: tcp transport: %s%s", rank, what, why);
}

static int tcp_listen(const tally__tp_ctx *ctx, const char *ip, int *lfd, int *port) {
    int rc = tally__net_listen(ip, 0, ctx->size + 16, lfd);
    if (rc) return tcp_reword(rc, ctx->rank, "");
    *port = tally__net_local_port(*lfd);
    return 0;
}

/* Waits until fd is ready for `events` (or has an error), bounded by the deadline, looking at the control
 * connections meanwhile. 0, TALLY_E_TIMEOUT, or the code of a fault another rank reported. */
static int tcp_wait(const tally__tp_ctx *ctx, int fd, short events, uint64_t deadline) {
    int nw = tally__boot_watch_max(ctx->boot);
    struct pollfd *pfd = calloc((size_t)nw + 1, sizeof *pfd);
    if (!pfd) return tally__seterr(TALLY_E_NOMEM, "rank %d: tcp transport: out of memory", ctx->rank);
    int rc = 0;
    for (;;) {
        if ((rc = tally__boot_watch_check(ctx->boot))) break;
        uint64_t now = tally__now_ns(), wake = tally__deadline(TCP_SLICE_S);
        if (now >= deadline) {
            rc = TALLY_E_TIMEOUT;
            break;
        }
        pfd[0] = (struct pollfd){.fd = fd, .events = events};
        int n = 1 + tally__boot_watch_fill(ctx->boot, pfd + 1);
        if (poll(pfd, (nfds_t)n, tally__net_poll_ms(wake < deadline ? wake : deadline)) > 0 && pfd[0].revents) break;
    }
    free(pfd);
    return rc;
}

/* Moves len bytes over a non-blocking socket in one direction, waiting (watched) for room or data. 0,
 * TALLY_E_PEER_LOST (closed or reset), TALLY_E_TIMEOUT, TALLY_E_SYSTEM, or a fault's code. */
static int tcp_move(const tally__tp_ctx *ctx, int fd, void *buf, size_t len, int out, uint64_t deadline) {
    unsigned char *p = buf;
    while (len > 0) {
        ssize_t k = out ? send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT) : recv(fd, p, len, MSG_DONTWAIT);
        if (k > 0) {
            p += k;
            len -= (size_t)k;
            continue;
        }
        if (k == 0) return TALLY_E_PEER_LOST;
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return errno == ECONNRESET || errno == EPIPE || errno == ENOTCONN ? TALLY_E_PEER_LOST : TALLY_E_SYSTEM;
        int rc = tcp_wait(ctx, fd, out ? POLLOUT : POLLIN, deadline);
        if (rc) return rc;
    }
    return 0;
}

/* The connector's handshake (auth.c's steps), every wait watched. TALLY_E_AUTH on a token mismatch. */
static int tcp_auth(const tally__tp_ctx *ctx, int fd, uint64_t deadline) {
    size_t tlen;
    const void *tok = tally__boot_token(ctx->boot, &tlen);
    tally__auth_con a;
    unsigned char reply[TALLY__AUTH_REPLY], verdict = 0;
    if (tally__auth_connect_begin(&a)) return TALLY_E_SYSTEM;
    int rc = tcp_move(ctx, fd, a.nonce, sizeof a.nonce, 1, deadline);
    if (!rc) rc = tcp_move(ctx, fd, reply, sizeof reply, 0, deadline);
    if (rc) return rc;
    int proved = tally__auth_connect_answer(&a, tok, tlen, "tcp", reply);
    if (proved < 0) return TALLY_E_SYSTEM;
    if ((rc = tcp_move(ctx, fd, a.proof, sizeof a.proof, 1, deadline))) return rc;
    if (!proved) return TALLY_E_AUTH;
    if ((rc = tcp_move(ctx, fd, &verdict, 1, 0, deadline))) return rc;
    return verdict == 1 ? 0 : TALLY_E_AUTH;
}

/* Connects, in watched slices: the lower rank's listener is up (the allgather came after it), so a
 * refusal means it is gone, which the watch hears about from rank 0. */
static int tcp_connect(const tally__tp_ctx *ctx, const tcp_addr *a, uint64_t deadline, int *fd) {
    for (;;) {
        int rc = tally__boot_watch_check(ctx->boot);
        if (rc) return rc;
        uint64_t slice = tally__deadline(TCP_SLICE_S);
        rc = tally__net_connect(a->ip, (int)a->port, slice < deadline ? slice : deadline, fd);
        if (rc != TALLY_E_TIMEOUT || tally__now_ns() >= deadline) return rc; /* its message says what happened */
    }
}

/* Words for a dial that failed; a fault another rank reported keeps its own message. `connecting`: the
 * connection itself never came up (its helper's message says why). */
static int tcp_dial_fail(const tally__tp_ctx *ctx, int peer, const tcp_addr *a, int rc, int connecting) {
    char prev[512];
    snprintf(prev, sizeof prev, "%s", tally_last_error());
    if (tally__boot_setup_failed_elsewhere(ctx->boot)) return rc; /* another rank's failure, in its words */
    if (connecting) return tally__seterr(rc, "rank %d: tcp transport: cannot reach rank %d: %s", ctx->rank, peer, prev);
    if (rc == TALLY_E_AUTH)
        return tally__seterr(rc,
                             "rank %d: tcp transport: authentication with rank %d at %s:%u failed: this "
                             "process's TALLY_TOKEN does not match the peer's; every rank of a job must have the same "
                             "TALLY_TOKEN",
                             ctx->rank, peer, a->ip, (unsigned)a->port);
    if (rc == TALLY_E_TIMEOUT)
        return tally__seterr(rc,
                             "rank %d: tcp transport: rank %d at %s:%u did not answer our connection within "
                             "%.0f s: it is hung or much slower (raise TALLY_TIMEOUT if that is expected)",
                             ctx->rank, peer, a->ip, (unsigned)a->port, ctx->timeout_s);
    if (rc == TALLY_E_PEER_LOST)
        return tally__seterr(rc, "rank %d: tcp transport: rank %d dropped the connection during setup", ctx->rank,
                             peer);
    return tally__seterr(rc, "rank %d: tcp transport: the handshake with rank %d failed: %s", ctx->rank, peer,
                         tally_strerror(rc));
}

/* Connects to a lower rank, proves the token, and names ourselves. A connection the acceptor dropped
 * before the verdict (its slots were full, or a flood pushed ours out) is dialed again. */
static int tcp_dial(const tally__tp_ctx *ctx, int peer, const tcp_addr *a, uint64_t deadline, int *out) {
    tally__tcp_hello h = {.magic = TALLY__TCP_MAGIC_HELLO, .rank = (uint32_t)ctx->rank, .size = (uint32_t)ctx->size};
    for (;;) {
        int fd = -1, rc = tcp_connect(ctx, a, deadline, &fd);
        if (rc) return tcp_dial_fail(ctx, peer, a, rc, 1);
        rc = tcp_auth(ctx, fd, deadline);
        if (!rc) rc = tcp_move(ctx, fd, &h, sizeof h, 1, deadline);
        if (!rc) {
            *out = fd;
            return 0;
        }
        close(fd);
        if (rc != TALLY_E_PEER_LOST || tally__now_ns() >= deadline) return tcp_dial_fail(ctx, peer, a, rc, 0);
        struct timespec ts = {0, TCP_REDIAL_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* A rank that cannot build its part of the mesh tells every rank why (through rank 0): they would
 * otherwise wait for it until their own timeouts. Not when the failure was another rank's, told to us. */
static int tcp_fail(const tally__tp_ctx *ctx, int rc) {
    if (!ctx->fault || tally__boot_setup_failed_elsewhere(ctx->boot)) return rc;
    char msg[sizeof ctx->fault->msg];
    snprintf(msg, sizeof msg, "%s", tally_last_error());
    if (!atomic_load(&ctx->fault->code)) return tally__fault_raise(ctx->fault, rc, ctx->rank, "%s", msg);
    tally__boot_tell_setup_failure(ctx->boot, rc, msg); /* a fault recorded earlier did not end our setup */
    return tally__seterr(rc, "%s", msg);
}

static void tcp_close_all(tally__tcp_conn *conns, int n) {
    for (int i = 0; i < n; i++)
        if (conns[i].fd >= 0) {
            close(conns[i].fd);
            conns[i].fd = -1;
        }
}

/* Dial down, then accept from above: rank i's dialing waits only on lower ranks, which finish their own
 * dialing first, so the order cannot deadlock; each accept finds its dialer actively waiting. */
static int tcp_connect_all(const tally__tp_ctx *ctx, tcp_addr *all, int lfd, tally__tcp_conn *conns,
                           uint64_t deadline) {
    int rc = 0;
    for (int j = 0; !rc && j < ctx->rank; j++) {
        all[j].ip[sizeof all[j].ip - 1] = '\0';
        rc = tcp_dial(ctx, j, &all[j], deadline, &conns[j].fd);
    }
    size_t tlen;
    const void *tok = tally__boot_token(ctx->boot, &tlen);
    return rc ? rc : tally__tcp_accept_peers(ctx, tok, tlen, lfd, conns, deadline);
}

static int tcp_mesh(const tally__tp_ctx *ctx, tally__tcp_conn *conns) {
    uint64_t deadline = tally__deadline(ctx->timeout_s);
    const tally__peer *peers = tally__boot_peers(ctx->boot);
    tcp_addr mine = {0}, *all = calloc((size_t)ctx->size, sizeof *all);
    if (!all) return tcp_fail(ctx, tally__seterr(TALLY_E_NOMEM, "rank %d: tcp transport: out of memory", ctx->rank));
    snprintf(mine.ip, sizeof mine.ip, "%s", peers[ctx->rank].ip);
    int lfd = -1, port = 0, rc = tcp_listen(ctx, mine.ip, &lfd, &port);
    mine.port = (uint32_t)port;
    /* A local failure is raised before the allgather, which then carries it to every rank. */
    if (rc) rc = tcp_fail(ctx, rc);
    int grc = tally__boot_allgather(ctx->boot, &mine, all, sizeof mine);
    if (!rc && !grc && (rc = tcp_connect_all(ctx, all, lfd, conns, deadline))) rc = tcp_fail(ctx, rc);
    if (lfd >= 0) close(lfd);
    free(all);
    if (!rc) rc = grc; /* the allgather's failure is a fault every rank has already */
    /* No rank uses the mesh before every rank has built its part: one still building, whose peer failed,
     * would otherwise hear of it only from rank 0, and rank 0 relays only while it watches here. */
    if (!rc) rc = tally__boot_watch_all_done(ctx->boot, deadline);
    if (!rc && ctx->boot) rc = tally__boot_barrier(ctx->boot);
    if (rc) tcp_close_all(conns, ctx->size);
    return rc;
}

tally__tcp_conn *tally__tcp_conns_new(const tally__tp_ctx *ctx) {
    tally__tcp_conn *conns = calloc((size_t)ctx->size, sizeof *conns);
    for (int p = 0; conns && p < ctx->size; p++) {
        conns[p].fd = -1;
        conns[p].w_peer = -1;
        if (p != ctx->rank && !(conns[p].rb = aligned_alloc(64, TALLY__TCP_RB))) {
            tally__tcp_conns_free(conns, ctx->size);
            return NULL;
        }
    }
    return conns;
}

void tally__tcp_conns_free(tally__tcp_conn *conns, int n) {
    for (int p = 0; conns && p < n; p++) free(conns[p].rb);
    free(conns);
}

int tally__tcp_mesh(const tally__tp_ctx *ctx, tally__tcp_conn *conns) {
    tally__boot_setup_phase(ctx->boot, 1); /* what fails meanwhile ends the other ranks' setup too */
    int rc = tcp_mesh(ctx, conns);
    tally__boot_setup_phase(ctx->boot, 0);
    return rc;
}
