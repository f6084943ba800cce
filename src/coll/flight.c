/* flight.c - the flight recorder's writing side: a ring of each communicator's last collectives, filled
 * as they begin and end, written as text to TALLY_FLIGHT_DIR on a peer's failure or a fatal signal. */
#include "flight.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <tally.h>

#include "coll.h"
#include "../core/file.h"
#include "config.h"

/* ---- the fatal-signal dump -------------------------------------------------------------------- */

#define FL_SLOTS 64
static tally__flight *_Atomic fl_registry[FL_SLOTS];
static const int fl_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
static pthread_once_t fl_once = PTHREAD_ONCE_INIT;

typedef struct fl_buf {
    int fd, bad;
    size_t n;
    char b[4096];
} fl_buf;
static fl_buf fl_sig_buf; /* the signal handler's: a signal stack may be small */
static int fl_write(tally__flight *f, const char *reason, int culprit, const char *msg, fl_buf *w);

static void fl_on_signal(int sig) {
    char reason[32] = "signal-";
    int n = 7, d = sig >= 10 ? 2 : 1;
    for (int k = d - 1, v = sig; k >= 0; k--, v /= 10) reason[n + k] = (char)('0' + v % 10);
    reason[n + d] = '\0';
    for (int i = 0; i < FL_SLOTS; i++) {
        tally__flight *f = atomic_load(&fl_registry[i]);
        if (f && !atomic_exchange(&f->dumped, 1)) fl_write(f, reason, -1, "a fatal signal", &fl_sig_buf);
    }
    raise(sig); /* blocked until we return; then the default action (SA_RESETHAND restored it) */
}

/* Only where nobody else handles the signal: a program's own handler (or a sanitizer's) stays. */
static void fl_install(void) {
    for (size_t i = 0; i < sizeof fl_signals / sizeof *fl_signals; i++) {
        struct sigaction old, sa;
        if (sigaction(fl_signals[i], NULL, &old) || old.sa_handler != SIG_DFL || (old.sa_flags & SA_SIGINFO)) continue;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = fl_on_signal;
        sa.sa_flags = SA_RESETHAND;
        sigemptyset(&sa.sa_mask);
        sigaction(fl_signals[i], &sa, NULL);
    }
}

static void fl_register(tally__flight *f) {
    pthread_once(&fl_once, fl_install);
    for (int i = 0; i < FL_SLOTS; i++) {
        tally__flight *none = NULL;
        if (atomic_compare_exchange_strong(&fl_registry[i], &none, f)) return;
    }
}

static void fl_unregister(tally__flight *f) {
    for (int i = 0; i < FL_SLOTS; i++) {
        tally__flight *me = f;
        if (atomic_compare_exchange_strong(&fl_registry[i], &me, NULL)) return;
    }
}

/* ---- set-up ----------------------------------------------------------------------------------- */

/* Where and as what f writes: a world, the config's directory (TALLY_FLIGHT_DIR), else $TMPDIR or
 * /tmp, tally-flight-<host>-<pid of rank 0>, and the job "<host of rank 0>-<its pid>-<its draw>"; a
 * split, its parent's directory and job (each communicator carries its own: two worlds of one process
 * keep theirs). */
static void fl_pick_dir(tally__flight *f, const tally__flight *parent, const char *job_host, int job_pid,
                        uint32_t job_draw, const char *d) {
    const char *host = job_host && job_host[0] ? job_host : "host";
    f->user_dir = parent ? parent->user_dir : d[0] != 0;
    if (parent)
        snprintf(f->dir, sizeof f->dir, "%s", parent->dir);
    else if (d[0])
        snprintf(f->dir, sizeof f->dir, "%s", d);
    else
        snprintf(f->dir, sizeof f->dir, "%.380s/tally-flight-%.64s-%d", tally__tmpdir(), host, job_pid);
    if (parent)
        snprintf(f->job, sizeof f->job, "%s", parent->job);
    else
        snprintf(f->job, sizeof f->job, "%.64s-%d-%08x", host, job_pid, (unsigned)job_draw);
    /* "a/b//" is a/b; "/" stays itself (its last component is then "." below) */
    size_t n = strlen(f->dir);
    while (n > 1 && f->dir[n - 1] == '/') f->dir[--n] = '\0';
    const char *slash = strrchr(f->dir, '/');
    f->base = slash ? (size_t)(slash - f->dir) + 1 : 0;
}

/* FNV-1a of s: a label too long to hold is named by its parent's, which is unique already. */
static uint64_t fl_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* "world"; a split of the world "comm<K>-<world rank of its rank 0>", of a split "<its label>.<K>-<...>",
 * K being the parent's collectives so far: every rank of the parent has made as many (a split is
 * collective over it, with collectives of its own, so no two splits share a K), whichever of its
 * communicators each rank made or stayed out of, and the siblings of one split differ by their rank 0.
 * A chain longer than a label holds becomes "h<hash of the parent's label>.<K>-<...>" (at most 46
 * characters for a world rank below 10^7; "h<hash>" of that past it): never cut, since two chains cut
 * alike would share a label and a file, and no unhashed label starts with "h". */
static void fl_label(tally__flight *f, const tally__flight *parent, uint64_t parent_seq, int first_world) {
    char own[40], chain[96];
    snprintf(own, sizeof own, "%llu-%d", (unsigned long long)parent_seq, first_world);
    if (!parent)
        snprintf(chain, sizeof chain, "world");
    else if (!strcmp(parent->label, "world"))
        snprintf(chain, sizeof chain, "comm%s", own);
    else
        snprintf(chain, sizeof chain, "%s.%s", parent->label, own);
    if (strlen(chain) >= sizeof f->label)
        snprintf(chain, sizeof chain, "h%016llx.%s", (unsigned long long)fl_hash(parent->label), own);
    if (strlen(chain) >= sizeof f->label) snprintf(chain, sizeof chain, "h%016llx", (unsigned long long)fl_hash(chain));
    memcpy(f->label, chain, strlen(chain) + 1);
}

void tally__flight_init(tally__flight *f, int rank, int size, int world_rank, int first_world,
                        const tally__flight *parent, uint64_t parent_seq, const char *job_host, int job_pid,
                        uint32_t job_draw, int depth, const char *dir) {
    memset(f, 0, sizeof *f);
    atomic_init(&f->awaited, -1);
    f->rank = rank;
    f->size = size;
    f->world_rank = world_rank;
    f->transport = "none";
    fl_pick_dir(f, parent, job_host, job_pid, job_draw, dir);
    fl_label(f, parent, parent_seq, first_world);
    if (gethostname(f->host, sizeof f->host - 1)) snprintf(f->host, sizeof f->host, "unknown");
    f->name = (size_t)snprintf(f->path, sizeof f->path, "%s/", f->dir);
    tally__flight_file_name(f->path + f->name, sizeof f->path - f->name, world_rank, f->label, f->job);
    if (depth <= 0 || !(f->ring = calloc((size_t)depth, sizeof *f->ring))) return;
    f->cap = (size_t)depth;
    f->on = 1;
    fl_register(f);
}

void tally__flight_file_name(char *out, size_t n, int world_rank, const char *label, const char *job) {
    snprintf(out, n, "rank%d.%s.%s.flight", world_rank, label, job);
    for (char *c = out; *c; c++)
        if (!isalnum((unsigned char)*c) && !strchr("._-", *c)) *c = '_';
}

void tally__flight_set_transport(tally__flight *f, const char *name) { f->transport = name; }

void tally__flight_fini(tally__flight *f) {
    if (!f->on) return;
    fl_unregister(f);
    free(f->ring);
    f->ring = NULL;
    f->on = 0;
}

/* ---- recording -------------------------------------------------------------------------------- */

/* The coarse clock (a tick of 1-4 ms) costs a few ns where the fine one costs 20-30: this runs twice a
 * collective, and a record explains waits of seconds. */
static uint64_t fl_wall_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME_COARSE, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

void tally__flight_begin(tally__flight *f, const tally__sig *sig) {
    if (!f->on) return;
    tally__flight_entry *e = &f->ring[f->n % f->cap];
    *e = (tally__flight_entry){.sig = *sig, .begin_ns = fl_wall_ns(), .peer = -1, .culprit = -1};
    f->n++;
    f->open = 1;
    atomic_store_explicit(&f->awaited, -1, memory_order_relaxed);
}

void tally__flight_end(tally__flight *f, int rc, int culprit) {
    if (!f->on || !f->open) return;
    tally__flight_entry *e = &f->ring[(f->n - 1) % f->cap];
    e->end_ns = fl_wall_ns();
    e->state = rc ? TALLY__FL_FAILED : TALLY__FL_DONE;
    e->rc = rc;
    e->peer = atomic_load_explicit(&f->awaited, memory_order_relaxed);
    e->culprit = rc ? culprit : -1;
    f->open = 0;
}

int tally__flight_wants(int rc) {
    return rc == TALLY_E_TIMEOUT || rc == TALLY_E_PEER_LOST || rc == TALLY_E_MISMATCH || rc == TALLY_E_ABORTED;
}

const char *tally__flight_reason(int rc) {
    switch (rc) {
    case TALLY_E_TIMEOUT: return "TIMEOUT";
    case TALLY_E_PEER_LOST: return "PEER_LOST";
    case TALLY_E_MISMATCH: return "MISMATCH";
    case TALLY_E_ABORTED: return "ABORTED";
    default: return "error";
    }
}

const char *tally__flight_state_name(int state) {
    return state == TALLY__FL_DONE ? "done" : state == TALLY__FL_FAILED ? "failed" : "running";
}

/* ---- writing (no stdio or allocation: it also runs in a signal handler) ----------------------- */

static void fl_flush(fl_buf *w) {
    size_t off = 0;
    while (off < w->n && !w->bad) {
        ssize_t k = write(w->fd, w->b + off, w->n - off);
        if (k > 0)
            off += (size_t)k;
        else if (k < 0 && errno != EINTR)
            w->bad = 1;
    }
    w->n = 0;
}

/* Appends s; text (a message) has its line breaks turned to spaces, so it stays one line, and is cut
 * after `text` bytes, so the line keeps within TALLY__FLIGHT_LINE. */
static void fl_put(fl_buf *w, const char *s, size_t text) {
    for (size_t k = 0; s && *s && (!text || k < text); s++, k++) {
        if (w->n == sizeof w->b) fl_flush(w);
        w->b[w->n++] = text && (*s == '\n' || *s == '\r') ? ' ' : *s;
    }
}
static void fl_s(fl_buf *w, const char *s) { fl_put(w, s, 0); }

static void fl_u(fl_buf *w, uint64_t v) {
    char d[24];
    int k = 0;
    do d[k++] = (char)('0' + v % 10);
    while ((v /= 10) && k < 23);
    char out[24];
    for (int i = 0; i < k; i++) out[i] = d[k - 1 - i];
    out[k] = '\0';
    fl_s(w, out);
}

static void fl_i(fl_buf *w, int64_t v) {
    if (v < 0) fl_s(w, "-");
    fl_u(w, v < 0 ? (uint64_t)(-(v + 1)) + 1 : (uint64_t)v);
}

static void fl_kv_s(fl_buf *w, const char *k, const char *v) {
    fl_s(w, k);
    fl_s(w, " ");
    fl_s(w, v);
    fl_s(w, "\n");
}

static void fl_kv_i(fl_buf *w, const char *k, int64_t v) {
    fl_s(w, k);
    fl_s(w, " ");
    fl_i(w, v);
    fl_s(w, "\n");
}

/* One line per entry: e seq coll count dtype op root algo state rc peer culprit begin_ns end_ns. */
static void fl_entry(fl_buf *w, const tally__flight_entry *e) {
    fl_s(w, "e ");
    fl_u(w, e->sig.seq);
    fl_s(w, " ");
    fl_s(w, tally__coll_name(e->sig.coll));
    fl_s(w, " ");
    fl_u(w, e->sig.count);
    fl_s(w, " ");
    fl_s(w, tally_dtype_name((tally_dtype)e->sig.dtype));
    fl_s(w, " ");
    fl_s(w, tally_op_name((tally_op)e->sig.op));
    fl_s(w, " ");
    fl_i(w, e->sig.root);
    fl_s(w, " ");
    fl_s(w, tally__algo_name(e->sig.algo));
    fl_s(w, " ");
    fl_s(w, tally__flight_state_name(e->state));
    int64_t rest[] = {e->rc, e->peer, e->culprit};
    for (int i = 0; i < 3; i++) {
        fl_s(w, " ");
        fl_i(w, rest[i]);
    }
    fl_s(w, " ");
    fl_u(w, e->begin_ns);
    fl_s(w, " ");
    fl_u(w, e->end_ns);
    fl_s(w, "\n");
}

static void fl_header(fl_buf *w, const tally__flight *f, const char *reason, int culprit, const char *msg) {
    fl_s(w, "tally-flight ");
    fl_u(w, TALLY__FLIGHT_FORMAT);
    fl_s(w, "\n");
    fl_kv_s(w, "job", f->job);
    fl_kv_s(w, "label", f->label);
    fl_kv_i(w, "rank", f->rank);
    fl_kv_i(w, "world_rank", f->world_rank);
    fl_kv_i(w, "size", f->size);
    fl_kv_s(w, "host", f->host);
    fl_kv_i(w, "pid", getpid());
    fl_kv_s(w, "transport", f->transport);
    fl_kv_s(w, "reason", reason);
    fl_kv_i(w, "culprit", culprit);
    fl_kv_i(w, "dumped_ns", (int64_t)fl_wall_ns());
    fl_s(w, "message ");
    fl_put(w, msg && msg[0] ? msg : "-", TALLY__FLIGHT_LINE - sizeof "message \n");
    fl_s(w, "\n");
}

/* Creates each missing directory above the last component of the path (0700: records name hosts and
 * pids); that one is made or checked by fl_open_dir. */
static void fl_mkdirs(const char *dir, size_t upto) {
    char p[TALLY__FLIGHT_PATH];
    if (upto >= sizeof p) return;
    memcpy(p, dir, upto);
    p[upto] = '\0';
    for (size_t i = 1; i < upto; i++)
        if (p[i] == '/') {
            p[i] = '\0';
            mkdir(p, 0700);
            p[i] = '/';
        }
}

static int fl_refuse(tally__flight *f, int why, const struct stat *st) {
    f->why = why;
    f->why_uid = (unsigned)st->st_uid;
    f->why_mode = (unsigned)(st->st_mode & 07777);
    errno = EPERM;
    return -1;
}

/* The directory to write in, opened, or -1 (f->why says why). Its last component is made 0700 when
 * missing; what is there is taken only when it is a directory of this user's (the default one: mode
 * 0700 or less, as tally makes it; TALLY_FLIGHT_DIR: not writable by group or others unless sticky), or,
 * for TALLY_FLIGHT_DIR, a sticky one of root's (such as /tmp), or a link to either that this user or root
 * made. Another user who made the default name first (it is predictable:
 * host and pid) could otherwise read, forge or, as a link, redirect the records. The checks are of what
 * was opened (fstat), and the files are then made relative to it, so a rename meanwhile redirects
 * nothing. Only system calls a signal handler may make. */
static int fl_open_dir(tally__flight *f) {
    char parent[TALLY__FLIGHT_PATH];
    const char *base = f->dir[f->base] ? f->dir + f->base : ".";
    if (f->base == 0)
        memcpy(parent, ".", 2);
    else if (f->base == 1)
        memcpy(parent, "/", 2);
    else {
        memcpy(parent, f->dir, f->base - 1);
        parent[f->base - 1] = '\0';
        fl_mkdirs(parent, f->base - 1);
        mkdir(parent, 0700);
    }
    f->why = TALLY__FL_WHY_ERRNO;
    int pfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (pfd < 0) return -1;
    if (mkdirat(pfd, base, 0700) != 0 && errno != EEXIST) {
        int e = errno;
        close(pfd);
        errno = e;
        return -1;
    }
    uid_t me = geteuid();
    struct stat st;
    int follow = 0;
    if (fstatat(pfd, base, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) {
        if (!f->user_dir || (st.st_uid != me && st.st_uid != 0)) {
            close(pfd);
            return fl_refuse(f, TALLY__FL_WHY_LINK, &st);
        }
        follow = 1; /* the user's own link to where they keep records */
    }
    int fd = openat(pfd, base, O_RDONLY | O_DIRECTORY | O_CLOEXEC | (follow ? 0 : O_NOFOLLOW));
    int e = errno;
    close(pfd);
    if (fd < 0) {
        errno = e == ELOOP ? EPERM : e; /* a link put there since */
        if (e == ELOOP) f->why = TALLY__FL_WHY_LINK, f->why_uid = (unsigned)-1;
        return -1;
    }
    if (fstat(fd, &st) != 0) {
        e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    /* A chosen directory: this user's, closed to writers other than them unless sticky; or root's and
     * sticky (/tmp). Another user's sticky directory is not enough: its owner may still remove or replace
     * the records, and the reader takes the owner's files for the job's. */
    int why = TALLY__FL_WHY_NONE, sticky = (st.st_mode & S_ISVTX) != 0;
    if (!f->user_dir && st.st_uid != me)
        why = TALLY__FL_WHY_OWNER;
    else if (!f->user_dir && (st.st_mode & 077))
        why = TALLY__FL_WHY_MODE;
    else if (f->user_dir && st.st_uid != me && !(st.st_uid == 0 && sticky))
        why = TALLY__FL_WHY_OWNER;
    else if (f->user_dir && st.st_uid == me && (st.st_mode & 022) && !sticky)
        why = TALLY__FL_WHY_MODE;
    if (why) {
        close(fd);
        return fl_refuse(f, why, &st);
    }
    f->why = TALLY__FL_WHY_NONE;
    return fd;
}

static int fl_write(tally__flight *f, const char *reason, int culprit, const char *msg, fl_buf *w) {
    const char *name = f->path + f->name;
    char tmp[sizeof f->path + 8];
    size_t n = strlen(name);
    memcpy(tmp, name, n);
    memcpy(tmp + n, ".tmp", 5);
    int dfd = fl_open_dir(f);
    if (dfd < 0) return -1;
    f->why = TALLY__FL_WHY_ERRNO;
    unlinkat(dfd, tmp, 0); /* a leftover of an interrupted dump of ours (a link there: the link goes) */
    int fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600); /* hosts, pids */
    if (fd < 0) {
        int e = errno;
        close(dfd);
        errno = e;
        return -1;
    }
    w->fd = fd;
    w->bad = 0;
    w->n = 0;
    fl_header(w, f, reason, culprit, msg);
    uint64_t first = f->n > f->cap ? f->n - f->cap : 0;
    fl_kv_i(w, "entries", (int64_t)(f->n - first));
    for (uint64_t i = first; i < f->n; i++) fl_entry(w, &f->ring[i % f->cap]);
    fl_flush(w);
    int bad = w->bad;
    if (close(fd) != 0) bad = 1; /* closed whatever the writes did: a full disk must not leak it */
    /* a link at the record's name is replaced, never followed */
    if (!bad && renameat(dfd, tmp, dfd, name)) bad = 1;
    int e = errno;
    if (bad) unlinkat(dfd, tmp, 0);
    close(dfd);
    errno = e;
    if (!bad) f->why = TALLY__FL_WHY_NONE;
    return bad ? -1 : 0;
}

int tally__flight_dump(tally__flight *f, const char *reason, int culprit, const char *msg) {
    if (!f->on || atomic_exchange(&f->dumped, 1)) return 0;
    fl_buf w;
    int rc = fl_write(f, reason, culprit, msg, &w);
    atomic_store(&f->written, rc ? 1 + (errno ? errno : EIO) : 1);
    return rc;
}

void tally__flight_why(const tally__flight *f, char *out, size_t n) {
    int err = atomic_load(&f->written) - 1;
    unsigned me = (unsigned)geteuid();
    const char *redo = f->user_dir ? "remove it, or choose another TALLY_FLIGHT_DIR"
                                   : "remove it (after a look at what is in it), or set TALLY_FLIGHT_DIR to a "
                                     "directory of yours";
    switch (f->why) {
    case TALLY__FL_WHY_LINK:
        if (f->why_uid == (unsigned)-1)
            snprintf(out, n, "%s became a symbolic link as it was opened, and tally follows none there; %s", f->dir,
                     redo);
        else
            snprintf(out, n,
                     "%s is a symbolic link made by uid %u, not this user (uid %u), and tally follows no link "
                     "there%s; %s",
                     f->dir, f->why_uid, me,
                     f->user_dir ? " but one of yours or root's"
                                 : ": another user may have put it there first to "
                                   "redirect the records",
                     redo);
        break;
    case TALLY__FL_WHY_OWNER:
        if (f->user_dir)
            snprintf(out, n,
                     "%s belongs to uid %u, not this user (uid %u)%s: tally writes its records only to a "
                     "directory of yours or a sticky one of root's (such as /tmp), where no other user can "
                     "replace them; choose another TALLY_FLIGHT_DIR",
                     f->dir, f->why_uid, me, f->why_mode & S_ISVTX ? " nor root, though sticky" : " and is not sticky");
        else
            snprintf(out, n,
                     "%s belongs to uid %u, not this user (uid %u): another user may have made it first to read, "
                     "forge or redirect the records; %s",
                     f->dir, f->why_uid, me, redo);
        break;
    case TALLY__FL_WHY_MODE:
        if (f->user_dir) {
            snprintf(out, n,
                     "%s has mode %04o: group or others may write in it and it is not sticky, so they could "
                     "remove or replace the records; make it chmod go-w (or +t), or choose another "
                     "TALLY_FLIGHT_DIR",
                     f->dir, f->why_mode);
            break;
        }
        snprintf(out, n,
                 "%s has mode %04o: group or others may use it, and tally makes it 0700, so it is not one tally "
                 "made; %s",
                 f->dir, f->why_mode, redo);
        break;
    default:
        snprintf(out, n, "cannot write to %s: %s%s", f->dir, strerror(err > 0 ? err : EIO),
                 tally__errno_hint(err > 0 ? err : EIO));
    }
}
