/* test_boot.c - the rendezvous layer: environment parsing per launcher, rendezvous and bootstrap
 * collectives for several world sizes, the bind address, refusals (token, rank, size, forged hellos,
 * strangers that stall), missing ranks named on every rank, the rendezvous limit, and the monitor. */
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "boot/boot.h"
#include "boot/boot_int.h"
#include "boot/net.h"
#include "core/clock.h"
#include "core/env.h"
#include "boot_env.h"
#include "harness.h"

/* ---- per-rank results, in memory shared with the parent ---- */

typedef struct rres {
    int rc, code, culprit, fd_leak, wake_ok;
    double secs;
    char msg[800];
    int pids[TH_MAX_RANKS];
    uint64_t hostids[TH_MAX_RANKS];
    char ip[TH_MAX_RANKS][64];
    tally__boot_env env;
} rres;

static rres *R;

static void usleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void save_err(int rank, int rc, double t0) {
    R[rank].rc = rc;
    R[rank].secs = th_now() - t0;
    snprintf(R[rank].msg, sizeof R[rank].msg, "%s", tally_last_error());
}

/* Polls the fault record for up to `secs`; records what arrived. */
static void wait_fault(int rank, tally__fault *f, double secs) {
    double t0 = th_now();
    while (th_now() - t0 < secs && !tally__fault_check(f)) usleep_ms(5);
    R[rank].code = tally__fault_check(f);
    R[rank].culprit = f->culprit;
    R[rank].secs = th_now() - t0;
    snprintf(R[rank].msg, sizeof R[rank].msg, "%s", R[rank].code ? f->msg : "");
}

/* The boot env tally_comm_init makes from this process's environment. */
static int boot_env_read(tally__boot_env *env) {
    tally_config cfg;
    return th_boot_env(&cfg, env);
}

/* env_read + fault_init + boot_init; returns the boot or NULL (result recorded). */
static tally__boot *boot_up(int rank, tally__fault *f, double timeout) {
    tally__boot_env env;
    tally__boot *b = NULL;
    double t0 = th_now();
    tally__fault_init(f);
    int rc = boot_env_read(&env);
    if (!rc) rc = tally__boot_init(&b, &env, f, timeout);
    save_err(rank, rc, t0);
    return b;
}

/* ---- rendezvous and bootstrap collectives ---- */

static int check_colls(tally__boot *b, int rank, int size) {
    int bad = 0;
    for (int root = 0; root < size; root++) {
        unsigned char buf[100];
        for (int i = 0; i < 100; i++) buf[i] = rank == root ? (unsigned char)(root * 31 + i) : 0;
        if (tally__boot_bcast(b, buf, sizeof buf, root)) return 100;
        for (int i = 0; i < 100; i++) bad += buf[i] != (unsigned char)(root * 31 + i);
    }
    size_t big = 1 << 20; /* larger than a socket buffer: the relay must stream it */
    unsigned char *p = malloc(big);
    for (size_t i = 0; i < big; i++) p[i] = rank == size - 1 ? (unsigned char)(i * 7) : 0;
    if (tally__boot_bcast(b, p, big, size - 1)) return 101;
    for (size_t i = 0; i < big; i++) bad += p[i] != (unsigned char)(i * 7);
    free(p);
    if (tally__boot_bcast(b, NULL, 0, 0)) return 102;
    int64_t mine = rank * 1000 + 7, all[TH_MAX_RANKS];
    if (tally__boot_allgather(b, &mine, all, sizeof mine)) return 103;
    for (int k = 0; k < size; k++) bad += all[k] != k * 1000 + 7;
    char odd[3 * TH_MAX_RANKS];
    for (int i = 0; i < 3; i++) odd[3 * rank + i] = (char)('a' + rank + i); /* in place */
    if (tally__boot_allgather(b, odd + 3 * rank, odd, 3)) return 104;
    for (int k = 0; k < size; k++) bad += odd[3 * k + 2] != (char)('a' + k + 2);
    int pid = getpid(), pids[TH_MAX_RANKS];
    if (tally__boot_allgather(b, &pid, pids, sizeof pid)) return 105;
    for (int k = 0; k < size; k++) bad += pids[k] != tally__boot_peers(b)[k].pid;
    for (int i = 0; i < 3; i++)
        if (tally__boot_barrier(b)) return 106;
    return bad ? 107 : 0;
}

static int fn_rendezvous(int rank, int size, void *arg) {
    int late = arg ? *(int *)arg : 0;
    int fds0 = th_count_fds();
    tally__fault f;
    if (late && rank == 0) usleep_ms(500); /* the others must retry until rank 0 listens */
    tally__boot *b = boot_up(rank, &f, 20);
    if (!b) return 10;
    const tally__peer *p = tally__boot_peers(b);
    for (int k = 0; k < size; k++) {
        R[rank].pids[k] = p[k].pid;
        R[rank].hostids[k] = p[k].hostid;
        memcpy(R[rank].ip[k], p[k].ip, 64);
    }
    int rc = check_colls(b, rank, size);
    if (!rc && (tally__boot_rank(b) != rank || tally__boot_size(b) != size || !tally__boot_single_host(b))) rc = 20;
    size_t tl;
    if (!rc && tally__boot_token(b, &tl) && tl != strlen(getenv("TALLY_TOKEN"))) rc = 21;
    if (!rc && tally__boot_start_monitor(b)) rc = 22;
    R[rank].wake_ok = f.wake_fd >= 0;
    tally__boot_free(b);
    R[rank].wake_ok &= f.wake_fd == -1;
    if (!rc && tally__fault_check(&f)) rc = 23;
    if (rc) snprintf(R[rank].msg, sizeof R[rank].msg, "%s", tally_last_error());
    R[rank].fd_leak = th_count_fds() - fds0;
    return rc;
}

static void test_rendezvous(int n, int late) {
    th_job job;
    memset(R, 0, sizeof *R * TH_MAX_RANKS);
    th_start(&job, n, NULL, fn_rendezvous, &late);
    int bad = th_wait(&job, 60);
    TH_CHECK(bad == 0, "rendezvous n=%d late=%d: %d ranks failed", n, late, bad);
    for (int r = 0; r < n; r++) {
        if (job.status[r] != 0) fprintf(stderr, "  rank %d status %d: %s\n", r, job.status[r], R[r].msg);
        int same = 1;
        for (int k = 0; k < n; k++)
            same &= R[r].pids[k] == job.pid[k] && R[r].hostids[k] == R[0].hostids[k] && R[r].ip[k][0] &&
                    !strcmp(R[r].ip[k], R[0].ip[k]);
        TH_CHECK(same, "n=%d: rank %d's peer table differs from the pids/hosts of the job", n, r);
        TH_CHECK(R[r].fd_leak == 0, "n=%d: rank %d leaked %d fds", n, r, R[r].fd_leak);
        TH_CHECK(R[r].wake_ok, "n=%d: rank %d: wake_fd not created by the monitor or not closed by free", n, r);
    }
}

/* ---- refusals: wrong token, duplicate rank, wrong size, strangers ---- */

static void env_bad_token(int rank, void *arg) {
    if (rank == 2) setenv("TALLY_TOKEN", "not-the-token", 1);
}
static void env_dup_rank(int rank, void *arg) {
    if (rank == 2) setenv("TALLY_RANK", "1", 1);
}
static void env_bad_size(int rank, void *arg) {
    if (rank == 2) setenv("TALLY_WORLD_SIZE", "4", 1);
}

static int fn_init_only(int rank, int size, void *arg) {
    tally__fault f;
    tally_config cfg = TALLY_CONFIG_INIT;
    tally_config_from_env(&cfg);
    tally__boot *b = boot_up(rank, &f, cfg.timeout);
    tally__boot_free(b);
    return 0;
}

/* The refused ranks' peers wait out TALLY_TIMEOUT: 3 s in the long tier, 2 in the quick one. */
static double refusal_s = 3;

static void run_refusal(const char *what, void (*child_env)(int, void *)) {
    th_opts o = {.timeout_s = refusal_s, .child_env = child_env};
    memset(R, 0, sizeof *R * TH_MAX_RANKS);
    int bad = th_run(3, &o, fn_init_only, NULL);
    TH_CHECK(bad == 0, "%s: ranks did not exit cleanly", what);
}

static void test_bad_token(void) {
    run_refusal("wrong token", env_bad_token);
    TH_CHECK(R[2].rc == TALLY_E_AUTH && strstr(R[2].msg, "TALLY_TOKEN does not match rank 0's"),
             "wrong token: rank 2 got %d '%s'", R[2].rc, R[2].msg);
    TH_CHECK(R[2].secs < refusal_s * 0.8, "wrong token: rank 2 learned it after %.1f s", R[2].secs);
    for (int r = 0; r < 2; r++)
        TH_CHECK(R[r].rc == TALLY_E_TIMEOUT && strstr(R[r].msg, "missing 1 of 3 ranks: 2."),
                 "wrong token: rank %d got %d '%s'", r, R[r].rc, R[r].msg);
}

static void test_dup_rank(void) {
    run_refusal("duplicate rank", env_dup_rank);
    int a = R[1].rc, c = R[2].rc; /* both claim rank 1; either may be first */
    int refused = a == TALLY_E_BOOT ? 1 : c == TALLY_E_BOOT ? 2 : -1;
    TH_CHECK(refused > 0 && strstr(R[refused].msg, "already holds"), "duplicate rank: got %d '%s' / %d '%s'", a,
             R[1].msg, c, R[2].msg);
    TH_CHECK(refused > 0 && R[3 - refused].rc == TALLY_E_TIMEOUT, "duplicate rank: the accepted one got %d",
             refused > 0 ? R[3 - refused].rc : 0);
    TH_CHECK(R[0].rc == TALLY_E_TIMEOUT && strstr(R[0].msg, "ranks: 2."), "duplicate rank: rank 0 got %d '%s'", R[0].rc,
             R[0].msg);
}

static void test_bad_size(void) {
    run_refusal("world size mismatch", env_bad_size);
    TH_CHECK(R[2].rc == TALLY_E_BOOT && strstr(R[2].msg, "world size is 4 but rank 0 has 3"),
             "size mismatch: rank 2 got %d '%s'", R[2].rc, R[2].msg);
    TH_CHECK(R[0].rc == TALLY_E_TIMEOUT && R[1].rc == TALLY_E_TIMEOUT, "size mismatch: ranks 0/1 got %d/%d", R[0].rc,
             R[1].rc);
}

/* ---- TALLY_HOST: ranks with one name are one host, others are not ---- */

static const char *const *HOST_NAMES; /* per rank, set before the fork */

static void env_host_names(int rank, void *arg) { setenv("TALLY_HOST", HOST_NAMES[rank], 1); }

/* The transport the communicator chose, in msg; its peers' host ids. */
static int fn_host_transport(int rank, int size, void *arg) {
    tally_comm *c;
    double t0 = th_now();
    int rc = tally_comm_init(&c);
    if (rc) {
        save_err(rank, rc, t0);
        return 0;
    }
    R[rank].rc = 0;
    snprintf(R[rank].msg, sizeof R[rank].msg, "%s", tally_comm_transport(c));
    tally_comm_free(c);
    return 0;
}

static void run_hosts(const char *what, const char *const *names, int n, double timeout) {
    HOST_NAMES = names;
    th_opts o = {.timeout_s = timeout, .child_env = env_host_names};
    memset(R, 0, sizeof *R * TH_MAX_RANKS);
    TH_CHECK(th_run(n, &o, fn_host_transport, NULL) == 0, "%s: ranks did not exit cleanly", what);
}

static void test_host_names(void) {
    static const char *const split[] = {"node-a", "node-a", "node_b.1"}, *const one[] = {"x", "x"},
                             *const bad[] = {"ok", "not a name"};
    run_hosts("TALLY_HOST split", split, 3, 60);
    for (int r = 0; r < 3; r++)
        TH_CHECK(R[r].rc == 0 && !strcmp(R[r].msg, "shm+tcp"), "TALLY_HOST node-a, node-a, node_b.1: rank %d: %d %s", r,
                 R[r].rc, R[r].msg);
    run_hosts("TALLY_HOST one", one, 2, 60);
    for (int r = 0; r < 2; r++)
        TH_CHECK(R[r].rc == 0 && !strcmp(R[r].msg, "shm"), "TALLY_HOST x, x: rank %d: %d %s", r, R[r].rc, R[r].msg);
    run_hosts("TALLY_HOST bad", bad, 2, refusal_s);
    TH_CHECK(R[1].rc == TALLY_E_INVALID && strstr(R[1].msg, "TALLY_HOST") && strstr(R[1].msg, "not a name"),
             "TALLY_HOST 'not a name': rank 1 got %d '%s'", R[1].rc, R[1].msg);
}

/* Rank 2 plays strangers against rank 0's port before joining itself. */
static int fn_strangers(int rank, int size, void *arg) {
    int silent = -1;
    if (rank == 2) {
        tally__boot_env env;
        if (boot_env_read(&env)) return 30;
        uint64_t dl = tally__deadline(10);
        unsigned char junk[200], reply[64];
        for (int i = 0; i < 200; i++) junk[i] = (unsigned char)rand();
        for (int kind = 0; kind < 4; kind++) {
            int fd;
            if (tally__net_connect(env.host, env.port, dl, &fd)) return 31;
            if (kind == 1) tally__net_send_all(fd, junk, sizeof junk, dl); /* random bytes */
            if (kind == 2) {                                               /* a full but wrong handshake */
                tally__net_send_all(fd, junk, 32, dl);
                tally__net_recv_all(fd, reply, 64, dl);
                tally__net_send_all(fd, junk + 32, 32, dl);
            }
            if (kind == 3) {
                silent = fd; /* connected and says nothing for the whole rendezvous */
                continue;
            }
            close(fd);
        }
    }
    tally__fault f;
    tally__boot *b = boot_up(rank, &f, 20);
    if (silent >= 0) close(silent);
    if (!b) return 32;
    int rc = tally__boot_barrier(b) ? 33 : 0;
    R[rank].pids[0] = tally__boot_peers(b)[2].pid;
    tally__boot_free(b);
    return rc;
}

static void test_strangers(void) {
    memset(R, 0, sizeof *R * TH_MAX_RANKS);
    th_job job;
    th_start(&job, 3, NULL, fn_strangers, NULL);
    int bad = th_wait(&job, 60);
    TH_CHECK(bad == 0, "strangers broke the rendezvous: %s / %s / %s", R[0].msg, R[1].msg, R[2].msg);
    TH_CHECK(R[0].pids[0] == job.pid[2], "strangers: rank 2's entry is not rank 2's pid");
}

/* ---- forged connections: the right token, then a wrong hello ---- */

#define FORGE_CASES 7
typedef struct forged {
    int code;
    char msg[CTL_MSG_MAX + 1];
} forged;
static forged *FG; /* [FORGE_CASES], shared */

/* Sends frame header `h` and hello `hello` after a correct handshake; reads rank 0's verdict. */
static void forge_one(const tally__boot_env *env, int k, const unsigned char *hdr, const unsigned char *hello) {
    int fd;
    uint64_t dl = tally__deadline(10);
    FG[k].code = 1;
    if (tally__net_connect(env->host, env->port, dl, &fd)) return;
    if (tally__auth_connect(fd, env->token, env->token_len, "ctl", dl) == 0 &&
        tally__net_send_all(fd, hdr, CTL_HDR, dl) == 0 && tally__net_send_all(fd, hello, HELLO_LEN, dl) == 0) {
        unsigned char h[CTL_HDR];
        ctl_frame f;
        if (tally__net_recv_all(fd, h, sizeof h, dl) == 0 && tally__ctl_hdr_get(h, &f) == 0 && f.type == CTL_REFUSE &&
            f.len <= CTL_MSG_MAX && tally__net_recv_all(fd, FG[k].msg, f.len, dl) == 0)
            FG[k].code = -(int)f.aux;
    }
    close(fd);
}

static void forge_hello(unsigned char *o, uint32_t magic, uint32_t version, int rank, int size) {
    memset(o, 0, HELLO_LEN);
    tally__put_be32(o, magic);
    tally__put_be32(o + 4, version);
    tally__put_be32(o + 8, (uint32_t)rank);
    tally__put_be32(o + 12, (uint32_t)size);
    tally__put_be32(o + 16, (uint32_t)getpid());
    memcpy(o + 32, "forger", 6);
    memcpy(o + 96, "127.0.0.1", 9);
}

/* Rank 2 knows the token and sends hellos rank 0 must refuse, then joins itself. */
static int fn_forged(int rank, int size, void *arg) {
    if (rank == 2) {
        tally__boot_env env;
        if (boot_env_read(&env)) return 60;
        unsigned char hdr[CTL_HDR], h[HELLO_LEN];
        tally__ctl_hdr_put(hdr, CTL_HELLO, 0, HELLO_LEN);
        forge_hello(h, 0x12345678u, BOOT_VERSION, 1, size); /* wrong magic */
        forge_one(&env, 0, hdr, h);
        forge_hello(h, HELLO_MAGIC, BOOT_VERSION + 1, 1, size); /* a newer protocol */
        forge_one(&env, 1, hdr, h);
        forge_hello(h, HELLO_MAGIC, BOOT_VERSION, size + 4, size); /* rank out of range */
        forge_one(&env, 2, hdr, h);
        forge_hello(h, HELLO_MAGIC, BOOT_VERSION, 0, size); /* rank 0 is rank 0 itself */
        forge_one(&env, 3, hdr, h);
        forge_hello(h, HELLO_MAGIC, BOOT_VERSION, -1, size);
        forge_one(&env, 4, hdr, h);
        forge_hello(h, HELLO_MAGIC, BOOT_VERSION, 1, size);
        unsigned char bad[CTL_HDR];
        memcpy(bad, hdr, CTL_HDR);
        bad[0] ^= 0xff; /* a frame that is not ours */
        forge_one(&env, 5, bad, h);
        tally__ctl_hdr_put(bad, CTL_DATA, 0, HELLO_LEN); /* ours, but not a hello */
        forge_one(&env, 6, bad, h);
    }
    tally__fault f;
    tally__boot *b = boot_up(rank, &f, 20);
    if (!b) return 61;
    int rc = tally__boot_barrier(b) ? 62 : 0;
    R[rank].pids[0] = tally__boot_peers(b)[1].pid;
    tally__boot_free(b);
    return rc;
}

static void test_forged(void) {
    static const struct {
        int code;
        const char *text;
    } want[FORGE_CASES] = {
        {TALLY_E_PROTOCOL, "(hello magic 12345678), rank 0 speaks 1"},
        {TALLY_E_PROTOCOL, "it speaks rendezvous protocol 2 (hello magic 544c5948), rank 0 speaks 1"},
        {TALLY_E_BOOT, "claims rank 7, which is not in 1..2"},
        {TALLY_E_BOOT, "claims rank 0, which is not in 1..2"},
        {TALLY_E_BOOT, "claims rank -1, which is not in 1..2"},
        {TALLY_E_PROTOCOL, "its first frame after authentication is not a hello"},
        {TALLY_E_PROTOCOL, "its first frame after authentication is not a hello (magic 544c5946, type 4"},
    };
    memset(R, 0, sizeof *R * TH_MAX_RANKS);
    memset(FG, 0, sizeof *FG * FORGE_CASES);
    th_job job;
    th_start(&job, 3, NULL, fn_forged, NULL);
    int bad = th_wait(&job, 60);
    TH_CHECK(bad == 0, "forged hellos disturbed the job: %s / %s / %s", R[0].msg, R[1].msg, R[2].msg);
    TH_CHECK(R[0].pids[0] == job.pid[1], "forged hellos: rank 1's entry is not rank 1's pid");
    for (int k = 0; k < FORGE_CASES; k++)
        TH_CHECK(FG[k].code == want[k].code && strstr(FG[k].msg, want[k].text),
                 "forged case %d: refused with %d '%s', expected %d '%s'", k, FG[k].code, FG[k].msg, want[k].code,
                 want[k].text);
}

/* ---- strangers that stall mid-handshake cost the real ranks nothing ---- */

static void env_boot_limit3(int rank, void *arg) { setenv("TALLY_BOOT_TIMEOUT", "3", 1); }

/* Opens a connection that sends `kind` worth of a handshake and then stalls; returns its fd. */
static int stall_one(const tally__boot_env *env, int kind, uint64_t dl) {
    int fd;
    unsigned char junk[64], hdr[CTL_HDR];
    if (tally__net_connect(env->host, env->port, dl, &fd)) return -1;
    for (int i = 0; i < 64; i++) junk[i] = (unsigned char)rand();
    switch (kind) {
    case 0: break;                                        /* connected, silent */
    case 1: tally__net_send_all(fd, junk, 10, dl); break; /* part of a nonce */
    case 2:                                               /* a nonce, reads the reply, no proof */
        tally__net_send_all(fd, junk, 32, dl);
        tally__net_recv_all(fd, junk, 64, dl);
        break;
    case 3: /* authenticated, then half a frame header */
    case 4: /* authenticated, a header, then part of the hello */
        if (tally__auth_connect(fd, env->token, env->token_len, "ctl", dl)) break;
        tally__ctl_hdr_put(hdr, CTL_HELLO, 0, HELLO_LEN);
        tally__net_send_all(fd, hdr, kind == 3 ? 8 : CTL_HDR, dl);
        if (kind == 4) tally__net_send_all(fd, junk, 50, dl);
        break;
    }
    return fd;
}

static int fn_stallers(int rank, int size, void *arg) {
    int fds[12], nfd = 0;
    if (rank == 2) {
        tally__boot_env env;
        if (boot_env_read(&env)) return 70;
        uint64_t dl = tally__deadline(10);
        static const int kinds[12] = {1, 2, 3, 4, 0, 1, 2, 3, 4, 1, 2, 0};
        for (int i = 0; i < 12; i++) fds[nfd++] = stall_one(&env, kinds[i], dl);
    }
    tally__fault f;
    tally__boot *b = boot_up(rank, &f, 20);
    for (int i = 0; i < nfd; i++)
        if (fds[i] >= 0) close(fds[i]);
    if (!b) return 71;
    int rc = tally__boot_barrier(b) ? 72 : 0;
    tally__boot_free(b);
    return rc;
}

static void test_stallers(void) {
    memset(R, 0, sizeof *R * TH_MAX_RANKS);
    th_opts o = {.child_env = env_boot_limit3};
    th_job job;
    th_start(&job, 3, &o, fn_stallers, NULL);
    int bad = th_wait(&job, 60);
    /* The limit (3 s) is shorter than the time a stalled stranger may hold its slot: only a rank 0 that
     * never waits on one finishes the rendezvous. */
    TH_CHECK(bad == 0, "strangers that stall held up the rendezvous: %s / %s / %s", R[0].msg, R[1].msg, R[2].msg);
}

/* ---- a rank that never arrives is named on every rank ---- */

typedef struct miss_arg {
    int missing; /* the rank that never starts its rendezvous */
    int late;    /* a rank that starts 1 s after the others, -1 none */
} miss_arg;

static void env_boot_limit(int rank, void *arg) { setenv("TALLY_BOOT_TIMEOUT", "1.5", 1); }

static int fn_missing(int rank, int size, void *arg) {
    miss_arg *m = arg;
    if (rank == m->missing) return 0;
    if (rank == m->late) usleep_ms(1000);
    tally__fault f;
    tally__boot *b = boot_up(rank, &f, 60); /* TALLY_BOOT_TIMEOUT must win over this */
    tally__boot_free(b);
    return 0;
}

static void test_missing(int n, int missing, int late) {
    miss_arg m = {missing, late};
    th_opts o = {.child_env = env_boot_limit};
    memset(R, 0, sizeof *R * TH_MAX_RANKS);
    TH_CHECK(th_run(n, &o, fn_missing, &m) == 0, "missing rank %d: ranks did not exit cleanly", missing);
    char want[64];
    if (missing == 0)
        snprintf(want, sizeof want, "Rank 0 is missing");
    else
        snprintf(want, sizeof want, "missing 1 of %d ranks: %d.", n, missing);
    for (int r = 0; r < n; r++) {
        if (r == missing) continue;
        TH_CHECK(R[r].rc == TALLY_E_TIMEOUT && strstr(R[r].msg, want) && strstr(R[r].msg, "1.5 s"),
                 "missing rank %d (late %d): rank %d got %d '%s'", missing, late, r, R[r].rc, R[r].msg);
        /* Bounded by the rendezvous limit, not the 60 s the caller passed (grace included). */
        TH_CHECK(R[r].secs < 30, "missing rank %d: rank %d waited %.1f s", missing, r, R[r].secs);
    }
}

/* ---- where rank 0 listens ---- */

/* The local address of the listener on `port` in /proc/net/tcp ("0100007F" is 127.0.0.1), or "". */
static void listen_addr(int port, char out[16]) {
    out[0] = '\0';
    FILE *f = fopen("/proc/net/tcp", "r");
    char line[512], addr[16];
    unsigned p, st;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, " %*d: %8[0-9A-Fa-f]:%x %*s %x", addr, &p, &st) == 3 && (int)p == port && st == 0x0A)
            snprintf(out, 16, "%s", addr);
    if (f) fclose(f);
}

static char (*BIND_SEEN)[16];

static void env_bind_any(int rank, void *arg) {
    if (rank == 0) setenv("TALLY_BIND", "0.0.0.0", 1);
}

static int fn_bind(int rank, int size, void *arg) {
    if (rank == 1) { /* looks at rank 0's listener before joining */
        tally__boot_env env;
        if (boot_env_read(&env)) return 80;
        double t0 = th_now();
        while (!BIND_SEEN[0][0] && th_now() - t0 < 10) {
            listen_addr(env.port, BIND_SEEN[0]);
            usleep_ms(5);
        }
    }
    tally__fault f;
    tally__boot *b = boot_up(rank, &f, 20);
    if (!b) return 81;
    memcpy(R[rank].ip[0], tally__boot_peers(b)[0].ip, 64);
    int rc = tally__boot_barrier(b) ? 82 : 0;
    tally__boot_free(b);
    return rc;
}

static void test_bind(int wildcard) {
    memset(R, 0, sizeof *R * TH_MAX_RANKS);
    memset(BIND_SEEN, 0, 16);
    th_opts o = {.child_env = wildcard ? env_bind_any : NULL};
    TH_CHECK(th_run(2, &o, fn_bind, NULL) == 0, "bind (wildcard %d): rendezvous failed: %s / %s", wildcard, R[0].msg,
             R[1].msg);
    const char *want = wildcard ? "00000000" : "0100007F";
    TH_CHECK(!strcmp(BIND_SEEN[0], want), "bind: rank 0 listened on %s, expected %s (%s)", BIND_SEEN[0], want,
             wildcard ? "TALLY_BIND=0.0.0.0" : "TALLY_ADDR=127.0.0.1:port, no TALLY_BIND");
    /* The table names an address peers can reach, never the wildcard. */
    for (int r = 0; r < 2; r++)
        TH_CHECK(!strcmp(R[r].ip[0], "127.0.0.1"), "bind: rank %d has rank 0's address as '%s'", r, R[r].ip[0]);
}

/* What the launcher gives its ranks when nothing is set: a loopback address. */
static void test_launcher_addr(void) {
    const char *bin = getenv("TALLY_BIN");
    if (!bin) {
        printf("test_boot: TALLY_BIN is not set (run through ctest): launcher address not checked\n");
        return;
    }
    char cmd[1024], out[4096];
    snprintf(cmd, sizeof cmd, "env -u TALLY_ADDR -u TALLY_BIND '%s' run -n 1 -- printenv TALLY_ADDR", bin);
    int rc = th_shell(cmd, 30, out, sizeof out);
    const char *addr = strstr(out, "] ") ? strstr(out, "] ") + 2 : out; /* output may come as "[0] line" */
    TH_CHECK(rc == 0 && !strncmp(addr, "127.0.0.1:", 10),
             "tally run: TALLY_ADDR is '%s' (rc %d), expected "
             "127.0.0.1:port",
             out, rc);
}

/* ---- monitor ---- */

typedef struct mon_arg {
    int victim; /* rank that dies (kill) or raises (fault) */
    int mode;   /* 0 kill -9, 1 raise a fault, 2 clean free, 3 exit before a bootstrap allgather */
} mon_arg;

static int fn_monitor(int rank, int size, void *arg) {
    mon_arg *m = arg;
    tally__fault f;
    tally__boot *b = boot_up(rank, &f, 20);
    if (!b) return 40;
    if (m->mode == 3) {
        if (rank == m->victim) _exit(0); /* no goodbye */
        int64_t x = rank, all[TH_MAX_RANKS];
        R[rank].rc = tally__boot_allgather(b, &x, all, sizeof x);
        wait_fault(rank, &f, 0);
        tally__boot_free(b);
        return 0;
    }
    if (tally__boot_barrier(b) || tally__boot_start_monitor(b)) return 41;
    if (m->mode == 0 && rank == m->victim) raise(SIGKILL);
    if (m->mode == 1 && rank == m->victim)
        tally__fault_raise(&f, TALLY_E_MISMATCH, rank, "test fault raised on rank %d", rank);
    if (m->mode == 2) {
        usleep_ms(20 * (size - rank)); /* rank 0 leaves last... */
        if (rank == 1) usleep_ms(150); /* ...except rank 1, after it */
        tally__boot_free(b);
        R[rank].code = tally__fault_check(&f);
        return 0;
    }
    wait_fault(rank, &f, 5);
    tally__boot_free(b);
    return 0;
}

static void run_monitor(int n, int victim, int mode) {
    mon_arg m = {victim, mode};
    memset(R, 0, sizeof *R * TH_MAX_RANKS);
    th_job job;
    th_start(&job, n, NULL, fn_monitor, &m);
    th_wait(&job, 60);
    for (int r = 0; r < n; r++) {
        int st = job.status[r];
        if (mode == 0 && r == victim) {
            TH_CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "monitor: victim %d was not killed", r);
            continue;
        }
        TH_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "monitor mode %d: rank %d exited with %d", mode, r, st);
        if (mode == 2) {
            TH_CHECK(R[r].code == 0, "clean free: rank %d has fault %d '%s'", r, R[r].code, R[r].msg);
            continue;
        }
        if (mode == 3 && r == victim) continue;
        int want = mode == 1 ? TALLY_E_MISMATCH : TALLY_E_PEER_LOST;
        char who[64];
        snprintf(who, sizeof who, mode == 1 ? "raised on rank %d" : "rank %d (pid %d on host", victim, job.pid[victim]);
        TH_CHECK(R[r].code == want && R[r].culprit == victim && strstr(R[r].msg, who),
                 "mode %d victim %d: rank %d got code %d culprit %d '%s'", mode, victim, r, R[r].code, R[r].culprit,
                 R[r].msg);
        if (mode == 3) TH_CHECK(R[r].rc == TALLY_E_PEER_LOST, "exit before allgather: rank %d got rc %d", r, R[r].rc);
        if (mode < 2) TH_CHECK(R[r].secs < 5, "monitor: rank %d waited %.1f s", r, R[r].secs);
    }
}

/* ---- environment parsing ---- */

typedef struct env_case {
    const char *vars[12]; /* NAME=VALUE, NULL-terminated */
} env_case;

static int fn_env(int rank, int size, void *arg) {
    const env_case *c = arg;
    clearenv();
    for (int i = 0; c->vars[i]; i++) {
        char buf[512];
        snprintf(buf, sizeof buf, "%s", c->vars[i]);
        char *eq = strchr(buf, '=');
        *eq = '\0';
        setenv(buf, eq + 1, 1);
    }
    R[0].rc = boot_env_read(&R[0].env);
    snprintf(R[0].msg, sizeof R[0].msg, "%s", tally_last_error());
    return 0;
}

/* Runs one case in a child with exactly these variables; returns its rc, fills R[0]. */
static int env_run(env_case c) {
    memset(R, 0, sizeof *R);
    if (th_run(1, NULL, fn_env, &c)) return 999;
    return R[0].rc;
}

#define ENV_OK(c, cond, ...)                                                                                           \
    do {                                                                                                               \
        int rc_ = env_run(c);                                                                                          \
        tally__boot_env *e = &R[0].env;                                                                                \
        (void)e;                                                                                                       \
        TH_CHECK(rc_ == 0 && (cond), __VA_ARGS__);                                                                     \
        if (rc_) fprintf(stderr, "   -> rc %d: %s\n", rc_, R[0].msg);                                                  \
    } while (0)
/* Something missing is TALLY_E_BOOT; a value that is set but malformed is TALLY_E_INVALID. */
#define ENV_FAILS(c, code, text)                                                                                       \
    do {                                                                                                               \
        int rc_ = env_run(c);                                                                                          \
        TH_CHECK(rc_ == (code) && strstr(R[0].msg, text), "expected %s with '%s', got %d '%s'", #code, text, rc_,      \
                 R[0].msg);                                                                                            \
    } while (0)
#define ENV_ERR(c, text) ENV_FAILS(c, TALLY_E_BOOT, text)
#define ENV_BAD(c, text) ENV_FAILS(c, TALLY_E_INVALID, text)
#define E(...)           ((env_case){{__VA_ARGS__, NULL}})

static void test_env_tally(void) {
    ENV_OK(E("TALLY_RANK=2", "TALLY_WORLD_SIZE=4", "TALLY_ADDR=node0:1234", "TALLY_TOKEN=abc"),
           e->rank == 2 && e->size == 4 && !strcmp(e->host, "node0") && e->port == 1234 && e->token_len == 3 &&
               !strcmp(e->token, "abc") && !strcmp(e->source, "TALLY") && !e->token_derived,
           "TALLY_* parsed");
    ENV_OK(E("TALLY_RANK=0", "TALLY_WORLD_SIZE=2", "TALLY_ADDR=[fe80::1]:29501", "TALLY_TOKEN=t"),
           !strcmp(e->host, "fe80::1") && e->port == 29501, "[v6]:port parsed");
    ENV_OK(E("TALLY_RANK=0", "TALLY_WORLD_SIZE=1"), e->size == 1 && e->rank == 0, "size 1 needs no address or token");
    ENV_ERR(E("TALLY_RANK=0"), "TALLY_WORLD_SIZE is not set");
    ENV_ERR(E("TALLY_WORLD_SIZE=2"), "TALLY_RANK is not set");
    ENV_BAD(E("TALLY_RANK=4", "TALLY_WORLD_SIZE=4", "TALLY_ADDR=h:1", "TALLY_TOKEN=t"),
            "TALLY_RANK='4' is out of range");
    ENV_BAD(E("TALLY_RANK=-1", "TALLY_WORLD_SIZE=4", "TALLY_ADDR=h:1", "TALLY_TOKEN=t"),
            "TALLY_RANK='-1' is out of range");
    ENV_BAD(E("TALLY_RANK=abc", "TALLY_WORLD_SIZE=4"), "TALLY_RANK='abc' is not a whole number");
    ENV_BAD(E("TALLY_RANK=0", "TALLY_WORLD_SIZE=0"), "TALLY_WORLD_SIZE='0' is out of range");
    ENV_BAD(E("TALLY_RANK=0", "TALLY_WORLD_SIZE=5000"), "TALLY_WORLD_SIZE='5000' is out of range");
    ENV_BAD(E("TALLY_RANK=0", "TALLY_WORLD_SIZE=2", "TALLY_ADDR=h:0", "TALLY_TOKEN=t"), "port '0'");
    ENV_BAD(E("TALLY_RANK=0", "TALLY_WORLD_SIZE=2", "TALLY_ADDR=h:70000", "TALLY_TOKEN=t"), "port '70000'");
    ENV_BAD(E("TALLY_RANK=0", "TALLY_WORLD_SIZE=2", "TALLY_ADDR=node0", "TALLY_TOKEN=t"),
            "TALLY_ADDR='node0' has no port");
    ENV_BAD(E("TALLY_RANK=0", "TALLY_WORLD_SIZE=2", "TALLY_ADDR=::1:5", "TALLY_TOKEN=t"), "brackets");
    ENV_BAD(E("TALLY_RANK=0", "TALLY_WORLD_SIZE=2", "TALLY_ADDR=:5", "TALLY_TOKEN=t"), "empty host");
    ENV_ERR(E("TALLY_RANK=0", "TALLY_WORLD_SIZE=2", "TALLY_TOKEN=t"), "export TALLY_ADDR=");
    ENV_ERR(E("TALLY_RANK=0", "TALLY_WORLD_SIZE=2", "TALLY_ADDR=h:5"), "TALLY_TOKEN is not set");
    ENV_ERR(E("HOME=/"), "set TALLY_RANK and TALLY_WORLD_SIZE");
    ENV_OK(E("TALLY_RANK=0", "TALLY_WORLD_SIZE=2", "TALLY_ADDR=h:5", "TALLY_TOKEN=t"),
           e->boot_timeout_s == 0 && e->bind[0] == '\0', "no TALLY_BOOT_TIMEOUT, no TALLY_BIND");
    ENV_OK(E("TALLY_RANK=0", "TALLY_WORLD_SIZE=2", "TALLY_ADDR=h:5", "TALLY_TOKEN=t", "TALLY_BOOT_TIMEOUT=2.5"),
           e->boot_timeout_s == 2.5, "TALLY_BOOT_TIMEOUT parsed");
    ENV_BAD(E("TALLY_RANK=0", "TALLY_WORLD_SIZE=2", "TALLY_ADDR=h:5", "TALLY_TOKEN=t", "TALLY_BOOT_TIMEOUT=soon"),
            "TALLY_BOOT_TIMEOUT='soon'");
    ENV_BAD(E("TALLY_RANK=0", "TALLY_WORLD_SIZE=2", "TALLY_ADDR=h:5", "TALLY_TOKEN=t", "TALLY_BOOT_TIMEOUT=0"),
            "TALLY_BOOT_TIMEOUT='0'");
    ENV_BAD(E("TALLY_RANK=0", "TALLY_WORLD_SIZE=1", "TALLY_BOOT_TIMEOUT=-3"), "TALLY_BOOT_TIMEOUT='-3'");
    ENV_OK(E("TALLY_RANK=0", "TALLY_WORLD_SIZE=2", "TALLY_ADDR=h:5", "TALLY_TOKEN=t", "TALLY_BIND=0.0.0.0"),
           !strcmp(e->bind, "0.0.0.0") && !strcmp(e->host, "h"), "TALLY_BIND=0.0.0.0 parsed, TALLY_ADDR kept");
    ENV_OK(E("TALLY_RANK=0", "TALLY_WORLD_SIZE=2", "TALLY_ADDR=h:5", "TALLY_TOKEN=t", "TALLY_BIND=::"),
           !strcmp(e->bind, "::"), "TALLY_BIND=:: parsed");
    ENV_OK(E("TALLY_RANK=0", "TALLY_WORLD_SIZE=2", "TALLY_ADDR=h:5", "TALLY_TOKEN=t", "TALLY_BIND=[fe80::1]"),
           !strcmp(e->bind, "fe80::1"), "TALLY_BIND=[v6] parsed");
    ENV_BAD(E("TALLY_RANK=0", "TALLY_WORLD_SIZE=2", "TALLY_ADDR=h:5", "TALLY_TOKEN=t", "TALLY_BIND=0.0.0.0:5"),
            "TALLY_BIND='0.0.0.0:5' has a port");
    ENV_BAD(E("TALLY_RANK=0", "TALLY_WORLD_SIZE=2", "TALLY_ADDR=h:5", "TALLY_TOKEN=t", "TALLY_BIND=[]"),
            "TALLY_BIND='[]' is not an address");
    static char longtok[300] = "TALLY_TOKEN=";
    memset(longtok + 12, 'x', 280);
    ENV_BAD(E("TALLY_RANK=0", "TALLY_WORLD_SIZE=2", "TALLY_ADDR=h:5", longtok), "TALLY_TOKEN is 280 bytes");
}

static void test_env_launchers(void) {
    /* As Debian's Open MPI 4.1 mpirun sets them on one host. */
#define OMPI1                                                                                                          \
    "OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_LOCAL_SIZE=2",                                \
        "OMPI_MCA_ess_base_jobid=1674575873", "PMIX_NAMESPACE=1674575873"
    ENV_OK(E(OMPI1),
           e->rank == 1 && e->size == 2 && !strcmp(e->source, "Open MPI") && !strcmp(e->host, "127.0.0.1") &&
               e->port >= 29500 && e->port <= 32767 && e->token_derived && e->token_len == 64,
           "Open MPI on one host: loopback, derived port and token");
    tally__boot_env r1 = R[0].env;
    ENV_OK(E("OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_LOCAL_SIZE=2",
             "OMPI_MCA_ess_base_jobid=1674575873", "PMIX_NAMESPACE=1674575873"),
           e->port == r1.port && !strcmp(e->token, r1.token), "Open MPI: ranks of one job agree on port and token");
    ENV_OK(E("OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_LOCAL_SIZE=2",
             "OMPI_MCA_ess_base_jobid=99", "PMIX_NAMESPACE=99"),
           strcmp(e->token, r1.token) != 0, "Open MPI: another job derives another token");
    ENV_ERR(E("OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_SIZE=2",
              "OMPI_MCA_ess_base_jobid=1"),
            "mpirun -x TALLY_ADDR=");
    ENV_OK(E("OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=4", "TALLY_ADDR=node0:4000", "TALLY_TOKEN=s"),
           e->rank == 3 && !strcmp(e->host, "node0") && e->port == 4000 && !e->token_derived,
           "Open MPI with TALLY_ADDR/TALLY_TOKEN");
    ENV_BAD(E("OMPI_COMM_WORLD_RANK=x", "OMPI_COMM_WORLD_SIZE=4"), "OMPI_COMM_WORLD_RANK='x'");
    ENV_OK(E("PMI_RANK=2", "PMI_SIZE=3", "MPI_LOCALNRANKS=3", "PMI_JOBID=j5"),
           e->rank == 2 && e->size == 3 && !strcmp(e->source, "PMI") && !strcmp(e->host, "127.0.0.1") &&
               e->token_derived,
           "PMI on one host");
    ENV_ERR(E("PMI_RANK=0", "PMI_SIZE=3", "TALLY_ADDR=h:5"), "TALLY_TOKEN is not set");
    ENV_OK(E("PMI_RANK=1", "PMI_SIZE=2", "PMI_JOBID=5.0", "SLURM_STEP_ID=0", "SLURM_STEP_NUM_NODES=1"),
           e->rank == 1 && !strcmp(e->source, "PMI") && !strcmp(e->host, "127.0.0.1"),
           "srun --mpi=pmi2 on one node: PMI's ranks, Slurm's node count");
    ENV_ERR(E("PMI_RANK=0"), "PMI_SIZE is not set");
    ENV_OK(E("SLURM_PROCID=3", "SLURM_NTASKS=4", "SLURM_LAUNCH_NODE_IPADDR=10.1.2.3", "SLURM_JOB_ID=77",
             "SLURM_STEP_ID=0", "SLURM_STEP_NUM_NODES=2"),
           e->rank == 3 && e->size == 4 && !strcmp(e->source, "Slurm") && !strcmp(e->host, "10.1.2.3") &&
               e->port >= 29500 && e->port <= 32767 && e->token_derived,
           "Slurm across nodes: launch node address");
    ENV_OK(E("SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_LAUNCH_NODE_IPADDR=10.1.2.3", "SLURM_JOB_ID=77",
             "SLURM_STEP_ID=0", "SLURM_STEP_NUM_NODES=1"),
           !strcmp(e->host, "127.0.0.1"), "Slurm on one node: loopback");
    ENV_OK(E("SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_JOB_ID=77", "SLURM_STEP_ID=1", "TALLY_ADDR=n1:6000"),
           !strcmp(e->host, "n1") && e->port == 6000, "Slurm with TALLY_ADDR");
    ENV_ERR(E("SLURM_PROCID=0", "SLURM_JOB_ID=7", "SLURM_STEP_ID=0"), "SLURM_NTASKS is not set");
    /* an sbatch script, outside any srun step: one process, not rank 0 of SLURM_NTASKS */
    ENV_ERR(E("SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_JOB_ID=7"), "cannot tell this process's rank");
    ENV_OK(E("RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=10.0.0.1", "MASTER_PORT=29500", "TALLY_TOKEN=x"),
           e->rank == 1 && !strcmp(e->source, "torchrun") && !strcmp(e->host, "10.0.0.1") && e->port == 29500,
           "torchrun: MASTER_ADDR:MASTER_PORT");
    ENV_OK(E("RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=10.0.0.1", "MASTER_PORT=29500"), e->token_derived,
           "torchrun: token derived from the master address");
    ENV_BAD(E("RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=abc"), "MASTER_PORT: port 'abc'");
    ENV_ERR(E("RANK=1", "WORLD_SIZE=2", "MASTER_PORT=1"), "MASTER_ADDR or MASTER_PORT is not set");
    ENV_OK(E("OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2", "SLURM_PROCID=0", "SLURM_NTASKS=1", "TALLY_ADDR=h:1",
             "TALLY_TOKEN=t"),
           e->rank == 1 && !strcmp(e->source, "Open MPI"), "Open MPI takes precedence over Slurm");
    ENV_OK(E("TALLY_RANK=1", "TALLY_WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=2", "TALLY_ADDR=h:1",
             "TALLY_TOKEN=t"),
           e->rank == 1 && !strcmp(e->source, "TALLY"), "TALLY_* take precedence over the launcher");
}

/* ---- size 1 ---- */

static int fn_single(int rank, int size, void *arg) {
    int fds0 = th_count_fds();
    tally__fault f;
    tally__boot *b = boot_up(rank, &f, 5);
    if (!b) return 50;
    int x = 5, all = 0, rc = 0;
    if (tally__boot_bcast(b, &x, sizeof x, 0) || tally__boot_allgather(b, &x, &all, sizeof x) || all != 5 ||
        tally__boot_barrier(b) || tally__boot_start_monitor(b) || tally__boot_peers(b)[0].pid != getpid())
        rc = 51;
    if (!rc && th_count_fds() != fds0 + 1) rc = 52; /* only the wake eventfd: no listener, no thread fds */
    tally__boot_free(b);
    R[0].fd_leak = th_count_fds() - fds0;
    return rc;
}

int main(void) {
    R = th_shared_alloc(sizeof *R * TH_MAX_RANKS);
    FG = th_shared_alloc(sizeof *FG * FORGE_CASES);
    BIND_SEEN = th_shared_alloc(16);
    srand((unsigned)getpid());
    int sizes[] = {1, 2, 3, 5, 8};
    if (th_quick()) {
        test_env_tally();
        test_env_launchers();
        TH_CHECK(th_run(1, NULL, fn_single, NULL) == 0 && R[0].fd_leak == 0, "size 1: no network, no leaks");
        for (int i = 0; i < 3; i++) test_rendezvous(sizes[i], 0);
        test_rendezvous(3, 1);
        test_bind(0);
        test_bind(1);
        test_launcher_addr();
        test_strangers();
        test_stallers();
        test_forged();
        test_missing(4, 3, -1);
        run_monitor(4, 3, 0);
        run_monitor(4, 0, 0);
        run_monitor(4, 2, 1);
        run_monitor(5, -1, 2);
        run_monitor(3, 2, 3);
        refusal_s = 2;
        test_bad_token();
        test_dup_rank();
        test_host_names();
    }
    if (th_long()) { /* the waits, and the larger worlds */
        for (int i = 3; i < 5; i++) test_rendezvous(sizes[i], 0);
        refusal_s = 3;
        test_bad_token();
        test_dup_rank();
        test_bad_size();
        test_host_names();
        test_missing(4, 3, 0); /* rank 0 starts 1 s after the others: they still hear its verdict */
        test_missing(3, 0, -1);
    }
    th_shared_free(R, sizeof *R * TH_MAX_RANKS);
    th_shared_free(FG, sizeof *FG * FORGE_CASES);
    th_shared_free(BIND_SEEN, 16);
    return th_verdict("test_boot");
}
