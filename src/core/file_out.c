/* file_out.c - the outputs a user names (--json, --svg, --plot, --trace, sim --save): a regular file or a
 * new name replaced whole by rename, a device, FIFO or descriptor written in place, a link never replaced. */
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/magic.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "err.h"

#define OUT_MAX_HOPS 40 /* the kernel's own limit on links in one lookup */

/* ---- the stream: stdio over the descriptor, keeping the first write error's errno ---- */

struct tally__out_sink {
    int fd, err;
};

/* write() with SIGPIPE held back: a FIFO or pipe whose reader left is EPIPE for the commit to report,
 * not a signal that kills the process (the library never exits). A SIGPIPE this write raised is taken
 * while still blocked; one pending from elsewhere is left as it was. */
static ssize_t write_nosig(int fd, const void *buf, size_t n) {
    sigset_t sp, old;
    sigemptyset(&sp);
    sigaddset(&sp, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &sp, &old);
    sigset_t pending;
    sigpending(&pending);
    int was_pending = sigismember(&pending, SIGPIPE) == 1;
    ssize_t k = write(fd, buf, n);
    int e = errno;
    if (k < 0 && e == EPIPE && !was_pending) {
        static const struct timespec now = {0, 0};
        while (sigtimedwait(&sp, NULL, &now) < 0 && errno == EINTR) {}
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    errno = e;
    return k;
}

static ssize_t sink_write(void *cookie, const char *buf, size_t n) {
    struct tally__out_sink *s = cookie;
    for (size_t done = 0; done < n;) {
        ssize_t k = write_nosig(s->fd, buf + done, n - done);
        if (k > 0) {
            done += (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) { /* a shared descriptor left non-blocking */
            struct pollfd p = {.fd = s->fd, .events = POLLOUT};
            if (poll(&p, 1, -1) >= 0 || errno == EINTR) continue;
        }
        if (!s->err) s->err = k < 0 ? errno : EIO;
        return 0; /* fopencookie's "error" */
    }
    return (ssize_t)n;
}

static int sink_close(void *cookie) {
    struct tally__out_sink *s = cookie;
    int rc = s->fd >= 0 ? close(s->fd) : 0;
    if (rc && !s->err) s->err = errno;
    s->fd = -1;
    return rc ? -1 : 0;
}

/* Takes fd: on failure it is closed. */
static int out_stream(tally__file_out *o, int fd) {
    o->sink = malloc(sizeof *o->sink);
    if (o->sink) {
        *o->sink = (struct tally__out_sink){.fd = fd, .err = 0};
        cookie_io_functions_t io = {.write = sink_write, .close = sink_close};
        o->f = fopencookie(o->sink, "w", io);
    }
    if (!o->f) {
        close(fd);
        return tally__seterr(TALLY_E_NOMEM, "%s: out of memory", o->path);
    }
    o->fd = fd;
    return 0;
}

/* ---- where the path leads ---- */

/* N for the digits of a descriptor's number (within an int), else -1. */
static int fd_path_digits(const char *p) {
    long n = 0;
    if (!*p) return -1;
    for (; *p; p++) {
        if (*p < '0' || *p > '9' || n > (INT_MAX - (*p - '0')) / 10) return -1;
        n = n * 10 + (*p - '0');
    }
    return (int)n;
}

/* N for /dev/fd/N, /proc/self/fd/N, /proc/thread-self/fd/N: names of a descriptor, not of a file; else -1. */
static int fd_path(const char *p) {
    static const char *const dirs[] = {"/dev/fd/", "/proc/self/fd/", "/proc/thread-self/fd/"};
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
        size_t l = strlen(dirs[i]);
        if (!strncmp(p, dirs[i], l)) return fd_path_digits(p + l);
    }
    return -1;
}

/* The pid procfs gives this process (in procfs's own pid namespace, which getpid()'s may not be). */
static long proc_self(void) {
    char t[32];
    ssize_t n = readlink("/proc/self", t, sizeof t - 1);
    if (n <= 0) return (long)getpid();
    t[n] = '\0';
    return strtol(t, NULL, 10);
}

/* N when p names a descriptor through procfs however it is spelled (/dev//fd/N, /proc/PID/fd/N,
 * /proc/self/task/TID/fd/N, /proc/self/task/../fd/N), with *pid the process whose it is; else -1. Its
 * link reads "pipe:[1234]" for a pipe: no path to follow, and not one to print as if it were. */
static int proc_fd_path(const char *p, long *pid) {
    const char *slash = strrchr(p, '/');
    int n = slash && slash > p ? fd_path_digits(slash + 1) : -1;
    char *dir = n >= 0 ? strndup(p, (size_t)(slash - p)) : NULL;
    char real[PATH_MAX];
    struct statfs fs;
    long tid;
    int at = 0;
    if (!dir || statfs(dir, &fs) != 0 || fs.f_type != PROC_SUPER_MAGIC || !realpath(dir, real) ||
        !((sscanf(real, "/proc/%ld/fd%n", pid, &at) == 1 && !real[at]) ||
          (sscanf(real, "/proc/%ld/task/%ld/fd%n", pid, &tid, &at) == 2 && !real[at])))
        n = -1;
    free(dir);
    return n;
}

static int out_descriptor(tally__file_out *o, int n) {
    int fl = fcntl(n, F_GETFL);
    if (fl < 0)
        return tally__seterr(TALLY_E_INVALID, "%s: names descriptor %d, which is not open in this process", o->path, n);
    if ((fl & O_ACCMODE) == O_RDONLY)
        return tally__seterr(TALLY_E_INVALID, "%s: names descriptor %d (%s), which is open for reading only", o->path,
                             n, tally__file_kind_fd(n));
    fflush(NULL); /* what stdio holds for that descriptor goes first */
    int fd = fcntl(n, F_DUPFD_CLOEXEC, 3);
    if (fd < 0)
        return tally__seterr(TALLY_E_SYSTEM, "%s: cannot duplicate descriptor %d: %s%s", o->path, n, strerror(errno),
                             tally__errno_hint(errno));
    snprintf(o->how, sizeof o->how, "descriptor %d, %s", n, tally__file_kind_fd(fd));
    return out_stream(o, fd);
}

/* Descriptor n of another process, named through procfs at p: 1 when its link leads to a path naming the
 * same file (then it is followed as any link is), else refused, saying what the descriptor is in words. */
static int out_foreign_fd(tally__file_out *o, const char *p, long pid, int n) {
    struct stat obj, named;
    if (stat(p, &obj) != 0)
        return tally__seterr(TALLY_E_INVALID, "%s: names descriptor %d of process %ld, which is not open there: %s",
                             o->path, n, pid, strerror(errno));
    char t[PATH_MAX];
    ssize_t k = readlink(p, t, sizeof t - 1);
    t[k > 0 ? k : 0] = '\0';
    if (t[0] == '/' && stat(t, &named) == 0 && named.st_dev == obj.st_dev && named.st_ino == obj.st_ino) return 1;
    int fd = open(p, O_PATH | O_CLOEXEC); /* the object itself, to say what it is */
    const char *kind = fd >= 0 ? tally__file_kind_fd(fd) : tally__file_kind(obj.st_mode);
    int rc = tally__seterr(TALLY_E_INVALID,
                           "%s: names descriptor %d of process %ld, %s; tally writes into its own descriptors "
                           "(/dev/fd/N) and into files by their names, not into another process's descriptor: "
                           "name a file, or give the descriptor to tally",
                           o->path, n, pid, kind);
    if (fd >= 0) close(fd);
    return rc;
}

static int out_open_dir(tally__file_out *o, const char *dir, int *fd);
static int out_split(tally__file_out *o, const char *p, char **dir, const char **base);

/* A device or FIFO at p (seen as *seen), opened as it is: never created, truncated or waited on; its
 * directory reached as an output's is (out_open_dir). */
static int out_in_place(tally__file_out *o, const char *p, const struct stat *seen) {
    char *dir = NULL;
    const char *base;
    int dfd = -1, rc = out_split(o, p, &dir, &base);
    if (!rc) rc = out_open_dir(o, dir, &dfd);
    free(dir);
    if (rc) return rc;
    int fd = openat(dfd, base, O_WRONLY | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW | O_CLOEXEC);
    int open_errno = errno;
    close(dfd);
    errno = open_errno;
    if (fd < 0) {
        int e = errno;
        if (e == ENXIO && S_ISFIFO(seen->st_mode))
            return tally__seterr(TALLY_E_INVALID,
                                 "%s: is a FIFO no one is reading; tally never waits for a reader: start the "
                                 "reader first",
                                 o->path);
        return tally__seterr(TALLY_E_SYSTEM, "%s: cannot open %s (%s) to write to it: %s%s", o->path, p,
                             tally__file_kind(seen->st_mode), strerror(e), tally__errno_hint(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0)
        rc = tally__seterr(TALLY_E_SYSTEM, "%s: cannot stat it: %s", o->path, strerror(errno));
    else if (st.st_dev != seen->st_dev || st.st_ino != seen->st_ino ||
             (st.st_mode & S_IFMT) != (seen->st_mode & S_IFMT))
        rc = tally__seterr(TALLY_E_INVALID, "%s: was replaced by %s while tally opened it; nothing was written",
                           o->path, tally__file_kind(st.st_mode));
    else
        rc = tally__file_blocking(fd, o->path);
    if (rc) {
        close(fd);
        return rc;
    }
    snprintf(o->how, sizeof o->how, "%s", tally__file_kind(st.st_mode));
    return out_stream(o, fd);
}

/* A new temporary file under o->dirfd, named .BASE.tmp.<random>: O_EXCL with a name no other writer
 * picks (the pid alone repeats across containers sharing a directory, and a clash would have removed the
 * other writer's file), so nothing there is ever opened, unlinked or followed. Mode 0666 less the umask,
 * as a new output would have; the replaced file's own mode is put back at commit. */
static int out_temp(tally__file_out *o, const char *base, int *fd) {
    size_t tl = strlen(base) + 40;
    if (!(o->tmp = malloc(tl))) return tally__seterr(TALLY_E_NOMEM, "%s: out of memory", o->path);
    for (int attempt = 0; attempt < 8; attempt++) {
        unsigned long long draw;
        if (getrandom(&draw, sizeof draw, 0) != (ssize_t)sizeof draw) draw = tally__now_ns() ^ (unsigned)getpid();
        snprintf(o->tmp, tl, ".%.200s.tmp.%016llx", base, draw); /* within NAME_MAX whatever base is */
        *fd = openat(o->dirfd, o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (*fd >= 0) return 0;
        if (errno != EEXIST) break;
    }
    int e = errno;
    const char *hint = e == ENOENT ? "; its directory takes no new files (removed meanwhile?)" : tally__errno_hint(e);
    free(o->tmp);
    o->tmp = NULL;
    return tally__seterr(TALLY_E_SYSTEM, "%s: cannot create a temporary file beside it: %s%s", o->path, strerror(e),
                         hint);
}

/* The directory dir, opened one name at a time with no link followed by name: a link met on the way (in
 * dir, or in a link's own target) must be this user's or root's, is read where it lies and its target
 * walked the same way. What is checked is what is opened, so nothing swapped in between is followed:
 * another user's link (/tmp/x -> their directory, or one reached through a link of ours) would have the
 * output made, and a file of that name replaced, where they chose. */
typedef struct out_walk {
    char *rest; /* the path being walked (dir, or a link's target and what followed the link) */
    size_t at;  /* where its next name starts */
    int fd;     /* O_PATH: the directory reached so far */
    int hops;
} out_walk;

static int walk_restart(out_walk *w, const char *target, const char *after) {
    size_t l = strlen(target) + 1 + strlen(after) + 1;
    char *r = malloc(l);
    if (!r) return -1;
    snprintf(r, l, "%s/%s", target, after);
    free(w->rest);
    w->rest = r;
    w->at = 0;
    if (target[0] == '/') {
        int root = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (root < 0) return -1;
        close(w->fd);
        w->fd = root;
    }
    return 0;
}

/* The next name of the walk: 0 and *name set, 1 at the end, or an error set. */
static int walk_next(tally__file_out *o, out_walk *w, char *name, size_t cap) {
    while (w->rest[w->at] == '/') w->at++;
    if (!w->rest[w->at]) return 1;
    size_t n = strcspn(w->rest + w->at, "/");
    if (n >= cap)
        return tally__seterr(TALLY_E_INVALID, "%s: a name on its way is longer than %zu bytes", o->path, cap - 1);
    memcpy(name, w->rest + w->at, n);
    name[n] = '\0';
    w->at += n;
    return 0;
}

/* One step from w->fd through name (a directory or a link to walk). */
static int walk_step(tally__file_out *o, out_walk *w, const char *name, const char *dir) {
    struct stat st;
    if (fstatat(w->fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return tally__seterr(TALLY_E_SYSTEM, "%s: cannot open the directory %s: %.*s: %s", o->path, dir, (int)w->at,
                             w->rest, strerror(errno));
    if (S_ISLNK(st.st_mode)) {
        uid_t me = geteuid();
        if (st.st_uid != me && st.st_uid != 0)
            return tally__seterr(TALLY_E_INVALID,
                                 "%s: the directory %.*s on its way is a symbolic link of uid %u's, not this user's "
                                 "(uid %u) nor root's; tally writes through no other user's link: name the real "
                                 "directory",
                                 o->path, (int)w->at, w->rest, (unsigned)st.st_uid, (unsigned)me);
        if (++w->hops > OUT_MAX_HOPS)
            return tally__seterr(TALLY_E_INVALID, "%s: more than %d symbolic links on the way to %s (a loop?)", o->path,
                                 OUT_MAX_HOPS, dir);
        char t[PATH_MAX];
        ssize_t k = readlinkat(w->fd, name, t, sizeof t - 1);
        if (k <= 0)
            return tally__seterr(TALLY_E_SYSTEM, "%s: cannot read the link %.*s: %s", o->path, (int)w->at, w->rest,
                                 k < 0 ? strerror(errno) : "it is empty");
        t[k] = '\0';
        char *after = strdup(w->rest + w->at);
        int bad = !after || walk_restart(w, t, after);
        free(after);
        return bad ? tally__seterr(TALLY_E_SYSTEM, "%s: cannot follow the link %s: %s", o->path, t, strerror(errno))
                   : 0;
    }
    if (!S_ISDIR(st.st_mode))
        return tally__seterr(TALLY_E_SYSTEM, "%s: cannot open the directory %s: %.*s is %s, not a directory", o->path,
                             dir, (int)w->at, w->rest, tally__file_kind(st.st_mode));
    int next = openat(w->fd, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0) /* made a link or removed since the look: not followed */
        return tally__seterr(TALLY_E_SYSTEM, "%s: cannot open the directory %s: %.*s changed while tally looked: %s",
                             o->path, dir, (int)w->at, w->rest, strerror(errno));
    close(w->fd);
    w->fd = next;
    return 0;
}

/* *fd: dir opened for reading (fsync and *at calls), reached as out_walk says. */
static int out_open_dir(tally__file_out *o, const char *dir, int *fd) {
    out_walk w = {.rest = strdup(dir), .fd = open(dir[0] == '/' ? "/" : ".", O_PATH | O_DIRECTORY | O_CLOEXEC)};
    int rc = !w.rest || w.fd < 0 ? tally__seterr(TALLY_E_SYSTEM, "%s: cannot start at %s: %s", o->path,
                                                 dir[0] == '/' ? "/" : "the current directory", strerror(errno))
                                 : 0;
    char name[NAME_MAX + 1];
    while (!rc && !(rc = walk_next(o, &w, name, sizeof name))) rc = walk_step(o, &w, name, dir);
    if (rc == 1) rc = 0;
    *fd = rc ? -1 : openat(w.fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (!rc && *fd < 0)
        rc = tally__seterr(TALLY_E_SYSTEM, "%s: cannot open the directory %s: %s%s", o->path, dir, strerror(errno),
                           tally__errno_hint(errno));
    if (w.fd >= 0) close(w.fd);
    free(w.rest);
    return rc;
}

/* p split at its last slash: *dir (".", "/" or the part before) and *base (NULL: p names a directory). */
static int out_split(tally__file_out *o, const char *p, char **dir, const char **base) {
    const char *slash = strrchr(p, '/');
    *base = slash ? slash + 1 : p;
    if (!**base || !strcmp(*base, ".") || !strcmp(*base, ".."))
        return tally__seterr(TALLY_E_INVALID, "%s: names a directory; name a file in it", o->path);
    size_t dl = slash ? (size_t)(slash - p) : 0;
    *dir = slash ? strndup(p, dl ? dl : 1) : strdup(".");
    return *dir ? 0 : tally__seterr(TALLY_E_NOMEM, "%s: out of memory", o->path);
}

/* p (a new name, or a regular file seen as *seen) replaced whole: a temporary file in p's directory. */
static int out_replace(tally__file_out *o, const char *p) {
    char *dir = NULL;
    const char *base;
    int rc = out_split(o, p, &dir, &base);
    if (!rc && !(o->name = strdup(base))) rc = tally__seterr(TALLY_E_NOMEM, "%s: out of memory", o->path);
    if (!rc) rc = out_open_dir(o, dir, &o->dirfd);
    struct statfs fs;
    if (!rc && fstatfs(o->dirfd, &fs) == 0 && (fs.f_type == PROC_SUPER_MAGIC || fs.f_type == SYSFS_MAGIC))
        rc = tally__seterr(TALLY_E_INVALID,
                           "%s: its directory %s is %s, a kernel file system that takes no new files; tally "
                           "writes an output as a new file: name one elsewhere",
                           o->path, dir, fs.f_type == PROC_SUPER_MAGIC ? "procfs (/proc)" : "sysfs (/sys)");
    free(dir);
    int fd = -1;
    if (!rc) rc = out_temp(o, base, &fd);
    if (!rc && (rc = out_stream(o, fd))) unlinkat(o->dirfd, o->tmp, 0);
    if (rc && o->tmp) {
        free(o->tmp); /* nothing of ours to remove any more */
        o->tmp = NULL;
    }
    return rc;
}

/* Where the link at p points, as a path from here (a relative target is relative to p's directory). */
static char *link_target(const char *p) {
    char t[PATH_MAX];
    ssize_t n = readlink(p, t, sizeof t - 1);
    if (n < 0) return NULL;
    t[n] = '\0';
    const char *slash = strrchr(p, '/');
    if (t[0] == '/' || !slash) return strdup(t);
    size_t dl = (size_t)(slash - p) + 1, l = dl + (size_t)n + 1;
    char *r = malloc(l);
    if (r) snprintf(r, l, "%.*s%s", (int)dl, p, t);
    return r;
}

static int out_route(tally__file_out *o) {
    uid_t me = geteuid();
    char *cur = strdup(o->path), *next = NULL;
    int rc = 1; /* 1: follow cur on */
    long self = proc_self();
    for (int hops = 0; rc == 1 && cur; hops++) {
        long pid = self;
        int n = fd_path(cur);
        if (n < 0) n = proc_fd_path(cur, &pid);
        struct stat st;
        if (n >= 0 && pid == self) {
            rc = out_descriptor(o, n);
        } else if (n >= 0 && (rc = out_foreign_fd(o, cur, pid, n)) != 1) {
            /* refused: another process's pipe, socket, deleted file... (1: a link to a path, as below) */
        } else if (lstat(cur, &st) != 0) {
            int e = errno;
            if (e == ENOENT && hops == 0)
                rc = out_replace(o, cur); /* a new name (a missing directory is named by the open of it) */
            else if (e == ENOENT)
                rc = tally__seterr(TALLY_E_INVALID,
                                   "%s: is a symbolic link to %s, which does not exist; tally creates nothing "
                                   "through a link: name %s itself, or remove the link",
                                   o->path, cur, cur);
            else
                rc = tally__seterr(TALLY_E_SYSTEM, "%s: cannot look at %s: %s%s", o->path, cur, strerror(e),
                                   e == ENOTDIR ? "; a part of the path is not a directory" : tally__errno_hint(e));
        } else if (S_ISLNK(st.st_mode)) {
            if (!(next = link_target(cur)))
                rc = tally__seterr(TALLY_E_SYSTEM, "%s: cannot read the link %s: %s", o->path, cur, strerror(errno));
            else if (st.st_uid != me && st.st_uid != 0)
                rc = tally__seterr(TALLY_E_INVALID,
                                   "%s: the symbolic link %s -> %s belongs to uid %u, not to this user (uid %u) nor "
                                   "root; tally follows no other user's link: remove it or name another file",
                                   o->path, cur, next, (unsigned)st.st_uid, (unsigned)me);
            else if (hops == OUT_MAX_HOPS)
                rc = tally__seterr(TALLY_E_INVALID, "%s: more than %d symbolic links in a row (a loop?) at %s", o->path,
                                   OUT_MAX_HOPS, cur);
            else {
                free(cur);
                cur = next;
                next = NULL;
            }
        } else if (S_ISREG(st.st_mode)) {
            if (hops && st.st_uid != me)
                rc = tally__seterr(TALLY_E_INVALID,
                                   "%s: is a symbolic link to %s, a file of uid %u's, not this user's (uid %u); "
                                   "tally replaces no other user's file through a link: name another file",
                                   o->path, cur, (unsigned)st.st_uid, (unsigned)me);
            else
                rc = out_replace(o, cur);
        } else if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) {
            rc = out_in_place(o, cur, &st);
        } else {
            rc = tally__seterr(TALLY_E_INVALID,
                               "%s: %s%s%s %s; tally writes an output to a regular file (or a new name), a "
                               "character device, a FIFO or a descriptor (/dev/fd/N)",
                               o->path, hops ? "is a symbolic link to " : "", hops ? cur : "",
                               hops ? ", which is" : "is", tally__file_kind(st.st_mode));
        }
    }
    if (rc == 1) rc = tally__seterr(TALLY_E_NOMEM, "%s: out of memory", o->path);
    free(cur);
    free(next);
    return rc;
}

/* ---- open, commit, abort ---- */

static void out_release(tally__file_out *o) {
    if (o->dirfd >= 0) close(o->dirfd);
    free(o->path);
    free(o->name);
    free(o->tmp);
    free(o->sink);
    memset(o, 0, sizeof *o);
    o->dirfd = o->fd = -1;
}

int tally__file_out_open(tally__file_out *o, const char *path) {
    memset(o, 0, sizeof *o);
    o->dirfd = o->fd = -1;
    if (!*path) return tally__seterr(TALLY_E_INVALID, "an output's file name is empty");
    if (!(o->path = strdup(path))) return tally__seterr(TALLY_E_NOMEM, "%s: out of memory", path);
    int rc = out_route(o);
    if (rc) out_release(o);
    return rc;
}

static const char *in_place_hint(int e) {
    switch (e) {
    case ENOSPC: return "; the device takes no more";
    case EPIPE: return "; its reader has gone";
    default: return tally__errno_hint(e);
    }
}

/* The replaced file's permissions put on the temporary file through its descriptor, never by a name
 * (a name in a directory others write could have been swapped for a link to anyone's file); set-id bits
 * are not carried over. */
static int out_keep_mode(tally__file_out *o) {
    struct stat st;
    if (fstatat(o->dirfd, o->name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) return 0;
    return fchmod(o->fd, st.st_mode & 0777) ? errno : 0;
}

/* After the data is safe: the temporary file goes over the name, if both are still what they were. 0,
 * an errno (*renamed 0: the temporary file is ours to remove), or an error set. */
static int out_rename(tally__file_out *o, const struct stat *mine, int *renamed, int *rc) {
    struct stat st; /* a link or anything but a regular file put there meanwhile is not replaced either */
    if (fstatat(o->dirfd, o->name, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode)) {
        *rc = tally__seterr(TALLY_E_INVALID,
                            "cannot write %s: %s took its place while tally wrote it; it is left as it is", o->path,
                            tally__file_kind(st.st_mode));
        return 0;
    }
    if (fstatat(o->dirfd, o->tmp, &st, AT_SYMLINK_NOFOLLOW) != 0 || st.st_dev != mine->st_dev ||
        st.st_ino != mine->st_ino) {
        *renamed = 1; /* not ours any more: nothing there is removed */
        *rc = tally__seterr(TALLY_E_INVALID,
                            "cannot write %s: its temporary file %s was moved or replaced while tally wrote it; %s is "
                            "left as it was",
                            o->path, o->tmp, o->name);
        return 0;
    }
    if (renameat(o->dirfd, o->tmp, o->dirfd, o->name) != 0) return errno;
    *renamed = 1;
    if (fsync(o->dirfd) != 0 && errno != EINVAL) /* the new name itself survives a crash */
        *rc = tally__seterr(TALLY_E_SYSTEM,
                            "%s: written, but its directory could not be synced (fsync: %s): a crash "
                            "now may lose the new name",
                            o->path, strerror(errno));
    return 0;
}

int tally__file_out_commit(tally__file_out *o) {
    int e = 0, rc = 0, renamed = 0;
    struct stat mine;
    if (fflush(o->f) != 0 || ferror(o->f)) e = o->sink->err ? o->sink->err : EIO;
    if (!e && o->tmp && fstat(o->fd, &mine) != 0) e = errno;
    if (!e && o->tmp) e = out_keep_mode(o);
    if (!e && o->tmp && fsync(o->fd) != 0) e = errno;
    if (fclose(o->f) != 0 && !e) e = o->sink->err ? o->sink->err : EIO;
    o->f = NULL;
    o->fd = -1;
    if (!e && o->tmp) e = out_rename(o, &mine, &renamed, &rc);
    if (e && o->tmp)
        rc = tally__seterr(TALLY_E_SYSTEM, "cannot write %s: %s%s", o->path, strerror(e), tally__errno_hint(e));
    else if (e)
        rc = tally__seterr(TALLY_E_SYSTEM, "cannot write %s (%s, written in place): %s%s", o->path, o->how, strerror(e),
                           in_place_hint(e));
    if (rc && o->tmp && !renamed) unlinkat(o->dirfd, o->tmp, 0);
    out_release(o);
    return rc;
}

void tally__file_out_abort(tally__file_out *o) {
    if (!o->path) return; /* never opened, or released */
    if (o->f) fclose(o->f);
    if (o->tmp) unlinkat(o->dirfd, o->tmp, 0);
    out_release(o);
}
