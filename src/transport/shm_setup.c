/* shm_setup.c - creating the shared-memory transport: rank 0 makes the segment under a random name,
 * every rank maps it, rank 0 unlinks it at once; then the single-copy probe, pidfds and teardown. */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "../boot/boot.h"
#include "../boot/fdlimit.h"
#include "../core/clock.h"
#include "../core/log.h"
#include "shm.h"

/* Knobs (read once per communicator):
 *   TALLY_SHM_CMA=0      never read a peer's memory directly: every message goes through the slots
 *                        (any rank saying 0 turns it off for all, so senders and receivers agree)
 *   TALLY_SHM_LARGE=256K messages at least this long go single-copy (process_vm_readv); "off" never.
 *                        Messages from tally_mem_alloc buffers are read in place (pidfd_getfd + mmap)
 *                        from max(this, SHM_MEM_MIN) whatever the calibration says; "off" stops that too.
 *                        Unset: rank 0 times the kernel's copy against a plain memcpy at setup and
 *                        uses single-copy from SHM_LARGE_DEFAULT only where it is not slower. (On a
 *                        2-core VM it ran at a third of memcpy's speed: 2-3 GB/s per direction for a
 *                        32 MiB exchange against 7-8 GB/s through the slot ring, which stays in cache.) */
#define SHM_LARGE_DEFAULT (256 << 10)
#define SHM_LARGE_OFF     ((size_t)-1)

#define SHM_MAGIC   0x32766d68736c6c74ull /* "tllshmv2": v2 added the wait records */
#define SHM_WHY_MAX 768 /* what failed, as a fault message is long: room for the descriptor limit's words */

/* What each rank tells the others after mapping the segment. */
typedef struct shm_info {
    int32_t pid, mapped, cma_wanted, cma_ok;
    uint64_t pidns, probe_addr, probe;
    int32_t cma_pays;          /* rank 0's verdict: the kernel's copy keeps up with memcpy here */
    float cma_gbps, copy_gbps; /* rank 0's calibration figures (0: not run) */
    int32_t mem_fd;            /* a memfd holding `probe`, for the peers' pidfd_getfd probe; -1 none */
    int32_t mem_ok;            /* we could fetch and read the next rank's probe memfd */
    int32_t fd_err;            /* EMFILE or ENFILE: this rank ran out of descriptors (its message names the limit) */
} shm_info;

/* What rank 0 broadcasts: where the segment is, or that there is none (and then rank 0's errno). */
typedef struct shm_where {
    char name[64];
    uint64_t bytes;
    int32_t err, pad;
} shm_where;

static const tally__tp_ops shm_ops = {
    "shm", tally__shm_exchange, tally__shm_destroy, tally__shm_mem_alloc, tally__shm_mem_free, tally__shm_mem_keep};

static size_t shm_round(size_t v, size_t to) { return (v + to - 1) / to * to; }

/* What a failed call said, naming the descriptor limit when that is what it hit. */
static void shm_why(char *why, size_t n, const char *what, int err) {
    char fd[600];
    if (tally__fd_exhausted(err)) tally__fd_explain(err, fd, sizeof fd);
    snprintf(why, n, "%s: %s", what, tally__fd_exhausted(err) ? fd : strerror(err));
}

/* A peer's failure in words: out of descriptors, or the step that failed. */
static void shm_peer_why(char *why, size_t n, int r, int fd_err, const char *step) {
    if (fd_err == ENFILE)
        snprintf(why, n,
                 "rank %d found the system's table of open files full (ENFILE) %s: raise fs.file-max, or "
                 "stop programs that hold many files",
                 r, step);
    else if (fd_err == EMFILE)
        snprintf(why, n,
                 "rank %d ran out of file descriptors (EMFILE) %s: its RLIMIT_NOFILE is too low for a world "
                 "of this size; raise it where the ranks start (ulimit -n, or the hard limit), by as much as its "
                 "own message says",
                 r, step);
    else
        snprintf(why, n, "rank %d could not %s", r, step);
}

static size_t shm_layout_bytes(int n, size_t slot_bytes, shm_seg_hdr *h) {
    h->magic = SHM_MAGIC;
    h->nranks = (uint32_t)n;
    h->nslots = SHM_NSLOTS;
    h->slot_bytes = slot_bytes;
    h->chan_stride = 4096 + SHM_NSLOTS * slot_bytes; /* control line and headers fill the first page */
    h->chans_off = shm_round(SHM_LINE + 2 * (size_t)n * SHM_LINE + (size_t)n * sizeof(shm_fault_rec) +
                                 (size_t)n * sizeof(shm_wait_rec) + (size_t)n * SHM_LINE,
                             4096);
    h->bytes = h->chans_off + (size_t)n * (size_t)(n - 1) * h->chan_stride;
    return h->bytes;
}

static void shm_random_name(char *out, size_t n) {
    unsigned char r[8];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
        /* getrandom cannot fail for 8 bytes after boot; mix time and address anyway as a last resort */
        uint64_t v = (uint64_t)tally__now_ns() ^ (uint64_t)(uintptr_t)out;
        memcpy(r, &v, sizeof r);
    }
    snprintf(out, n, "/tally-%d-%02x%02x%02x%02x%02x%02x%02x%02x", (int)getpid(), r[0], r[1], r[2], r[3], r[4], r[5],
             r[6], r[7]);
}

/* Sizes the file, shrinking the slots when /dev/shm is too small; allocating every page now turns
 * a full /dev/shm into an error here instead of a SIGBUS in the middle of a collective. */
static int shm_size_file(int fd, int n, shm_seg_hdr *h, char *why, size_t whylen) {
    /* Bigger slots pipeline better (64 KiB: ~8 GB/s per direction against ~7 with 32 KiB on the
     * 2-core VM), but every ordered pair has a ring: shrink them as pairs multiply. */
    size_t first = n <= 4 ? (64 << 10) : n <= 8 ? (32 << 10) : n <= 16 ? (16 << 10) : n <= 32 ? (8 << 10) : 4096;
    for (size_t sb = first; sb >= 2048; sb /= 4) {
        size_t bytes = shm_layout_bytes(n, sb, h);
        int rc = ftruncate(fd, (off_t)bytes) ? errno : posix_fallocate(fd, 0, (off_t)bytes);
        if (rc == 0) return 0;
        if (ftruncate(fd, 0)) { /* shrinking a file we own cannot fail; try the next size anyway */
        }
        snprintf(why, whylen, "sizing it to %zu bytes: %s (is /dev/shm full or too small?)", bytes, strerror(rc));
        if (rc != ENOSPC && rc != EFBIG && rc != ENOMEM) break;
    }
    return -1;
}

/* Rank 0: create, size and map the segment. On failure w->name is "" and why says what failed. */
static int shm_make(shm_tp *t, shm_where *w, char *why, size_t whylen) {
    int fd = -1;
    for (int tries = 0; tries < 16 && fd < 0; tries++) {
        shm_random_name(t->name, sizeof t->name);
        fd = shm_open(t->name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        char what[96];
        w->err = errno;
        snprintf(what, sizeof what, "shm_open(%s)", t->name);
        shm_why(why, whylen, what, w->err);
        t->name[0] = '\0';
        return -1;
    }
    shm_seg_hdr h;
    void *p = MAP_FAILED;
    if (shm_size_file(fd, t->n, &h, why, whylen) == 0) {
        p = mmap(NULL, h.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED)
            snprintf(why, whylen, "mmap of %llu bytes: %s", (unsigned long long)h.bytes, strerror(errno));
    }
    close(fd);
    if (p == MAP_FAILED) {
        shm_unlink(t->name);
        t->name[0] = '\0';
        return -1;
    }
    memcpy(p, &h, sizeof h); /* the rest of a fresh segment is zero: every counter starts at 0 */
    t->seg = p;
    t->seg_bytes = h.bytes;
    snprintf(w->name, sizeof w->name, "%s", t->name);
    w->bytes = h.bytes;
    return 0;
}

/* The other ranks: map what rank 0 made, and check it is what it claims. */
static int shm_attach(shm_tp *t, const shm_where *w, int32_t *fd_err, char *why, size_t whylen) {
    int fd = shm_open(w->name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
        char what[96];
        if (tally__fd_exhausted(errno)) *fd_err = errno;
        snprintf(what, sizeof what, "shm_open(%s)", w->name);
        shm_why(why, whylen, what, errno);
        return -1;
    }
    struct stat st;
    void *p = MAP_FAILED;
    if (fstat(fd, &st) == 0 && (uint64_t)st.st_size == w->bytes)
        p = mmap(NULL, w->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    const shm_seg_hdr *h = p;
    if (p == MAP_FAILED || h->magic != SHM_MAGIC || h->nranks != (uint32_t)t->n || h->bytes != w->bytes) {
        if (p != MAP_FAILED) munmap(p, w->bytes);
        snprintf(why, whylen, "segment %s is not the one rank 0 described", w->name);
        return -1;
    }
    t->seg = p;
    t->seg_bytes = w->bytes;
    return 0;
}

static void shm_adopt_layout(shm_tp *t) {
    const shm_seg_hdr *h = (const shm_seg_hdr *)t->seg;
    t->slot_bytes = h->slot_bytes;
    t->chan_stride = h->chan_stride;
    t->chans_off = h->chans_off;
    t->bell = (shm_word32 *)(t->seg + SHM_LINE);
    t->sleeping = t->bell + t->n;
    t->rec = (shm_fault_rec *)(t->sleeping + t->n);
    t->wait = (shm_wait_rec *)(t->rec + t->n);
    t->oncpu = (shm_word32 *)(t->wait + t->n);
}

static uint64_t shm_pidns(void) {
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* Reads the next rank's probe word through process_vm_readv: proves single-copy works here. */
static int shm_probe_cma(shm_tp *t, const shm_info *all) {
    const shm_info *peer = &all[(t->me + 1) % t->n];
    uint64_t got = 0;
    struct iovec l = {&got, sizeof got}, r = {(void *)(uintptr_t)peer->probe_addr, sizeof got};
    ssize_t rc = process_vm_readv(peer->pid, &l, 1, &r, 1, 0);
    if (rc == (ssize_t)sizeof got && got == peer->probe) return 1;
    tally__log_debug(1,
                     "shm: rank %d cannot read rank %d's memory (process_vm_readv: %s); large messages "
                     "will be copied through the shared segment",
                     t->me, (t->me + 1) % t->n, rc < 0 ? strerror(errno) : "wrong data");
    return 0;
}

static double shm_best_of(int reps, unsigned char *dst, const unsigned char *src, size_t len, int kernel) {
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = tally__now_ns();
        for (size_t off = 0; off < len; off += SHM_PIECE) {
            if (!kernel) {
                memcpy(dst, src + off, SHM_PIECE);
                continue;
            }
            struct iovec l = {dst, SHM_PIECE}, rv = {(void *)(src + off), SHM_PIECE};
            if (process_vm_readv(getpid(), &l, 1, &rv, 1, 0) != SHM_PIECE) return 1e30;
        }
        double s = (double)(tally__now_ns() - t0);
        if (s < best) best = s;
    }
    return best;
}

/* Single-copy saves the sender's copy into a slot but costs the receiver a syscall, page pinning and
 * the kernel's copy; it pays only where that copy is about as fast as memcpy. */
static int shm_cma_pays(shm_tp *t, shm_info *mine) {
    size_t len = 4 * SHM_PIECE;
    unsigned char *src = malloc(len);
    if (!src) return 0;
    memset(src, 1, len);
    shm_best_of(1, t->scratch, src, len, 1); /* warm both paths */
    double kernel = shm_best_of(5, t->scratch, src, len, 1), user = shm_best_of(5, t->scratch, src, len, 0);
    free(src);
    int pays = kernel <= 1.25 * user;
    mine->cma_gbps = (float)((double)len / kernel);
    mine->copy_gbps = (float)((double)len / user);
    tally__log_debug(1, "shm: process_vm_readv copies at %.1f GB/s, memcpy at %.1f GB/s: single-copy %s",
                     (double)len / kernel, (double)len / user, pays ? "on for large messages" : "off");
    return pays;
}

/* Fetches the next rank's probe memfd as a receiver fetches a shared region: proves tally_mem_alloc
 * buffers can be read in place here (same rights as process_vm_readv, but no per-message syscall). */
static int shm_probe_mem(shm_tp *t, const shm_info *all, int32_t *fd_err) {
    int p = (t->me + 1) % t->n;
    if (tally__shm_mem_probe_read(t->pidfd[p], all[p].mem_fd, all[p].probe)) return 1;
    if (t->pidfd[p] >= 0 && all[p].mem_fd >= 0 && tally__fd_exhausted(errno) && !*fd_err) *fd_err = errno;
    tally__log_debug(1,
                     "shm: rank %d cannot fetch rank %d's memory file (pidfd_getfd: %s); tally_mem_alloc "
                     "buffers will be sent like any other",
                     t->me, p, strerror(errno));
    return 0;
}

/* A kernel without pidfds only costs the prompt notice of a dead peer; running out of descriptors for
 * them is an error (*fd_err), since every later descriptor would fail too. */
static void shm_open_pidfds(shm_tp *t, const shm_info *all, int32_t *fd_err) {
    for (int r = 0; r < t->n; r++) {
        t->pid[r] = t->liveness ? all[r].pid : -1;
        t->pidfd[r] = -1;
#ifdef SYS_pidfd_open
        if (r != t->me && t->liveness) t->pidfd[r] = (int)syscall(SYS_pidfd_open, all[r].pid, 0);
        if (t->pidfd[r] < 0 && r != t->me && t->liveness && tally__fd_exhausted(errno) && !*fd_err) *fd_err = errno;
#endif
    }
}

/* Backoff for waits: with at least a core per rank spinning is cheap and fastest; with more ranks
 * than cores a spinning waiter takes the core the awaited peer needs, so it yields from the start (a
 * yield hands the CPU to whichever rank can move), and long, since a futex sleep and wake-up cost more:
 * 1 KiB at 8 ranks on 2 CPUs took 15-23 us so against 25-29 us spinning 2 us and yielding 50 us, and
 * 89 us sleeping at once. */
static void shm_pick_backoff(shm_tp *t) {
    if (!t->base.ctx.crowded) {
        t->spin_ns = 20000;
        t->yield_ns = 200000;
    } else {
        t->spin_ns = 0;
        t->yield_ns = 1000000;
    }
}

static int shm_alloc_state(shm_tp *t) {
    size_t n = (size_t)t->n;
    t->tx = calloc(n, sizeof *t->tx);
    t->tx_free = calloc(n, sizeof *t->tx_free);
    t->rx = calloc(n, sizeof *t->rx);
    t->pid = calloc(n, sizeof *t->pid);
    t->pidfd = calloc(n, sizeof *t->pidfd);
    t->sop = calloc(n, sizeof *t->sop);
    t->rop = calloc(n, sizeof *t->rop);
    t->mark = calloc(n, sizeof *t->mark);
    t->scratch = aligned_alloc(4096, SHM_PIECE);
    for (size_t r = 0; r < n && t->pidfd; r++) t->pidfd[r] = -1;
    return (t->tx && t->tx_free && t->rx && t->pid && t->pidfd && t->sop && t->rop && t->mark && t->scratch) ? 0 : -1;
}

/* After the segment is mapped: pidfds, the single-copy and in-place probes, and what every rank found.
 * A rank out of descriptors says so in fd_err, and every rank fails. */
static int shm_probe_all(shm_tp *t, shm_info *mine, shm_info *all, int cma, int same_ns, int calibrate, char *why,
                         size_t whylen) {
    t->liveness = same_ns;
    shm_open_pidfds(t, all, &mine->fd_err);
    if (mine->fd_err) shm_why(why, whylen, "pidfd_open (to watch the peers)", mine->fd_err);
    mine->cma_ok = cma && same_ns && shm_probe_cma(t, all);
    mine->cma_pays = mine->cma_ok && calibrate && t->me == 0 && shm_cma_pays(t, mine);
    int32_t had = mine->fd_err;
    mine->mem_ok = same_ns && shm_probe_mem(t, all, &mine->fd_err);
    if (mine->fd_err && !had) shm_why(why, whylen, "pidfd_getfd (the in-place read probe)", mine->fd_err);
    int rc = tally__boot_allgather(t->base.ctx.boot, mine, all, sizeof *mine);
    int mem = 1, wanted = cma;
    for (int r = 0; r < t->n && !rc; r++) {
        cma &= all[r].cma_ok;
        mem &= all[r].mem_ok;
        if (!all[r].fd_err) continue;
        if (!mine->fd_err) shm_peer_why(why, whylen, r, all[r].fd_err, "opening its peers' pidfds");
        rc = TALLY_E_SYSTEM;
    }
    t->cma = !rc && cma && same_ns;
    t->mem = !rc && mem && same_ns;
    if (!rc && calibrate) t->large_min = all[0].cma_pays ? SHM_LARGE_DEFAULT : SHM_LARGE_OFF;
    t->cma_why = !wanted                         ? SHM_CMA_UNWANTED
                 : !same_ns                      ? SHM_CMA_NS
                 : !cma                          ? SHM_CMA_DENIED /* wanted, same namespace: a probe failed */
                 : calibrate && !all[0].cma_pays ? SHM_CMA_SLOW
                                                 : SHM_CMA_ON;
    t->cma_gbps = all[0].cma_gbps;
    t->copy_gbps = all[0].copy_gbps;
    return rc;
}

/* Steps every rank takes together; each failure is shared so no rank is left waiting. *fd_short: the
 * failure was a rank out of descriptors (another transport would need as many). */
static int shm_rendezvous(shm_tp *t, int usable, int cma_wanted, int calibrate, int *fd_short, char *why,
                          size_t whylen) {
    tally__boot *b = t->base.ctx.boot;
    shm_where w = {{0}, 0, 0, 0};
    int rc, me_ok = usable;
    if (t->me == 0 && shm_make(t, &w, why, whylen)) me_ok = 0;
    if ((rc = tally__boot_bcast(b, &w, sizeof w, 0))) return rc;
    if (!w.name[0]) {
        if (t->me != 0) shm_peer_why(why, whylen, 0, w.err, "create the shared-memory segment");
        *fd_short = tally__fd_exhausted(w.err);
        return TALLY_E_SYSTEM;
    }
    shm_info mine = {.pid = (int32_t)getpid(),
                     .cma_wanted = cma_wanted,
                     .pidns = shm_pidns(),
                     .probe_addr = (uint64_t)(uintptr_t)&t->probe,
                     .probe = atomic_load(&t->probe)};
    if (t->me != 0 && shm_attach(t, &w, &mine.fd_err, why, whylen)) me_ok = 0;
    mine.mapped = me_ok;
    mine.mem_fd = tally__shm_mem_probe_make(mine.probe); /* closed once every peer has probed it */
    if (mine.mem_fd < 0 && tally__fd_exhausted(errno) && me_ok) {
        mine.fd_err = errno;
        shm_why(why, whylen, "memfd_create (the in-place read probe)", errno);
    }
    shm_info *all = calloc((size_t)t->n, sizeof *all);
    if (!all) {
        if (mine.mem_fd >= 0) close(mine.mem_fd);
        return TALLY_E_NOMEM;
    }
    rc = tally__boot_allgather(b, &mine, all, sizeof mine);
    /* Every rank has it open (or gave up): nothing is left behind. Each rank unlinks it, so it goes even
     * when rank 0 died after naming it (the others' ENOENT is harmless). */
    if (w.name[0]) shm_unlink(w.name);
    t->name[0] = '\0';
    int same_ns = 1, cma = 1;
    for (int r = 0; r < t->n && !rc; r++) {
        if (!all[r].mapped || all[r].fd_err) {
            if (me_ok && !mine.fd_err) shm_peer_why(why, whylen, r, all[r].fd_err, "map the shared-memory segment");
            *fd_short |= tally__fd_exhausted(all[r].fd_err);
            rc = TALLY_E_SYSTEM;
        }
        same_ns &= all[r].pidns == all[0].pidns && all[r].pidns != 0;
        cma &= all[r].cma_wanted;
    }
    if (!rc) rc = shm_probe_all(t, &mine, all, cma, same_ns, calibrate, why, whylen);
    if (rc == TALLY_E_SYSTEM && mine.fd_err) *fd_short = 1;
    for (int r = 0; r < t->n && rc == TALLY_E_SYSTEM; r++) *fd_short |= tally__fd_exhausted(all[r].fd_err);
    free(all);
    if (mine.mem_fd >= 0) close(mine.mem_fd);
    return rc;
}

/* The config's shm_large (TALLY_SHM_LARGE): TALLY_SHM_LARGE_OFF for the slots only, else the size from
 * which messages go single-copy, or TALLY_SHM_LARGE_AUTO (calibration decides); shm_cma: 0 or 1. A
 * transport made without a config takes the defaults. */
typedef struct shm_knobs {
    int off, cma, calibrate;
    uint64_t large_min;
} shm_knobs;

static shm_knobs shm_read_knobs(const tally_config *cfg) {
    static const tally_config defaults = TALLY_CONFIG_INIT;
    if (!cfg) cfg = &defaults;
    return (shm_knobs){.off = cfg->shm_large == TALLY_SHM_LARGE_OFF,
                       .cma = cfg->shm_cma,
                       .calibrate = cfg->shm_large == TALLY_SHM_LARGE_AUTO,
                       .large_min = cfg->shm_large > 0 ? (uint64_t)cfg->shm_large : 0};
}

static void shm_size_words(char *buf, size_t n, size_t bytes) {
    if (bytes >= (1u << 20) && bytes % (1u << 20) == 0)
        snprintf(buf, n, "%zu MiB", bytes >> 20);
    else if (bytes >= 1024 && bytes % 1024 == 0)
        snprintf(buf, n, "%zu KiB", bytes >> 10);
    else
        snprintf(buf, n, "%zu B", bytes);
}

/* Why messages from ordinary buffers go through the segment (copied in and out) rather than single-copy. */
static const char *shm_cma_off_words(const shm_tp *t, char *buf, size_t n) {
    switch (t->cma_why) {
    case SHM_CMA_UNWANTED: return "TALLY_SHM_CMA=0 on a rank";
    case SHM_CMA_NS: return "the ranks are in different pid namespaces";
    case SHM_CMA_DENIED: return "process_vm_readv is not permitted here (ptrace rules)";
    case SHM_CMA_SLOW:
        snprintf(buf, n, "process_vm_readv copies at %.1f GB/s against memcpy's %.1f here", t->cma_gbps, t->copy_gbps);
        return buf;
    default: return "single-copy is off";
    }
}

/* Single-copy (process_vm_readv) takes the messages of large_min bytes or more. */
static int shm_cma_on(const shm_tp *t) { return t->cma && t->large_min != SHM_LARGE_OFF; }

/* base.large: what large messages do here (which buffers are read in place, and what stopped the rest). */
static void shm_describe_large(shm_tp *t, int off) {
    char *d = t->base.large, at[32], why[96];
    size_t n = sizeof t->base.large;
    if (off) {
        snprintf(d, n, "every message through the shared segment (TALLY_SHM_LARGE=off)");
        return;
    }
    int k = 0;
    if (t->base.mem_min) {
        shm_size_words(at, sizeof at, t->base.mem_min);
        k = snprintf(d, n, "tally_mem_alloc buffers read in place from %s; ", at);
    } else {
        k = snprintf(d, n, "tally_mem_alloc buffers sent like any other (pidfd_getfd failed); ");
    }
    if (k < 0 || (size_t)k >= n) return;
    if (shm_cma_on(t)) {
        shm_size_words(at, sizeof at, t->large_min);
        snprintf(d + k, n - (size_t)k, "others from %s read with process_vm_readv (single copy)", at);
    } else {
        snprintf(d + k, n - (size_t)k, "others through the shared segment (%s)", shm_cma_off_words(t, why, sizeof why));
    }
}

int tally__shm_create(const tally__tp_ctx *ctx, tally__tp **out) {
    *out = NULL;
    shm_tp *t = calloc(1, sizeof *t);
    if (!t) return tally__seterr(TALLY_E_NOMEM, "rank %d: no memory for the shm transport", ctx->rank);
    t->base.ops = &shm_ops;
    t->base.ctx = *ctx;
    t->me = ctx->rank;
    t->n = ctx->size;
    shm_knobs k = shm_read_knobs(ctx->cfg);
    int off = k.off;
    uint64_t large_min = k.large_min;
    t->large_min = off ? SHM_LARGE_OFF : large_min > SHM_INLINE ? (size_t)large_min : SHM_INLINE + 1;
    /* Shared regions are read in place whatever the calibration says (no kernel copy to be slow), but
     * not below SHM_MEM_MIN, and not at all when TALLY_SHM_LARGE=off asks for the slots only. */
    t->mem_min = off ? SHM_LARGE_OFF : large_min > SHM_MEM_MIN ? (size_t)large_min : SHM_MEM_MIN;
    uint64_t nonce = 0;
    if (getrandom(&nonce, sizeof nonce, 0) != (ssize_t)sizeof nonce) nonce = tally__now_ns();
    atomic_store(&t->probe, nonce | 1);
    char why[SHM_WHY_MAX] = "";
    int rc = shm_alloc_state(t) || tally__shm_mem_init(t) ? TALLY_E_NOMEM : 0, fd_short = 0;
    /* Even without memory this rank must take part in the rendezvous, or the others would wait. */
    int rrc = shm_rendezvous(t, rc == 0, k.cma, k.calibrate, &fd_short, why, sizeof why);
    if (!rc) rc = rrc;
    if (rc) {
        tally__shm_destroy(&t->base);
        return tally__seterr(rc, "rank %d: shared-memory transport setup failed: %s%s", ctx->rank,
                             why[0] ? why : tally_strerror(rc), fd_short ? "" : "; TALLY_TRANSPORT=tcp avoids it");
    }
    shm_adopt_layout(t);
    t->base.mem_min = t->mem && t->mem_min != SHM_LARGE_OFF ? t->mem_min : 0;
    shm_describe_large(t, off);
    atomic_store(&t->wait[t->me].peer, -1);
    shm_pick_backoff(t);
    t->base.fan_out = 1;
    if (shm_cma_on(t)) { /* each receiver reads its own: they copy side by side */
        t->base.pull = ctx->cpus > 1 ? (ctx->cpus < t->n - 1 ? ctx->cpus : t->n - 1) : 1;
        t->base.pull_min = t->large_min;
        tally__log_debug(1,
                         "shm: %d ranks, %d slots of %zu KiB per channel, segment %zu KiB; messages of %zu "
                         "bytes or more are read in place (process_vm_readv)",
                         t->n, SHM_NSLOTS, t->slot_bytes >> 10, t->seg_bytes >> 10, t->large_min);
    } else {
        tally__log_debug(1,
                         "shm: %d ranks, %d slots of %zu KiB per channel, segment %zu KiB; every message "
                         "goes through the slots",
                         t->n, SHM_NSLOTS, t->slot_bytes >> 10, t->seg_bytes >> 10);
    }
    if (t->base.mem_min)
        tally__log_debug(1,
                         "shm: tally_mem_alloc buffers: messages of %zu bytes or more are read in place "
                         "(pidfd_getfd + mmap)",
                         t->mem_min);
    else
        tally__log_debug(1, "shm: tally_mem_alloc buffers: sent like any other");
    *out = &t->base;
    return 0;
}

void tally__shm_destroy(tally__tp *tp) {
    shm_tp *t = (shm_tp *)tp;
    if (!t) return;
    /* A fault this rank raised or adopted outside an exchange (an abort, one relayed by the monitor) is
     * left for the peers too: they read it here sooner than through rank 0. */
    if (t->seg && t->rec) tally__shm_publish(t);
    if (t->seg) munmap(t->seg, t->seg_bytes);
    tally__shm_mem_fini(t);
    if (t->name[0]) shm_unlink(t->name); /* setup failed before the others mapped it */
    for (int r = 0; t->pidfd && r < t->n; r++)
        if (t->pidfd[r] >= 0) close(t->pidfd[r]);
    free(t->tx);
    free(t->tx_free);
    free(t->rx);
    free(t->pid);
    free(t->pidfd);
    free(t->sop);
    free(t->rop);
    free(t->mark);
    free(t->scratch);
    free(t);
}
