/* po_cma.c - large payloads of a peer on this host read straight from its memory (process_vm_readv), so
 * they cross no socket buffer: the probe that says whether it can, the read (the largest in two halves,
 * one by the copier thread), and the acks that free them. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "../core/log.h"
#include "po_int.h"

/* One process_vm_readv reads at most this much: a message kept until its receive grows in steps. */
#define PO_CMA_CHUNK ((size_t)64 << 20)

int tally__po_cma_probe(tally__po *po, const tally__po_hello *h) {
    const tally__peer *p = tally__boot_peers(po->boot);
    if (!po->cma_wanted || p[h->rank].hostid != p[po->rank].hostid || p[h->rank].pid != (int)h->pid || !h->pidns ||
        h->pidns != po->pidns)
        return 0; /* another host, or a pid that names another process here */
    uint64_t got = 0;
    struct iovec l = {&got, sizeof got}, r = {(void *)(uintptr_t)h->probe_addr, sizeof got};
    ssize_t n = process_vm_readv((pid_t)h->pid, &l, 1, &r, 1, 0);
    if (n == (ssize_t)sizeof got && got == h->probe) return 1;
    tally__log_debug(1,
                     "rank %d cannot read rank %d's memory (process_vm_readv: %s): its large point-to-point "
                     "messages come through the socket",
                     po->rank, (int)h->rank, n < 0 ? strerror(errno) : "wrong data");
    return 0;
}

/* n bytes at the sender's addr into dst: 0, or the errno. */
static int po_cma_copy(pid_t pid, unsigned char *dst, uint64_t addr, size_t n) {
    while (n > 0) {
        struct iovec l = {dst, n}, r = {(void *)(uintptr_t)addr, n};
        ssize_t k = process_vm_readv(pid, &l, 1, &r, 1, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return k < 0 ? errno : EFAULT;
        dst += k;
        addr += (uint64_t)k;
        n -= (size_t)k;
    }
    return 0;
}

static void *po_copier_main(void *arg) {
    tally__po_copier *k = arg;
    pthread_mutex_lock(&k->mu);
    for (;;) {
        while (!k->busy && !k->stop) pthread_cond_wait(&k->go, &k->mu);
        if (!k->busy) break; /* stopped, and nothing posted */
        pid_t pid = k->pid;
        unsigned char *dst = k->dst;
        uint64_t addr = k->addr;
        size_t n = k->n;
        pthread_mutex_unlock(&k->mu);
        int err = po_cma_copy(pid, dst, addr, n);
        pthread_mutex_lock(&k->mu);
        k->err = err;
        k->busy = 0;
        pthread_cond_signal(&k->done);
    }
    pthread_mutex_unlock(&k->mu);
    return NULL;
}

void tally__po_copier_init(tally__po_copier *k) {
    memset(k, 0, sizeof *k);
    pthread_mutex_init(&k->mu, NULL);
    pthread_cond_init(&k->go, NULL);
    pthread_cond_init(&k->done, NULL);
}

void tally__po_copier_end(tally__po_copier *k) {
    if (k->state == PO_COPIER_RUNNING) {
        pthread_mutex_lock(&k->mu);
        k->stop = 1;
        pthread_cond_signal(&k->go);
        pthread_mutex_unlock(&k->mu);
        pthread_join(k->th, NULL);
    }
    pthread_cond_destroy(&k->go);
    pthread_cond_destroy(&k->done);
    pthread_mutex_destroy(&k->mu);
}

/* The copier's thread, started at the first large read where this process may run on two CPUs (a rank
 * bound to one would only take turns with it). 1 when it runs. Only a reader under po->mu calls it. */
static int po_copier_up(tally__po *po) {
    tally__po_copier *k = &po->copier;
    if (k->state != PO_COPIER_UNTRIED) return k->state == PO_COPIER_RUNNING;
    cpu_set_t set;
    k->state = PO_COPIER_NONE;
    if (sched_getaffinity(0, sizeof set, &set) || CPU_COUNT(&set) < 2) return 0;
    int err = pthread_create(&k->th, NULL, po_copier_main, k);
    if (err) {
        tally__log_debug(1, "rank %d: point-to-point: no copier thread (%s): large messages are read by one thread",
                         po->rank, strerror(err));
        return 0;
    }
    k->state = PO_COPIER_RUNNING;
    return 1;
}

/* n bytes at the sender's addr into dst, a large read in two halves side by side: 0, or the errno. */
static int po_cma_copy_split(tally__po *po, pid_t pid, unsigned char *dst, uint64_t addr, size_t n) {
    if (n < TALLY__PO_CMA_SPLIT_MIN || !po_copier_up(po)) return po_cma_copy(pid, dst, addr, n);
    tally__po_copier *k = &po->copier;
    size_t half = (n / 2) & ~(size_t)4095; /* the halves part at a page: no page is pinned by both */
    pthread_mutex_lock(&k->mu);
    k->pid = pid;
    k->dst = dst + half;
    k->addr = addr + half;
    k->n = n - half;
    k->err = 0;
    k->busy = 1;
    pthread_cond_signal(&k->go);
    pthread_mutex_unlock(&k->mu);
    int err = po_cma_copy(pid, dst, addr, half);
    pthread_mutex_lock(&k->mu); /* the copier's read ends: a syscall on our own memory and a pid */
    while (k->busy) pthread_cond_wait(&k->done, &k->mu);
    int err2 = k->err;
    pthread_mutex_unlock(&k->mu);
    return err ? err : err2;
}

int tally__po_cma_flush(tally__po *po, tally__po_in *in) {
    (void)po;
    while (in->n_acks) {
        int r = tally__po_io(in->fd, &in->acks[0], sizeof in->acks[0], &in->ack_off, 1);
        if (r <= 0) return r; /* 0: the socket is full, the thread waits for room */
        in->ack_off = 0;
        memmove(in->acks, in->acks + 1, --in->n_acks * sizeof *in->acks);
    }
    return 0;
}

/* The sender may reuse its buffer once it hears: rc 0, or why the read failed. */
static int po_cma_ack(tally__po *po, tally__po_in *in, uint64_t id, int rc, int flush) {
    if (in->n_acks == in->cap_acks) {
        size_t cap = in->cap_acks ? 2 * in->cap_acks : 8;
        tally__po_ack *a = realloc(in->acks, cap * sizeof *a);
        if (!a) return TALLY_E_NOMEM;
        in->acks = a;
        in->cap_acks = cap;
    }
    in->acks[in->n_acks++] = (tally__po_ack){.magic = TALLY__PO_MAGIC_ACK, .rc = rc, .id = id};
    return flush ? tally__po_cma_flush(po, in) : 0;
}

int tally__po_cma_read(tally__po *po, tally__po_in *in, tally__po_msg *m, int flush) {
    uint64_t id = m->id;
    int rc = 0;
    char why[256];
    m->unread = 0;
    m->from = NULL;
    for (;;) {
        if (m->discard) { /* nobody wants it: nothing to read */
            tally__po_msg_grew(po, m, m->bytes - m->got);
            break;
        }
        size_t room;
        unsigned char *dst = tally__po_msg_dst(m, &room, po->scratch, sizeof po->scratch);
        size_t n = room < PO_CMA_CHUNK ? room : PO_CMA_CHUNK;
        int err = dst ? po_cma_copy_split(po, in->pid, dst, m->addr + m->got, n) : ENOMEM;
        if (err) {
            rc = err == ENOMEM ? TALLY_E_NOMEM : err == ESRCH ? TALLY_E_PEER_LOST : TALLY_E_SYSTEM;
            snprintf(why, sizeof why, "could not read rank %d's message of %zu bytes in place (process_vm_readv: %s)",
                     in->rank, m->bytes, strerror(err));
            tally__po_msg_lost(po, m, rc, why);
            break;
        }
        if (tally__po_msg_grew(po, m, n)) break;
    }
    return po_cma_ack(po, in, id, rc, flush);
}

tally__po_in *tally__po_cma_due(tally__po *po, uint64_t now, uint64_t *next, int *rc) {
    for (tally__po_msg *m = po->unx; m; m = m->next) {
        if (!m->unread) continue;
        if (m->grace > now) {
            if (m->grace < *next) *next = m->grace;
            continue;
        }
        tally__po_in *in = m->from;
        if ((*rc = tally__po_cma_read(po, in, m, 1))) return in;
        return tally__po_cma_due(po, now, next, rc); /* the queue changed: from its head again */
    }
    return NULL;
}
