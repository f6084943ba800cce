/* shm_mem.c - tally_mem_alloc on shm: regions are memfds that peers fetch with pidfd_getfd and map
 * read-only once, so a large message from one is read in place with a single copy and no syscall. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../boot/fdlimit.h"
#include "../core/alloc.h"
#include "../core/log.h"
#include "shm.h"

#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438 /* same number on every architecture; older headers lack it */
#endif

/* One region this rank allocated. */
typedef struct shm_region {
    uint64_t id; /* from a counter that only grows: a peer's cached mapping can never name a newer region */
    int fd;
    unsigned char *base;
    size_t len;
    int kept; /* tally_mem_keep: destroy leaves it mapped */
} shm_region;

static void shm_unmap_kept(void *base, size_t len) { munmap(base, len); }

/* Hands a kept region to the process-wide registry (left mapped for good when no memory is left for
 * that: a leak, never a buffer unmapped under its owner). */
static void shm_keep_past(const shm_region *r) { tally__kept_add(r->base, r->len, shm_unmap_kept); }

/* One peer region this rank mapped. */
typedef struct shm_peer_map {
    int peer;
    uint64_t id, used; /* used: last lookup, for evicting the least recently used */
    const unsigned char *base;
    size_t len;
} shm_peer_map;

typedef struct shm_mem_state {
    /* reg, nreg, capreg, next_id: tally_mem_alloc/_free/_keep change them on the user's threads while a
     * collective on the communication thread looks a buffer up (tally__shm_mem_find) */
    pthread_mutex_t mu;
    shm_region *reg;
    size_t nreg, capreg;
    uint64_t next_id;
    shm_peer_map *map;
    size_t nmap, capmap;
    uint64_t clock;
} shm_mem_state;

int tally__shm_mem_init(shm_tp *t) {
    t->ms = calloc(1, sizeof *t->ms);
    if (!t->ms) return -1;
    t->ms->next_id = 1; /* 0 means "no region" on the wire */
    pthread_mutex_init(&t->ms->mu, NULL);
    /* Larger than the receives one exchange can have in flight (n - 1), so LRU never evicts one. */
    t->ms->capmap = (size_t)(t->n * 2 > 64 ? t->n * 2 : 64);
    t->ms->map = calloc(t->ms->capmap, sizeof *t->ms->map);
    return t->ms->map ? 0 : -1;
}

void tally__shm_mem_fini(shm_tp *t) {
    shm_mem_state *m = t->ms;
    if (!m) return;
    for (size_t i = 0; i < m->nreg; i++) {
        if (m->reg[i].kept)
            shm_keep_past(&m->reg[i]); /* the mapping holds the memfd: its descriptor can go */
        else
            munmap(m->reg[i].base, m->reg[i].len);
        close(m->reg[i].fd);
    }
    for (size_t i = 0; i < m->nmap; i++) munmap((void *)m->map[i].base, m->map[i].len);
    free(m->reg);
    free(m->map);
    pthread_mutex_destroy(&m->mu);
    free(m);
    t->ms = NULL;
}

static int shm_reg_grow(shm_mem_state *m) {
    if (m->nreg < m->capreg) return 0;
    size_t cap = m->capreg ? 2 * m->capreg : 8;
    shm_region *r = realloc(m->reg, cap * sizeof *r);
    if (!r) return -1;
    m->reg = r;
    m->capreg = cap;
    return 0;
}

/* A memfd of `len` bytes mapped shared; the pages are reserved now so a full tmpfs fails here rather
 * than with SIGBUS inside a collective. */
static void *shm_region_make(shm_tp *t, size_t len, int *fd_out) {
    int fd = memfd_create("tally-mem", MFD_CLOEXEC); /* the name is for /proc only: the id is given later */
    if (fd < 0) {
        char why[600];
        if (tally__fd_exhausted(errno))
            tally__fd_explain(errno, why, sizeof why);
        else
            snprintf(why, sizeof why, "%s", strerror(errno));
        tally__seterr(TALLY_E_SYSTEM,
                      "rank %d: tally_mem_alloc: memfd_create: %s (each buffer holds one descriptor "
                      "until tally_mem_free)",
                      t->me, why);
        return NULL;
    }
    int e = ftruncate(fd, (off_t)len) ? errno : posix_fallocate(fd, 0, (off_t)len);
    void *p = e ? MAP_FAILED : mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        if (!e) e = errno;
        close(fd);
        tally__seterr(e == ENOSPC || e == ENOMEM ? TALLY_E_NOMEM : TALLY_E_SYSTEM,
                      "rank %d: tally_mem_alloc of %zu bytes: %s", t->me, len, strerror(e));
        return NULL;
    }
    *fd_out = fd;
    return p;
}

void *tally__shm_mem_alloc(tally__tp *tp, size_t bytes) {
    shm_tp *t = (shm_tp *)tp;
    size_t page = (size_t)sysconf(_SC_PAGESIZE), len = (bytes ? bytes : 1) + page - 1;
    if (len < bytes) {
        tally__seterr(TALLY_E_INVALID, "rank %d: tally_mem_alloc: %zu bytes is too large", t->me, bytes);
        return NULL;
    }
    len -= len % page;
    int fd;
    void *p = shm_region_make(t, len, &fd);
    if (!p) return NULL;
    shm_mem_state *m = t->ms;
    pthread_mutex_lock(&m->mu);
    int grown = shm_reg_grow(m) == 0;
    if (grown) m->reg[m->nreg++] = (shm_region){m->next_id++, fd, p, len, 0};
    pthread_mutex_unlock(&m->mu);
    if (grown) return p; /* page aligned, so 64-byte aligned */
    munmap(p, len);
    close(fd);
    tally__seterr(TALLY_E_NOMEM, "rank %d: tally_mem_alloc: out of memory", t->me);
    return NULL;
}

int tally__shm_mem_free(tally__tp *tp, void *ptr) {
    shm_tp *t = (shm_tp *)tp;
    shm_mem_state *m = t->ms;
    shm_region gone = {0};
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < m->nreg && !gone.base; i++)
        if (m->reg[i].base == ptr) {
            gone = m->reg[i];
            m->reg[i] = m->reg[--m->nreg];
        }
    pthread_mutex_unlock(&m->mu);
    if (gone.base) { /* peers that mapped it keep their own reference to the memfd: unmapping ours is safe */
        munmap(gone.base, gone.len);
        close(gone.fd);
        return 0;
    }
    return tally__seterr(TALLY_E_INVALID,
                         "rank %d: tally_mem_free: %p did not come from tally_mem_alloc on this "
                         "communicator (or was freed already)",
                         t->me, ptr);
}

int tally__shm_mem_keep(tally__tp *tp, void *ptr) {
    shm_tp *t = (shm_tp *)tp;
    int found = 0;
    pthread_mutex_lock(&t->ms->mu);
    for (size_t i = 0; i < t->ms->nreg && !found; i++)
        if (t->ms->reg[i].base == ptr) t->ms->reg[i].kept = found = 1;
    pthread_mutex_unlock(&t->ms->mu);
    if (found) return 0;
    return tally__seterr(TALLY_E_INVALID,
                         "rank %d: tally_mem_keep: %p did not come from tally_mem_alloc on this communicator (or "
                         "was freed already)",
                         t->me, ptr);
}

int tally__shm_mem_find(shm_tp *t, const void *buf, size_t len, uint64_t *id, int *fd, uint64_t *off) {
    shm_mem_state *m = t->ms;
    uintptr_t b = (uintptr_t)buf;
    int found = 0;
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < m->nreg && !found; i++) {
        uintptr_t lo = (uintptr_t)m->reg[i].base;
        if (b < lo || b - lo > m->reg[i].len || len > m->reg[i].len - (b - lo)) continue;
        *id = m->reg[i].id;
        *fd = m->reg[i].fd;
        *off = b - lo;
        found = 1;
    }
    pthread_mutex_unlock(&m->mu);
    return found;
}

/* Out of descriptors fetching a peer's region. With process_vm_readv to fall back on the message still
 * arrives (said once); without, it cannot, and the fault names the limit (shm.c's own raise then keeps it). */
static void shm_map_no_fd(shm_tp *t, int p, int err) {
    char why[600];
    tally__fd_explain(err, why, sizeof why);
    if (t->cma) {
        static _Atomic int said;
        if (!atomic_exchange(&said, 1))
            tally__log_warn("rank %d: cannot fetch rank %d's tally_mem_alloc buffer: %s; reading such buffers "
                            "with process_vm_readv instead",
                            t->me, p, why);
        return;
    }
    tally__fault_raise(t->base.ctx.fault, TALLY_E_SYSTEM, t->me,
                       "rank %d could not fetch rank %d's tally_mem_alloc "
                       "buffer (pidfd_getfd): %s",
                       t->me, p, why);
    errno = err;
}

/* Copies rank p's descriptor `fd` into this process and maps it whole, read-only. */
static const unsigned char *shm_map_peer(shm_tp *t, int p, int fd, size_t *len) {
    if (t->pidfd[p] < 0) return NULL;
    int mine = (int)syscall(SYS_pidfd_getfd, t->pidfd[p], fd, 0);
    if (mine < 0 && tally__fd_exhausted(errno)) shm_map_no_fd(t, p, errno);
    if (mine < 0) return NULL;
    struct stat st;
    void *base = MAP_FAILED;
    if (fstat(mine, &st) == 0 && st.st_size > 0) base = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, mine, 0);
    close(mine); /* the mapping keeps the memfd alive */
    if (base == MAP_FAILED) return NULL;
    *len = (size_t)st.st_size;
    return base;
}

/* A free cache entry: the next unused one, or the least recently used one unmapped. */
static shm_peer_map *shm_map_slot(shm_mem_state *m) {
    if (m->nmap < m->capmap) return &m->map[m->nmap++];
    shm_peer_map *v = &m->map[0];
    for (size_t i = 1; i < m->nmap; i++)
        if (m->map[i].used < v->used) v = &m->map[i];
    munmap((void *)v->base, v->len);
    return v;
}

const unsigned char *tally__shm_mem_map(shm_tp *t, int p, uint64_t id, int fd, size_t need) {
    shm_mem_state *m = t->ms;
    m->clock++;
    for (size_t i = 0; i < m->nmap; i++) {
        shm_peer_map *e = &m->map[i];
        if (e->peer != p || e->id != id) continue;
        e->used = m->clock;
        return need <= e->len ? e->base : NULL;
    }
    size_t len = 0;
    const unsigned char *base = shm_map_peer(t, p, fd, &len);
    if (!base) return NULL;
    shm_peer_map *e = shm_map_slot(m);
    *e = (shm_peer_map){p, id, m->clock, base, len};
    return need <= len ? base : NULL;
}

int tally__shm_mem_probe_make(uint64_t word) {
    int fd = memfd_create("tally-probe", MFD_CLOEXEC);
    if (fd < 0) return -1;
    if (pwrite(fd, &word, sizeof word, 0) != (ssize_t)sizeof word) {
        close(fd);
        return -1;
    }
    return fd;
}

int tally__shm_mem_probe_read(int pidfd, int fd, uint64_t word) {
    if (pidfd < 0 || fd < 0) return 0;
    int mine = (int)syscall(SYS_pidfd_getfd, pidfd, fd, 0);
    if (mine < 0) return 0;
    uint64_t got = 0;
    int ok = pread(mine, &got, sizeof got, 0) == (ssize_t)sizeof got && got == word;
    close(mine);
    return ok;
}
