/* test_limits.c - worlds as large as the launcher takes (128 and 256 tcp ranks set up and run), and the
 * descriptor limit: too low, or exhausted mid-mesh, every rank fails at once, naming RLIMIT_NOFILE. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "boot/boot.h"
#include "boot/boot_int.h"
#include "boot/net.h"
#include "core/clock.h"
#include "harness.h"
#include "transport/tcp_int.h"

#define TL_TIMEOUT_S 60.0 /* TALLY_TIMEOUT of the jobs: a job that waited for it would show */
#define TL_PROMPT_S  10.0 /* every rank of a job that must fail has failed within this */

/* ---- accept4 as the library sees it: out of descriptors on demand ---- */

/* Set in one rank's child: its tl_accept_fail_at-th accept (counting those that returned a connection)
 * fails once with EMFILE, leaving the connection in the backlog as a full table does. */
static int tl_accept_fail_at, tl_accepts;

/* And its tl_pidfd_fail_at-th pidfd_open (the shm transport's way of watching its peers) fails once. */
static int tl_pidfd_fail_at, tl_pidfds;

long syscall(long nr, ...) {
    static long (*real)(long, ...);
    if (!real) real = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    va_list ap;
    va_start(ap, nr);
    long a[6];
    for (int i = 0; i < 6; i++) a[i] = va_arg(ap, long); /* registers on the Linux ABIs: unused ones are junk */
    va_end(ap);
    if (nr == SYS_pidfd_open && tl_pidfd_fail_at > 0 && ++tl_pidfds == tl_pidfd_fail_at) {
        tl_pidfd_fail_at = 0;
        errno = EMFILE;
        return -1;
    }
    return real(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
}

int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
    if (tl_accept_fail_at > 0 && tl_accepts + 1 == tl_accept_fail_at) {
        tl_accept_fail_at = 0;
        errno = EMFILE;
        return -1;
    }
    int rc = (int)syscall(SYS_accept4, fd, addr, len, flags);
    tl_accepts += rc >= 0;
    return rc;
}

/* ---- jobs: every rank inits, runs one allreduce, and reports ---- */

typedef struct tl_shared {
    int rc[TH_MAX_RANKS], init_rc[TH_MAX_RANKS], open[TH_MAX_RANKS];
    double t[TH_MAX_RANKS];
    unsigned long long soft_after[TH_MAX_RANKS], hard_after[TH_MAX_RANKS];
    char msg[TH_MAX_RANKS][1024];
} tl_shared;

/* What the ranks of the next job get, set by the parent before it forks them. */
static struct {
    int limited;       /* the rank whose RLIMIT_NOFILE is lowered; -1 every rank */
    rlim_t soft, hard; /* hard 0: keep the hard limit */
    int accept_rank, accept_at;
    int pidfd_rank, pidfd_at;
} C;

static void tl_child_env(int rank, void *arg) {
    (void)arg;
    if (C.soft && (C.limited < 0 || C.limited == rank)) {
        struct rlimit rl;
        getrlimit(RLIMIT_NOFILE, &rl);
        rl.rlim_cur = C.soft;
        if (C.hard) rl.rlim_max = C.hard;
        if (setrlimit(RLIMIT_NOFILE, &rl)) perror("setrlimit");
    }
    if (C.pidfd_at && rank == C.pidfd_rank) {
        tl_pidfd_fail_at = C.pidfd_at;
        tl_pidfds = 0;
    }
    if (C.accept_at && rank == C.accept_rank) {
        tl_accept_fail_at = C.accept_at;
        tl_accepts = 0; /* the parent's own accepts (the flood test) are not this rank's */
    }
}

static int tl_rank(int rank, int size, void *arg) {
    tl_shared *sh = arg;
    sh->open[rank] = th_count_fds() - 3; /* its entries count ".", ".." and the directory's own descriptor */
    double t0 = th_now();
    tally_comm *c = NULL;
    int rc = tally_comm_init(&c);
    sh->init_rc[rank] = rc;
    if (!rc) {
        float x[4] = {1, 2, 3, 4};
        rc = tally_allreduce(c, x, x, 4, TALLY_F32, TALLY_SUM);
        if (!rc && (x[0] != (float)size || x[3] != 4.0f * (float)size)) rc = 1; /* wrong data */
    }
    sh->rc[rank] = rc;
    sh->t[rank] = th_now() - t0;
    snprintf(sh->msg[rank], sizeof sh->msg[rank], "%s", tally_last_error());
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    sh->soft_after[rank] = rl.rlim_cur;
    sh->hard_after[rank] = rl.rlim_max;
    tally_comm_free(c);
    return 0;
}

static tl_shared *tl_job(int n, const char *transport, double *took) {
    tl_shared *sh = th_shared_alloc(sizeof *sh);
    th_opts o = {
        .transport = transport, .timeout_s = TL_TIMEOUT_S, .wall_s = 2 * TL_TIMEOUT_S, .child_env = tl_child_env};
    double t0 = th_now();
    TH_CHECK(th_run(n, &o, tl_rank, sh) == 0, "%s job of %d ranks: every rank exited by itself", transport, n);
    *took = th_now() - t0;
    return sh;
}

/* Every rank failed with TALLY_E_SYSTEM, soon, with a message naming the limit and `also` (NULL: none). */
static void tl_all_named(const tl_shared *sh, int n, const char *what, const char *also) {
    for (int r = 0; r < n; r++) {
        TH_CHECK(sh->rc[r] == TALLY_E_SYSTEM, "%s: rank %d fails with TALLY_E_SYSTEM (rc %d: %s)", what, r, sh->rc[r],
                 sh->msg[r]);
        TH_CHECK(sh->t[r] < TL_PROMPT_S, "%s: rank %d fails at once (%.1f s), not at TALLY_TIMEOUT", what, r, sh->t[r]);
        TH_CHECK(strstr(sh->msg[r], "RLIMIT_NOFILE") && strstr(sh->msg[r], "ulimit -n") &&
                     (!also || strstr(sh->msg[r], also)),
                 "%s: rank %d names the limit%s%s and how to raise it: %s", what, r, also ? " and " : "",
                 also ? also : "", sh->msg[r]);
    }
}

/* Every rank's limit is too low, and cannot be raised: each says what it needs. */
static void tl_low_everywhere(const char *transport, int n) {
    C = (typeof(C)){.limited = -1, .soft = 64, .hard = 64};
    double took;
    tl_shared *sh = tl_job(n, transport, &took);
    char what[64], world[64];
    snprintf(what, sizeof what, "%s, %d ranks, ulimit -n 64", transport, n);
    snprintf(world, sizeof world, "a %s world of %d ranks needs about", transport, n);
    tl_all_named(sh, n, what, world);
    TH_CHECK(strstr(sh->msg[0], "rank 0:") == sh->msg[0], "%s: rank 0's message is its own: %s", what, sh->msg[0]);
    TH_CHECK(strstr(sh->msg[n - 1], "on rank") && strstr(sh->msg[n - 1], "hard 64"),
             "%s: the last rank says which rank and the hard limit: %s", what, sh->msg[n - 1]);
    fprintf(stderr, "  %s: every rank failed within %.2f s\n", what, took);
    th_shared_free(sh, sizeof *sh);
}

/* One rank's limit is too low: every rank fails, naming it. */
static void tl_low_one(const char *transport, int n, int rank, rlim_t limit) {
    C = (typeof(C)){.limited = rank, .soft = limit, .hard = limit};
    double took;
    tl_shared *sh = tl_job(n, transport, &took);
    char what[96], who[16];
    snprintf(what, sizeof what, "%s, %d ranks, rank %d under ulimit -n %d", transport, n, rank, (int)limit);
    snprintf(who, sizeof who, "rank %d", rank);
    tl_all_named(sh, n, what, who);
    fprintf(stderr, "  %s: every rank failed within %.2f s\n", what, took);
    th_shared_free(sh, sizeof *sh);
}

/* A soft limit below what is needed, under a high hard one, is raised once at init, where needed only. */
static void tl_raised(void) {
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < 256) {
        printf("test_limits: hard RLIMIT_NOFILE %llu: raising not tried\n", (unsigned long long)rl.rlim_max);
        return;
    }
    int n = 16;
    C = (typeof(C)){.limited = -1, .soft = 40};
    double took;
    tl_shared *sh = tl_job(n, "tcp", &took);
    int raised = 0;
    for (int r = 0; r < n; r++) {
        TH_CHECK(sh->rc[r] == 0, "soft limit 40, 16 tcp ranks: rank %d works (rc %d: %s)", r, sh->rc[r], sh->msg[r]);
        long want = sh->open[r] + tally__boot_fd_need(r, n);
        int must = want > 40;
        raised += sh->soft_after[r] > 40;
        TH_CHECK(must ? sh->soft_after[r] >= (unsigned long long)want : sh->soft_after[r] == 40,
                 "rank %d needs about %ld: soft limit %llu after init (%s)", r, want, sh->soft_after[r],
                 must ? "raised" : "left alone");
        TH_CHECK(sh->hard_after[r] == rl.rlim_max, "rank %d: the hard limit is untouched", r);
    }
    TH_CHECK(raised >= 1, "rank 0, which holds a connection per rank, had its soft limit raised");
    th_shared_free(sh, sizeof *sh);
}

/* Rank 2's second accept of the mesh finds the descriptor table full: it fails at once naming the limit,
 * and so does every other rank, wherever it was in the setup (or in its first collective). */
/* Rank 0's third accept of the rendezvous finds the table full: the ranks that joined and those still
 * to come are told why, at once. */
static void tl_mid_rendezvous(void) {
    int n = 8;
    C = (typeof(C)){.accept_rank = 0, .accept_at = 3};
    double took;
    tl_shared *sh = tl_job(n, "tcp", &took);
    tl_all_named(sh, n, "EMFILE in rank 0's rendezvous", "rank 0");
    TH_CHECK(strstr(sh->msg[0], "rendezvous"), "rank 0 says it ran out in the rendezvous: %s", sh->msg[0]);
    fprintf(stderr, "  EMFILE in rank 0's rendezvous: every rank failed within %.2f s\n", took);
    th_shared_free(sh, sizeof *sh);
}

/* Rank 2 runs out of descriptors opening its peers' pidfds (shm): every rank fails, naming rank 2. */
static void tl_shm_pidfd(void) {
    int n = 4;
    C = (typeof(C)){.pidfd_rank = 2, .pidfd_at = 2};
    double took;
    tl_shared *sh = tl_job(n, "shm", &took);
    tl_all_named(sh, n, "EMFILE in rank 2's pidfd_open", "rank 2");
    TH_CHECK(strstr(sh->msg[2], "pidfd_open") && !strstr(sh->msg[2], "TALLY_TRANSPORT=tcp"),
             "rank 2 says which call ran out, and does not send the user to a transport that needs as many: %s",
             sh->msg[2]);
    fprintf(stderr, "  EMFILE in rank 2's pidfd_open: every rank failed within %.2f s\n", took);
    th_shared_free(sh, sizeof *sh);
}

static void tl_mid_mesh(void) {
    int n = 6;
    C = (typeof(C)){.accept_rank = 2, .accept_at = 2};
    double took;
    tl_shared *sh = tl_job(n, "tcp", &took);
    for (int r = 0; r < n; r++) {
        TH_CHECK(sh->rc[r] != 0 && sh->t[r] < TL_PROMPT_S,
                 "EMFILE mid-mesh: rank %d fails at once (rc %d after %.1f "
                 "s, %s)",
                 r, sh->rc[r], sh->t[r], sh->init_rc[r] ? "in init" : "in its first allreduce");
        TH_CHECK(strstr(sh->msg[r], "RLIMIT_NOFILE") && strstr(sh->msg[r], "rank 2"),
                 "EMFILE mid-mesh: rank %d names rank 2 and the limit: %s", r, sh->msg[r]);
    }
    TH_CHECK(sh->init_rc[2] == TALLY_E_SYSTEM && strstr(sh->msg[2], "accepting"),
             "rank 2 says its accept ran out of descriptors: %s", sh->msg[2]);
    fprintf(stderr, "  EMFILE in rank 2's accept: every rank failed within %.2f s\n", took);
    th_shared_free(sh, sizeof *sh);
}

/* tally_mem_alloc on shm holds a memfd per buffer: with every descriptor in use it fails, naming the
 * limit, and the communicator works on once the limit is back. */
static int tl_memalloc_rank(int rank, int size, void *arg) {
    tl_shared *sh = arg;
    tally_comm *c = NULL;
    int rc = tally_comm_init(&c);
    if (rc) {
        snprintf(sh->msg[rank], sizeof sh->msg[rank], "init: %s", tally_last_error());
        sh->rc[rank] = rc;
        return 0;
    }
    struct rlimit rl, low;
    getrlimit(RLIMIT_NOFILE, &rl);
    int top = 0; /* one past the highest descriptor: the lowest free one is at most this */
    for (int fd = 0; fd < 4096; fd++)
        if (fcntl(fd, F_GETFD) >= 0) top = fd + 1;
    low = (struct rlimit){(rlim_t)top, rl.rlim_max};
    setrlimit(RLIMIT_NOFILE, &low);
    while (dup(0) >= 0) { /* fill every hole below it */
    }
    void *p = tally_mem_alloc(c, 1 << 20);
    snprintf(sh->msg[rank], sizeof sh->msg[rank], "%s", p ? "" : tally_last_error());
    setrlimit(RLIMIT_NOFILE, &rl);
    sh->init_rc[rank] = p == NULL;
    tally_mem_free(c, p);
    float x = 1;
    sh->rc[rank] = tally_allreduce(c, &x, &x, 1, TALLY_F32, TALLY_SUM);
    if (!sh->rc[rank] && x != (float)size) sh->rc[rank] = 1;
    tally_comm_free(c);
    return 0;
}

static void tl_memalloc(void) {
    tl_shared *sh = th_shared_alloc(sizeof *sh);
    th_opts o = {.transport = "shm", .timeout_s = TL_TIMEOUT_S, .wall_s = 2 * TL_TIMEOUT_S};
    TH_CHECK(th_run(2, &o, tl_memalloc_rank, sh) == 0, "tally_mem_alloc job");
    for (int r = 0; r < 2; r++) {
        TH_CHECK(sh->init_rc[r] && strstr(sh->msg[r], "tally_mem_alloc") && strstr(sh->msg[r], "RLIMIT_NOFILE"),
                 "rank %d: tally_mem_alloc without a free descriptor fails, naming the limit: %s", r, sh->msg[r]);
        TH_CHECK(sh->rc[r] == 0, "rank %d: the communicator works on (rc %d)", r, sh->rc[r]);
    }
    th_shared_free(sh, sizeof *sh);
}

/* ---- the mesh's acceptor, in process: a flood of strangers, and a real EMFILE ---- */

typedef struct tl_flood {
    int port, size, strangers, joined;
    int *fds; /* strangers first, then the genuine ranks' */
} tl_flood;

static int tl_dial(int port) {
    int fd = -1;
    return tally__net_connect("127.0.0.1", port, tally__deadline(5.0), &fd) ? -1 : fd;
}

static void *tl_flood_clients(void *arg) {
    tl_flood *f = arg;
    for (int i = 0; i < f->strangers; i++) { /* part of a nonce, then silence */
        f->fds[i] = tl_dial(f->port);
        if (f->fds[i] >= 0) (void)send(f->fds[i], "0123456789", 10, MSG_NOSIGNAL);
    }
    for (int r = 1; r < f->size; r++) {
        int fd = tl_dial(f->port);
        tally__tcp_hello h = {.magic = TALLY__TCP_MAGIC_HELLO, .rank = (uint32_t)r, .size = (uint32_t)f->size};
        if (fd >= 0 && tally__auth_connect(fd, "flood", 5, "tcp", tally__deadline(5.0)) == 0 &&
            tally__net_send_all(fd, &h, sizeof h, tally__deadline(5.0)) == 0)
            f->joined++;
        f->fds[f->strangers + r - 1] = fd;
    }
    return NULL;
}

/* 200 ranks above rank 0, after 80 strangers that hold their connections silent: every rank gets in
 * (more than the 64 slots strangers share), and the strangers do not outlast the mesh. */
static void tl_flood_test(void) {
    tl_flood f = {.size = 201, .strangers = 80};
    int lfd = -1, nfd = f.strangers + f.size - 1;
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < (rlim_t)(3 * nfd)) {
        printf("test_limits: RLIMIT_NOFILE %llu: the flood of strangers is not tried\n",
               (unsigned long long)rl.rlim_cur);
        return;
    }
    f.fds = calloc((size_t)nfd, sizeof *f.fds);
    TH_CHECK(tally__net_listen("127.0.0.1", 0, 4096, &lfd) == 0, "listen on loopback");
    f.port = tally__net_local_port(lfd);
    tally__tcp_conn *conns = calloc((size_t)f.size, sizeof *conns);
    for (int r = 0; r < f.size; r++) conns[r].fd = -1;
    tally__tp_ctx ctx = {.rank = 0, .size = f.size, .timeout_s = 20.0};
    pthread_t th;
    pthread_create(&th, NULL, tl_flood_clients, &f);
    double t0 = th_now();
    int rc = tally__tcp_accept_peers(&ctx, "flood", 5, lfd, conns, tally__deadline(ctx.timeout_s));
    double took = th_now() - t0;
    pthread_join(th, NULL);
    TH_CHECK(rc == 0 && f.joined == f.size - 1, "200 ranks joined past 80 stalled strangers (rc %d, %d joined: %s)", rc,
             f.joined, tally_last_error());
    TH_CHECK(took < TALLY__TCP_AUTH_S, "no rank waited for a stranger to expire (%.1f s)", took);
    int closed = 0;
    for (int i = 0; i < f.strangers; i++) {
        char c;
        closed += f.fds[i] >= 0 && recv(f.fds[i], &c, 1, MSG_DONTWAIT) == 0;
    }
    TH_CHECK(closed == f.strangers, "every stranger was closed by the end of the mesh (%d of %d)", closed, f.strangers);
    for (int i = 0; i < nfd; i++)
        if (f.fds[i] >= 0) close(f.fds[i]);
    for (int r = 0; r < f.size; r++)
        if (conns[r].fd >= 0) close(conns[r].fd);
    close(lfd);
    free(conns);
    free(f.fds);
}

/* Waits for a child at most secs, then kills it; its status (-1 if it was killed here). */
static int tl_reap(pid_t pid, double secs) {
    int st = -1;
    for (double end = th_now() + secs; waitpid(pid, &st, WNOHANG) == 0;) {
        if (th_now() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0); /* SIGKILL cannot be ignored: this returns */
            return -1;
        }
        usleep(10000);
    }
    return st;
}

/* In a child whose every descriptor is taken: the acceptor fails at once, naming the limit, instead of
 * waiting for its deadline. */
static void tl_real_emfile(void) {
    int lfd = -1;
    TH_CHECK(tally__net_listen("127.0.0.1", 0, 16, &lfd) == 0, "listen on loopback");
    int port = tally__net_local_port(lfd);
    fflush(NULL);
    pid_t dialer = fork();
    if (dialer == 0) {
        close(lfd);
        int fd = tl_dial(port);
        sleep(fd >= 0 ? 20 : 0); /* killed at the end */
        _exit(0);
    }
    pid_t acceptor = fork();
    if (acceptor == 0) {
        struct rlimit rl = {256, 256};
        setrlimit(RLIMIT_NOFILE, &rl);
        while (dup(0) >= 0) {}
        tally__tp_ctx ctx = {.rank = 0, .size = 2, .timeout_s = 20.0};
        tally__tcp_conn conns[2] = {{.fd = -1}, {.fd = -1}};
        double t0 = th_now();
        int rc = tally__tcp_accept_peers(&ctx, "emfile", 6, lfd, conns, tally__deadline(ctx.timeout_s));
        int ok = rc == TALLY_E_SYSTEM && strstr(tally_last_error(), "RLIMIT_NOFILE") && th_now() - t0 < TL_PROMPT_S;
        if (!ok) fprintf(stderr, "acceptor: rc %d after %.1f s: %s\n", rc, th_now() - t0, tally_last_error());
        _exit(ok ? 0 : 1);
    }
    close(lfd);
    int st = tl_reap(acceptor, 2 * TL_PROMPT_S);
    kill(dialer, SIGKILL);
    tl_reap(dialer, TL_PROMPT_S);
    TH_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "accept() out of descriptors fails at once, naming the limit");
}

/* ---- through the CLI: the launcher's pipes, and worlds of 128 and 256 tcp ranks ---- */

static void tl_launcher(const char *bin) {
    static char out[1 << 16];
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "sh -c 'ulimit -n 64; exec %s run -n 64 -- true'", bin);
    double t0 = th_now();
    int rc = th_shell(cmd, 60, out, sizeof out);
    TH_CHECK(rc == 1 && strstr(out, "RLIMIT_NOFILE") && strstr(out, "--no-prefix") && th_now() - t0 < TL_PROMPT_S,
             "tally run -n 64 under ulimit -n 64 stops at once, naming the limit (exit %d): %s", rc, out);
    snprintf(cmd, sizeof cmd, "sh -c 'ulimit -Sn 64; exec %s run -n 64 -- sh -c \"test \\$(ulimit -Sn) = 64\"'", bin);
    rc = th_shell(cmd, 60, out, sizeof out);
    TH_CHECK(rc == 0,
             "under a soft limit of 64 the launcher makes room for its pipes, and the ranks still start "
             "with 64 (exit %d): %s",
             rc, out);
}

static void tl_big_world(const char *bin, int n) {
    static char out[1 << 20];
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "env TALLY_TRANSPORT=tcp TALLY_TIMEOUT=%g %s run -n %d -- %s bench allreduce -b 8 -e 64 "
             "-f 8 --iters 2 --warmup 1 -c",
             TL_TIMEOUT_S * 2, bin, n, bin);
    double t0 = th_now();
    int rc = th_shell(cmd, (int)(TL_TIMEOUT_S * 4), out, sizeof out);
    double took = th_now() - t0;
    TH_CHECK(rc == 0 && strstr(out, "Out of bounds values : 0 OK"),
             "%d tcp ranks set up and allreduce correctly "
             "(exit %d): %.2000s",
             n, rc, out + (strlen(out) > 2000 ? strlen(out) - 2000 : 0));
    TH_CHECK(took < TL_TIMEOUT_S, "%d tcp ranks ended well within TALLY_TIMEOUT (%.1f s)", n, took);
    TH_CHECK(!strstr(out, "gave way") && !strstr(out, "refused"), "%d tcp ranks: no connection of the job was refused",
             n);
    fprintf(stderr, "  %d tcp ranks: set up and benchmarked in %.1f s\n", n, took);
}

/* TL_ONLY=name[,name...] runs only those groups of cases: flood, emfile, low, raised, memalloc, midmesh,
 * cli. */
static int tl_want(const char *name) {
    const char *only = getenv("TL_ONLY");
    size_t n = strlen(name);
    for (const char *p = only; p && (p = strstr(p, name)); p += n)
        if ((p == only || p[-1] == ',') && (p[n] == ',' || !p[n])) return 1;
    return !only || !*only;
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    if (tl_want("flood")) tl_flood_test();
    if (tl_want("emfile")) tl_real_emfile();
    if (tl_want("low")) {
        tl_low_everywhere("tcp", 64);
        tl_low_everywhere("shm", 64);
        tl_low_one("tcp", 8, 5, 16);
        tl_low_one("shm", 8, 5, 16);
        tl_low_one("tcp", 32, 0, 12); /* rank 0 can hold a few connections at a time: it tells them in turns */
    }
    if (tl_want("raised")) tl_raised();
    if (tl_want("memalloc")) tl_memalloc();
    if (tl_want("midmesh")) {
        tl_mid_rendezvous();
        tl_mid_mesh();
        tl_shm_pidfd();
    }
    const char *bin = getenv("TALLY_BIN");
    if (!tl_want("cli")) {
    } else if (!bin) {
        printf("test_limits: TALLY_BIN is not set (run through ctest): the CLI cases are not tried\n");
    } else {
        tl_launcher(bin);
        if (th_long()) { /* 128 and 256 ranks: the long tier */
            tl_big_world(bin, th_light() ? 96 : 128);
            if (!th_light()) tl_big_world(bin, 256);
        }
    }
    return th_verdict("test_limits");
}
