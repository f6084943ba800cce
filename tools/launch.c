/* launch.c - starts N local ranks with the TALLY_* environment, relays their output line by line as
 * "[rank] line", and stops them all when one fails or the launcher is signalled. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* execvpe, pipe2, signalfd */
#endif
#include "launch.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <tally.h>
#include <time.h>
#include <unistd.h>

#include "../src/boot/fdlimit.h"
#include "place.h"

extern char **environ;

#define LAUNCH_TOKEN_BYTES  32
#define LAUNCH_CHUNK        65536     /* one read from a rank's pipe */
#define LAUNCH_LINE_MAX     (1 << 20) /* longer lines are relayed in pieces rather than held in memory */
#define LAUNCH_EXEC_WAIT_MS 10000     /* for a child to report whether exec worked */
#define LAUNCH_REAP_WAIT_MS 5000      /* after SIGKILL, before giving up on a child */
#define LAUNCH_DRAIN_MS     1000      /* after the last rank exits, for pipes its leftovers hold open */
#define LAUNCH_TICK_MS      1000      /* poll wakes at least this often to re-check the children */
/* Descriptors the launcher holds besides two pipes per rank: /dev/null, the signalfd, a rank's status
 * pipe while it starts, the socket that finds a free port, and a little room. */
#define LAUNCH_FD_EXTRA 8

typedef struct {
    int fd;    /* read end of the rank's pipe; -1 once closed */
    int out;   /* where its lines go: 1 or 2 */
    char *buf; /* the current line so far */
    size_t len, cap;
    int midline; /* a piece of an over-long line went out; the rest carries no prefix */
} launch_stream;

typedef struct {
    pid_t pid; /* also its process group id */
    int running;
    launch_stream io[2]; /* stdout, stderr */
} launch_rank;

typedef struct {
    const tally_launch_opts *o;
    const char *name;
    launch_rank *ranks;
    int n, started, live;
    pid_t self;
    int sigfd, devnull;
    sigset_t oldmask;
    struct sigaction old_pipe, old_chld;
    int stopping; /* 0; 1 once SIGTERM (or a forwarded signal) went out; 2 after SIGKILL */
    int64_t kill_at, give_up_at, drain_until;
    int result;      /* exit code once decided, -1 while all is well */
    int signalled;   /* the launcher itself was told to stop: no restart */
    int out_dead[3]; /* our stdout/stderr reader went away */
    int fd_raised;   /* we raised RLIMIT_NOFILE's soft limit: fd_orig is what the ranks get */
    struct rlimit fd_orig;
    tally_place place; /* each rank's CPUs, when pinned */
} launcher;

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const char *plural(int k) { return k == 1 ? "" : "s"; }

/* ---- environment of a rank ---------------------------------------------------------------- */

static int hex_token(char *out, size_t outsz) {
    unsigned char raw[LAUNCH_TOKEN_BYTES];
    if (outsz < 2 * sizeof raw + 1 || RAND_bytes(raw, (int)sizeof raw) != 1) return -1;
    for (size_t i = 0; i < sizeof raw; i++) snprintf(out + 2 * i, 3, "%02x", raw[i]);
    return 0;
}

/* The port is free now; rank 0 binds it moments later. Another process could take it in between,
 * a race every single-host launcher accepts (rank 0 then fails to listen, and says so). */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* Variables the launcher sets; inherited copies are dropped so a rank never sees two values. */
static int env_is_ours(const char *entry, const tally_launch_opts *o) {
    static const char *const always[] = {"TALLY_RANK=", "TALLY_WORLD_SIZE=", "TALLY_ADDR=",    "TALLY_TOKEN=",
                                         "LOCAL_RANK=", "LOCAL_WORLD_SIZE=", "TALLY_RESTART=", "RANK=",
                                         "WORLD_SIZE=", "MASTER_ADDR=",      "MASTER_PORT="};
    for (size_t i = 0; i < sizeof always / sizeof always[0]; i++)
        if (strncmp(entry, always[i], strlen(always[i])) == 0) return 1;
    if (o->transport && strncmp(entry, "TALLY_TRANSPORT=", 16) == 0) return 1;
    if (o->timeout_s > 0 && strncmp(entry, "TALLY_TIMEOUT=", 14) == 0) return 1;
    return 0;
}

static char *dup_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *dup_printf(const char *fmt, ...) {
    char *out;
    va_list ap;
    va_start(ap, fmt);
    int k = vasprintf(&out, fmt, ap);
    va_end(ap);
    return k < 0 ? NULL : out;
}

static void free_vars(char **v);

/* The variables common to all ranks, as "NAME=value" strings; NULL-terminated. */
static char **common_vars(const tally_launch_opts *o, const char *token, int port, int master_port, int restart) {
    char **v = calloc(12, sizeof *v);
    if (!v) return NULL;
    int k = 0;
    v[k++] = dup_printf("TALLY_RESTART=%d", restart);
    v[k++] = dup_printf("TALLY_WORLD_SIZE=%d", o->n);
    v[k++] = dup_printf("LOCAL_WORLD_SIZE=%d", o->n);
    v[k++] = dup_printf("TALLY_ADDR=127.0.0.1:%d", port);
    v[k++] = dup_printf("TALLY_TOKEN=%s", token);
    /* torchrun's names too, so a PyTorch program's init_process_group (env://) runs unchanged. */
    v[k++] = dup_printf("WORLD_SIZE=%d", o->n);
    v[k++] = dup_printf("MASTER_ADDR=127.0.0.1");
    v[k++] = dup_printf("MASTER_PORT=%d", master_port);
    if (o->transport) v[k++] = dup_printf("TALLY_TRANSPORT=%s", o->transport);
    if (o->timeout_s > 0) v[k++] = dup_printf("TALLY_TIMEOUT=%g", o->timeout_s);
    for (int i = 0; i < k; i++)
        if (!v[i]) { /* the rest may be set; free_vars stops at the first NULL */
            for (int j = i + 1; j < k; j++) free(v[j]);
            v[i] = NULL;
            free_vars(v);
            return NULL;
        }
    return v;
}

static void free_vars(char **v) {
    for (int i = 0; v && v[i]; i++) free(v[i]);
    free(v);
}

/* Built before fork so the child only has to exec (no malloc between fork and exec). The strings
 * belong to environ, `common` and `rankvars`; free only the array. */
static char **rank_env(const tally_launch_opts *o, char **common, char *rankvars[3]) {
    size_t ne = 0, nc = 0;
    while (environ && environ[ne]) ne++;
    while (common[nc]) nc++;
    char **env = malloc((ne + nc + 4) * sizeof *env);
    if (!env) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < ne; i++)
        if (!env_is_ours(environ[i], o)) env[k++] = environ[i];
    for (size_t i = 0; i < nc; i++) env[k++] = common[i];
    for (int i = 0; i < 3; i++) env[k++] = rankvars[i];
    env[k] = NULL;
    return env;
}

/* ---- relaying output -------------------------------------------------------------------- */

/* Writes all of iov to fd; -1 with errno on failure. Partial writes resume where they stopped. */
static int write_iov(int fd, struct iovec *iov, int cnt) {
    while (cnt > 0) {
        ssize_t w = writev(fd, iov, cnt);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) { /* someone made our stdout non-blocking; wait for room */
                struct pollfd p = {.fd = fd, .events = POLLOUT};
                poll(&p, 1, LAUNCH_TICK_MS);
                continue;
            }
            return -1;
        }
        while (cnt > 0 && (size_t)w >= iov->iov_len) {
            w -= (ssize_t)iov->iov_len;
            iov++;
            cnt--;
        }
        if (cnt > 0) {
            iov->iov_base = (char *)iov->iov_base + w;
            iov->iov_len -= (size_t)w;
        }
    }
    return 0;
}

static void stream_close(launch_stream *s) {
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
}

/* Our reader is gone (tally run ... | head): close the ranks' pipes too, so a rank writing more
 * gets SIGPIPE as it would in a shell pipeline, rather than running on with nobody listening. */
static void output_gone(launcher *L, int out) {
    L->out_dead[out] = 1;
    for (int r = 0; r < L->started; r++) {
        launch_stream *s = &L->ranks[r].io[out - 1];
        stream_close(s);
        s->len = 0;
    }
}

/* One line (or piece) as a single writev, so lines of different ranks never mix. */
static void emit(launcher *L, launch_stream *s, int rank, const char *a, size_t alen, const char *b, size_t blen) {
    if (L->out_dead[s->out]) return;
    char prefix[24];
    int plen = s->midline ? 0 : snprintf(prefix, sizeof prefix, "[%d] ", rank);
    struct iovec iov[3] = {{prefix, (size_t)plen}, {(void *)a, alen}, {(void *)b, blen}};
    if (write_iov(s->out, iov, 3) < 0 && errno == EPIPE) output_gone(L, s->out);
}

static int stream_hold(launch_stream *s, const char *p, size_t k) {
    if (s->len + k > s->cap) {
        size_t cap = s->cap ? s->cap : 256;
        while (cap < s->len + k) cap *= 2;
        char *nb = realloc(s->buf, cap);
        if (!nb) return -1;
        s->buf = nb;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, p, k);
    s->len += k;
    return 0;
}

/* Splits bytes from a rank into lines; a line is written once its newline arrives. */
static void stream_feed(launcher *L, launch_stream *s, int rank, const char *p, size_t k) {
    while (k > 0) {
        const char *nl = memchr(p, '\n', k);
        if (nl) {
            size_t seg = (size_t)(nl - p) + 1;
            emit(L, s, rank, s->buf, s->len, p, seg);
            s->len = 0;
            s->midline = 0;
            p += seg;
            k -= seg;
            continue;
        }
        if (s->len + k > LAUNCH_LINE_MAX || stream_hold(s, p, k) < 0) {
            emit(L, s, rank, s->buf, s->len, p, k); /* out of patience or memory: send the piece */
            s->len = 0;
            s->midline = 1;
        }
        return;
    }
}

/* At EOF a last line without newline still goes out, with one added so the next line starts clean. */
static void stream_finish(launcher *L, launch_stream *s, int rank) {
    if (s->len > 0 || s->midline) emit(L, s, rank, s->buf, s->len, "\n", 1);
    s->len = 0;
    s->midline = 0;
    stream_close(s);
}

/* One read; returns 1 when more may be waiting, 0 when the pipe is empty or closed. */
static int stream_pump(launcher *L, launch_stream *s, int rank) {
    if (s->fd < 0) return 0;
    char chunk[LAUNCH_CHUNK];
    ssize_t got = read(s->fd, chunk, sizeof chunk);
    if (got > 0) {
        stream_feed(L, s, rank, chunk, (size_t)got);
        return 1;
    }
    if (got < 0 && errno == EINTR) return 1;
    if (got < 0 && errno == EAGAIN) return 0;
    stream_finish(L, s, rank); /* EOF, or an error that would repeat forever */
    return 0;
}

/* What a rank wrote before it died comes before the message about its death. Bounded, in case
 * something it left behind keeps writing. */
static void rank_drain(launcher *L, int r) {
    for (int i = 0; i < 2; i++)
        for (int rounds = 0; rounds < 64 && stream_pump(L, &L->ranks[r].io[i], r); rounds++) {}
}

/* ---- starting ranks --------------------------------------------------------------------- */

/* In the child, between fork and exec. Only async-signal-safe calls except snprintf on failure. */
static void child_exec(const launcher *L, int r, int pipes[2][2], int status_fd, const char *file, char *const argv[],
                       char **envp) {
    int err_fd = fcntl(2, F_DUPFD_CLOEXEC, 3); /* our real stderr, for an exec failure message */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != L->self) _exit(127); /* the launcher died before prctl took effect */
    setpgid(0, 0);
    if (r != 0 || isatty(0)) dup2(L->devnull, 0); /* a rank in its own group must not read the tty */
    if (pipes[0][1] >= 0) dup2(pipes[0][1], 1);
    if (pipes[1][1] >= 0) dup2(pipes[1][1], 2);
    sigaction(SIGPIPE, &L->old_pipe, NULL);
    sigaction(SIGCHLD, &L->old_chld, NULL);
    sigprocmask(SIG_SETMASK, &L->oldmask, NULL);
    if (L->fd_raised) setrlimit(RLIMIT_NOFILE, &L->fd_orig); /* the ranks start with the limits they were given */
    if (L->place.pinned) {
        cpu_set_t mine;
        CPU_ZERO(&mine);
        for (int k = 0; k < L->place.per; k++) CPU_SET(L->place.order[r * L->place.per + k], &mine);
        sched_setaffinity(0, sizeof mine, &mine); /* within our own set, so it cannot be refused */
    }
    execvpe(file, argv, envp);
    int e = errno;
    char msg[512];
    int m = snprintf(msg, sizeof msg, "%s: cannot execute '%s': %s\n", L->name, file, strerror(e));
    if (m > (int)sizeof msg - 1) m = (int)sizeof msg - 1;
    if (err_fd >= 0 && m > 0 && write(err_fd, msg, (size_t)m) < 0) {}
    if (write(status_fd, &e, sizeof e) < 0) {}
    _exit(127);
}

static void close_pipes(int pipes[2][2]) {
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            if (pipes[i][j] >= 0) close(pipes[i][j]);
}

/* Read ends are non-blocking for poll; write ends stay blocking since they become the rank's stdio. */
static int open_pipes(const launcher *L, int pipes[2][2]) {
    for (int i = 0; i < 2; i++) pipes[i][0] = pipes[i][1] = -1;
    if (!L->o->prefix_output) return 0;
    for (int i = 0; i < 2; i++) {
        if (pipe2(pipes[i], O_CLOEXEC) < 0) return -1;
        fcntl(pipes[i][0], F_SETFL, fcntl(pipes[i][0], F_GETFL) | O_NONBLOCK);
    }
    return 0;
}

/* The child closes the status pipe by exec'ing (CLOEXEC) or writes errno to it when exec fails.
 * Returns 0 when exec worked (or we stopped waiting), else the errno. */
static int exec_result(int fd) {
    int64_t until = now_ms() + LAUNCH_EXEC_WAIT_MS;
    for (;;) {
        int64_t left = until - now_ms();
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (left <= 0) return 0;
        int k = poll(&p, 1, (int)left);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return 0;
        int e = 0;
        ssize_t got = read(fd, &e, sizeof e);
        if (got < 0 && errno == EINTR) continue;
        return got == (ssize_t)sizeof e ? e : 0;
    }
}

/* Forks and execs rank r. Returns 0, 127 when exec failed (the child said why), or 1. */
static int rank_start(launcher *L, int r, const char *file, char *const argv[], char **common) {
    int pipes[2][2], status[2] = {-1, -1};
    char *rankvars[3] = {NULL, NULL, NULL};
    char **envp = NULL;
    int rc = 1;
    if (open_pipes(L, pipes) < 0 || pipe2(status, O_CLOEXEC) < 0) {
        char why[600];
        if (tally__fd_exhausted(errno))
            tally__fd_explain(errno, why, sizeof why);
        else
            snprintf(why, sizeof why, "%s", strerror(errno));
        fprintf(stderr, "%s: cannot create pipes for rank %d: %s\n", L->name, r, why);
        goto out;
    }
    rankvars[0] = dup_printf("TALLY_RANK=%d", r);
    rankvars[1] = dup_printf("LOCAL_RANK=%d", r);
    rankvars[2] = dup_printf("RANK=%d", r);
    if (!rankvars[0] || !rankvars[1] || !rankvars[2] || !(envp = rank_env(L->o, common, rankvars))) {
        fprintf(stderr, "%s: out of memory\n", L->name);
        goto out;
    }
    fflush(NULL); /* a child must not inherit, and later flush, our unwritten stdio */
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "%s: cannot start rank %d: %s\n", L->name, r, strerror(errno));
        goto out;
    }
    if (pid == 0) child_exec(L, r, pipes, status[1], file, argv, envp);
    setpgid(pid, pid); /* also here, so signalling the group cannot race the child's own setpgid */
    launch_rank *rk = &L->ranks[r];
    rk->pid = pid;
    rk->running = 1;
    for (int i = 0; i < 2; i++) rk->io[i] = (launch_stream){.fd = pipes[i][0], .out = i + 1};
    for (int i = 0; i < 2; i++) pipes[i][0] = -1;
    L->started++;
    L->live++;
    close(status[1]);
    status[1] = -1;
    rc = exec_result(status[0]) ? 127 : 0;
out:
    close_pipes(pipes);
    if (status[0] >= 0) close(status[0]);
    if (status[1] >= 0) close(status[1]);
    free(rankvars[0]);
    free(rankvars[1]);
    free(rankvars[2]);
    free(envp);
    return rc;
}

/* ---- stopping and reaping ----------------------------------------------------------------- */

/* Signals each rank's whole process group, reaped ranks included, so what a rank started (a shell's
 * `sleep`, a pipeline) stops with it. An emptied group just gives ESRCH: its id could only name a
 * stranger that took the same pid and made itself a group leader within these few seconds. */
static void signal_ranks(launcher *L, int sig) {
    for (int r = 0; r < L->started; r++) kill(-L->ranks[r].pid, sig);
}

static double grace_s(const launcher *L) { return L->o->grace_s > 0 ? L->o->grace_s : TALLY_LAUNCH_GRACE_S; }

static void begin_stop(launcher *L, int sig) {
    signal_ranks(L, sig);
    L->stopping = 1;
    L->kill_at = now_ms() + (int64_t)(grace_s(L) * 1000);
}

static void kill_ranks(launcher *L) {
    signal_ranks(L, SIGKILL);
    L->stopping = 2;
    L->give_up_at = now_ms() + LAUNCH_REAP_WAIT_MS;
}

static int status_code(int st) { return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st); }

static void report_failure(launcher *L, int r, int st) {
    char what[160];
    if (WIFEXITED(st))
        snprintf(what, sizeof what, "exited with status %d", WEXITSTATUS(st));
    else
        snprintf(what, sizeof what, "was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    if (L->live > 0)
        fprintf(stderr, "%s: rank %d (pid %d) %s; stopping the other %d rank%s\n", L->name, r, (int)L->ranks[r].pid,
                what, L->live, plural(L->live));
    else
        fprintf(stderr, "%s: rank %d (pid %d) %s\n", L->name, r, (int)L->ranks[r].pid, what);
}

static void rank_exited(launcher *L, int r, int st) {
    L->ranks[r].running = 0;
    L->live--;
    if (L->live == 0) L->drain_until = now_ms() + LAUNCH_DRAIN_MS;
    rank_drain(L, r);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return;
    if (L->stopping || L->result >= 0) return; /* a consequence of stopping, not news */
    L->result = status_code(st);
    report_failure(L, r, st);
    if (L->live > 0) begin_stop(L, SIGTERM);
}

/* Per pid rather than waitpid(-1): the caller may have children of its own. */
static void reap(launcher *L) {
    for (int r = 0; r < L->started; r++) {
        if (!L->ranks[r].running) continue;
        int st;
        pid_t p = waitpid(L->ranks[r].pid, &st, WNOHANG);
        if (p == L->ranks[r].pid)
            rank_exited(L, r, st);
        else if (p < 0 && errno == ECHILD)
            rank_exited(L, r, 0); /* reaped elsewhere: nothing to tell */
    }
}

static const char *signame(int sig) {
    return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : "a signal";
}

static void on_signal(launcher *L, int sig) {
    if (sig == SIGCHLD) return; /* reap() runs every round */
    if (L->stopping) {
        fprintf(stderr, "%s: got %s again; killing the ranks\n", L->name, signame(sig));
        kill_ranks(L);
        return;
    }
    if (L->result < 0) L->result = 128 + sig;
    L->signalled = 1;
    fprintf(stderr, "%s: got %s; forwarding it to %d rank%s\n", L->name, signame(sig), L->live, plural(L->live));
    begin_stop(L, sig);
}

/* Moves the stop along once its deadlines pass; returns nonzero when it is time to give up. */
static int stop_progress(launcher *L, int64_t now) {
    if (L->stopping == 1 && now >= L->kill_at) {
        if (L->live > 0)
            fprintf(stderr, "%s: %d rank%s still running %g s after being told to stop; sending SIGKILL\n", L->name,
                    L->live, plural(L->live), grace_s(L));
        kill_ranks(L);
    }
    if (L->stopping == 2 && L->live > 0 && now >= L->give_up_at) {
        for (int r = 0; r < L->started; r++)
            if (L->ranks[r].running)
                fprintf(stderr, "%s: rank %d (pid %d) did not exit after SIGKILL; not waiting for it\n", L->name, r,
                        (int)L->ranks[r].pid);
        return 1;
    }
    return 0;
}

/* ---- the loop ----------------------------------------------------------------------------- */

static void handle_signals(launcher *L) {
    struct signalfd_siginfo si;
    while (read(L->sigfd, &si, sizeof si) == (ssize_t)sizeof si) on_signal(L, (int)si.ssi_signo);
}

static int open_streams(const launcher *L) {
    for (int r = 0; r < L->started; r++)
        if (L->ranks[r].io[0].fd >= 0 || L->ranks[r].io[1].fd >= 0) return 1;
    return 0;
}

static int next_timeout(const launcher *L, int64_t now) {
    int64_t t = LAUNCH_TICK_MS;
    if (L->stopping == 1 && L->kill_at - now < t) t = L->kill_at - now;
    if (L->stopping == 2 && L->give_up_at - now < t) t = L->give_up_at - now;
    if (L->live == 0 && L->drain_until - now < t) t = L->drain_until - now;
    return t < 0 ? 0 : (int)t;
}

static void poll_once(launcher *L, struct pollfd *pfd, launch_stream **who, int *rank_of) {
    int k = 0;
    pfd[k++] = (struct pollfd){.fd = L->sigfd, .events = POLLIN};
    for (int r = 0; r < L->started; r++)
        for (int i = 0; i < 2; i++)
            if (L->ranks[r].io[i].fd >= 0) {
                who[k] = &L->ranks[r].io[i];
                rank_of[k] = r;
                pfd[k] = (struct pollfd){.fd = who[k]->fd, .events = POLLIN};
                k++;
            }
    int ready = poll(pfd, (nfds_t)k, next_timeout(L, now_ms()));
    if (ready <= 0) return;
    if (pfd[0].revents) handle_signals(L);
    for (int i = 1; i < k; i++)
        if (pfd[i].revents && who[i]->fd == pfd[i].fd) /* not closed meanwhile by output_gone */
            stream_pump(L, who[i], rank_of[i]);
}

static void run_loop(launcher *L) {
    size_t cap = 1 + 2 * (size_t)L->started;
    struct pollfd *pfd = calloc(cap, sizeof *pfd);
    launch_stream **who = calloc(cap, sizeof *who);
    int *rank_of = calloc(cap, sizeof *rank_of);
    if (!pfd || !who || !rank_of) { /* cannot relay; still stop and reap, by ticking */
        fprintf(stderr, "%s: out of memory; stopping the ranks\n", L->name);
        kill_ranks(L);
    }
    for (;;) {
        reap(L);
        int64_t now = now_ms();
        if (L->stopping && stop_progress(L, now)) break;
        if (L->live == 0 && (!open_streams(L) || now >= L->drain_until)) break;
        if (pfd && who && rank_of)
            poll_once(L, pfd, who, rank_of);
        else {
            handle_signals(L);
            poll(NULL, 0, 100);
        }
    }
    free(pfd);
    free(who);
    free(rank_of);
}

/* ---- setup and teardown ------------------------------------------------------------------- */

/* Signals arrive through a signalfd so the loop handles them in order with the pipes, and SIGCHLD
 * must be at its default: inherited SIG_IGN would have the kernel reap our ranks for us. */
static int signals_take(launcher *L) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    struct sigaction ign = {.sa_handler = SIG_IGN}, dfl = {.sa_handler = SIG_DFL};
    sigaction(SIGPIPE, &ign, &L->old_pipe); /* a vanished reader is an EPIPE we handle */
    sigaction(SIGCHLD, &dfl, &L->old_chld);
    sigprocmask(SIG_BLOCK, &set, &L->oldmask);
    L->sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    return L->sigfd < 0 ? -1 : 0;
}

static void signals_give_back(launcher *L) {
    if (L->sigfd >= 0) close(L->sigfd);
    sigprocmask(SIG_SETMASK, &L->oldmask, NULL);
    sigaction(SIGPIPE, &L->old_pipe, NULL);
    sigaction(SIGCHLD, &L->old_chld, NULL);
}

static void launcher_free(launcher *L) {
    for (int r = 0; r < L->started; r++)
        for (int i = 0; i < 2; i++) {
            stream_close(&L->ranks[r].io[i]);
            free(L->ranks[r].io[i].buf);
        }
    free(L->ranks);
    if (L->devnull >= 0) close(L->devnull);
    tally_place_free(&L->place);
}

/* --bind, else TALLY_CPU_BIND, else core: 1 to pin, 0 not to, -1 (said why) when the word is bad. */
static int bind_mode(const tally_launch_opts *o, const char *name) {
    const char *from = o->bind ? "--bind" : "TALLY_CPU_BIND", *s = o->bind ? o->bind : getenv("TALLY_CPU_BIND");
    int core;
    if (tally_place_parse(from, s, &core) == 0) return core;
    fprintf(stderr, "%s: %s\n", name, tally_last_error());
    return -1;
}

static int opts_valid(const tally_launch_opts *o, const char *name, const char *file) {
    if (!o || o->n < 1 || o->n > TALLY_LAUNCH_MAX_RANKS) {
        fprintf(stderr, "%s: the number of ranks must be 1..%d\n", name, TALLY_LAUNCH_MAX_RANKS);
        return 0;
    }
    if (!file || !*file) {
        fprintf(stderr, "%s: no program to run\n", name);
        return 0;
    }
    return bind_mode(o, name) >= 0;
}

/* Room for the pipes of every rank, made before the first starts (raising the soft limit if it must),
 * so a low limit stops the launch at once, by name, rather than at the rank whose pipes do not fit. */
static int fd_budget(launcher *L) {
    long need = (L->o->prefix_output ? 2L * L->n : 0) + LAUNCH_FD_EXTRA;
    tally__fd_limit lim;
    getrlimit(RLIMIT_NOFILE, &L->fd_orig);
    if (tally__fd_room(need, &lim) == 0) {
        L->fd_raised = lim.raised_from != 0;
        return 0;
    }
    char adv[420];
    tally__fd_advice(&lim, adv, sizeof adv);
    int norelay = L->o->prefix_output && strcmp(L->name, "tally run") == 0;
    fprintf(stderr, "%s: %d rank%s%s need about %ld file descriptors in the launcher (%ld open already) but %s%s\n",
            L->name, L->n, plural(L->n), L->o->prefix_output ? " with their output relayed" : "", lim.want, lim.open,
            adv,
            norelay ? "; or pass --no-prefix: the ranks then write to the terminal themselves and the launcher "
                      "holds no pipes"
                    : "");
    return -1;
}

static void fd_budget_give_back(launcher *L) {
    if (L->fd_raised) setrlimit(RLIMIT_NOFILE, &L->fd_orig);
}

/* Starts ranks one by one, so a program that cannot be executed stops the launch at the first. */
static int start_all(launcher *L, const char *file, char *const argv[], char **common) {
    for (int r = 0; r < L->n; r++) {
        int rc = rank_start(L, r, file, argv, common);
        if (rc == 0) continue;
        L->result = rc;
        if (L->live > (rc == 127)) /* the failed exec is still counted live until reaped */
            fprintf(stderr, "%s: stopping the %d rank%s already started\n", L->name, L->live - (rc == 127),
                    plural(L->live - (rc == 127)));
        begin_stop(L, SIGTERM);
        return -1;
    }
    return 0;
}

/* One start of all ranks, until they have all exited. *signalled says the launcher was told to stop. */
/* Takes the signals, starts every rank and relays until all have exited; gives the signals back. */
static void launch_run(launcher *L, const char *file, char *const argv[], char **common) {
    if (signals_take(L) < 0) {
        fprintf(stderr, "%s: signalfd: %s\n", L->name, strerror(errno));
        L->result = 1;
    } else {
        start_all(L, file, argv, common);
        run_loop(L);
        if (L->stopping) signal_ranks(L, SIGKILL); /* leftovers of the stopped ranks, if any */
    }
    signals_give_back(L);
}

static int launch_once(const tally_launch_opts *o, const char *name, const char *file, char *const argv[], int restart,
                       int *signalled) {
    launcher L = {.o = o, .name = name, .n = o->n, .self = getpid(), .sigfd = -1, .result = -1, .devnull = -1};
    if (fd_budget(&L) < 0) return 1;
    if (tally_place_plan(o->n, o->cpus_per_rank, bind_mode(o, name) == 1, &L.place) < 0) {
        fprintf(stderr, "%s: out of memory\n", name);
        fd_budget_give_back(&L);
        return 1;
    }
    char token[2 * LAUNCH_TOKEN_BYTES + 1];
    int port = free_port(), master_port = free_port();
    for (int tries = 0; master_port == port && tries < 8; tries++) master_port = free_port();
    char **common = NULL;
    if (hex_token(token, sizeof token) < 0 || port < 0 || master_port < 0) {
        fprintf(stderr, "%s: cannot %s\n", name,
                port < 0 ? "find a free port on 127.0.0.1" : "generate TALLY_TOKEN (RAND_bytes failed)");
        L.result = 1;
    } else {
        common = common_vars(o, token, port, master_port, restart);
        L.ranks = calloc((size_t)o->n, sizeof *L.ranks);
        L.devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (!common || !L.ranks || L.devnull < 0) {
            fprintf(stderr, "%s: cannot set up the launch: %s\n", name,
                    L.devnull < 0 && L.ranks && common ? "cannot open /dev/null" : "out of memory");
            L.result = 1;
        } else {
            launch_run(&L, file, argv, common);
        }
    }
    launcher_free(&L);
    fd_budget_give_back(&L);
    free_vars(common);
    *signalled = L.signalled;
    return L.result < 0 ? 0 : L.result;
}

static int launch_file(const tally_launch_opts *o, const char *file, char *const argv[]) {
    const char *name = o && o->name ? o->name : "tally run";
    if (!opts_valid(o, name, file)) return 2;
    for (int restart = 0;; restart++) {
        int signalled = 0, rc = launch_once(o, name, file, argv, restart, &signalled);
        /* A program that cannot be executed (127) would only fail again. */
        if (rc == 0 || signalled || rc == 127 || restart >= o->max_restarts) return rc;
        fprintf(stderr, "%s: restarting all %d rank%s (restart %d of %d)\n", name, o->n, plural(o->n), restart + 1,
                o->max_restarts);
    }
}

int tally_launch(const tally_launch_opts *opts, char *const argv[]) {
    return launch_file(opts, argv ? argv[0] : NULL, argv);
}

int tally_launch_in_rank(void) {
    const char *v;
    /* Ours count when set at all, as the library reads them: an empty one is refused there, by name. */
    if (getenv("TALLY_RANK") || getenv("TALLY_WORLD_SIZE")) return 1;
    if ((v = getenv("OMPI_COMM_WORLD_RANK")) && *v) return 1;
    if ((v = getenv("PMI_RANK")) && *v) return 1;
    /* srun's tasks (a job step); not a batch script, which has SLURM_PROCID but no step */
    if ((v = getenv("SLURM_PROCID")) && *v && (v = getenv("SLURM_STEP_ID")) && *v) return 1;
    return getenv("RANK") && getenv("MASTER_ADDR");
}

int tally_launch_self(const tally_launch_opts *opts, int argc, char **argv) {
    if (tally_launch_in_rank()) return TALLY_LAUNCH_IS_RANK;
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[len > 0 ? len : 0] = '\0';
    char **args = calloc((size_t)argc + 2, sizeof *args);
    if (!args) return 1;
    args[0] = len > 0 ? exe : "tally"; /* for ps and the ranks' messages */
    for (int i = 0; i < argc; i++) args[i + 1] = argv[i];
    /* /proc/self/exe, not the path: it still works if the binary was replaced since we started */
    int rc = launch_file(opts, "/proc/self/exe", args);
    free(args);
    return rc;
}
