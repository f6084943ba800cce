/* harness.c - forks ranks with the rendezvous environment, bounds every wait, reaps every child.
 * Used by every multi-process test. */
#include "harness.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int th_passed, th_failed;

double th_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int th_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (struct sockaddr *)&a, &len)) {
        perror("th_free_port");
        exit(2);
    }
    close(fd);
    return ntohs(a.sin_port);
}

int th_count_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    if (!d) return -1;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

int th_count_threads(void) {
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

int th_count_threads_after(int before) {
    int n = th_count_threads();
    for (int waited = 0; n > before && waited < 200; waited++) {
        usleep(1000);
        n = th_count_threads();
    }
    return n;
}

int th_wait_set(const double *flag, double limit_s) {
    double end = th_now() + limit_s;
    while (*(const volatile double *)flag == 0) {
        if (th_now() > end) return 0;
        usleep(2000);
    }
    return 1;
}

int th_first_rank_named(const char *msg) {
    const char *p = strstr(msg, "rank ");
    return p ? atoi(p + 5) : -1;
}

const char *th_path(const char *dir, const char *name) {
    static char buf[4][512];
    static int k;
    char *p = buf[k++ & 3];
    snprintf(p, 512, "%s/%s", dir, name);
    return p;
}

void th_write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) {
        perror(path);
        exit(2);
    }
}

void th_rm_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    char p[1024];
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.') {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    closedir(d);
    rmdir(dir);
}

int th_light(void) {
    const char *s = getenv("TALLY_TEST_LIGHT");
    return s && *s == '1';
}

enum { TH_ALL, TH_QUICK, TH_LONG, TH_EXTERNAL };
static int th_tier(void) {
    static int tier = -1;
    if (tier >= 0) return tier;
    const char *s = getenv("TALLY_TEST_TIER");
    if (!s || !*s)
        tier = TH_ALL;
    else if (!strcmp(s, "quick"))
        tier = TH_QUICK;
    else if (!strcmp(s, "long"))
        tier = TH_LONG;
    else if (!strcmp(s, "external"))
        tier = TH_EXTERNAL;
    else {
        fprintf(stderr, "TALLY_TEST_TIER='%s': expected quick, long or external (or unset for all)\n", s);
        exit(2);
    }
    return tier;
}

int th_quick(void) { return th_tier() == TH_ALL || th_tier() == TH_QUICK; }
int th_long(void) { return th_tier() == TH_ALL || th_tier() == TH_LONG; }
int th_external(void) { return th_tier() == TH_ALL || th_tier() == TH_EXTERNAL; }

void *th_shared_alloc(size_t bytes) {
    void *p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("th_shared_alloc");
        exit(2);
    }
    return p;
}

void th_shared_free(void *p, size_t bytes) { munmap(p, bytes ? bytes : 1); }

static void th_child(int rank, int n, int port, const char *token, const th_opts *o, th_rank_fn fn, void *arg) {
    char buf[64];
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* a dying test takes its ranks with it */
    snprintf(buf, sizeof buf, "%d", rank);
    setenv("TALLY_RANK", buf, 1);
    snprintf(buf, sizeof buf, "%d", n);
    setenv("TALLY_WORLD_SIZE", buf, 1);
    snprintf(buf, sizeof buf, "127.0.0.1:%d", port);
    setenv("TALLY_ADDR", buf, 1);
    setenv("TALLY_TOKEN", token, 1);
    if (o && o->transport) setenv("TALLY_TRANSPORT", o->transport, 1);
    if (o && o->algo) setenv("TALLY_ALGO", o->algo, 1);
    if (o && o->timeout_s > 0) {
        snprintf(buf, sizeof buf, "%g", o->timeout_s);
        setenv("TALLY_TIMEOUT", buf, 1);
    }
    if (!(o && o->measure)) setenv("TALLY_COST", TH_COST, 0);
    if (o && o->child_env) o->child_env(rank, arg);
    int rc = fn(rank, n, arg);
    fflush(stdout);
    fflush(stderr);
    _exit(rc == 0 ? 0 : (rc > 0 && rc < 126 ? rc : 1));
}

/* The flight records the tests' failures leave go to one directory of this test's, removed at its
 * verdict, rather than one /tmp/tally-flight-* per job. */
static char th_flight[64];
void th_flight_default(void) {
    if (th_flight[0] || getenv("TALLY_FLIGHT_DIR")) return;
    snprintf(th_flight, sizeof th_flight, "/tmp/tally-test-records-%d", (int)getpid());
    setenv("TALLY_FLIGHT_DIR", th_flight, 1);
}

int th_start(th_job *job, int n, const th_opts *o, th_rank_fn fn, void *arg) {
    th_flight_default();
    memset(job, 0, sizeof *job);
    if (n < 1 || n > TH_MAX_RANKS) return -1;
    job->n = n;
    job->t0 = th_now();
    int port = th_free_port();
    char token[40];
    snprintf(token, sizeof token, "test-%d-%ld-%d", (int)getpid(), (long)time(NULL), rand());
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < n; r++) {
        pid_t p = fork();
        if (p < 0) {
            for (int k = 0; k < r; k++) kill(job->pid[k], SIGKILL);
            for (int k = 0; k < r; k++) waitpid(job->pid[k], NULL, 0);
            return -1;
        }
        if (p == 0) {
            setpgid(0, 0); /* a group of its own: a hung rank is killed with what it forked */
            th_child(r, n, port, token, o, fn, arg);
        }
        setpgid(p, p); /* (either side may come first) */
        job->pid[r] = p;
        job->status[r] = -1;
    }
    return 0;
}

static int th_index(const th_job *job, pid_t p) {
    for (int r = 0; r < job->n; r++)
        if (job->pid[r] == p) return r;
    return -1;
}

int th_wait(th_job *job, double wall_s) {
    if (wall_s <= 0) wall_s = 120;
    int left = 0;
    for (int r = 0; r < job->n; r++) left += job->status[r] == -1;
    double deadline = job->t0 + wall_s;
    while (left > 0) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p > 0) {
            int r = th_index(job, p);
            if (r >= 0 && job->status[r] == -1) {
                job->status[r] = st;
                job->exit_s[r] = th_now() - job->t0;
                left--;
            }
            continue;
        }
        if (p < 0 && errno == ECHILD) break;
        if (th_now() > deadline) {
            for (int r = 0; r < job->n; r++)
                if (job->status[r] == -1) {
                    job->killed_by_harness[r] = 1;
                    kill(-job->pid[r], SIGKILL); /* the rank and any child of its own (test_lifetime's fork) */
                    kill(job->pid[r], SIGKILL);
                }
            deadline = th_now() + 10; /* SIGKILL cannot be ignored: reaping follows at once */
            wall_s = 1e9;
        }
        usleep(2000);
    }
    int bad = 0;
    for (int r = 0; r < job->n; r++)
        bad += !(job->status[r] != -1 && WIFEXITED(job->status[r]) && WEXITSTATUS(job->status[r]) == 0);
    return bad;
}

int th_run(int n, const th_opts *o, th_rank_fn fn, void *arg) {
    th_job job;
    if (th_start(&job, n, o, fn, arg)) return -1;
    int bad = th_wait(&job, o && o->wall_s > 0 ? o->wall_s : 120);
    for (int r = 0; r < n && bad; r++) {
        int st = job.status[r];
        if (job.killed_by_harness[r])
            fprintf(stderr, "  rank %d/%d: still running after the wall limit, killed (hang)\n", r, n);
        else if (WIFSIGNALED(st))
            fprintf(stderr, "  rank %d/%d: killed by signal %d\n", r, n, WTERMSIG(st));
        else if (WIFEXITED(st) && WEXITSTATUS(st))
            fprintf(stderr, "  rank %d/%d: exited with status %d\n", r, n, WEXITSTATUS(st));
    }
    return bad;
}

int th_verdict(const char *name) {
    if (th_flight[0]) th_rm_dir(th_flight);
    printf("%s: %d passed, %d failed\n", name, th_passed, th_failed);
    fflush(stdout);
    return th_failed ? 1 : 0;
}

int th_shell(const char *cmd, int timeout_s, char *out, size_t cap) {
    char full[1200];
    snprintf(full, sizeof full, "timeout -s KILL %d %s 2>&1", timeout_s, cmd);
    FILE *p = popen(full, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
