/* fdlimit.c - file descriptors under RLIMIT_NOFILE: counts what is open, raises the soft limit toward the
 * hard one when a step needs more (as Go's runtime and many tools do), and names the limit in errors. */
#include "fdlimit.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

/* Suggested limits are powers of two from this one: the usual default soft limit, so the advice never
 * names a value below what most systems start with. */
#define FD_SUGGEST_MIN 1024

static unsigned long long fd_val(rlim_t v) { return v == RLIM_INFINITY ? TALLY__FD_UNLIMITED : (unsigned long long)v; }

static void fd_str(unsigned long long v, char *buf, size_t n) {
    if (v == TALLY__FD_UNLIMITED)
        snprintf(buf, n, "unlimited");
    else
        snprintf(buf, n, "%llu", v);
}

/* Open descriptors whose numbers are below `below`: the kernel hands out the lowest free number, so
 * these are what stands between us and the limit. */
static long fd_count_open(unsigned long long below) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return errno == EMFILE ? (long)(below > 1u << 30 ? 1u << 30 : below) : 3; /* full; or no /proc */
    long n = 0;
    int self = dirfd(d);
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        long fd = strtol(e->d_name, NULL, 10);
        n += fd != self && (unsigned long long)fd < below;
    }
    closedir(d);
    return n;
}

static long fd_suggest(long want) {
    long s = FD_SUGGEST_MIN;
    while (s < want + want / 8 && s < (1L << 30)) s *= 2;
    return s;
}

/* setrlimit refuses values past fs.nr_open even under an unlimited hard limit: then try what is wanted. */
static int fd_raise(struct rlimit *rl, unsigned long long target, unsigned long long want) {
    struct rlimit nl = {(rlim_t)target, rl->rlim_max};
    if (setrlimit(RLIMIT_NOFILE, &nl) == 0) return 0;
    nl.rlim_cur = (rlim_t)want;
    return target != want && setrlimit(RLIMIT_NOFILE, &nl) == 0 ? 0 : -1;
}

/* The limit now, what is open under it, and what `more` would make: -1 when the limit cannot be read. */
static int fd_measure(long more, struct rlimit *rl, tally__fd_limit *lim) {
    *lim = (tally__fd_limit){.soft = TALLY__FD_UNLIMITED, .hard = TALLY__FD_UNLIMITED};
    if (getrlimit(RLIMIT_NOFILE, rl) != 0) return -1;
    lim->soft = fd_val(rl->rlim_cur);
    lim->hard = fd_val(rl->rlim_max);
    lim->open = fd_count_open(lim->soft);
    lim->want = lim->open + (more > 0 ? more : 0);
    return 0;
}

int tally__fd_room(long more, tally__fd_limit *lim) {
    struct rlimit rl;
    if (fd_measure(more, &rl, lim)) return 0; /* cannot tell: let the calls themselves say */
    unsigned long long want = (unsigned long long)lim->want;
    if (want <= lim->soft) return 0;
    if (want > lim->hard) return -1;
    /* What tally holds comes on top of the headroom the program had, so its own files still fit. */
    unsigned long long target = lim->soft + (unsigned long long)(more > 0 ? more : 0);
    if (target < want) target = want;
    if (target > lim->hard) target = lim->hard;
    if (fd_raise(&rl, target, want)) return -1;
    lim->raised_from = lim->soft;
    getrlimit(RLIMIT_NOFILE, &rl);
    lim->soft = fd_val(rl.rlim_cur);
    return 0;
}

int tally__fd_spare(long more) {
    struct rlimit rl;
    tally__fd_limit lim;
    return fd_measure(more, &rl, &lim) == 0 && (unsigned long long)lim.want <= lim.soft;
}

void tally__fd_advice(const tally__fd_limit *lim, char *buf, size_t n) {
    char soft[24], hard[24];
    fd_str(lim->soft, soft, sizeof soft);
    fd_str(lim->hard, hard, sizeof hard);
    long sug = fd_suggest(lim->want);
    if ((unsigned long long)lim->want <= lim->hard)
        snprintf(buf, n, "RLIMIT_NOFILE is %s (hard %s): raise it with `ulimit -n %ld` before starting the job", soft,
                 hard, sug);
    else
        snprintf(buf, n,
                 "RLIMIT_NOFILE is %s (hard %s, which only root can raise): raise both with `ulimit -n %ld` "
                 "where the job starts, or the hard limit (nofile in /etc/security/limits.conf, LimitNOFILE= of a "
                 "systemd unit, docker run --ulimit nofile=%ld)",
                 soft, hard, sug, sug);
}

int tally__fd_exhausted(int err) { return err == EMFILE || err == ENFILE; }

void tally__fd_explain(int err, char *buf, size_t n) {
    if (err == ENFILE) {
        snprintf(buf, n,
                 "the system's table of open files is full (ENFILE): stop programs that hold many files, "
                 "or raise fs.file-max (sysctl fs.file-max=N)");
        return;
    }
    struct rlimit rl;
    tally__fd_limit lim = {.soft = TALLY__FD_UNLIMITED, .hard = TALLY__FD_UNLIMITED};
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        lim.soft = fd_val(rl.rlim_cur);
        lim.hard = fd_val(rl.rlim_max);
    }
    /* Every descriptor is in use: suggest twice as many as the limit allowed. */
    lim.open = lim.soft == TALLY__FD_UNLIMITED ? 1L << 20 : (long)(lim.soft > 1u << 29 ? 1u << 29 : lim.soft);
    lim.want = 2 * lim.open;
    char adv[400];
    tally__fd_advice(&lim, adv, sizeof adv);
    snprintf(buf, n, "too many open files (EMFILE: every descriptor this process may have is in use); %s", adv);
}
