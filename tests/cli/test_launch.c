/* test_launch.c - runs the built tally binary (TALLY_BIN) and checks `tally run`: the ranks'
 * environment, prefixed output, stopping on failure, exec errors, signals, usage. Waits are bounded. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RUN_LIMIT_S 20.0 /* any single tally invocation; the slowest case needs ~0.1 s */
#define QUICK_S     10.0 /* "stopped quickly": well under the ranks' sleep 30 */

typedef struct {
    int rc;    /* exit status, 128+signal, or -1 when it ran past RUN_LIMIT_S and was killed */
    char *out; /* everything it wrote to stdout, NUL-terminated */
    char *err; /* and to stderr */
    size_t outlen, errlen;
    double secs;
} result;

static const char *tally_bin;
static int failures; /* checks failed within the current case */

#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            failures++;                                                                                                \
            fprintf(stderr, "  FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                          \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fprintf(stderr, "\n");                                                                                     \
        }                                                                                                              \
    } while (0)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void append(char **buf, size_t *len, const char *p, size_t k) {
    char *nb = realloc(*buf, *len + k + 1);
    if (!nb) abort();
    memcpy(nb + *len, p, k);
    *len += k;
    nb[*len] = '\0';
    *buf = nb;
}

static int count_of(const char *hay, const char *needle) {
    int k = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) k++;
    return k;
}

/* In its own process group, so a timeout can kill it and everything it started. */
static pid_t spawn(const char *const args[], int out[2], int err[2]) {
    pid_t pid = fork();
    if (pid != 0) return pid;
    setpgid(0, 0);
    int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, 0);
    dup2(out[1], 1);
    dup2(err[1], 2);
    const char *argv[32] = {tally_bin};
    for (int i = 0; args[i] && i < 30; i++) argv[i + 1] = args[i];
    execv(tally_bin, (char *const *)argv);
    fprintf(stderr, "test_launch: cannot execute %s: %s\n", tally_bin, strerror(errno));
    _exit(126);
}

/* Reads both pipes until EOF and reaps the child, all before the deadline. Once stdout holds
 * `when_n` copies of `when`, sends `sig` to tally itself (not its group: tally must forward it). */
static void collect(result *r, pid_t pid, int outfd, int errfd, const char *when, int when_n, int sig) {
    double deadline = r->secs + RUN_LIMIT_S;
    int fds[2] = {outfd, errfd}, open_n = 2, reaped = 0, status = 0, signalled = 0;
    while ((open_n > 0 || !reaped) && now_s() < deadline) {
        struct pollfd p[2];
        int k = 0;
        for (int i = 0; i < 2; i++)
            if (fds[i] >= 0) p[k++] = (struct pollfd){.fd = fds[i], .events = POLLIN};
        if (poll(p, (nfds_t)k, 20) > 0)
            for (int i = 0; i < k; i++) {
                if (!p[i].revents) continue;
                char buf[65536];
                ssize_t got = read(p[i].fd, buf, sizeof buf);
                int is_out = p[i].fd == outfd;
                if (got > 0)
                    append(is_out ? &r->out : &r->err, is_out ? &r->outlen : &r->errlen, buf, (size_t)got);
                else if (got == 0 || errno != EINTR) {
                    close(p[i].fd);
                    fds[is_out ? 0 : 1] = -1;
                    open_n--;
                }
            }
        if (when && !signalled && count_of(r->out, when) >= when_n) signalled = kill(pid, sig) == 0;
        if (!reaped && waitpid(pid, &status, WNOHANG) == pid) reaped = 1;
    }
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0) close(fds[i]);
    if (!reaped) {
        kill(-pid, SIGKILL);
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0); /* SIGKILL cannot be caught: this returns */
        r->rc = -1;
    } else {
        r->rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    r->secs = now_s() - r->secs;
}

/* Runs `tally args...`; see collect() for when/when_n/sig. */
static result run_sig(const char *const args[], const char *when, int when_n, int sig) {
    result r = {.out = calloc(1, 1), .err = calloc(1, 1), .secs = now_s()};
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0) {
        perror("test_launch: pipe");
        exit(1);
    }
    fflush(NULL);
    pid_t pid = spawn(args, out, err);
    close(out[1]);
    close(err[1]);
    if (pid < 0) {
        perror("test_launch: fork");
        exit(1);
    }
    collect(&r, pid, out[0], err[0], when, when_n, sig);
    return r;
}

static result run(const char *const args[]) { return run_sig(args, NULL, 0, 0); }

static void result_free(result *r) {
    free(r->out);
    free(r->err);
}

static void show(const result *r) {
    fprintf(stderr, "  (rc %d after %.2f s)\n  stdout: %.2000s\n  stderr: %.2000s\n", r->rc, r->secs, r->out, r->err);
}

/* A process that exited but was never reaped (its parent is gone) counts as gone. */
static int pid_gone(pid_t pid) {
    for (double until = now_s() + 3; now_s() < until; usleep(20000)) {
        if (kill(pid, 0) < 0 && errno == ESRCH) return 1;
        char path[64], stat[256];
        snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
        FILE *f = fopen(path, "r");
        if (!f) return 1;
        size_t got = fread(stat, 1, sizeof stat - 1, f);
        fclose(f);
        stat[got] = '\0';
        const char *paren = strrchr(stat, ')');
        if (paren && paren[1] == ' ' && paren[2] == 'Z') return 1;
    }
    return 0;
}

/* Every "pid N" line the ranks printed names a process that must be gone once tally returned. */
static void check_no_leftovers(const result *r) {
    for (const char *p = r->out; (p = strstr(p, "pid ")); p += 4) {
        int pid = atoi(p + 4);
        if (pid > 1) CHECK(pid_gone(pid), "process %d outlived tally run", pid);
    }
}

/* ---- the cases ---------------------------------------------------------------------------- */

static void t_hello(void) {
    const char *a[] = {"run", "-n", "3", "--", "sh", "-c", "echo hello $TALLY_RANK $TALLY_WORLD_SIZE", NULL};
    result r = run(a);
    CHECK(r.rc == 0, "exit %d", r.rc);
    CHECK(strstr(r.out, "[0] hello 0 3\n") != NULL, "rank 0's line");
    CHECK(strstr(r.out, "[1] hello 1 3\n") != NULL, "rank 1's line");
    CHECK(strstr(r.out, "[2] hello 2 3\n") != NULL, "rank 2's line");
    CHECK(count_of(r.out, "\n") == 3, "exactly three lines");
    if (failures) show(&r);
    result_free(&r);
}

/* Copies the value after "key=" up to a space or newline. */
static void field(const char *s, const char *key, char *out, size_t n) {
    out[0] = '\0';
    const char *p = strstr(s, key);
    if (!p) return;
    p += strlen(key);
    size_t k = strcspn(p, " \n");
    if (k >= n) k = n - 1;
    memcpy(out, p, k);
    out[k] = '\0';
}

static int is_hex64(const char *s) { return strlen(s) == 64 && strspn(s, "0123456789abcdef") == 64; }

static void t_env(void) {
    const char *script = "echo \"tok=$TALLY_TOKEN addr=$TALLY_ADDR rank=$TALLY_RANK local=$LOCAL_RANK/$LOCAL_WORLD_SIZE"
                         " tr=$TALLY_TRANSPORT to=$TALLY_TIMEOUT\"";
    const char *a1[] = {"run", "-n", "2", "--", "sh", "-c", script, NULL};
    const char *a2[] = {"run", "-n", "2", "--transport", "tcp", "--timeout", "7", "--", "sh", "-c", script, NULL};
    setenv("TALLY_RANK", "99", 1); /* stale values from our environment must not reach the ranks */
    setenv("TALLY_TOKEN", "stale", 1);
    result r1 = run(a1), r2 = run(a2);
    unsetenv("TALLY_RANK");
    unsetenv("TALLY_TOKEN");
    char tok0[128], tok1[128], tok2[128], addr0[64], addr1[64], v[64];
    const char *l0 = strstr(r1.out, "[0] "), *l1 = strstr(r1.out, "[1] "), *m0 = strstr(r2.out, "[0] ");
    CHECK(r1.rc == 0 && r2.rc == 0, "exit %d and %d", r1.rc, r2.rc);
    CHECK(l0 && l1 && m0, "every rank printed");
    if (l0 && l1 && m0) {
        field(l0, "tok=", tok0, sizeof tok0);
        field(l1, "tok=", tok1, sizeof tok1);
        field(m0, "tok=", tok2, sizeof tok2);
        CHECK(is_hex64(tok0), "token '%s' is 64 hex digits", tok0);
        CHECK(strcmp(tok0, tok1) == 0, "ranks of one launch share the token");
        CHECK(strcmp(tok0, tok2) != 0, "two launches got different tokens");
        field(l0, "addr=", addr0, sizeof addr0);
        field(l1, "addr=", addr1, sizeof addr1);
        int port = strncmp(addr0, "127.0.0.1:", 10) == 0 ? atoi(addr0 + 10) : 0;
        CHECK(port > 0 && port < 65536, "TALLY_ADDR '%s' is 127.0.0.1:PORT", addr0);
        CHECK(strcmp(addr0, addr1) == 0, "ranks share TALLY_ADDR");
        field(l1, "rank=", v, sizeof v);
        CHECK(strcmp(v, "1") == 0, "TALLY_RANK overrides the inherited one, got '%s'", v);
        field(l1, "local=", v, sizeof v);
        CHECK(strcmp(v, "1/2") == 0, "LOCAL_RANK/LOCAL_WORLD_SIZE '%s'", v);
        field(m0, "tr=", v, sizeof v);
        CHECK(strcmp(v, "tcp") == 0, "TALLY_TRANSPORT '%s'", v);
        field(m0, "to=", v, sizeof v);
        CHECK(strcmp(v, "7") == 0, "TALLY_TIMEOUT '%s'", v);
    }
    if (failures) show(&r1), show(&r2);
    result_free(&r1);
    result_free(&r2);
}

static void t_rank_exits_3(void) {
    const char *a[] = {"run",
                       "-n",
                       "3",
                       "--",
                       "sh",
                       "-c",
                       "echo pid $$; if [ $TALLY_RANK = 1 ]; then exit 3; fi; sleep 30 & echo pid $!; wait",
                       NULL};
    result r = run(a);
    CHECK(r.rc == 3, "exit %d, want the failing rank's 3", r.rc);
    CHECK(r.secs < QUICK_S, "took %.1f s", r.secs);
    CHECK(strstr(r.err, "rank 1 ") && strstr(r.err, "exited with status 3"), "message names rank 1 and status 3");
    CHECK(strstr(r.err, "stopping the other 2 ranks") != NULL, "message says the others are stopped");
    check_no_leftovers(&r);
    if (failures) show(&r);
    result_free(&r);
}

static void t_rank_killed(void) {
    const char *a[] = {"run",
                       "-n",
                       "4",
                       "--",
                       "sh",
                       "-c",
                       "echo pid $$; if [ $TALLY_RANK = 2 ]; then kill -9 $$; fi; sleep 30 & echo pid $!; wait",
                       NULL};
    result r = run(a);
    CHECK(r.rc == 128 + 9, "exit %d, want 137", r.rc);
    CHECK(r.secs < QUICK_S, "took %.1f s", r.secs);
    CHECK(strstr(r.err, "rank 2 ") && strstr(r.err, "killed by signal 9"), "message names rank 2 and signal 9");
    check_no_leftovers(&r);
    if (failures) show(&r);
    result_free(&r);
}

static void t_missing_program(void) {
    const char *a[] = {"run", "-n", "2", "--", "tally-test-no-such-program", "x", NULL};
    const char *b[] = {"run", "-n", "1", "/nonexistent/dir/prog", NULL};
    result r = run(a), s = run(b);
    CHECK(r.rc == 127 && s.rc == 127, "exit %d and %d, want 127", r.rc, s.rc);
    CHECK(strstr(r.err, "cannot execute 'tally-test-no-such-program': No such file or directory") != NULL,
          "message names the program and the reason");
    CHECK(strstr(s.err, "cannot execute '/nonexistent/dir/prog'") != NULL, "message names the path");
    CHECK(r.secs < QUICK_S, "took %.1f s", r.secs);
    if (failures) show(&r), show(&s);
    result_free(&r);
    result_free(&s);
}

static void t_stderr_prefixed(void) {
    const char *a[] = {"run", "-n", "2", "--", "sh", "-c", "echo oops $TALLY_RANK >&2", NULL};
    result r = run(a);
    CHECK(r.rc == 0, "exit %d", r.rc);
    CHECK(strstr(r.err, "[0] oops 0\n") && strstr(r.err, "[1] oops 1\n"), "stderr lines carry the rank");
    CHECK(r.outlen == 0, "nothing on stdout");
    if (failures) show(&r);
    result_free(&r);
}

/* A last line without newline still comes out whole; a 200 KB line is not split or mixed. */
static void t_partial_and_long_lines(void) {
    const char *a[] = {"run", "-n", "2", "--", "sh", "-c", "printf 'no newline %s' $TALLY_RANK", NULL};
    const char *b[] = {"run", "-n", "2", "--", "sh", "-c", "head -c 200000 /dev/zero | tr '\\0' x; echo", NULL};
    result r = run(a), s = run(b);
    CHECK(r.rc == 0 && s.rc == 0, "exit %d and %d", r.rc, s.rc);
    CHECK(strstr(r.out, "[0] no newline 0\n") && strstr(r.out, "[1] no newline 1\n"), "partial lines flushed");
    for (int rank = 0; rank < 2; rank++) {
        char head[24];
        snprintf(head, sizeof head, "[%d] x", rank);
        const char *p = strstr(s.out, head);
        size_t xs = p ? strspn(p + 4, "x") : 0;
        CHECK(xs == 200000 && p[4 + xs] == '\n', "rank %d's long line intact (%zu x)", rank, xs);
    }
    CHECK(s.outlen == 2 * (4 + 200000 + 1), "stdout is exactly the two long lines (%zu bytes)", s.outlen);
    if (failures) show(&r);
    result_free(&r);
    result_free(&s);
}

/* SIGTERM to the launcher reaches every rank; tally exits 128+15 once they have stopped. */
static void t_signal_forwarded(void) {
    const char *a[] = {"run",
                       "-n",
                       "2",
                       "--",
                       "sh",
                       "-c",
                       "trap 'echo got-term $TALLY_RANK; exit 0' TERM; echo ready; sleep 30 & wait",
                       NULL};
    result r = run_sig(a, "ready\n", 2, SIGTERM);
    CHECK(r.rc == 128 + SIGTERM, "exit %d, want 143", r.rc);
    CHECK(strstr(r.out, "[0] got-term 0") && strstr(r.out, "[1] got-term 1"), "both ranks saw SIGTERM");
    CHECK(r.secs < QUICK_S, "took %.1f s", r.secs);
    if (failures) show(&r);
    result_free(&r);
}

static void t_usage(void) {
    const char *bad[][8] = {
        {"run", "-n", "0", "--", "true", NULL},
        {"run", "--bogus", NULL},
        {"run", "-n", "2", NULL}, /* no program */
        {"run", "-n", "1", "--transport", "udp", "true", NULL},
        {"run", "-n", NULL},
        {"run", "--timeout", "-1", "-n", "1", "true", NULL},
        {"frobnicate", NULL},
        {NULL}, /* no subcommand at all */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        result r = run(bad[i]);
        CHECK(r.rc == 2, "bad case %zu: exit %d, want 2", i, r.rc);
        CHECK(strstr(r.err, "usage: tally") != NULL, "case %zu prints the usage", i);
        result_free(&r);
    }
    const char *help[] = {"--help", NULL}, *ver[] = {"--version", NULL}, *rhelp[] = {"run", "--help", NULL};
    result h = run(help), v = run(ver), rh = run(rhelp);
    CHECK(h.rc == 0 && strstr(h.out, "run") && strstr(h.out, "bench"), "--help lists the subcommands");
    CHECK(v.rc == 0 && strncmp(v.out, "tally ", 6) == 0, "--version: '%s'", v.out);
    CHECK(rh.rc == 0 && strstr(rh.out, "--transport"), "run --help lists its flags");
    result_free(&h);
    result_free(&v);
    result_free(&rh);
}

/* ---- runner ------------------------------------------------------------------------------- */

static const char *find_tally(void) {
    const char *env = getenv("TALLY_BIN");
    if (env && *env) return env;
    if (access("./tally", X_OK) == 0) return "./tally";
    if (access("../tally", X_OK) == 0) return "../tally";
    return NULL;
}

int main(void) {
    static const struct {
        const char *name;
        void (*fn)(void);
    } cases[] = {
        {"hello", t_hello},
        {"env", t_env},
        {"rank_exits_3", t_rank_exits_3},
        {"rank_killed", t_rank_killed},
        {"missing_program", t_missing_program},
        {"stderr_prefixed", t_stderr_prefixed},
        {"partial_and_long_lines", t_partial_and_long_lines},
        {"signal_forwarded", t_signal_forwarded},
        {"usage", t_usage},
    };
    tally_bin = find_tally();
    if (!tally_bin) {
        fprintf(stderr, "test_launch: no tally binary (set TALLY_BIN)\n");
        printf("test_launch: 0 passed, 1 failed\n");
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    int passed = 0, failed = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        failures = 0;
        cases[i].fn();
        printf("%s %s\n", failures ? "FAIL" : "ok  ", cases[i].name);
        fflush(stdout);
        failures ? failed++ : passed++;
    }
    printf("test_launch: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
