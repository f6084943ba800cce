/* tool_runner.c - the tally binary run as a user would: no rank variables of ours, a process group of its
 * own killed at the limit, output read through one pipe, the peak memory from wait4. */
#include "tool_runner.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static const char *tool_bin(void) {
    const char *b = getenv("TALLY_BIN");
    return b && *b ? b : "./tally";
}

static void tool_child(char *const argv[], const th_tool_opts *o, int fd) {
    dup2(fd, 1);
    dup2(fd, 2);
    static const char *strip[] = {
        "TALLY_RANK",           "TALLY_WORLD_SIZE", "TALLY_ADDR",   "TALLY_TOKEN", "TALLY_TIMEOUT",
        "TALLY_TRANSPORT",      "TALLY_ALGO",       "TALLY_DEBUG",  "RANK",        "WORLD_SIZE",
        "OMPI_COMM_WORLD_RANK", "PMI_RANK",         "SLURM_PROCID", NULL};
    for (int i = 0; strip[i]; i++) unsetenv(strip[i]);
    for (int i = 0; o && o->env && o->env[i]; i++) {
        char buf[512];
        snprintf(buf, sizeof buf, "%s", o->env[i]);
        char *eq = strchr(buf, '=');
        if (!eq) continue;
        *eq = '\0';
        setenv(buf, eq + 1, 1);
    }
    if (o && o->child) o->child(o->arg);
    execv(tool_bin(), argv);
    _exit(127);
}

/* Reads until the end, the limit or the cap; 1 when the process must be killed. */
static int tool_read(int fd, double end, th_tool *r) {
    for (;;) {
        int ms = (int)((end - th_now()) * 1000);
        if (ms <= 0) return r->timed_out = 1;
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, ms) <= 0) continue;
        char buf[4096];
        ssize_t got = read(fd, buf, sizeof buf);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return 0;
        size_t room = sizeof r->out - 1 - r->len, take = (size_t)got < room ? (size_t)got : room;
        memcpy(r->out + r->len, buf, take);
        r->len += take;
        r->out[r->len] = '\0';
        if (take < (size_t)got) return 1; /* a flood */
    }
}

void th_tool_run(const char *const *args, const th_tool_opts *o, th_tool *r) {
    th_flight_default();
    char *argv[48];
    int n = 0;
    argv[n++] = "tally";
    for (int i = 0; args[i] && n < 47; i++) argv[n++] = (char *)args[i];
    argv[n] = NULL;
    r->rc = -1;
    r->timed_out = 0;
    r->len = 0;
    r->out[0] = '\0';
    r->maxrss_kb = 0;
    int p[2];
    if (pipe(p)) return;
    double t0 = th_now();
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        setpgid(0, 0);
        tool_child(argv, o, p[1]);
    }
    close(p[1]);
    if (pid < 0) return (void)close(p[0]);
    int kill_it = tool_read(p[0], t0 + (o && o->wall_s > 0 ? o->wall_s : 20), r);
    close(p[0]);
    if (kill_it) kill(-pid, SIGKILL);
    int st;
    struct rusage ru;
    while (wait4(pid, &st, 0, &ru) < 0 && errno == EINTR) {}
    r->secs = th_now() - t0;
    r->maxrss_kb = ru.ru_maxrss;
    r->rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

void th_tool_expect(const th_tool *r, int cond, const char *what) {
    TH_CHECK(cond, "%s: exit %d%s after %.1f s:\n%.3000s", what, r->rc, r->timed_out ? " (killed at the limit)" : "",
             r->secs, r->out);
}
