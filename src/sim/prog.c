/* prog.c - the programs the event level plays: each rank's lanes of steps, built from traced schedules
 * with their peers mapped to world ranks, and every pair's messages numbered in order (FIFO matching). */
#include <stdlib.h>
#include <string.h>

#include "../core/err.h"
#include "sim_int.h"

int tally__sim_prog_init(tally__sim_prog *p, int n) {
    memset(p, 0, sizeof *p);
    p->n = n;
    if (!(p->lane = calloc((size_t)n * TALLY__SIM_LANES, sizeof *p->lane)))
        return tally__seterr(TALLY_E_NOMEM, "sim: out of memory for the programs of %d ranks", n);
    return 0;
}

void tally__sim_prog_free(tally__sim_prog *p) {
    if (p->lane)
        for (long i = 0; i < (long)p->n * TALLY__SIM_LANES; i++) free(p->lane[i].step);
    free(p->lane);
    free(p->msg);
    memset(p, 0, sizeof *p);
}

int tally__sim_grow(void **buf, long *cap, long need, size_t each) {
    if (need <= *cap) return 0;
    long c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*buf, (size_t)c * each);
    if (!q) return -1;
    *buf = q;
    *cap = c;
    return 0;
}

long tally__sim_prog_append(tally__sim_prog *p, int rank, int lane, const tally__sim_sched *s, int map_base,
                            int map_stride, int dep_lane, long dep_step, double lead) {
    tally__sim_lane *l = &p->lane[(size_t)rank * TALLY__SIM_LANES + lane];
    if (s->nstep == 0) return -1;
    if (tally__sim_grow((void **)&l->step, &l->cap, l->nstep + s->nstep, sizeof *l->step) ||
        tally__sim_grow((void **)&p->msg, &p->cap, p->nmsg + s->nmsg, sizeof *p->msg)) {
        tally__seterr(TALLY_E_NOMEM, "sim: out of memory for a program of %ld messages", p->nmsg + s->nmsg);
        return -2;
    }
    for (long k = 0; k < s->nstep; k++) {
        tally__sim_pstep *st = &l->step[l->nstep++];
        *st = (tally__sim_pstep){.first = p->nmsg, .count = s->first[k + 1] - s->first[k], .dep_lane = -1};
        if (k == 0 && dep_lane >= 0) st->dep_lane = dep_lane, st->dep_step = dep_step;
        if (k == 0) st->compute = lead;
        for (int m = s->first[k]; m < s->first[k + 1]; m++) {
            const tally__sim_msg *x = &s->msg[m];
            p->msg[p->nmsg++] = (tally__sim_pmsg){
                .peer = map_base + x->peer * map_stride, .send = x->send, .reduce = x->reduce, .bytes = x->bytes};
        }
    }
    return l->nstep - 1;
}

/* Each rank numbers its sends per receiver and its receives per sender; lanes of a rank never share a
 * peer (hier's host lane talks in the host, its other lane across hosts), so lane order is the order. */
int tally__sim_prog_seal(tally__sim_prog *p) {
    uint32_t *sent = calloc((size_t)p->n, sizeof *sent), *got = calloc((size_t)p->n, sizeof *got);
    if (!sent || !got) {
        free(sent);
        free(got);
        return tally__seterr(TALLY_E_NOMEM, "sim: out of memory numbering the messages of %d ranks", p->n);
    }
    for (int r = 0; r < p->n; r++) {
        long touched = 0;
        for (int ln = 0; ln < TALLY__SIM_LANES; ln++) {
            const tally__sim_lane *l = &p->lane[(size_t)r * TALLY__SIM_LANES + ln];
            for (long k = 0; k < l->nstep; k++)
                for (long m = l->step[k].first; m < l->step[k].first + l->step[k].count; m++, touched++) {
                    tally__sim_pmsg *x = &p->msg[m];
                    x->seq = x->send ? sent[x->peer]++ : got[x->peer]++;
                }
        }
        if (touched) { /* reset only what this rank used: a world of many ranks has few peers each */
            for (int ln = 0; ln < TALLY__SIM_LANES; ln++) {
                const tally__sim_lane *l = &p->lane[(size_t)r * TALLY__SIM_LANES + ln];
                for (long k = 0; k < l->nstep; k++)
                    for (long m = l->step[k].first; m < l->step[k].first + l->step[k].count; m++)
                        sent[p->msg[m].peer] = got[p->msg[m].peer] = 0;
            }
        }
    }
    free(sent);
    free(got);
    return 0;
}
