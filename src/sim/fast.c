/* fast.c - the symmetric fast path: when every rank of a level runs the same schedule up to a shift (ring:
 * each sends to rank + d) or an xor (recursive halving: rank ^ d), a step's flows are one pattern, whose
 * link loads are counted once over the world; each step then takes its slowest flow's time, as the
 * event level would with every rank in lock step. Checked against the event level in test_sim. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/err.h"
#include "sim_int.h"

#define MAX_SENDS 4 /* per step, in the patterns the fast path takes */
#define CACHE     64

typedef struct pattern {
    int kind, nd, d[MAX_SENDS], reduce; /* kind: 0 shift, 1 xor */
    int has_shm, has_net;
    double shm_rate, net_rate;     /* bytes/s of the slowest flow inside a host, and between hosts */
    int shm_id, net_id;            /* the link that holds each (kind x hosts + at), -1 its own cap */
    double most[TALLY__SIM_KINDS]; /* per byte of the step, what its busiest link of each kind carried */
    int most_at[TALLY__SIM_KINDS];
} pattern;

typedef struct fast {
    const tally__sim_cluster *c;
    const tally__sim_level *lv;
    int H, L;
    double *load[TALLY__SIM_KINDS]; /* flows on each NIC and uplink; core-seconds per byte on each CPU */
    pattern cache[CACHE];
    int ncache;
} fast;

static int world(const tally__sim_level *lv, int k, int i) { return k * lv->stride_k + i * lv->stride_i; }

static int sizes(const fast *f, int kind) { return kind >= TALLY__SIM_UP ? f->L : f->H; }

/* Visits every flow of the pattern: fn(f, p, src_host, dst_host, arg). */
typedef void (*visit_fn)(fast *f, pattern *p, int hs, int hd, void *arg);
static void each_flow(fast *f, pattern *p, visit_fn fn, void *arg) {
    const tally__sim_level *lv = f->lv;
    for (int i = 0; i < lv->copies; i++)
        for (int k = 0; k < lv->n; k++)
            for (int j = 0; j < p->nd; j++) {
                int q = p->kind == 0 ? (k + p->d[j]) % lv->n : k ^ p->d[j];
                if (q < lv->n)
                    fn(f, p, tally__sim_host(f->c, world(lv, k, i)), tally__sim_host(f->c, world(lv, q, i)), arg);
            }
}

static double red_of(const fast *f, const pattern *p) { return p->reduce ? f->c->shm.gamma : 0; }

static void count_one(fast *f, pattern *p, int hs, int hd, void *arg) {
    const tally__sim_cluster *c = f->c;
    double red = red_of(f, p);
    if (hs == hd) {
        f->load[TALLY__SIM_CPU][tally__sim_cpu_of(c, hd)] += c->shm.beta + red;
        return;
    }
    f->load[TALLY__SIM_NIC_TX][hs]++;
    f->load[TALLY__SIM_NIC_RX][hd]++;
    int ls = tally__sim_leaf(c, hs), ld = tally__sim_leaf(c, hd);
    if (ls != ld) f->load[TALLY__SIM_UP][ls]++, f->load[TALLY__SIM_DOWN][ld]++;
    f->load[TALLY__SIM_CPU][tally__sim_cpu_of(c, hs)] += c->tcp_cpu;
    f->load[TALLY__SIM_CPU][tally__sim_cpu_of(c, hd)] += c->tcp_cpu + red;
}

/* A flow's rate if every flow rises alike: its tightest link's capacity over the weight on it. */
static void rate_one(fast *f, pattern *p, int hs, int hd, void *arg) {
    const tally__sim_cluster *c = f->c;
    double red = red_of(f, p), cores = tally__sim_cores(c), best;
    int at;
    (void)arg;
    if (hs == hd) {
        int cpu = tally__sim_cpu_of(c, hd);
        best = 1.0 / (c->shm.beta + red), at = -1;
        double r = cores / f->load[TALLY__SIM_CPU][cpu];
        if (r < best) best = r, at = TALLY__SIM_CPU * f->H + cpu;
        p->has_shm = 1;
        if (best < p->shm_rate) p->shm_rate = best, p->shm_id = at;
        return;
    }
    double w = fmax(c->tcp_cpu, c->tcp_cpu + red);
    best = w > 0 ? 1.0 / w : HUGE_VAL, at = -1;
    int ls = tally__sim_leaf(c, hs), ld = tally__sim_leaf(c, hd);
    struct {
        int kind, at;
    } on[6] = {{TALLY__SIM_NIC_TX, hs},
               {TALLY__SIM_NIC_RX, hd},
               {TALLY__SIM_UP, ls},
               {TALLY__SIM_DOWN, ld},
               {TALLY__SIM_CPU, tally__sim_cpu_of(c, hs)},
               {TALLY__SIM_CPU, tally__sim_cpu_of(c, hd)}};
    for (int k = 0; k < 6; k++) {
        if (k >= 2 && k < 4 && ls == ld) continue;
        double load = f->load[on[k].kind][on[k].at];
        if (load <= 0) continue;
        double r = tally__sim_capacity(c, on[k].kind) / load;
        if (r < best) best = r, at = on[k].kind * f->H + on[k].at;
    }
    p->has_net = 1;
    if (best < p->net_rate) p->net_rate = best, p->net_id = at;
}

static void count_pattern(fast *f, pattern *p) {
    for (int k = 0; k < TALLY__SIM_KINDS; k++) memset(f->load[k], 0, (size_t)sizes(f, k) * sizeof *f->load[k]);
    each_flow(f, p, count_one, NULL);
    p->shm_rate = p->net_rate = HUGE_VAL;
    p->shm_id = p->net_id = -1;
    p->has_shm = p->has_net = 0;
    each_flow(f, p, rate_one, NULL);
    for (int kind = 0; kind < TALLY__SIM_KINDS; kind++) {
        p->most[kind] = 0;
        p->most_at[kind] = -1;
        for (int at = 0; at < sizes(f, kind); at++)
            if (f->load[kind][at] > p->most[kind]) p->most[kind] = f->load[kind][at], p->most_at[kind] = at;
    }
}

static pattern *pattern_of(fast *f, int kind, const int *d, int nd, int reduce) {
    for (int i = 0; i < f->ncache; i++) {
        pattern *p = &f->cache[i];
        if (p->kind == kind && p->nd == nd && p->reduce == reduce && !memcmp(p->d, d, (size_t)nd * sizeof *d)) return p;
    }
    pattern *p = &f->cache[f->ncache < CACHE ? f->ncache++ : CACHE - 1];
    *p = (pattern){.kind = kind, .nd = nd, .reduce = reduce};
    memcpy(p->d, d, (size_t)nd * sizeof *d);
    count_pattern(f, p);
    return p;
}

/* Whether sample rank k's schedule is rank 0's moved by a shift (kind 0) or an xor (kind 1). */
static int same_shape(const tally__sim_sched *a, const tally__sim_sched *b, int k, int n, int kind) {
    if (a->nstep != b->nstep) return 0;
    for (long s = 0; s < a->nstep; s++) {
        if (a->first[s + 1] - a->first[s] != b->first[s + 1] - b->first[s]) return 0;
        for (int m = a->first[s], o = b->first[s]; m < a->first[s + 1]; m++, o++) {
            const tally__sim_msg *x = &a->msg[m], *y = &b->msg[o];
            int want = kind == 0 ? (x->peer + k) % n : x->peer ^ k;
            if (x->send != y->send || y->peer != want) return 0;
        }
    }
    return 1;
}

typedef struct samples {
    tally__sim_sched s[5];
    int rank[5], ns;
} samples;

static int take_samples(samples *sm, int algo, int coll, int n, size_t bytes, tally_dtype t) {
    int want[5] = {0, 1, n / 3, n / 2, n - 1};
    sm->ns = 0;
    for (int i = 0; i < 5; i++) {
        int dup = 0;
        for (int j = 0; j < sm->ns; j++) dup |= sm->rank[j] == want[i];
        if (dup || want[i] >= n) continue;
        int rc = tally__sim_trace(algo, coll, want[i], n, bytes, t, 0, &sm->s[sm->ns]);
        if (rc) return rc;
        sm->rank[sm->ns++] = want[i];
    }
    return 0;
}

static int kind_of(const samples *sm, int n) {
    for (int kind = 0; kind < 2; kind++) {
        int ok = 1;
        for (int i = 1; i < sm->ns && ok; i++) ok = same_shape(&sm->s[0], &sm->s[i], sm->rank[i], n, kind);
        if (ok) return kind;
    }
    return -1;
}

/* A step's time: its slowest flow, shm or between hosts, with the latency of its link. */
static double step_time(const fast *f, const pattern *p, double bytes, tally__sim_result *r, double *by_link) {
    const tally__sim_cluster *c = f->c;
    double t_shm = 0, t_net = 0;
    if (p->has_shm) t_shm = tally__sim_shm_time(c, bytes * (c->shm.beta + red_of(f, p)), bytes / p->shm_rate);
    if (p->has_net) t_net = tally__sim_net_alpha(c) + bytes / p->net_rate;
    for (int kind = 0; kind < TALLY__SIM_KINDS; kind++)
        if (p->most_at[kind] >= 0) {
            r->util[kind] += p->most[kind] * bytes / tally__sim_capacity(c, kind);
            r->util_at[kind] = p->most_at[kind];
        }
    double t = fmax(t_shm, t_net);
    int id = t_net >= t_shm ? p->net_id : p->shm_id;
    if (by_link && id >= 0) by_link[id] += t;
    return t;
}

static int play(fast *f, const samples *sm, int kind, double *seconds, tally__sim_result *r, double *by_link) {
    const tally__sim_sched *s0 = &sm->s[0];
    double total = 0;
    for (long s = 0; s < s0->nstep; s++) {
        int d[MAX_SENDS], nd = 0, reduce = 0, any = 0;
        double bytes = 0;
        for (int m = s0->first[s]; m < s0->first[s + 1]; m++) {
            const tally__sim_msg *x = &s0->msg[m];
            any = 1;
            if (!x->send) continue;
            if (nd == MAX_SENDS)
                return tally__seterr(TALLY_E_INVALID, "sim: a step sends to more than %d peers", MAX_SENDS);
            d[nd++] = x->peer; /* rank 0's peer is the shift and the xor alike */
        }
        for (int i = 0; i < sm->ns; i++)
            for (int m = sm->s[i].first[s]; m < sm->s[i].first[s + 1]; m++) {
                const tally__sim_msg *x = &sm->s[i].msg[m];
                reduce |= x->reduce;
                if ((double)x->bytes > bytes) bytes = (double)x->bytes;
            }
        if (!any) continue;
        if (!nd) /* rank 0 only receives here: its peers' sends make the pattern */
            for (int m = s0->first[s]; m < s0->first[s + 1] && nd < MAX_SENDS; m++)
                d[nd++] = kind == 0 ? (f->lv->n - s0->msg[m].peer) % f->lv->n : s0->msg[m].peer;
        total += step_time(f, pattern_of(f, kind, d, nd, reduce), bytes, r, by_link);
    }
    *seconds = total;
    r->steps += s0->nstep;
    r->messages += s0->nmsg * (long)f->lv->n * f->lv->copies / 2;
    return 0;
}

int tally__sim_fast(const tally__sim_cluster *c, const tally__sim_level *lv, int algo, int coll, size_t bytes,
                    tally_dtype t, double *seconds, tally__sim_result *r) {
    fast f = {.c = c, .lv = lv, .H = c->hosts, .L = tally__sim_leaves(c)};
    samples sm = {0};
    double *by_link = calloc((size_t)TALLY__SIM_KINDS * (size_t)(f.H > f.L ? f.H : f.L), sizeof *by_link);
    int rc = by_link ? 0 : tally__seterr(TALLY_E_NOMEM, "sim: out of memory for %d hosts", c->hosts);
    for (int k = 0; k < TALLY__SIM_KINDS && !rc; k++)
        if (!(f.load[k] = malloc((size_t)sizes(&f, k) * sizeof *f.load[k])))
            rc = tally__seterr(TALLY_E_NOMEM, "sim: out of memory for %d hosts", c->hosts);
    if (!rc) rc = take_samples(&sm, algo, coll, lv->n, bytes, t);
    int kind = rc ? -1 : kind_of(&sm, lv->n);
    if (!rc && kind < 0)
        rc = tally__seterr(TALLY_E_INVALID,
                           "sim: %s's schedule on %d ranks differs from rank to rank, so the fast path cannot take it",
                           tally__algo_name(algo), lv->n);
    if (!rc) rc = play(&f, &sm, kind, seconds, r, by_link);
    if (!rc) { /* the link that held the steps longest */
        double top = 0;
        for (int i = 0; i < TALLY__SIM_KINDS * (f.H > f.L ? f.H : f.L); i++)
            if (by_link[i] > top) top = by_link[i], r->crit_kind = i / f.H, r->crit_at = i % f.H;
        r->crit_link_share = *seconds > 0 ? top / *seconds : 0;
    }
    for (int i = 0; i < sm.ns; i++) tally__sim_sched_free(&sm.s[i]);
    for (int k = 0; k < TALLY__SIM_KINDS; k++) free(f.load[k]);
    free(by_link);
    return rc;
}
