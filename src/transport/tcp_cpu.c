/* tcp_cpu.c - where the tcp transport's local peers run: each message says the CPU it was sent from, a
 * waiter whose awaited peer shares its CPU yields instead of spinning, and moves if they stay together. */
#include <sched.h>

#include "../core/clock.h"
#include "../core/cpus.h"
#include "../core/log.h"
#include "tcp_int.h"

/* Every CPU a local peer last sent from, and ours: the ones a move must avoid. */
static void tcp_move_off(tally__tcp_tp *t) {
    cpu_set_t used;
    CPU_ZERO(&used);
    for (int p = 0; p < t->base.ctx.size; p++) {
        uint32_t c = p == t->base.ctx.rank ? t->mycpu : t->conns[p].local ? t->conns[p].cpu : 0;
        if (c && c - 1 < CPU_SETSIZE) CPU_SET(c - 1, &used);
    }
    int to = tally__cpus_move_off(&used, t->base.ctx.rank);
    if (to < 0) return;
    tally__log_debug(1, "tcp: rank %d shared CPU %u with a peer it waits for; moved to CPU %d", t->base.ctx.rank,
                     t->mycpu - 1, to);
    t->mycpu = tally__cpus_current();
}

int tally__tcp_peer_here(tally__tcp_tp *t, int peer) {
    const tally__tcp_conn *c = &t->conns[peer];
    if (!t->mycpu || !c->local || c->cpu != t->mycpu) return 0;
    /* Of two ranks on one CPU the higher one moves, so they do not both land on the same free CPU. */
    if (tally__crowding_yield(&t->crowding, tally__now_ns()) && peer < t->base.ctx.rank) tcp_move_off(t);
    return 1;
}
