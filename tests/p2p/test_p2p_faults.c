/* test_p2p_faults.c - point-to-point under failure: a receive nobody sends to and a send nobody takes
 * (TALLY_E_TIMEOUT naming the rank and tag), a peer killed mid-message or before it (TALLY_E_PEER_LOST
 * naming it, within seconds), another rank's death failing a receive from a live one, abort while a
 * receive waits, and a hostile peer (junk, a wrong token, malformed and absurd headers) that costs no
 * crash, no unbounded allocation and no other peer's traffic. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <tally.h>
#include <unistd.h>

#include "boot/boot.h"
#include "boot/net.h"
#include "coll/coll.h"
#include "core/clock.h"
#include "harness.h"
#include "p2p/po_int.h"

typedef struct result {
    int fails, rc;
    double secs, flag, flag2;
    char msg[800], first[800];
} result;

static result *R; /* [TH_MAX_RANKS], shared */

static void bad(int rank, const char *what) {
    if (R[rank].fails++ == 0) snprintf(R[rank].first, sizeof R[rank].first, "%s: %s", what, tally_last_error());
}
#define EXPECT(rank, cond)                                                                                             \
    do {                                                                                                               \
        if (!(cond)) bad(rank, #cond);                                                                                 \
    } while (0)

static void note(int rank, int rc, double t0) {
    R[rank].rc = rc;
    R[rank].secs = th_now() - t0;
    snprintf(R[rank].msg, sizeof R[rank].msg, "%s", tally_last_error());
}

static void reset(void) { memset(R, 0, sizeof *R * TH_MAX_RANKS); }

static void no_fails(int n, const char *what) {
    for (int r = 0; r < n; r++)
        TH_CHECK(R[r].fails == 0, "%s: rank %d: %d failures, first: %s", what, r, R[r].fails, R[r].first);
}

/* ---- timeouts: a receive nobody sends to; a send to a rank that never makes a point-to-point call is
 * no timeout (its post office runs from creation and keeps the message) ---- */

#define SHORT_S 1.0

static int fn_timeouts(int rank, int n, void *arg) {
    tally_comm *c;
    if (tally_comm_init(&c)) return bad(rank, "init"), 0;
    uint32_t v[4] = {0};
    double t0 = th_now();
    if (rank == 0) {
        note(rank, tally_send(c, v, 4, TALLY_I32, 2, 11), t0); /* rank 2 never receives it: still sent */
    } else if (rank == 1) {
        tally_request *any;
        EXPECT(rank, tally_irecv(c, v, 4, TALLY_I32, TALLY_ANY_SOURCE, 6, &any) == 0);
        note(rank, tally_recv(c, v, 4, TALLY_I32, 0, 5, NULL), t0);
        int rc = tally_wait(any);
        EXPECT(rank,
               rc == TALLY_E_TIMEOUT && strstr(tally_last_error(), "any rank") && strstr(tally_last_error(), "tag 6"));
        tally_request_free(any);
    }
    /* All ranks meet at one deadline, well after rank 1's timeouts, so the barrier's own 1 s timeout
     * measures only scheduling skew, not the test's choreography (a loaded machine once pushed rank 2
     * past rank 0's barrier wait). */
    double meet = t0 + 1.6 * SHORT_S;
    if (th_now() < meet) usleep((useconds_t)((meet - th_now()) * 1e6));
    EXPECT(rank, tally_barrier(c) == 0); /* a point-to-point timeout leaves the communicator whole */
    tally_comm_free(c);
    return 0;
}

static void test_timeouts(void) {
    reset();
    th_opts o = {.transport = "tcp", .timeout_s = SHORT_S, .wall_s = 30};
    TH_CHECK(th_run(3, &o, fn_timeouts, NULL) == 0, "timeouts: ranks did not exit cleanly");
    no_fails(3, "timeouts");
    TH_CHECK(R[1].rc == TALLY_E_TIMEOUT && strstr(R[1].msg, "rank 1: tally_recv from rank 0 with tag 5") &&
                 R[1].secs < SHORT_S + 3,
             "a receive nobody sends to: TIMEOUT naming rank 0 and tag 5 after %.1f s: %s (%s)", R[1].secs, R[1].msg,
             tally_strerror(R[1].rc));
    TH_CHECK(R[0].rc == 0 && R[0].secs < SHORT_S,
             "a send to a rank that never receives it is handed off at once, not after %.1f s: %s (%s)", R[0].secs,
             R[0].msg, tally_strerror(R[0].rc));
}

/* ---- a peer killed: mid-message, or with nothing sent; another rank's death ---- */

typedef struct kill_arg {
    int mid;   /* rank 0 dies while its large message is on the way */
    int other; /* rank 1 dies; rank 0's receive waits on rank 2, which lives */
} kill_arg;

static int fn_kill(int rank, int n, void *arg) {
    const kill_arg *k = arg;
    tally_comm *c;
    if (tally_comm_init(&c)) return bad(rank, "init"), 0;
    size_t m = th_light() ? (8u << 20) : (64u << 20);
    uint32_t *v = calloc(m, 4), small[2] = {1, 2};
    if (k->other) {
        if (rank == 1) {
            th_wait_set(&R[0].flag, 10);
            _exit(0); /* no goodbye */
        }
        if (rank == 0) {
            tally_request *r;
            EXPECT(rank, tally_irecv(c, small, 2, TALLY_I32, 2, 1, &r) == 0);
            R[0].flag = th_now();
            note(rank, tally_wait(r), R[0].flag);
            tally_request_free(r);
        }
        if (rank == 2) th_wait_set(&R[0].secs, 20);
    } else if (rank == 0) {
        EXPECT(rank, tally_send(c, small, 2, TALLY_I32, 1, 1) == 0); /* the connection is up */
        th_wait_set(&R[1].flag, 10);
        tally_request *s;
        if (k->mid)
            EXPECT(rank, tally_isend(c, v, m, TALLY_I32, 1, 2, &s) == 0); /* a part went */
        else
            usleep(2000);
        kill(getpid(), SIGKILL);
    } else {
        EXPECT(rank, tally_recv(c, small, 2, TALLY_I32, 0, 1, NULL) == 0);
        tally_request *r;
        EXPECT(rank, tally_irecv(c, v, m, TALLY_I32, 0, 2, &r) == 0);
        R[1].flag = th_now();
        note(rank, tally_wait(r), R[1].flag);
        tally_request_free(r);
    }
    free(v);
    tally_comm_free(c);
    return 0;
}

/* Mid-message means through the socket: a payload read in place would be read whole at once. */
static void no_cma_env(int rank, void *arg) {
    if (((const kill_arg *)arg)->mid) setenv("TALLY_SHM_CMA", "0", 1);
}

static void test_kill(int mid, int other, const char *transport) {
    reset();
    kill_arg a = {mid, other};
    th_opts o = {.transport = transport, .timeout_s = 60, .wall_s = 40, .child_env = no_cma_env};
    th_job job;
    int n = other ? 3 : 2, waiter = other ? 0 : 1, dead = other ? 1 : 0;
    if (th_start(&job, n, &o, fn_kill, &a)) {
        TH_CHECK(0, "kill: fork failed");
        return;
    }
    th_wait(&job, 40);
    const char *what = other ? "another rank dies" : mid ? "killed mid-message" : "killed before sending";
    TH_CHECK(WIFEXITED(job.status[waiter]) && WEXITSTATUS(job.status[waiter]) == 0, "%s (%s): rank %d did not exit 0",
             what, transport, waiter);
    no_fails(n, what);
    char name[16];
    snprintf(name, sizeof name, "rank %d", dead);
    TH_CHECK(R[waiter].rc == TALLY_E_PEER_LOST && strstr(R[waiter].msg, name) && R[waiter].secs < 10,
             "%s (%s): PEER_LOST naming rank %d within seconds, got %s after %.1f s: %s", what, transport, dead,
             tally_strerror(R[waiter].rc), R[waiter].secs, R[waiter].msg);
}

/* ---- abort while a receive waits on another thread ---- */

typedef struct waiter {
    tally_comm *c;
    int rc;
    double secs;
    char msg[800];
} waiter;

static void *recv_thread(void *arg) {
    waiter *w = arg;
    uint32_t v[4];
    double t0 = th_now();
    w->rc = tally_recv(w->c, v, 4, TALLY_I32, 0, 3, NULL);
    w->secs = th_now() - t0;
    snprintf(w->msg, sizeof w->msg, "%s", tally_last_error());
    return NULL;
}

static int fn_abort(int rank, int n, void *arg) {
    tally_comm *c;
    if (tally_comm_init(&c)) return bad(rank, "init"), 0;
    uint32_t v[4];
    if (rank == 1) {
        waiter w = {.c = c};
        pthread_t th;
        pthread_create(&th, NULL, recv_thread, &w);
        usleep(200 * 1000);
        double t0 = th_now();
        EXPECT(rank, tally_comm_abort(c) == 0);
        pthread_join(th, NULL);
        R[1].rc = w.rc;
        R[1].secs = th_now() - t0;
        snprintf(R[1].msg, sizeof R[1].msg, "%s", w.msg);
        return 0;
    }
    tally_request *r;
    EXPECT(rank, tally_irecv(c, v, 4, TALLY_I32, 1, 4, &r) == 0);
    double t0 = th_now();
    note(rank, tally_wait(r), t0);
    tally_request_free(r);
    tally_comm_free(c);
    return 0;
}

static void test_abort(void) {
    reset();
    th_opts o = {.transport = "tcp", .timeout_s = 60, .wall_s = 30};
    TH_CHECK(th_run(2, &o, fn_abort, NULL) == 0, "abort: ranks did not exit cleanly");
    no_fails(2, "abort");
    TH_CHECK(R[1].rc == TALLY_E_ABORTED && R[1].secs < 2,
             "abort: the waiting receive ends ABORTED, got %s after %.1f s: %s", tally_strerror(R[1].rc), R[1].secs,
             R[1].msg);
    TH_CHECK((R[0].rc == TALLY_E_ABORTED || R[0].rc == TALLY_E_PEER_LOST) && strstr(R[0].msg, "rank 1") &&
                 R[0].secs < 10,
             "abort: the peer's receive from the aborting rank fails naming it, got %s after %.1f s: %s",
             tally_strerror(R[0].rc), R[0].secs, R[0].msg);
}

/* ---- a hostile peer: rank 1 speaks the protocol by hand to rank 0, rank 2 is a real peer ---- */

static int raw_connect(int port, int auth, const char *token) {
    int fd = -1;
    if (tally__net_connect("127.0.0.1", port, tally__deadline(5), &fd)) return -1;
    if (auth && tally__auth_connect(fd, token, strlen(token), TALLY__PO_ROLE, tally__deadline(5))) {
        close(fd);
        return -2;
    }
    return fd;
}

/* An impostor naming rank 1 that sends one header (and `payload` bytes of it): returns the socket. */
static int impostor(int port, const char *token, tally__po_hdr h, size_t payload) {
    int fd = raw_connect(port, 1, token);
    if (fd < 0) return fd;
    tally__po_hello hello = {.magic = TALLY__PO_MAGIC_HELLO, .rank = 1, .size = 3, .pid = (uint32_t)getpid()};
    unsigned char welcome = 0xff;
    tally__net_send_all(fd, &hello, sizeof hello, tally__deadline(5));
    tally__net_recv_all(fd, &welcome, 1, tally__deadline(5));
    tally__net_send_all(fd, &h, sizeof h, tally__deadline(5));
    char *junk = calloc(1, payload + 1);
    if (payload) tally__net_send_all(fd, junk, payload, tally__deadline(5));
    free(junk);
    return fd;
}

/* 1 when the other end closed fd within limit_s. */
static int closed_by_peer(int fd, double limit_s) {
    char b[256];
    uint64_t dl = tally__deadline(limit_s);
    for (;;) {
        int rc = tally__net_recv_all(fd, b, sizeof b, dl);
        if (rc == TALLY_E_PEER_LOST) return 1;
        if (rc == TALLY_E_TIMEOUT) return 0;
    }
}

static void hostile_peer(int rank, int port, const char *token) {
    int stranger = raw_connect(port, 0, token);
    EXPECT(rank, stranger >= 0);
    if (stranger >= 0) send(stranger, "GET / HTTP/1.0\r\n", 16, MSG_NOSIGNAL);
    EXPECT(rank, raw_connect(port, 1, "not the token") == -2); /* refused: the verdict says so */
    tally__po_hdr h = {.magic = TALLY__PO_MAGIC_MSG, .src = 1, .tag = 0, .dtype = TALLY_I32, .count = 10, .bytes = 41};
    int fd = impostor(port, token, h, 0); /* a length that does not add up */
    EXPECT(rank, fd >= 0 && closed_by_peer(fd, 10));
    close(fd);
    R[1].flag2 = th_now();       /* rank 0 posts its receive only now: the reason must outlive the connection */
    th_wait_set(&R[0].flag, 10); /* rank 0's receive failed */
    h.bytes = 0, h.count = (uint64_t)1 << 62; /* absurd */
    fd = impostor(port, token, h, 0);
    EXPECT(rank, fd >= 0 && closed_by_peer(fd, 10));
    close(fd);
    h.count = 1 << 20, h.bytes = 4u << 20, h.flags = TALLY__PO_CMA; /* in place, never agreed */
    fd = impostor(port, token, h, 0);
    EXPECT(rank, fd >= 0 && closed_by_peer(fd, 10));
    close(fd);
    h.flags = 0, h.count = (uint64_t)1 << 40, h.bytes = (uint64_t)1 << 42; /* 4 TiB said, 1 MiB sent */
    fd = impostor(port, token, h, 1u << 20);
    EXPECT(rank, fd >= 0);
    close(fd);
    R[1].flag = th_now();
    th_wait_set(&R[0].flag2, 20);
    if (stranger >= 0) close(stranger);
}

static int fn_hostile(int rank, int n, void *arg) {
    tally_comm *c;
    if (tally_comm_init(&c)) return bad(rank, "init"), 0;
    int32_t port = (int32_t)tally__po_port(tally__comm_po(c)), ports[3];
    EXPECT(rank, tally_allgather(c, &port, ports, 1, TALLY_I32) == 0);
    uint32_t v[10];
    if (rank == 1) {
        hostile_peer(rank, ports[0], getenv("TALLY_TOKEN"));
    } else if (rank == 2) {
        v[0] = 42;
        EXPECT(rank, tally_send(c, v, 1, TALLY_I32, 0, 8) == 0); /* while a stranger holds a connection */
        th_wait_set(&R[1].flag, 20);
        v[0] = 43;
        EXPECT(rank, tally_send(c, v, 1, TALLY_I32, 0, 9) == 0); /* after every impostor */
    } else {
        tally_request *r;
        th_wait_set(&R[1].flag2, 20);
        EXPECT(rank, tally_irecv(c, v, 10, TALLY_I32, 1, 0, &r) == 0);
        int rc = tally_wait(r);
        snprintf(R[0].msg, sizeof R[0].msg, "%s", tally_last_error());
        R[0].rc = rc;
        tally_request_free(r);
        R[0].flag = th_now();
        int from = -1;
        EXPECT(rank, tally_recv(c, v, 1, TALLY_I32, TALLY_ANY_SOURCE, 8, &from) == 0 && from == 2 && v[0] == 42);
        EXPECT(rank, tally_recv(c, v, 1, TALLY_I32, 2, 9, NULL) == 0 && v[0] == 43);
        R[0].flag2 = th_now();
    }
    EXPECT(rank, tally_barrier(c) == 0);
    tally_comm_free(c);
    return 0;
}

static void test_hostile(void) {
    reset();
    th_opts o = {.transport = "tcp", .timeout_s = 30, .wall_s = 60};
    TH_CHECK(th_run(3, &o, fn_hostile, NULL) == 0, "hostile: ranks did not exit cleanly");
    no_fails(3, "hostile");
    TH_CHECK(R[0].rc == TALLY_E_PROTOCOL && strstr(R[0].msg, "rank 1") && strstr(R[0].msg, "length"),
             "a header whose length does not add up: PROTOCOL naming rank 1, got %s: %s", tally_strerror(R[0].rc),
             R[0].msg);
}

int main(void) {
    R = th_shared_alloc(sizeof *R * TH_MAX_RANKS);
    if (th_quick()) {
        test_timeouts();
        test_kill(1, 0, "tcp");
        test_abort();
        test_hostile();
    }
    if (th_long()) {
        test_kill(0, 0, "tcp");
        test_kill(1, 0, "shm");
        test_kill(0, 0, "shm");
        test_kill(0, 1, "tcp");
        test_kill(0, 1, "shm");
    }
    th_shared_free(R, sizeof *R * TH_MAX_RANKS);
    return th_verdict("test_p2p_faults");
}
