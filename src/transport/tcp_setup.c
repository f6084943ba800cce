/* tcp_setup.c - the TCP mesh: every rank listens on its own address, the addresses are allgathered,
 * rank i connects to each j < i, and each connection is authenticated and names its rank once. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../boot/boot.h"
#include "../boot/net.h"
#include "../core/clock.h"
#include "../core/log.h"
#include "tcp_int.h"

/* Socket buffers large enough that a ring step of a few MiB streams without waiting for the reader
 * (the kernel caps them at net.core.[rw]mem_max). */
#define TCP_SOCKBUF (4 * 1024 * 1024)

typedef struct tcp_addr {
    char ip[64];
    uint32_t port;
    uint32_t reserved;
} tcp_addr;

/* Large buffers let a ring step of a few MiB stream without waiting for the reader. Best effort:
 * a smaller buffer costs speed, not correctness. */
static void tcp_bufs(int fd) {
    int buf = TCP_SOCKBUF;
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
}

/* Prefixes the helper's message (already in this thread's error) with our rank and layer. */
static int tcp_reword(int rc, int rank, const char *what) {
    char why[512];
    snprintf(why, sizeof why, "%s", tally_last_error());
    return tally__seterr(rc, "rank %d: tcp transport: %s%s", rank, what, why);
}

static int tcp_listen(const tally__tp_ctx *ctx, const char *ip, int *lfd, int *port) {
    int rc = tally__net_listen(ip, 0, ctx->size + 16, lfd);
    if (rc) return tcp_reword(rc, ctx->rank, "");
    tcp_bufs(*lfd); /* accepted sockets inherit them; nobody connects before the allgather below */
    *port = tally__net_local_port(*lfd);
    return 0;
}

/* Connects to a lower rank, proves the token, and names ourselves. */
static int tcp_dial(const tally__tp_ctx *ctx, int peer, const tcp_addr *a, uint64_t deadline, int *out) {
    size_t tlen;
    const void *tok = tally__boot_token(ctx->boot, &tlen);
    int fd = -1, rc = tally__net_connect(a->ip, (int)a->port, deadline, &fd);
    if (rc) return tcp_reword(rc, ctx->rank, "cannot reach a lower rank: ");
    tcp_bufs(fd);
    rc = tally__auth_connect(fd, tok, tlen, "tcp", deadline);
    if (rc) {
        close(fd);
        return tcp_reword(rc, ctx->rank, "");
    }
    tally__tcp_hello h = {.magic = TALLY__TCP_MAGIC_HELLO, .rank = (uint32_t)ctx->rank, .size = (uint32_t)ctx->size};
    if ((rc = tally__net_send_all(fd, &h, sizeof h, deadline))) {
        close(fd);
        return tally__seterr(rc, "rank %d: tcp transport: rank %d dropped the connection during setup", ctx->rank,
                             peer);
    }
    *out = fd;
    return 0;
}

static void tcp_close_all(tally__tcp_conn *conns, int n) {
    for (int i = 0; i < n; i++)
        if (conns[i].fd >= 0) {
            close(conns[i].fd);
            conns[i].fd = -1;
        }
}

int tally__tcp_mesh(const tally__tp_ctx *ctx, tally__tcp_conn *conns) {
    uint64_t deadline = tally__deadline(ctx->timeout_s);
    const tally__peer *peers = tally__boot_peers(ctx->boot);
    tcp_addr mine = {0}, *all = calloc((size_t)ctx->size, sizeof *all);
    if (!all) return tally__seterr(TALLY_E_NOMEM, "rank %d: tcp transport: out of memory", ctx->rank);
    snprintf(mine.ip, sizeof mine.ip, "%s", peers[ctx->rank].ip);
    int lfd = -1, port = 0, rc = tcp_listen(ctx, mine.ip, &lfd, &port);
    mine.port = (uint32_t)port;
    /* Every rank takes part in the allgather even after a local failure, so none waits for us. */
    int grc = tally__boot_allgather(ctx->boot, &mine, all, sizeof mine);
    if (!rc && grc) rc = grc;
    /* Dial down, then accept from above: rank i's dialing waits only on lower ranks, which finish their
     * own dialing first, so the order cannot deadlock; each accept finds its dialer actively waiting. */
    for (int j = 0; !rc && j < ctx->rank; j++) {
        all[j].ip[sizeof all[j].ip - 1] = '\0';
        rc = tcp_dial(ctx, j, &all[j], deadline, &conns[j].fd);
    }
    if (!rc) {
        size_t tlen;
        const void *tok = tally__boot_token(ctx->boot, &tlen);
        rc = tally__tcp_accept_peers(ctx, tok, tlen, lfd, conns, deadline);
    }
    if (lfd >= 0) close(lfd);
    free(all);
    if (rc) tcp_close_all(conns, ctx->size);
    return rc;
}
