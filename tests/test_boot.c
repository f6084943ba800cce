/* test_boot.c - the rendezvous layer: environment parsing per launcher, rendezvous and bootstrap
 * collectives for several world sizes, refusals (token, rank, size, strangers), and the monitor. */
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
#include "boot/net.h"
#include "core/clock.h"
#include "core/env.h"
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

/* env_read + fault_init + boot_init; returns the boot or NULL (result recorded). */
static tally__boot *boot_up(int rank, tally__fault *f, double timeout) {
    tally__boot_env env;
    tally__boot *b = NULL;
    double t0 = th_now();
    tally__fault_init(f);
    int rc = tally__boot_env_read(&env);
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
        if (job.status[r] != 0)
            fprintf(stderr, "  rank %d status %d: %s\n", r, job.status[r], R[r].msg);
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
    tally__boot *b = boot_up(rank, &f, tally__timeout_s());
    tally__boot_free(b);
    return 0;
}

static void run_refusal(const char *what, void (*child_env)(int, void *)) {
    th_opts o = {.timeout_s = 3, .child_env = child_env};
    memset(R, 0, sizeof *R * TH_MAX_RANKS);
    int bad = th_run(3, &o, fn_init_only, NULL);
    TH_CHECK(bad == 0, "%s: ranks did not exit cleanly", what);
}

static void test_bad_token(void) {
    run_refusal("wrong token", env_bad_token);
    TH_CHECK(R[2].rc == TALLY_E_AUTH && strstr(R[2].msg, "TALLY_TOKEN does not match rank 0's"),
             "wrong token: rank 2 got %d '%s'", R[2].rc, R[2].msg);
    TH_CHECK(R[2].secs < 2.5, "wrong token: rank 2 learned it after %.1f s", R[2].secs);
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
    TH_CHECK(R[0].rc == TALLY_E_TIMEOUT && strstr(R[0].msg, "ranks: 2."), "duplicate rank: rank 0 got %d '%s'",
             R[0].rc, R[0].msg);
}

static void test_bad_size(void) {
    run_refusal("world size mismatch", env_bad_size);
    TH_CHECK(R[2].rc == TALLY_E_BOOT && strstr(R[2].msg, "world size is 4 but rank 0 has 3"),
             "size mismatch: rank 2 got %d '%s'", R[2].rc, R[2].msg);
    TH_CHECK(R[0].rc == TALLY_E_TIMEOUT && R[1].rc == TALLY_E_TIMEOUT, "size mismatch: ranks 0/1 got %d/%d",
             R[0].rc, R[1].rc);
}

/* Rank 2 plays strangers against rank 0's port before joining itself. */
static int fn_strangers(int rank, int size, void *arg) {
    int silent = -1;
    if (rank == 2) {
        tally__boot_env env;
        if (tally__boot_env_read(&env)) return 30;
        uint64_t dl = tally__deadline(10);
        unsigned char junk[200], reply[64];
        for (int i = 0; i < 200; i++) junk[i] = (unsigned char)rand();
        for (int kind = 0; kind < 4; kind++) {
            int fd;
            if (tally__net_connect(env.host, env.port, dl, &fd)) return 31;
            if (kind == 1) tally__net_send_all(fd, junk, sizeof junk, dl); /* random bytes */
            if (kind == 2) { /* a full but wrong handshake */
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

/* ---- monitor ---- */

typedef struct mon_arg {
    int victim;      /* rank that dies (kill) or raises (fault) */
    int mode;        /* 0 kill -9, 1 raise a fault, 2 clean free, 3 exit before a bootstrap allgather */
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
    R[0].rc = tally__boot_env_read(&R[0].env);
    snprintf(R[0].msg, sizeof R[0].msg, "%s", tally_last_error());
    return 0;
}

/* Runs one case in a child with exactly these variables; returns its rc, fills R[0]. */
static int env_run(env_case c) {
    memset(R, 0, sizeof *R);
    if (th_run(1, NULL, fn_env, &c)) return 999;
    return R[0].rc;
}

#define ENV_OK(c, cond, ...)                                                       \
    do {                                                                           \
        int rc_ = env_run(c);                                                      \
        tally__boot_env *e = &R[0].env;                                            \
        (void)e;                                                                   \
        TH_CHECK(rc_ == 0 && (cond), __VA_ARGS__);                                 \
        if (rc_) fprintf(stderr, "   -> rc %d: %s\n", rc_, R[0].msg);              \
    } while (0)
#define ENV_ERR(c, text)                                                                              \
    do {                                                                                              \
        int rc_ = env_run(c);                                                                         \
        TH_CHECK(rc_ == TALLY_E_BOOT && strstr(R[0].msg, text), "expected TALLY_E_BOOT with '%s', got %d '%s'", \
                 text, rc_, R[0].msg);                                                                \
    } while (0)
#define E(...) ((env_case){{__VA_ARGS__, NULL}})

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
    ENV_ERR(E("TALLY_RANK=4", "TALLY_WORLD_SIZE=4", "TALLY_ADDR=h:1", "TALLY_TOKEN=t"), "TALLY_RANK=4 is out of range");
    ENV_ERR(E("TALLY_RANK=-1", "TALLY_WORLD_SIZE=4", "TALLY_ADDR=h:1", "TALLY_TOKEN=t"), "TALLY_RANK=-1");
    ENV_ERR(E("TALLY_RANK=abc", "TALLY_WORLD_SIZE=4"), "TALLY_RANK='abc' is not an integer");
    ENV_ERR(E("TALLY_RANK=0", "TALLY_WORLD_SIZE=0"), "TALLY_WORLD_SIZE=0 is out of range");
    ENV_ERR(E("TALLY_RANK=0", "TALLY_WORLD_SIZE=5000"), "TALLY_WORLD_SIZE=5000 is out of range");
    ENV_ERR(E("TALLY_RANK=0", "TALLY_WORLD_SIZE=2", "TALLY_ADDR=h:0", "TALLY_TOKEN=t"), "port '0'");
    ENV_ERR(E("TALLY_RANK=0", "TALLY_WORLD_SIZE=2", "TALLY_ADDR=h:70000", "TALLY_TOKEN=t"), "port '70000'");
    ENV_ERR(E("TALLY_RANK=0", "TALLY_WORLD_SIZE=2", "TALLY_ADDR=node0", "TALLY_TOKEN=t"), "TALLY_ADDR='node0' has no port");
    ENV_ERR(E("TALLY_RANK=0", "TALLY_WORLD_SIZE=2", "TALLY_ADDR=::1:5", "TALLY_TOKEN=t"), "brackets");
    ENV_ERR(E("TALLY_RANK=0", "TALLY_WORLD_SIZE=2", "TALLY_ADDR=:5", "TALLY_TOKEN=t"), "empty host");
    ENV_ERR(E("TALLY_RANK=0", "TALLY_WORLD_SIZE=2", "TALLY_TOKEN=t"), "export TALLY_ADDR=");
    ENV_ERR(E("TALLY_RANK=0", "TALLY_WORLD_SIZE=2", "TALLY_ADDR=h:5"), "TALLY_TOKEN is not set");
    ENV_ERR(E("HOME=/"), "set TALLY_RANK and TALLY_WORLD_SIZE");
    static char longtok[300] = "TALLY_TOKEN=";
    memset(longtok + 12, 'x', 280);
    ENV_ERR(E("TALLY_RANK=0", "TALLY_WORLD_SIZE=2", "TALLY_ADDR=h:5", longtok), "TALLY_TOKEN is 280 bytes");
}

static void test_env_launchers(void) {
    /* As Debian's Open MPI 4.1 mpirun sets them on one host. */
#define OMPI1 "OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_LOCAL_SIZE=2", \
              "OMPI_MCA_ess_base_jobid=1674575873", "PMIX_NAMESPACE=1674575873"
    ENV_OK(E(OMPI1), e->rank == 1 && e->size == 2 && !strcmp(e->source, "Open MPI") && !strcmp(e->host, "127.0.0.1") &&
                         e->port >= 29500 && e->port <= 39499 && e->token_derived && e->token_len == 64,
           "Open MPI on one host: loopback, derived port and token");
    tally__boot_env r1 = R[0].env;
    ENV_OK(E("OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_LOCAL_SIZE=2",
             "OMPI_MCA_ess_base_jobid=1674575873", "PMIX_NAMESPACE=1674575873"),
           e->port == r1.port && !strcmp(e->token, r1.token), "Open MPI: ranks of one job agree on port and token");
    ENV_OK(E("OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_LOCAL_SIZE=2",
             "OMPI_MCA_ess_base_jobid=99", "PMIX_NAMESPACE=99"),
           strcmp(e->token, r1.token) != 0, "Open MPI: another job derives another token");
    ENV_ERR(E("OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_SIZE=2",
              "OMPI_MCA_ess_base_jobid=1"), "mpirun -x TALLY_ADDR=");
    ENV_OK(E("OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=4", "TALLY_ADDR=node0:4000", "TALLY_TOKEN=s"),
           e->rank == 3 && !strcmp(e->host, "node0") && e->port == 4000 && !e->token_derived,
           "Open MPI with TALLY_ADDR/TALLY_TOKEN");
    ENV_ERR(E("OMPI_COMM_WORLD_RANK=x", "OMPI_COMM_WORLD_SIZE=4"), "OMPI_COMM_WORLD_RANK='x'");
    ENV_OK(E("PMI_RANK=2", "PMI_SIZE=3", "MPI_LOCALNRANKS=3", "PMI_JOBID=j5"),
           e->rank == 2 && e->size == 3 && !strcmp(e->source, "PMI") && !strcmp(e->host, "127.0.0.1") &&
               e->token_derived,
           "PMI on one host");
    ENV_ERR(E("PMI_RANK=0", "PMI_SIZE=3", "TALLY_ADDR=h:5"), "TALLY_TOKEN is not set");
    ENV_ERR(E("PMI_RANK=0"), "PMI_SIZE is not set");
    ENV_OK(E("SLURM_PROCID=3", "SLURM_NTASKS=4", "SLURM_LAUNCH_NODE_IPADDR=10.1.2.3", "SLURM_JOB_ID=77",
             "SLURM_STEP_ID=0", "SLURM_STEP_NUM_NODES=2"),
           e->rank == 3 && e->size == 4 && !strcmp(e->source, "Slurm") && !strcmp(e->host, "10.1.2.3") &&
               e->port >= 29500 && e->port <= 39499 && e->token_derived,
           "Slurm across nodes: launch node address");
    ENV_OK(E("SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_LAUNCH_NODE_IPADDR=10.1.2.3", "SLURM_JOB_ID=77",
             "SLURM_STEP_NUM_NODES=1"),
           !strcmp(e->host, "127.0.0.1"), "Slurm on one node: loopback");
    ENV_OK(E("SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_JOB_ID=77", "TALLY_ADDR=n1:6000"),
           !strcmp(e->host, "n1") && e->port == 6000, "Slurm with TALLY_ADDR");
    ENV_ERR(E("SLURM_PROCID=0", "SLURM_JOB_ID=7"), "SLURM_NTASKS is not set");
    ENV_OK(E("RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=10.0.0.1", "MASTER_PORT=29500", "TALLY_TOKEN=x"),
           e->rank == 1 && !strcmp(e->source, "torchrun") && !strcmp(e->host, "10.0.0.1") && e->port == 29500,
           "torchrun: MASTER_ADDR:MASTER_PORT");
    ENV_OK(E("RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=10.0.0.1", "MASTER_PORT=29500"),
           e->token_derived, "torchrun: token derived from the master address");
    ENV_ERR(E("RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=abc"), "MASTER_PORT: port 'abc'");
    ENV_ERR(E("RANK=1", "WORLD_SIZE=2", "MASTER_PORT=1"), "MASTER_ADDR is not set");
    ENV_OK(E("OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2", "SLURM_PROCID=0", "SLURM_NTASKS=1",
             "TALLY_ADDR=h:1", "TALLY_TOKEN=t"),
           e->rank == 1 && !strcmp(e->source, "Open MPI"), "Open MPI takes precedence over Slurm");
    ENV_OK(E("TALLY_RANK=1", "TALLY_WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=2",
             "TALLY_ADDR=h:1", "TALLY_TOKEN=t"),
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
    srand((unsigned)getpid());
    test_env_tally();
    test_env_launchers();
    TH_CHECK(th_run(1, NULL, fn_single, NULL) == 0 && R[0].fd_leak == 0, "size 1: no network, no leaks");
    int sizes[] = {1, 2, 3, 5, 8};
    for (int i = 0; i < 5; i++) test_rendezvous(sizes[i], 0);
    test_rendezvous(3, 1);
    test_strangers();
    test_bad_token();
    test_dup_rank();
    test_bad_size();
    run_monitor(4, 3, 0);
    run_monitor(4, 0, 0);
    run_monitor(4, 2, 1);
    run_monitor(5, -1, 2);
    run_monitor(3, 2, 3);
    th_shared_free(R, sizeof *R * TH_MAX_RANKS);
    return th_verdict("test_boot");
}
