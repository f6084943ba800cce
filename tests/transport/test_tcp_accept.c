/* test_tcp_accept.c - the TCP mesh's accepting side under strangers: stalled handshakes, junk, a wrong
 * token, hellos of another world or naming a rank already held; the genuine ranks still get in, in time. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "boot/boot.h"
#include "boot/net.h"
#include "core/clock.h"
#include "harness.h"
#include "transport/tcp_int.h"

#define TOKEN    "tcp-accept-test-token"
#define STALLERS 12

static int ta_port;
static int ta_stall_fd[STALLERS];

static int ta_dial(void) {
    int fd = -1;
    if (tally__net_connect("127.0.0.1", ta_port, tally__deadline(3.0), &fd)) return -1;
    return fd;
}

/* Reads until the acceptor closes the connection (1), or 2 s pass (0). */
static int ta_closed(int fd) {
    char buf[256];
    uint64_t end = tally__deadline(2.0);
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return 1;
        if (n < 0 && tally__net_wait(fd, POLLIN, end)) return 0;
    }
}

/* Authenticates with `token` and names rank `rank` of `size`; then sends one marker byte. Returns the
 * fd, or -1 with *auth_rc set when the handshake failed. */
static int ta_join(const char *token, uint32_t magic, int rank, int size, char marker, int *auth_rc) {
    int fd = ta_dial();
    if (fd < 0) return -1;
    *auth_rc = tally__auth_connect(fd, token, strlen(token), "tcp", tally__deadline(3.0));
    if (*auth_rc) {
        close(fd);
        return -1;
    }
    tally__tcp_hello h = {.magic = magic, .rank = (uint32_t)rank, .size = (uint32_t)size};
    if (tally__net_send_all(fd, &h, sizeof h, tally__deadline(3.0)) ||
        tally__net_send_all(fd, &marker, 1, tally__deadline(3.0))) {
        close(fd);
        return -1;
    }
    return fd;
}

typedef struct ta_result {
    int junk_closed, probe_closed, wrong_token_rc, foreign_closed, low_rank_closed, dup_closed;
    int fd1, fd2;
} ta_result;

static void *ta_clients(void *arg) {
    ta_result *r = arg;
    int rc = 0;
    for (int i = 0; i < STALLERS; i++) { /* part of a nonce, then silence until the end */
        ta_stall_fd[i] = ta_dial();
        if (ta_stall_fd[i] >= 0) (void)send(ta_stall_fd[i], "0123456789", 10, MSG_NOSIGNAL);
    }
    int fd = ta_dial();
    char junk[200];
    memset(junk, 0xa5, sizeof junk);
    if (fd >= 0) (void)send(fd, junk, sizeof junk, MSG_NOSIGNAL); /* a nonce, then a "proof" that is junk */
    r->junk_closed = fd >= 0 && ta_closed(fd);
    if (fd >= 0) close(fd);
    fd = ta_dial(); /* a port probe */
    if (fd >= 0) close(fd);
    r->probe_closed = fd >= 0;
    fd = ta_join("not-the-token", TALLY__TCP_MAGIC_HELLO, 1, 3, '!', &r->wrong_token_rc);
    if (fd >= 0) close(fd);
    fd = ta_join(TOKEN, TALLY__TCP_MAGIC_HELLO, 1, 4, '!', &rc); /* another world's size */
    r->foreign_closed = fd >= 0 && ta_closed(fd);
    if (fd >= 0) close(fd);
    fd = ta_join(TOKEN, TALLY__TCP_MAGIC_HELLO, 0, 3, '!', &rc); /* the acceptor's own rank */
    r->low_rank_closed = fd >= 0 && ta_closed(fd);
    if (fd >= 0) close(fd);
    r->fd2 = ta_join(TOKEN, TALLY__TCP_MAGIC_HELLO, 2, 3, '2', &rc);
    fd = ta_join(TOKEN, TALLY__TCP_MAGIC_HELLO, 2, 3, '!', &rc); /* rank 2 again */
    r->dup_closed = fd >= 0 && ta_closed(fd);
    if (fd >= 0) close(fd);
    r->fd1 = ta_join(TOKEN, TALLY__TCP_MAGIC_HELLO, 1, 3, '1', &rc);
    return NULL;
}

static char ta_marker(int fd) {
    char c = 0;
    if (fd < 0 || tally__net_recv_all(fd, &c, 1, tally__deadline(3.0))) return 0;
    return c;
}

static void ta_strangers_refused(void) {
    int fds0 = th_count_fds(), lfd = -1;
    TH_CHECK(tally__net_listen("127.0.0.1", 0, 64, &lfd) == 0, "listen on loopback");
    ta_port = tally__net_local_port(lfd);
    tally__tp_ctx ctx = {.rank = 0, .size = 3, .timeout_s = 6.0};
    tally__tcp_conn conns[3] = {{.fd = -1}, {.fd = -1}, {.fd = -1}};
    ta_result r = {.fd1 = -1, .fd2 = -1};
    pthread_t th;
    TH_CHECK(pthread_create(&th, NULL, ta_clients, &r) == 0, "start the clients");
    /* Twelve stalled handshakes would hold a blocking acceptor for their 10 s each, past this deadline. */
    int rc = tally__tcp_accept_peers(&ctx, TOKEN, strlen(TOKEN), lfd, conns, tally__deadline(ctx.timeout_s));
    pthread_join(th, NULL);
    TH_CHECK(rc == 0, "the genuine ranks 1 and 2 were accepted (rc %d: %s)", rc, tally_last_error());
    TH_CHECK(ta_marker(conns[1].fd) == '1', "rank 1's connection is the genuine rank 1's");
    TH_CHECK(ta_marker(conns[2].fd) == '2', "rank 2's connection is the first rank 2's, not the duplicate's");
    TH_CHECK(r.junk_closed, "a connection sending junk was closed");
    TH_CHECK(r.probe_closed, "a port probe connected and left");
    TH_CHECK(r.wrong_token_rc == TALLY_E_AUTH, "a wrong token learns it was refused (rc %d)", r.wrong_token_rc);
    TH_CHECK(r.foreign_closed, "a hello of another world size was refused");
    TH_CHECK(r.low_rank_closed, "a hello naming a rank not above the acceptor was refused");
    TH_CHECK(r.dup_closed, "a second hello naming rank 2 was refused");
    for (int i = 0; i < STALLERS; i++) {
        TH_CHECK(ta_stall_fd[i] >= 0 && ta_closed(ta_stall_fd[i]), "stalled handshake %d was closed at the end", i);
        if (ta_stall_fd[i] >= 0) close(ta_stall_fd[i]);
    }
    close(conns[1].fd);
    close(conns[2].fd);
    close(r.fd1);
    close(r.fd2);
    close(lfd);
    TH_CHECK(th_count_fds() == fds0, "no descriptor left behind (%d before, %d after)", fds0, th_count_fds());
}

static void ta_missing_rank(void) {
    int fds0 = th_count_fds(), lfd = -1;
    TH_CHECK(tally__net_listen("127.0.0.1", 0, 64, &lfd) == 0, "listen on loopback");
    ta_port = tally__net_local_port(lfd);
    int stall = ta_dial();
    TH_CHECK(stall >= 0, "connect a staller");
    tally__tp_ctx ctx = {.rank = 1, .size = 4, .timeout_s = 1.0};
    tally__tcp_conn conns[4] = {{.fd = -1}, {.fd = -1}, {.fd = -1}, {.fd = -1}};
    double t0 = th_now();
    int rc = tally__tcp_accept_peers(&ctx, TOKEN, strlen(TOKEN), lfd, conns, tally__deadline(ctx.timeout_s));
    double took = th_now() - t0;
    TH_CHECK(rc == TALLY_E_TIMEOUT, "no rank above came: timeout (rc %d)", rc);
    TH_CHECK(strstr(tally_last_error(), "rank 1") && strstr(tally_last_error(), "2 rank(s) above us"),
             "the message names us and how many are missing: %s", tally_last_error());
    TH_CHECK(took < 5.0, "the deadline bounds the wait (%.1f s)", took);
    TH_CHECK(ta_closed(stall), "the stalled connection was closed");
    close(stall);
    close(lfd);
    TH_CHECK(th_count_fds() == fds0, "no descriptor left behind");
}

int main(void) {
    ta_strangers_refused();
    ta_missing_rank();
    return th_verdict("test_tcp_accept");
}
