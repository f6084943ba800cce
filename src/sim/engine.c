/* engine.c - the event level: every rank's program played message by message. A message starts once both
 * sides have posted it (plus the link's latency) and flows at a max-min fair rate over the links it
 * crosses: NIC each way and leaf uplinks (bytes), and the CPUs of the hosts that copy and reduce it
 * (core-seconds: shm's copy and reduction at the receiver, tcp's stack at both ends); the critical path
 * is walked back from the step that ends last. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/err.h"
#include "sim_int.h"

typedef struct xfer {
    int src, dst, lane[2]; /* [0] the sender's lane, [1] the receiver's */
    long step[2];
    double bytes, left, rate, t_rate, t_post, t_end;
    double t_floor; /* it ends no sooner: a crowded host's wake-up (tally__sim_shm_time) */
    double cap;     /* bytes/s: one core at each end it costs CPU, or HUGE_VAL */
    int net, gate;  /* gate: which side posted last (0 sender, 1 receiver) */
    int link[6], nlink, bottleneck;
    double wt[6]; /* what a byte takes of each link: 1 of a NIC or uplink, core-seconds of a CPU */
} xfer;

typedef struct post {
    uint64_t key;
    int rank, lane, used;
    long step, msg;
    double t;
} post;

typedef struct event {
    double t;
    int type; /* 0: a step's messages are posted (rank, lane, step); 1: transfer a starts; 2: a ends */
    int a, b;
    long c;
} event;

typedef struct lane_state {
    long cur, pending, done; /* the step in progress, its unfinished messages, steps done */
    double *t_done;
    long *last; /* per step: the transfer that finished it last, -1 none */
    double *t_start;
} lane_state;

typedef struct sim {
    const tally__sim_cluster *c;
    const tally__sim_prog *p;
    lane_state *ls;
    post *tab;
    size_t tab_mask;
    event *heap;
    long nheap, cap_heap;
    xfer *x;
    long nx, cap_x;
    long *act;
    long nact;
    int nlinks;
    double *carried, *rem, *wsum;
    double now;
    long messages;
    int dirty, failed;
} sim;

static int link_id(const sim *s, int kind, int at) {
    int H = s->c->hosts, L = tally__sim_leaves(s->c);
    switch (kind) {
    case TALLY__SIM_CPU: return tally__sim_cpu_of(s->c, at); /* test hosts: one kernel's CPUs */
    case TALLY__SIM_NIC_TX: return H + at;
    case TALLY__SIM_NIC_RX: return 2 * H + at;
    case TALLY__SIM_UP: return 3 * H + at;
    default: return 3 * H + L + at;
    }
}

static void link_of(const sim *s, int id, int *kind, int *at) {
    int H = s->c->hosts, L = tally__sim_leaves(s->c);
    if (id < 3 * H)
        *kind = id / H, *at = id % H;
    else if (id < 3 * H + L)
        *kind = TALLY__SIM_UP, *at = id - 3 * H;
    else
        *kind = TALLY__SIM_DOWN, *at = id - 3 * H - L;
}

static double link_cap(const sim *s, int id) {
    int kind, at;
    link_of(s, id, &kind, &at);
    return tally__sim_capacity(s->c, kind);
}

static void add_link(xfer *x, int id, double wt) {
    for (int k = 0; k < x->nlink; k++)
        if (x->link[k] == id) { /* both ends on one pool of CPUs */
            x->wt[k] += wt;
            return;
        }
    x->link[x->nlink] = id;
    x->wt[x->nlink++] = wt;
}

/* ---- the heap of timed events ---- */

static int push(sim *s, event e) {
    if (tally__sim_grow((void **)&s->heap, &s->cap_heap, s->nheap + 1, sizeof *s->heap)) return s->failed = 1, -1;
    long i = s->nheap++;
    while (i > 0 && s->heap[(i - 1) / 2].t > e.t) {
        s->heap[i] = s->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    s->heap[i] = e;
    return 0;
}

static event pop(sim *s) {
    event top = s->heap[0], last = s->heap[--s->nheap];
    long i = 0;
    for (;;) {
        long k = 2 * i + 1;
        if (k >= s->nheap) break;
        if (k + 1 < s->nheap && s->heap[k + 1].t < s->heap[k].t) k++;
        if (s->heap[k].t >= last.t) break;
        s->heap[i] = s->heap[k];
        i = k;
    }
    if (s->nheap) s->heap[i] = last;
    return top;
}

/* ---- posts waiting for their other side ---- */

static uint64_t mix(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
}

static post *find(sim *s, uint64_t key, int insert) {
    for (size_t i = mix(key) & s->tab_mask;; i = (i + 1) & s->tab_mask) {
        post *e = &s->tab[i];
        if (e->used == 1 && e->key == key) return e;
        if (e->used == 0) return insert ? e : NULL;
    }
}

static lane_state *lane(sim *s, int rank, int ln) { return &s->ls[(size_t)rank * TALLY__SIM_LANES + ln]; }
static const tally__sim_lane *plane(const sim *s, int rank, int ln) {
    return &s->p->lane[(size_t)rank * TALLY__SIM_LANES + ln];
}

/* ---- transfers ---- */

static long new_xfer(sim *s) {
    if (tally__sim_grow((void **)&s->x, &s->cap_x, s->nx + 1, sizeof *s->x)) return s->failed = 1, -1;
    return s->nx++;
}

/* The links a message crosses and what each byte takes of them; its cap: one core at each end. */
static void route(sim *s, xfer *x, int reduce) {
    const tally__sim_cluster *c = s->c;
    int hs = tally__sim_host(c, x->src), hd = tally__sim_host(c, x->dst);
    double red = reduce ? c->shm.gamma : 0;
    x->net = hs != hd;
    x->nlink = 0;
    if (!x->net) { /* single copy: the receiver reads the sender's bytes (and reduces them) */
        add_link(x, link_id(s, TALLY__SIM_CPU, hd), c->shm.beta + red);
        x->cap = 1.0 / (c->shm.beta + red);
        return;
    }
    add_link(x, link_id(s, TALLY__SIM_NIC_TX, hs), 1);
    add_link(x, link_id(s, TALLY__SIM_NIC_RX, hd), 1);
    int ls = tally__sim_leaf(c, hs), ld = tally__sim_leaf(c, hd);
    if (ls != ld) {
        add_link(x, link_id(s, TALLY__SIM_UP, ls), 1);
        add_link(x, link_id(s, TALLY__SIM_DOWN, ld), 1);
    }
    double ws = c->tcp_cpu, wd = c->tcp_cpu + red, most = fmax(ws, wd);
    if (ws > 0) add_link(x, link_id(s, TALLY__SIM_CPU, hs), ws);
    if (wd > 0) add_link(x, link_id(s, TALLY__SIM_CPU, hd), wd);
    x->cap = most > 0 ? 1.0 / most : HUGE_VAL;
}

static void step_start(sim *s, int rank, int ln, double t);

static void finish(sim *s, long id, double t) {
    xfer *x = &s->x[id];
    x->t_end = t;
    for (int k = 0; k < x->nlink; k++) s->carried[x->link[k]] += x->bytes * x->wt[k];
    int ranks[2] = {x->src, x->dst};
    for (int side = 0; side < 2; side++) {
        lane_state *l = lane(s, ranks[side], x->lane[side]);
        l->last[x->step[side]] = id; /* transfers finish in time order: the last one written stays */
        if (--l->pending == 0) {
            l->t_done[l->cur] = t;
            l->done++;
            step_start(s, ranks[side], x->lane[side], t);
            step_start(s, ranks[side], 1 - x->lane[side], t); /* a step of the other lane may wait on this one */
        }
    }
}

/* Both sides have posted: the message starts after the link's latency. */
static void matched(sim *s, int src, int sl, long ss, int dst, int dl, long ds, const tally__sim_pmsg *m, double t_post,
                    int gate) { /* m: the receiver's side, which says whether it reduces */
    long id = new_xfer(s);
    if (id < 0) return;
    xfer *x = &s->x[id];
    *x = (xfer){.src = src,
                .dst = dst,
                .lane = {sl, dl},
                .step = {ss, ds},
                .bytes = (double)m->bytes,
                .left = (double)m->bytes,
                .t_post = t_post,
                .gate = gate,
                .bottleneck = -1};
    route(s, x, m->reduce);
    const tally__sim_cluster *c = s->c;
    s->messages++;
    x->t_floor = x->net ? 0 : t_post + tally__sim_shm_time(c, x->bytes / x->cap, 0);
    push(s, (event){.t = t_post + (x->net ? tally__sim_net_alpha(c) : c->shm.alpha), .type = 1, .a = (int)id});
}

static void post_step(sim *s, int rank, int ln, long k, double t) {
    const tally__sim_pstep *st = &plane(s, rank, ln)->step[k];
    for (long i = st->first; i < st->first + st->count; i++) {
        const tally__sim_pmsg *m = &s->p->msg[i];
        int src = m->send ? rank : m->peer, dst = m->send ? m->peer : rank;
        /* one entry per message: whichever side posts first waits here */
        uint64_t key = (((uint64_t)src * (uint64_t)s->p->n + (uint64_t)dst) << 24) ^ m->seq;
        post *e = find(s, key, 0);
        if (!e) {
            e = find(s, key, 1);
            *e = (post){.key = key, .rank = rank, .lane = ln, .step = k, .msg = i, .t = t, .used = 1};
            continue;
        }
        e->used = 2; /* a tombstone: the probe chains stay whole */
        if (m->send)
            matched(s, rank, ln, k, dst, e->lane, e->step, &s->p->msg[e->msg], t, 0);
        else
            matched(s, src, e->lane, e->step, rank, ln, k, m, t, 1);
    }
}

/* The lane's next step, when the last one is done and its dependency too. */
static void step_start(sim *s, int rank, int ln, double t) {
    lane_state *l = lane(s, rank, ln);
    const tally__sim_lane *pl = plane(s, rank, ln);
    if (l->cur + 1 >= pl->nstep || l->done <= l->cur) return; /* nothing left, or the current step runs */
    const tally__sim_pstep *st = &pl->step[l->cur + 1];
    if (st->dep_lane >= 0 && lane(s, rank, st->dep_lane)->done <= st->dep_step) return;
    l->cur++;
    l->t_start[l->cur] = t;
    l->pending = st->count;
    l->last[l->cur] = -1;
    push(s, (event){.t = t + st->compute, .type = 0, .a = rank, .b = ln, .c = l->cur});
}

static void on_post(sim *s, int rank, int ln, long k, double t) {
    lane_state *l = lane(s, rank, ln);
    if (l->pending == 0) { /* a step of compute alone */
        l->t_done[k] = t;
        l->done++;
        step_start(s, rank, ln, t);
        step_start(s, rank, 1 - ln, t);
        return;
    }
    post_step(s, rank, ln, k, t);
}

/* ---- max-min fair rates ---- */

/* Progressive filling: every unfrozen flow's rate rises alike until a link is full (what its flows take
 * of it, weighted, reaches its capacity) or a flow reaches its cap; those freeze, the rest go on. */
static void rates(sim *s) {
    for (long i = 0; i < s->nact; i++) {
        xfer *x = &s->x[s->act[i]];
        for (int k = 0; k < x->nlink; k++) s->wsum[x->link[k]] = 0, s->rem[x->link[k]] = link_cap(s, x->link[k]);
    }
    long nfree = s->nact;
    for (long i = 0; i < s->nact; i++) {
        xfer *x = &s->x[s->act[i]];
        x->left -= x->rate * (s->now - x->t_rate);
        if (x->left < 0) x->left = 0;
        x->t_rate = s->now;
        x->rate = -1;
        for (int k = 0; k < x->nlink; k++) s->wsum[x->link[k]] += x->wt[k];
    }
    while (nfree > 0) {
        double best = HUGE_VAL;
        int bl = -1;
        long bf = -1;
        for (long i = 0; i < s->nact; i++) {
            xfer *x = &s->x[s->act[i]];
            if (x->rate >= 0) continue;
            for (int k = 0; k < x->nlink; k++) {
                double share = s->rem[x->link[k]] / s->wsum[x->link[k]];
                if (share < best) best = share, bl = x->link[k], bf = -1;
            }
            if (x->cap < best) best = x->cap, bf = i, bl = -1;
        }
        for (long i = 0; i < s->nact; i++) {
            xfer *x = &s->x[s->act[i]];
            if (x->rate >= 0) continue;
            int hit = bf == i;
            for (int k = 0; k < x->nlink && !hit; k++) hit = x->link[k] == bl;
            if (!hit) continue;
            x->rate = best;
            x->bottleneck = bl >= 0 ? bl : x->link[x->nlink - 1];
            for (int k = 0; k < x->nlink; k++) s->rem[x->link[k]] -= best * x->wt[k], s->wsum[x->link[k]] -= x->wt[k];
            nfree--;
        }
    }
    for (long i = 0; i < s->nact; i++) {
        xfer *x = &s->x[s->act[i]];
        x->t_end = s->now + (x->rate > 0 ? x->left / x->rate : 0);
    }
    s->dirty = 0;
}

/* Its bytes are through: it ends now, or parks (taking no link) until its floor. */
static void bytes_done(sim *s, long id) {
    if (s->x[id].t_floor > s->now + 1e-12 * (1 + s->now))
        push(s, (event){.t = s->x[id].t_floor, .type = 2, .a = (int)id});
    else
        finish(s, id, s->now);
}

static void start_xfer(sim *s, long id) {
    xfer *x = &s->x[id];
    if (x->bytes <= 0) {
        bytes_done(s, id);
        return;
    }
    x->t_rate = s->now;
    x->rate = 0;
    s->act[s->nact++] = id;
    s->dirty = 1;
}

/* ---- the critical path ---- */

static void walk_back(sim *s, tally__sim_result *r, double total) {
    int n = s->p->n;
    double *by_rank = calloc((size_t)n, sizeof *by_rank), *by_link = calloc((size_t)s->nlinks, sizeof *by_link);
    if (!by_rank || !by_link) goto out;
    int rank = -1, ln = 0;
    double latest = -1;
    for (int q = 0; q < n; q++)
        for (int k = 0; k < TALLY__SIM_LANES; k++) {
            lane_state *l = lane(s, q, k);
            if (l->done > 0 && l->t_done[l->done - 1] > latest) latest = l->t_done[l->done - 1], rank = q, ln = k;
        }
    long k = rank >= 0 ? lane(s, rank, ln)->done - 1 : -1;
    for (long guard = 0; k >= 0 && guard < 100000000L; guard++) {
        lane_state *l = lane(s, rank, ln);
        const tally__sim_pstep *st = &plane(s, rank, ln)->step[k];
        long id = l->last[k];
        if (id >= 0) {
            xfer *x = &s->x[id];
            by_link[x->bottleneck >= 0 ? x->bottleneck : x->link[0]] += x->t_end - x->t_post;
            int g = x->gate ? x->dst : x->src;
            by_rank[g] += x->t_end - x->t_post;
            rank = g;
            ln = x->lane[x->gate];
            k = x->step[x->gate];
            l = lane(s, rank, ln);
            st = &plane(s, rank, ln)->step[k];
        }
        by_rank[rank] += st->compute;
        /* what this step waited for before it started: its lane's last step or its dependency */
        double t0 = l->t_start[k];
        if (st->dep_lane >= 0 && lane(s, rank, st->dep_lane)->t_done[st->dep_step] >= t0 - 1e-15 &&
            (k == 0 || l->t_done[k - 1] < t0 - 1e-15)) {
            ln = st->dep_lane;
            k = st->dep_step;
        } else {
            k--;
        }
    }
    double top = 0, sum = 0, ltop = 0;
    int seen = 0;
    for (int q = 0; q < n; q++) {
        sum += by_rank[q];
        seen += by_rank[q] > 0;
        if (by_rank[q] > top) top = by_rank[q], r->crit_rank = q;
    }
    r->crit_rank_share = total > 0 ? top / total : 0;
    if (seen > 1 && top < 2 * sum / seen) r->crit_rank = -1; /* no rank stands out */
    for (int i = 0; i < s->nlinks; i++)
        if (by_link[i] > ltop) ltop = by_link[i], link_of(s, i, &r->crit_kind, &r->crit_at);
    r->crit_link_share = total > 0 ? ltop / total : 0;
out:
    free(by_rank);
    free(by_link);
}

/* ---- the run ---- */

static int setup(sim *s, const tally__sim_cluster *c, const tally__sim_prog *p) {
    memset(s, 0, sizeof *s);
    s->c = c;
    s->p = p;
    s->nlinks = 3 * c->hosts + 2 * tally__sim_leaves(c);
    size_t slots = 1024;
    while (slots < 2 * (size_t)p->nmsg) slots *= 2;
    s->tab_mask = slots - 1;
    s->ls = calloc((size_t)p->n * TALLY__SIM_LANES, sizeof *s->ls);
    s->tab = calloc(slots, sizeof *s->tab);
    s->act = malloc((size_t)(p->nmsg + 1) * sizeof *s->act);
    s->carried = calloc((size_t)s->nlinks, sizeof *s->carried);
    s->rem = calloc((size_t)s->nlinks, sizeof *s->rem);
    s->wsum = calloc((size_t)s->nlinks, sizeof *s->wsum);
    if (!s->ls || !s->tab || !s->act || !s->carried || !s->rem || !s->wsum) return -1;
    for (long i = 0; i < (long)p->n * TALLY__SIM_LANES; i++) {
        lane_state *l = &s->ls[i];
        long ns = p->lane[i].nstep;
        l->cur = -1;
        if (!ns) continue;
        l->t_done = calloc((size_t)ns, sizeof *l->t_done);
        l->t_start = calloc((size_t)ns, sizeof *l->t_start);
        l->last = malloc((size_t)ns * sizeof *l->last);
        if (!l->t_done || !l->t_start || !l->last) return -1;
    }
    return 0;
}

static void teardown(sim *s) {
    if (s->ls)
        for (long i = 0; i < (long)s->p->n * TALLY__SIM_LANES; i++) {
            free(s->ls[i].t_done);
            free(s->ls[i].t_start);
            free(s->ls[i].last);
        }
    free(s->ls);
    free(s->tab);
    free(s->heap);
    free(s->x);
    free(s->act);
    free(s->carried);
    free(s->rem);
    free(s->wsum);
}

static void loop(sim *s) {
    for (int q = 0; q < s->p->n; q++)
        for (int k = 0; k < TALLY__SIM_LANES; k++) step_start(s, q, k, 0);
    while (!s->failed) {
        if (s->dirty) rates(s);
        double t_flow = HUGE_VAL, t_heap = s->nheap ? s->heap[0].t : HUGE_VAL;
        for (long i = 0; i < s->nact; i++) t_flow = fmin(t_flow, s->x[s->act[i]].t_end);
        double t = fmin(t_flow, t_heap);
        if (t == HUGE_VAL) break;
        s->now = t;
        double eps = 1e-12 * (1 + t);
        for (long i = 0; i < s->nact;) { /* finish what ends now */
            long id = s->act[i];
            if (s->x[id].t_end <= t + eps) {
                s->act[i] = s->act[--s->nact];
                s->dirty = 1;
                bytes_done(s, id);
            } else {
                i++;
            }
        }
        while (s->nheap && s->heap[0].t <= t + eps) {
            event e = pop(s);
            if (e.type == 0)
                on_post(s, e.a, e.b, e.c, t);
            else if (e.type == 1)
                start_xfer(s, e.a);
            else
                finish(s, e.a, t);
        }
    }
}

int tally__sim_event_run(const tally__sim_cluster *c, const tally__sim_prog *p, tally__sim_result *r) {
    sim s;
    int rc = 0;
    if (setup(&s, c, p)) {
        rc = tally__seterr(TALLY_E_NOMEM, "sim: out of memory for the event level of %ld messages", p->nmsg);
        goto out;
    }
    loop(&s);
    if (s.failed) {
        rc = tally__seterr(TALLY_E_NOMEM, "sim: out of memory playing %ld messages", p->nmsg);
        goto out;
    }
    double total = 0;
    long most = 0;
    for (long i = 0; i < (long)p->n * TALLY__SIM_LANES; i++) {
        lane_state *l = &s.ls[i];
        if (l->done != p->lane[i].nstep) {
            rc = tally__seterr(TALLY_E_INVALID,
                               "sim: rank %ld stopped at step %ld of %ld: its peers' programs do not match",
                               i / TALLY__SIM_LANES, l->done, p->lane[i].nstep);
            goto out;
        }
        if (l->done) total = fmax(total, l->t_done[l->done - 1]);
        most = p->lane[i].nstep > most ? p->lane[i].nstep : most;
    }
    r->seconds = total;
    r->messages = s.messages;
    r->steps = most;
    for (int k = 0; k < TALLY__SIM_KINDS; k++) r->util[k] = 0, r->util_at[k] = -1;
    for (int i = 0; i < s.nlinks; i++) {
        int kind, at;
        link_of(&s, i, &kind, &at);
        double u = total > 0 ? s.carried[i] / (link_cap(&s, i) * total) : 0;
        if (s.carried[i] > 0 && (r->util_at[kind] < 0 || u > r->util[kind])) r->util[kind] = u, r->util_at[kind] = at;
    }
    r->crit_rank = r->crit_kind = r->crit_at = -1;
    walk_back(&s, r, total);
out:
    teardown(&s);
    return rc;
}
