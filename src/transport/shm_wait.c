/* shm_wait.c - how the shared-memory transport waits: spin briefly (or yield at once to an awaited peer
 * on our CPU), yield, then sleep on a futex; and in that slow path check faults, deadline, peers. */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../core/clock.h"
#include "shm.h"

#define SHM_SLEEP_NS 1000000 /* longest futex nap: bounds how late a fault or a death is noticed */

static inline void shm_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Not FUTEX_PRIVATE: the word lives in memory shared between processes. */
static void shm_futex_wait(_Atomic uint32_t *w, uint32_t seen, long ns) {
    struct timespec ts = {0, ns};
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, seen, &ts, NULL, 0);
}

static void shm_futex_wake(_Atomic uint32_t *w) {
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

void tally__shm_wake(shm_tp *t, int r) {
    /* Pairs with the fence in shm_sleep: either we see the sleeper's flag, or it sees our data. */
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&t->sleeping[r].v, memory_order_relaxed)) {
        atomic_fetch_add_explicit(&t->bell[r].v, 1, memory_order_relaxed);
        shm_futex_wake(&t->bell[r].v);
    }
}

int tally__shm_peer_dead(shm_tp *t, int r) {
    if (t->pidfd[r] >= 0) {
        struct pollfd p = {.fd = t->pidfd[r], .events = POLLIN};
        return poll(&p, 1, 0) > 0; /* a pidfd polls readable once the process has exited */
    }
    return t->liveness && t->pid[r] > 0 && kill(t->pid[r], 0) < 0 && errno == ESRCH;
}

int tally__shm_adopt(shm_tp *t, int r) {
    for (int p = r < 0 ? 0 : r; p < (r < 0 ? t->n : r + 1); p++) {
        const shm_fault_rec *rec = &t->rec[p];
        int code = p == t->me ? 0 : atomic_load_explicit(&rec->code, memory_order_acquire);
        if (code == 0) continue;
        tally__fault_adopt(t->base.ctx.fault, code, rec->culprit, rec->msg);
        return tally__fault_check(t->base.ctx.fault);
    }
    return 0;
}

int tally__shm_raise_lost(shm_tp *t, int r, const char *doing) {
    char what[160];
    int rc = tally__shm_adopt(t, r); /* it stopped after a fault of its own: that fault is the news */
    if (rc) return rc;
    tally__sig_format(t->base.ctx.sig, what, sizeof what);
    int cause = tally__fault_await(t->base.ctx.fault, TALLY__LOST_GRACE_S);
    if (cause) return cause;
    return tally__fault_raise(t->base.ctx.fault, TALLY_E_PEER_LOST, r,
                              "rank %d (pid %d) died while rank %d was %s in %s", r, t->pid[r], t->me, doing, what);
}

int tally__shm_sig_fault(shm_tp *t, int p, const shm_slot *s) {
    tally__sig theirs = s->sig;
    const tally__sig *mine = t->base.ctx.sig;
    char a[160], b[160];
    tally__sig_format(&theirs, a, sizeof a);
    tally__sig_format(mine, b, sizeof b);
    tally__fault *f = t->base.ctx.fault;
    if (tally__sig_equal(&theirs, mine))
        return tally__fault_raise(f, TALLY_E_PROTOCOL, p,
                                  "rank %d: the message from rank %d in %s has a corrupt "
                                  "fingerprint",
                                  t->me, p, b);
    if (theirs.seq != mine->seq)
        return tally__fault_raise(f, TALLY_E_MISMATCH, p,
                                  "collective mismatch: rank %d sent a message of %s to "
                                  "rank %d, which is in %s (the ranks called different sequences of collectives)",
                                  p, a, t->me, b);
    /* The lower rank first, so every detector words the same mismatch the same way. */
    if (p < t->me)
        return tally__fault_raise(f, TALLY_E_MISMATCH, p,
                                  "collective mismatch: rank %d called %s but rank %d "
                                  "called %s",
                                  p, a, t->me, b);
    return tally__fault_raise(f, TALLY_E_MISMATCH, p, "collective mismatch: rank %d called %s but rank %d called %s",
                              t->me, b, p, a);
}

/* 1 if a pending operation can move now: the condition a sleeper rechecks after announcing itself. */
static int shm_ready(const shm_xchg *x) {
    shm_tp *t = x->t;
    for (int i = 0; i < x->nr; i++) {
        const shm_rop *o = &t->rop[i];
        int p = o->r->peer;
        if (o->done) continue;
        const shm_slot *s = shm_slot_at(t, p, t->me, t->rx[p]);
        if (atomic_load_explicit(&s->flag, memory_order_acquire) == (uint32_t)(t->rx[p] + 1)) return 1;
    }
    for (int i = 0; i < x->ns; i++) {
        const shm_sop *o = &t->sop[i];
        if (!o->done &&
            atomic_load_explicit(shm_consumed(t, t->me, o->peer), memory_order_acquire) != t->tx_free[o->peer])
            return 1;
    }
    return 0;
}

/* Sleeps on this rank's bell until a peer rings it or SHM_SLEEP_NS passes. */
static void shm_sleep(const shm_xchg *x) {
    shm_tp *t = x->t;
    _Atomic uint32_t *bell = &t->bell[t->me].v;
    uint32_t seen = atomic_load_explicit(bell, memory_order_relaxed);
    atomic_store_explicit(&t->sleeping[t->me].v, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    if (!shm_ready(x)) shm_futex_wait(bell, seen, SHM_SLEEP_NS);
    atomic_store_explicit(&t->sleeping[t->me].v, 0, memory_order_relaxed);
}

/* Which peer this exchange waits on and for what, for the timeout message. */
static int shm_awaited(const shm_xchg *x, const char **what, const char **dir) {
    shm_tp *t = x->t;
    *dir = "to";
    for (int i = 0; i < x->nr; i++)
        if (!t->rop[i].done) {
            *what = t->rop[i].started ? "did not send the rest of its part of" : "did not send its part of";
            return t->rop[i].r->peer;
        }
    for (int i = 0; i < x->ns; i++)
        if (!t->sop[i].done) {
            *what = "did not receive its part of";
            *dir = "from";
            return t->sop[i].peer;
        }
    *what = "did not take part in";
    return -1;
}

/* tally__stall's view of rank r: whom its wait record names, if it is still waiting. */
static int shm_awaits(void *arg, int r, uint64_t *seq) {
    const shm_tp *t = arg;
    const shm_wait_rec *w = &t->wait[r];
    uint64_t beat = atomic_load_explicit(&w->beat_ns, memory_order_acquire), now = tally__now_ns();
    if (beat > now || (double)(now - beat) * 1e-9 > TALLY__STALL_FRESH * t->base.ctx.timeout_s) return -1;
    *seq = atomic_load_explicit(&w->seq, memory_order_relaxed);
    return atomic_load_explicit(&w->peer, memory_order_relaxed);
}

/* Rank r waits over tcp in a shm+tcp world (it said so within the freshness bound). */
static int shm_hidden(void *arg, int r) {
    uint64_t seq;
    return shm_awaits(arg, r, &seq) == SHM_WAIT_ELSEWHERE;
}

void tally__shm_wait_elsewhere(tally__tp *tp, int elsewhere, uint64_t seq) {
    shm_tp *t = (shm_tp *)tp;
    shm_wait_rec *w = &t->wait[t->me];
    if (!elsewhere) {
        int32_t was = SHM_WAIT_ELSEWHERE; /* a wait of the shm half itself is left as it is */
        atomic_compare_exchange_strong_explicit(&w->peer, &was, -1, memory_order_relaxed, memory_order_relaxed);
        return;
    }
    atomic_store_explicit(&w->seq, seq, memory_order_relaxed);
    atomic_store_explicit(&w->peer, SHM_WAIT_ELSEWHERE, memory_order_relaxed);
    atomic_store_explicit(&w->beat_ns, tally__now_ns(), memory_order_release);
}

static int shm_timeout(const shm_xchg *x) {
    shm_tp *t = x->t;
    const char *what, *dir;
    char coll[160], detail[300];
    int p = shm_awaited(x, &what, &dir);
    tally__sig_format(t->base.ctx.sig, coll, sizeof coll);
    snprintf(detail, sizeof detail, "%s %s %s rank %d", what, coll, dir, t->me);
    tally__stall s = {.me = t->me,
                      .awaited = p,
                      .size = t->n,
                      .timeout_s = t->base.ctx.timeout_s,
                      .sig = t->base.ctx.sig,
                      .detail = detail,
                      .awaits = shm_awaits,
                      .hidden = shm_hidden,
                      .arg = t};
    return tally__stall_raise(t->base.ctx.fault, &s);
}

/* Says whom we wait for, and that we are still alive and waiting (peers read it when they time out). */
static void shm_beat(shm_xchg *x, uint64_t now) {
    shm_tp *t = x->t;
    shm_wait_rec *w = &t->wait[t->me];
    const char *what, *dir;
    int p = shm_awaited(x, &what, &dir);
    if (p != x->waiting_on) {
        atomic_store_explicit(&w->seq, t->base.ctx.sig->seq, memory_order_relaxed);
        atomic_store_explicit(&w->peer, p, memory_order_relaxed);
        x->waiting_on = p;
        if (p >= 0 && t->base.ctx.awaited) atomic_store_explicit(t->base.ctx.awaited, p, memory_order_relaxed);
    }
    atomic_store_explicit(&w->beat_ns, now, memory_order_release);
}

void tally__shm_unwait(shm_xchg *x) {
    if (x->waiting_on < 0) return;
    atomic_store_explicit(&x->t->wait[x->t->me].peer, -1, memory_order_relaxed);
    x->waiting_on = -1;
}

/* A dead peer this exchange depends on fails it now, without waiting for the timeout. */
static int shm_check_peers(const shm_xchg *x) {
    shm_tp *t = x->t;
    for (int i = 0; i < x->nr; i++)
        if (!t->rop[i].done && tally__shm_peer_dead(t, t->rop[i].r->peer))
            return tally__shm_raise_lost(t, t->rop[i].r->peer, "waiting for its message");
    for (int i = 0; i < x->ns; i++)
        if (!t->sop[i].done && tally__shm_peer_dead(t, t->sop[i].peer))
            return tally__shm_raise_lost(t, t->sop[i].peer, "sending to it");
    return 0;
}

/* A peer we are not waiting on may have sent us a message of this collective with another fingerprint
 * (say it runs another algorithm, so the awaited peer never sends): that is the real error. */
static int shm_scan_mismatch(const shm_xchg *x) {
    shm_tp *t = x->t;
    for (int p = 0; p < t->n; p++) {
        if (p == t->me) continue;
        int busy = 0;
        for (int i = 0; i < x->nr; i++) busy |= t->rop[i].r->peer == p && t->rop[i].started && !t->rop[i].done;
        if (busy) continue; /* the slot there is the middle of a message we are taking */
        const shm_slot *s = shm_slot_at(t, p, t->me, t->rx[p]);
        if (atomic_load_explicit(&s->flag, memory_order_acquire) != (uint32_t)(t->rx[p] + 1)) continue;
        if (s->kind == SHM_CONT || s->sighash == x->hash) continue;
        if (s->sig.seq == t->base.ctx.sig->seq) return tally__shm_sig_fault(t, p, s);
    }
    return 0;
}

int tally__shm_idle(shm_xchg *x) {
    shm_tp *t = x->t;
    int rc = tally__fault_check(t->base.ctx.fault);
    if (rc) return rc;
    uint64_t now = tally__now_ns();
    if (!x->idle_since) x->idle_since = now;
    uint64_t idle = now - x->idle_since;
    if (idle < t->yield_ns) {
        tally__shm_note_cpu(t);
        if (idle >= t->spin_ns || tally__shm_crowded(x)) {
            sched_yield();
            return 0;
        }
        for (int i = 0; i < 8; i++) shm_pause();
        return 0;
    }
    if ((double)(now - x->t_start) * 1e-9 > t->base.ctx.timeout_s) return shm_timeout(x);
    if ((rc = tally__shm_adopt(t, -1)) || (rc = shm_check_peers(x)) || (rc = shm_scan_mismatch(x))) return rc;
    shm_beat(x, now);
    shm_sleep(x);
    return 0;
}
