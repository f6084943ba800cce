/* shm.c - the shared-memory exchange: tiny messages inline with their flag, others pipelined through a
 * ring of slots, or read in place from the sender where setup found that pays; all progressed together. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "../core/clock.h"
#include "../core/numeric/dtype.h"
#include "../core/numeric/reduce.h"
#include "shm.h"

/* Fingerprints are compared as a 64-bit hash on the fast path; the full one rides in line 1 for the
 * message that explains a mismatch. */
uint64_t tally__shm_sighash(const tally__sig *s) {
    uint64_t w[3];
    memcpy(w, s, sizeof w);
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 3; i++) {
        h ^= w[i] + 0x632be59bd9b4e019ull + (h << 6) + (h >> 2);
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 33;
    }
    return h;
}
_Static_assert(sizeof(tally__sig) == 24, "the fingerprint is hashed as three words");

/* ---- sending ---------------------------------------------------------------------------------- */

static void shm_send_begin(shm_tp *t, shm_sop *o, const tally__send *s) {
    o->peer = s->peer;
    o->buf = s->buf;
    o->len = s->len;
    o->posted = 0;
    o->done = 0;
    o->mem_id = 0;
    if (s->len <= SHM_INLINE) {
        o->kind = SHM_TINY;
        o->nuse = 1;
    } else if (t->mem && s->len >= t->mem_min &&
               tally__shm_mem_find(t, s->buf, s->len, &o->mem_id, &o->mem_fd, &o->mem_off)) {
        o->kind = SHM_LARGE; /* the receiver reads it in place from its mapping of our region */
        o->nuse = 1;
    } else if (t->cma && s->len >= t->large_min) {
        o->kind = SHM_LARGE;
        o->nuse = 1;
    } else {
        o->kind = SHM_SLOT;
        o->nuse = (s->len + t->slot_bytes - 1) / t->slot_bytes;
    }
}

/* Fills slot use k with the next part of the message and publishes it. */
static void shm_fill(shm_tp *t, const shm_xchg *x, shm_sop *o, uint64_t k) {
    shm_slot *s = shm_slot_at(t, t->me, o->peer, k);
    size_t off = (size_t)o->posted * t->slot_bytes;
    if (o->posted == 0) {
        s->kind = (uint16_t)o->kind;
        s->sighash = x->hash;
        s->sig = *t->base.ctx.sig;
        s->len = o->len;
        if (o->kind == SHM_TINY) {
            s->tiny_len = (uint16_t)o->len;
            if (o->len) memcpy(s->data, o->buf, o->len);
        } else if (o->kind == SHM_LARGE) {
            s->addr = (uint64_t)(uintptr_t)o->buf;
            s->mem_id = o->mem_id; /* 0 (read with process_vm_readv) unless a shared region holds it */
            s->mem_off = o->mem_off;
            s->mem_fd = o->mem_id ? o->mem_fd : -1;
            s->mem_pid = (int32_t)getpid();
            o->last_use = k;
        }
    } else {
        s->kind = SHM_CONT;
    }
    if (o->kind == SHM_SLOT) {
        size_t n = o->len - off < t->slot_bytes ? o->len - off : t->slot_bytes;
        memcpy(shm_slot_data(t, t->me, o->peer, k), o->buf + off, n);
    }
    atomic_store_explicit(&s->flag, (uint32_t)(k + 1), memory_order_release);
}

/* Posts what the ring has room for; a LARGE send completes once the receiver consumed it.
 * Returns 1 when something moved. */
static int shm_send_progress(shm_tp *t, shm_xchg *x, shm_sop *o) {
    int p = o->peer, moved = 0;
    _Atomic uint64_t *consumed = shm_consumed(t, t->me, p);
    while (o->posted < o->nuse) {
        uint64_t k = t->tx[p];
        if (k - t->tx_free[p] >= SHM_NSLOTS) {
            /* acquire: the receiver's reads of the slot happened before we overwrite it */
            t->tx_free[p] = atomic_load_explicit(consumed, memory_order_acquire);
            if (k - t->tx_free[p] >= SHM_NSLOTS) break;
        }
        shm_fill(t, x, o, k);
        t->tx[p] = k + 1;
        o->posted++;
        moved = 1;
        tally__shm_wake(t, p);
    }
    if (o->posted < o->nuse) return moved;
    if (o->kind == SHM_LARGE) {
        /* acquire: the receiver finished reading our buffer before we hand it back to the caller */
        if (t->tx_free[p] <= o->last_use) t->tx_free[p] = atomic_load_explicit(consumed, memory_order_acquire);
        if (t->tx_free[p] <= o->last_use) return moved;
    }
    o->done = 1;
    x->left--;
    return 1;
}

/* ---- receiving -------------------------------------------------------------------------------- */

static void shm_recv_begin(shm_rop *o, const tally__recv *r) {
    o->r = r;
    o->kind = 0;
    o->started = 0;
    o->done = 0;
    o->off = 0;
    o->esize = r->src ? tally_dtype_size(r->dtype) : 1;
}

/* A LARGE message from a shared region: find it in our mapping of that region, or fall back to
 * process_vm_readv where that works; never guess. */
static int shm_recv_map(shm_tp *t, shm_rop *o, const shm_slot *s) {
    int p = o->r->peer;
    size_t need = s->mem_off + o->r->len;
    const unsigned char *base = NULL;
    if (s->mem_pid == t->pid[p] && need >= s->mem_off) base = tally__shm_mem_map(t, p, s->mem_id, s->mem_fd, need);
    if (base) {
        o->map = base + s->mem_off;
        return 0;
    }
    if (t->cma) return 0;
    return tally__fault_raise(t->base.ctx.fault, TALLY_E_SYSTEM, p,
                              "rank %d could not map the shared buffer "
                              "(tally_mem_alloc region %llu, fd %d) rank %d sent from (pidfd_getfd or mmap: %s); "
                              "TALLY_SHM_LARGE=off sends such buffers through the segment",
                              t->me, (unsigned long long)s->mem_id, (int)s->mem_fd, p, strerror(errno));
}

/* Checks a message's first slot against what we expect: same collective, same length. */
static int shm_recv_head(shm_tp *t, const shm_xchg *x, shm_rop *o, const shm_slot *s) {
    int p = o->r->peer;
    tally__fault *f = t->base.ctx.fault;
    char what[160];
    if (s->kind != SHM_TINY && s->kind != SHM_SLOT && s->kind != SHM_LARGE)
        return tally__fault_raise(f, TALLY_E_PROTOCOL, p,
                                  "rank %d received a malformed message (kind %u) from "
                                  "rank %d",
                                  t->me, (unsigned)s->kind, p);
    if (s->sighash != x->hash) return tally__shm_sig_fault(t, p, s);
    uint64_t len = s->kind == SHM_TINY ? s->tiny_len : s->len;
    if (len != o->r->len || (s->kind == SHM_LARGE && !t->cma && !(t->mem && s->mem_id))) {
        tally__sig_format(t->base.ctx.sig, what, sizeof what);
        return tally__fault_raise(f, TALLY_E_PROTOCOL, p,
                                  "rank %d sent %llu bytes in %s but rank %d expected "
                                  "%zu (kind %u)",
                                  p, (unsigned long long)len, what, t->me, o->r->len, (unsigned)s->kind);
    }
    o->kind = s->kind;
    o->addr = s->addr;
    o->map = NULL;
    o->started = 1;
    return s->kind == SHM_LARGE && s->mem_id ? shm_recv_map(t, o, s) : 0;
}

/* dst = data, or dst = src (op) data, for the n bytes at the op's current offset. */
static void shm_deliver(const shm_rop *o, const void *data, size_t n) {
    if (n == 0) return;
    unsigned char *dst = (unsigned char *)o->r->dst + o->off;
    if (!o->r->src)
        memcpy(dst, data, n);
    else
        tally__reduce(dst, (const unsigned char *)o->r->src + o->off, data, n / o->esize, o->r->dtype, o->r->op);
}

/* Hands a slot back to its sender. */
static void shm_release(shm_tp *t, int p) {
    t->rx[p]++;
    atomic_store_explicit(shm_consumed(t, p, t->me), t->rx[p], memory_order_release);
    tally__shm_wake(t, p);
}

/* Reads n bytes at addr in rank p into dst; a failed read is a lost peer or a protocol error. */
static int shm_cma_read(shm_tp *t, int p, void *dst, uint64_t addr, size_t n) {
    unsigned char *d = dst;
    while (n > 0) {
        struct iovec l = {d, n}, r = {(void *)(uintptr_t)addr, n};
        ssize_t got = process_vm_readv(t->pid[p], &l, 1, &r, 1, 0);
        if (got > 0) {
            d += got;
            addr += (uint64_t)got;
            n -= (size_t)got;
            continue;
        }
        int e = got < 0 ? errno : EFAULT;
        if (e == EINTR) continue;
        if (e == ESRCH) return tally__shm_raise_lost(t, p, "reading its message");
        /* A peer being killed can briefly look like one whose buffer vanished: give its exit a moment. */
        for (int i = 0; i < 100; i++) {
            if (tally__shm_peer_dead(t, p)) return tally__shm_raise_lost(t, p, "reading its message");
            usleep(1000);
        }
        return tally__fault_raise(t->base.ctx.fault, e == EFAULT ? TALLY_E_PROTOCOL : TALLY_E_SYSTEM, p,
                                  "rank %d could not read the message rank %d posted (process_vm_readv: %s)", t->me, p,
                                  strerror(e));
    }
    return 0;
}

/* One cache-sized piece of a single-copy receive, read into scratch (it stays in L2) and then reduced
 * or copied into dst while hot. Plain receives bounce too: reading straight into dst saves no memory
 * traffic, and where the kernel's first write to a fresh user page is slow (shadow paging on VMs;
 * measured 10x on a 64 MiB receive) it would pay that on every new destination. */
static int shm_large_piece(shm_tp *t, shm_rop *o) {
    size_t left = o->r->len - o->off, n = left < SHM_PIECE ? left : SHM_PIECE;
    if (o->map) { /* in place: the mapping is the sender's buffer, no bounce needed */
        shm_deliver(o, o->map + o->off, n);
        o->off += n;
        return 0;
    }
    int rc = shm_cma_read(t, o->r->peer, t->scratch, o->addr + o->off, n);
    if (rc) return rc;
    shm_deliver(o, t->scratch, n);
    o->off += n;
    return 0;
}

/* Takes whatever has arrived for this receive. Returns 1 when something moved, 0 when nothing had
 * arrived, or a fault code. */
static int shm_recv_progress(shm_tp *t, shm_xchg *x, shm_rop *o) {
    int p = o->r->peer, moved = 0, rc;
    for (;;) {
        uint64_t k = t->rx[p];
        const shm_slot *s = shm_slot_at(t, p, t->me, k);
        if (atomic_load_explicit(&s->flag, memory_order_acquire) != (uint32_t)(k + 1)) return moved;
        if (!o->started) {
            if ((rc = shm_recv_head(t, x, o, s))) return rc;
        } else if (o->kind == SHM_SLOT && s->kind != SHM_CONT) {
            return tally__fault_raise(t->base.ctx.fault, TALLY_E_PROTOCOL, p,
                                      "rank %d: a message from rank %d "
                                      "ended early (a new one started inside it)",
                                      t->me, p);
        }
        moved = 1;
        if (o->kind == SHM_TINY) {
            shm_deliver(o, s->data, o->r->len);
            o->off = o->r->len;
        } else if (o->kind == SHM_SLOT) {
            size_t n = o->r->len - o->off < t->slot_bytes ? o->r->len - o->off : t->slot_bytes;
            shm_deliver(o, shm_slot_data(t, p, t->me, k), n);
            o->off += n;
        } else {
            if ((rc = shm_large_piece(t, o))) return rc;
            if (o->off < o->r->len) return 1; /* one piece per turn: the other ops progress meanwhile */
        }
        shm_release(t, p);
        if (o->off == o->r->len) {
            o->done = 1;
            x->left--;
            return 1;
        }
    }
}

/* ---- the exchange ----------------------------------------------------------------------------- */

static int shm_bad(shm_tp *t, const char *what, int peer) {
    return tally__seterr(TALLY_E_INVALID, "rank %d: shm exchange: %s (peer %d, world size %d)", t->me, what, peer,
                         t->n);
}

/* Rejects calls that break transport.h's rules before anything is posted. */
static int shm_validate(shm_tp *t, const tally__send *s, int ns, const tally__recv *r, int nr) {
    if (ns < 0 || nr < 0 || ns > t->n - 1 || nr > t->n - 1 || (ns && !s) || (nr && !r))
        return shm_bad(t, "bad number of sends or receives", -1);
    t->stamp += 2;
    if (t->stamp < 2) { /* wrapped: old stamps could collide with new ones */
        memset(t->mark, 0, (size_t)t->n * sizeof *t->mark);
        t->stamp = 2;
    }
    for (int i = 0; i < ns; i++) {
        int p = s[i].peer;
        if (p < 0 || p >= t->n || p == t->me) return shm_bad(t, "send to an invalid peer", p);
        if (t->mark[p] == t->stamp) return shm_bad(t, "two sends to one peer", p);
        if (s[i].len && !s[i].buf) return shm_bad(t, "send buffer is NULL", p);
        t->mark[p] = t->stamp;
    }
    for (int i = 0; i < nr; i++) {
        int p = r[i].peer;
        if (p < 0 || p >= t->n || p == t->me) return shm_bad(t, "receive from an invalid peer", p);
        if (t->mark[p] == t->stamp + 1) return shm_bad(t, "two receives from one peer", p);
        if (r[i].len && !r[i].dst) return shm_bad(t, "receive buffer is NULL", p);
        if (r[i].src && (!tally__dtype_valid((int)r[i].dtype) || !tally__op_valid((int)r[i].op) ||
                         r[i].len % tally_dtype_size(r[i].dtype)))
            return shm_bad(t, "reducing receive with a bad dtype, op or length", p);
        t->mark[p] = t->stamp + 1;
    }
    return 0;
}

static int shm_progress(shm_tp *t, shm_xchg *x, const tally__send *s, int ns, const tally__recv *r, int nr) {
    int rc;
    for (int i = 0; i < ns; i++) shm_send_begin(t, &t->sop[i], &s[i]);
    for (int i = 0; i < nr; i++) shm_recv_begin(&t->rop[i], &r[i]);
    while (x->left > 0) {
        int moved = 0;
        for (int i = 0; i < ns; i++)
            if (!t->sop[i].done) moved |= shm_send_progress(t, x, &t->sop[i]);
        for (int i = 0; i < nr; i++) {
            if (t->rop[i].done) continue;
            if ((rc = shm_recv_progress(t, x, &t->rop[i])) < 0) return rc;
            moved |= rc;
        }
        if (moved) {
            x->idle_since = 0;
        } else if ((rc = tally__shm_idle(x))) {
            return rc;
        }
    }
    return 0;
}

static int shm_exchange(shm_tp *t, const tally__send *s, int ns, const tally__recv *r, int nr) {
    int rc = tally__fault_check(t->base.ctx.fault);
    if (rc || (rc = shm_validate(t, s, ns, r, nr))) return rc;
    shm_xchg x = {.t = t,
                  .ns = ns,
                  .nr = nr,
                  .left = ns + nr,
                  .hash = tally__shm_sighash(t->base.ctx.sig),
                  .t_start = tally__now_ns(),
                  .waiting_on = -1};
    tally__shm_note_cpu(t); /* before a peer may wait on us: it yields when we share its CPU */
    rc = shm_progress(t, &x, s, ns, r, nr);
    /* After a failure the record stays: peers that time out a moment later still see whom we waited for. */
    if (!rc) tally__shm_unwait(&x);
    return rc;
}

/* Leaves our first fault in the segment for the peers (see shm_fault_rec). */
void tally__shm_publish(shm_tp *t) {
    tally__fault *f = t->base.ctx.fault;
    int code = atomic_load_explicit(&f->code, memory_order_acquire);
    if (t->published || code == 0) return;
    shm_fault_rec *rec = &t->rec[t->me];
    rec->culprit = f->culprit;
    snprintf(rec->msg, sizeof rec->msg, "%s", f->msg);
    atomic_store_explicit(&rec->code, code, memory_order_release);
    t->published = 1;
    for (int p = 0; p < t->n; p++)
        if (p != t->me) tally__shm_wake(t, p);
}

int tally__shm_exchange(tally__tp *tp, const tally__send *s, int ns, const tally__recv *r, int nr) {
    shm_tp *t = (shm_tp *)tp;
    int rc = shm_exchange(t, s, ns, r, nr);
    if (rc) tally__shm_publish(t);
    return rc;
}
