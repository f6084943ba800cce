/* shm_cpu.c - where the ranks of a segment run: each publishes its CPU, a waiter whose awaited peer
 * shares its CPU yields instead of spinning, and if they stay together it moves to a CPU nobody uses. */
#include <sched.h>

#include "../core/clock.h"
#include "../core/cpus.h"
#include "../core/log.h"
#include "shm.h"

void tally__shm_note_cpu(shm_tp *t) {
    uint32_t v = tally__cpus_current();
    if (v == t->mycpu) return; /* a store only on a move: the line stays shared in the readers' caches */
    t->mycpu = v;
    atomic_store_explicit(&t->oncpu[t->me].v, v, memory_order_relaxed);
}

static uint32_t shm_cpu_of(const shm_tp *t, int r) {
    return atomic_load_explicit(&t->oncpu[r].v, memory_order_relaxed);
}

/* The lowest-numbered pending peer of this exchange on our CPU, or -1. Four looks at most: a wide
 * exchange pays no more per spin than a ring step. */
static int shm_peer_here(const shm_xchg *x) {
    const shm_tp *t = x->t;
    int looked = 0, found = -1;
    for (int i = 0; i < x->nr && looked < 4; i++) {
        if (t->rop[i].done) continue;
        looked++;
        int p = t->rop[i].r->peer;
        if (shm_cpu_of(t, p) == t->mycpu && (found < 0 || p < found)) found = p;
    }
    for (int i = 0; i < x->ns && looked < 4; i++) {
        if (t->sop[i].done) continue;
        looked++;
        int p = t->sop[i].peer;
        if (shm_cpu_of(t, p) == t->mycpu && (found < 0 || p < found)) found = p;
    }
    return found;
}

/* Nothing happens when every CPU of our set has a rank, as with more ranks than CPUs. */
static void shm_move_off(shm_tp *t) {
    cpu_set_t used;
    CPU_ZERO(&used);
    for (int r = 0; r < t->n; r++) {
        uint32_t c = shm_cpu_of(t, r);
        if (c && c - 1 < CPU_SETSIZE) CPU_SET(c - 1, &used);
    }
    unsigned was = t->mycpu - 1;
    int to = tally__cpus_move_off(&used, t->me);
    if (to < 0) return;
    tally__log_debug(1, "shm: rank %d shared CPU %u with a peer it waits for; moved to CPU %d", t->me, was, to);
    tally__shm_note_cpu(t);
}

int tally__shm_crowded(shm_xchg *x) {
    shm_tp *t = x->t;
    if (!t->mycpu) return 0;
    int p = shm_peer_here(x);
    if (p < 0) return 0;
    /* Of two ranks on one CPU the higher one moves, so they do not both land on the same free CPU. */
    if (tally__crowding_yield(&t->crowding, tally__now_ns()) && p < t->me) shm_move_off(t);
    return 1;
}
