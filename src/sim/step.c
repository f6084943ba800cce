/* step.c - training steps on the simulated cluster: each rank's compute (constant, drawn, or a named slow
 * rank), the gradient's collectives as the sync engines post them (stage 0 buckets during backward, ZeRO
 * 1-3 per layer), or a parameter server under a staleness bound (async); the collectives' times come
 * from tally__sim_collective. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/err.h"
#include "../core/rng.h"
#include "sim_int.h"

/* Each distinct collective is played once. */
#define MAX_KINDS 8
typedef struct colls {
    const tally__sim_cluster *c;
    const tally__sim_train *t;
    int n;
    struct {
        int coll;
        size_t bytes;
        double s;
    } seen[MAX_KINDS];
    int nseen;
    tally__sim_step *out;
} colls;

static size_t whole(double bytes) {
    size_t b = (size_t)ceil(bytes / 4.0) * 4;
    return b ? b : 4;
}

static int coll_time(colls *k, int coll, double bytes, double *s) {
    size_t b = whole(bytes);
    if (coll != TALLY__ALLREDUCE) b = (b / 4 + (size_t)k->n - 1) / (size_t)k->n * (size_t)k->n * 4; /* n blocks */
    for (int i = 0; i < k->nseen; i++)
        if (k->seen[i].coll == coll && k->seen[i].bytes == b) return *s = k->seen[i].s, 0;
    tally__sim_coll q = {.coll = coll, .algo = k->t->algo, .bytes = b, .dtype = TALLY_F32, .method = k->t->method};
    tally__sim_result r;
    int rc = tally__sim_collective(k->c, &q, &r);
    if (rc) return rc;
    if (k->nseen < MAX_KINDS) k->seen[k->nseen++] = (typeof(k->seen[0])){coll, b, r.seconds};
    if (b >= k->out->big_bytes) k->out->big = r, k->out->big_bytes = b;
    *s = r.seconds;
    return 0;
}

/* Compute is CPU work too: ranks that outnumber their cores share them. */
static double crowding(const tally__sim_cluster *c) {
    double ranks = c->shared_cores ? (double)c->hosts * c->per_host : c->per_host, cores = tally__sim_cores(c);
    return ranks > cores ? ranks / cores : 1;
}

/* This step's compute factor of every rank: slow ones named, the rest drawn around 1. */
static double factor(const tally__sim_cluster *c, tally__rng *g, int rank) {
    double f = 1;
    for (int i = 0; i < c->nslow; i++)
        if (c->slow[i].rank == rank) f *= c->slow[i].factor;
    if (c->compute_sd > 0) f *= fmax(0.05, 1 + c->compute_sd * tally__rng_normal(g));
    return f * crowding(c);
}

/* The slowest rank's factor this step, and which rank it is. */
static double slowest(const tally__sim_cluster *c, tally__rng *g, int n, int *who) {
    double most = -1;
    for (int r = 0; r < n; r++) {
        double f = factor(c, g, r);
        if (f > most) most = f, *who = r;
    }
    return most;
}

typedef struct lanes {
    double compute, comm; /* when each is free */
    double comm_busy;     /* seconds the collectives took */
} lanes;

static int post(colls *k, lanes *l, int coll, double bytes, double ready) {
    double s;
    int rc = coll_time(k, coll, bytes, &s);
    if (rc) return rc;
    l->comm = fmax(l->comm, ready) + s;
    l->comm_busy += s;
    k->out->colls++;
    return 0;
}

/* One sync step at compute factor f on the slowest rank; its seconds. */
static int sync_step(colls *k, double f, double *seconds) {
    const tally__sim_train *t = k->t;
    int K = t->accum > 0 ? t->accum : 1, nl = t->nlayers > 0 ? t->nlayers : 1, rc = 0;
    double C = t->compute_s * f, fwd = C / 3, bwd = C - fwd, S = t->grad_bytes, per = S / nl;
    double upd = (t->zero >= 1 ? t->update_s / k->n : t->update_s) * crowding(k->c);
    lanes l = {0};
    k->out->colls = 0;
    if (t->zero == 0) {
        double b = t->bucket_bytes > 0 ? t->bucket_bytes : S;
        int nb = (int)ceil(S / b);
        l.compute = (K - 1) * C + fwd; /* the engine reduces during the last micro-batch only */
        for (int j = 0; j < nb && !rc; j++) {
            double bytes = j == nb - 1 ? S - (nb - 1) * b : b;
            rc = post(k, &l, TALLY__ALLREDUCE, bytes, l.compute + bwd * (j + 1) / nb);
        }
        l.compute += bwd;
        *seconds = fmax(l.compute, l.comm) + upd;
    } else if (t->zero <= 2) {
        for (int m = 0; m < K && !rc; m++) {
            l.compute += fwd;
            for (int i = 0; i < nl && !rc && t->zero == 2; i++) /* stage 2: each layer as backward leaves it */
                rc = post(k, &l, TALLY__REDUCE_SCATTER, per, l.compute + bwd * (i + 1) / nl);
            l.compute += bwd;
        }
        for (int i = 0; i < nl && !rc && t->zero == 1; i++) rc = post(k, &l, TALLY__REDUCE_SCATTER, per, l.compute);
        double end = fmax(l.compute, l.comm) + upd;
        l.comm = end;
        for (int i = 0; i < nl && !rc; i++) rc = post(k, &l, TALLY__ALLGATHER, per, end);
        *seconds = l.comm;
    } else { /* stage 3: each layer gathered before its forward and its backward, reduced after it */
        for (int m = 0; m < K && !rc; m++) {
            for (int i = 0; i < nl && !rc; i++) {
                if (!(m > 0 && i == 0)) rc = post(k, &l, TALLY__ALLGATHER, per, 0); /* the first layer stays */
                l.compute = fmax(l.compute, l.comm) + fwd / nl;
            }
            for (int i = nl - 1; i >= 0 && !rc; i--) {
                if (i != nl - 1 && (rc = post(k, &l, TALLY__ALLGATHER, per, 0))) break; /* the last one stays */
                l.compute = fmax(l.compute, l.comm) + bwd / nl;
                rc = post(k, &l, TALLY__REDUCE_SCATTER, per, l.compute);
            }
        }
        *seconds = fmax(l.compute, l.comm) + upd;
    }
    k->out->comm_s = l.comm_busy;
    k->out->exposed_s = *seconds - K * C - upd;
    return rc;
}

/* ---- async: a parameter server on rank 0, workers 1..N-1, no worker past the slowest by more than S ---- */

typedef struct wheap {
    int *w;
    double *t; /* each worker's next time */
    int n;
} wheap;

static void wh_push(wheap *h, int who) {
    int i = h->n++;
    while (i > 0 && h->t[h->w[(i - 1) / 2]] > h->t[who]) h->w[i] = h->w[(i - 1) / 2], i = (i - 1) / 2;
    h->w[i] = who;
}

static int wh_pop(wheap *h) {
    int top = h->w[0], last = h->w[--h->n], i = 0;
    for (;;) {
        int k = 2 * i + 1;
        if (k >= h->n) break;
        if (k + 1 < h->n && h->t[h->w[k + 1]] < h->t[h->w[k]]) k++;
        if (h->t[h->w[k]] >= h->t[last]) break;
        h->w[i] = h->w[k];
        i = k;
    }
    if (h->n) h->w[i] = last;
    return top;
}

typedef struct ps_sim {
    const tally__sim_cluster *c;
    const tally__sim_train *t;
    int nw, steps;
    int *step;       /* steps each worker has played */
    double *applied; /* [worker x steps]: when the server had applied it (S = 0: when it arrived) */
    double tx, rx, cpu;
    tally__rng g;
    double compute_sum;
    long *slower;
} ps_sim;

/* When worker x's step i may pull: every worker's step i - S - 1 applied; -1 while one has not played it. */
static double gate(const ps_sim *p, int i) {
    int need = i - p->t->staleness - 1;
    if (need < 0) return 0;
    double g = 0;
    for (int y = 0; y < p->nw; y++) {
        if (p->step[y] <= need) return -1;
        g = fmax(g, p->applied[(size_t)y * p->steps + need]);
    }
    return p->t->staleness == 0 ? g + p->t->update_s : g; /* S = 0: one averaged update a round */
}

/* Pull, compute, push, apply: the server's NIC sends and receives in turn, its CPU applies in turn. */
static double play_step(ps_sim *p, int x, double t0) {
    const tally__sim_cluster *c = p->c;
    int rank = x + 1, remote = tally__sim_host(c, rank) != 0, K = p->t->accum > 0 ? p->t->accum : 1;
    double S = p->t->grad_bytes, local = tally__sim_shm_time(c, S * c->shm.beta, S * c->shm.beta);
    double pulled = remote ? (p->tx = fmax(t0, p->tx) + S / tally__sim_nic_bytes(c)) + c->nic_alpha : t0 + local;
    double f = factor(c, &p->g, rank), comp = p->t->compute_s * K * f;
    p->compute_sum += comp;
    p->slower[rank] += f > crowding(c);
    double sent = remote ? (p->rx = fmax(pulled + comp, p->rx) + S / tally__sim_nic_bytes(c)) : pulled + comp + local;
    double arrive = sent + (remote ? c->nic_alpha : 0);
    double applied = p->t->staleness == 0 ? arrive : (p->cpu = fmax(p->cpu, arrive) + p->t->update_s);
    p->applied[(size_t)x * p->steps + p->step[x]] = applied;
    p->step[x]++;
    return sent;
}

static int async_run(const tally__sim_cluster *c, const tally__sim_train *t, tally__sim_step *r) {
    int n = c->hosts * c->per_host, nw = n - 1;
    if (nw < 1) return tally__seterr(TALLY_E_INVALID, "sim: async needs 2 or more ranks: rank 0 serves");
    if ((double)nw * t->steps > 5e7)
        return tally__seterr(TALLY_E_INVALID,
                             "sim: async plays every worker's steps: %d workers x %d steps is past 5e7", nw, t->steps);
    ps_sim p = {.c = c, .t = t, .nw = nw, .steps = t->steps};
    wheap h = {0};
    p.step = calloc((size_t)nw, sizeof *p.step);
    p.applied = malloc((size_t)nw * t->steps * sizeof *p.applied);
    p.slower = calloc((size_t)n, sizeof *p.slower);
    h.w = malloc((size_t)nw * sizeof *h.w);
    h.t = calloc((size_t)nw, sizeof *h.t);
    int rc = 0;
    if (!p.step || !p.applied || !p.slower || !h.w || !h.t) {
        rc = tally__seterr(TALLY_E_NOMEM, "sim: out of memory for %d workers", nw);
        goto out;
    }
    tally__rng_seed(&p.g, c->seed, 0x7073ULL);
    for (int x = 0; x < nw; x++) wh_push(&h, x);
    double end = 0;
    while (h.n) {
        int x = wh_pop(&h);
        double g = gate(&p, p.step[x]);
        if (g < 0) { /* a worker behind it has not played the step it waits for: it goes first */
            double next = HUGE_VAL;
            for (int y = 0; y < nw; y++)
                if (p.step[y] < p.step[x]) next = fmin(next, h.t[y]);
            h.t[x] = fmax(h.t[x], next) + 1e-12;
            wh_push(&h, x);
            continue;
        }
        h.t[x] = play_step(&p, x, fmax(h.t[x], g));
        end = fmax(end, p.applied[(size_t)x * p.steps + p.step[x] - 1]);
        if (p.step[x] < p.steps) wh_push(&h, x);
    }
    r->step_s = (end + (t->staleness == 0 ? t->update_s : 0)) / t->steps;
    r->compute_s = p.compute_sum / ((double)nw * t->steps);
    r->samples_per_step_factor = (double)nw / n;
    r->comm_s = 2 * t->grad_bytes / tally__sim_nic_bytes(c);
    long most = 0;
    r->pace_rank = -1;
    for (int i = 0; i < n; i++)
        if (p.slower[i] > most) most = p.slower[i], r->pace_rank = i;
    r->pace_share = most / (double)t->steps;
out:
    free(p.step);
    free(p.applied);
    free(p.slower);
    free(h.w);
    free(h.t);
    return rc;
}

/* ---- local SGD: each rank's steps on its own clock, a round's end where all meet and average ---- */

/* No rank waits for another inside a round: the round ends when the slowest has taken its H steps, then
 * one allreduce of the parameters (int8's all-to-all + all-gather moves what an allreduce of a quarter
 * does, and is played as that). */
static int local_run(colls *k, tally__rng *g, long *paced, double *total, double *compute) {
    const tally__sim_train *t = k->t;
    const tally__sim_cluster *c = k->c;
    int n = k->n, K = t->accum > 0 ? t->accum : 1, H = t->local_steps, rc = 0;
    double ratio = t->outer_ratio > 0 ? t->outer_ratio : 1, avg = 0, busy = 0;
    double *clock = calloc((size_t)n, sizeof *clock);
    if (!clock) return tally__seterr(TALLY_E_NOMEM, "sim: out of memory for %d ranks", n);
    if (n > 1) rc = coll_time(k, TALLY__ALLREDUCE, t->grad_bytes * ratio, &avg);
    for (int s = 0; s < t->steps && !rc; s++) {
        for (int r = 0; r < n; r++) {
            double f = factor(c, g, r), comp = t->compute_s * f * K;
            clock[r] += comp + t->update_s * crowding(c);
            *compute += comp / n;
            paced[r] += f > crowding(c);
        }
        if ((s + 1) % H && s + 1 != t->steps) continue;
        double end = 0;
        for (int r = 0; r < n; r++) end = fmax(end, clock[r]);
        end += n > 1 ? avg : 0;
        busy += n > 1 ? avg : 0;
        for (int r = 0; r < n; r++) clock[r] = end;
    }
    *total = clock[0];
    k->out->colls = n > 1; /* one, every H steps */
    k->out->comm_s = busy / t->steps;
    free(clock);
    return rc;
}

int tally__sim_train_step(const tally__sim_cluster *c, const tally__sim_train *t, tally__sim_step *r) {
    memset(r, 0, sizeof *r);
    int rc = tally__sim_cluster_check(c), n = c->hosts * c->per_host;
    if (rc) return rc;
    if (t->steps < 1 || t->steps > 100000 || t->zero < 0 || t->zero > 3 || !(t->grad_bytes > 0))
        return tally__seterr(TALLY_E_INVALID, "sim: a training step needs a gradient, 1..100000 steps, ZeRO 0..3");
    if (t->async) return async_run(c, t, r);
    colls k = {.c = c, .t = t, .n = n, .out = r};
    tally__rng g;
    tally__rng_seed(&g, c->seed, 0x73696dULL);
    long *paced = calloc((size_t)n, sizeof *paced);
    if (!paced) return tally__seterr(TALLY_E_NOMEM, "sim: out of memory for %d ranks", n);
    double sum = 0, compute = 0;
    if (t->local_steps > 0) rc = local_run(&k, &g, paced, &sum, &compute);
    for (int s = 0; s < t->steps && !rc && t->local_steps <= 0; s++) {
        int who = 0;
        double f = slowest(c, &g, n, &who), sec = 0;
        if (f > crowding(c)) paced[who]++;
        if (n > 1)
            rc = sync_step(&k, f, &sec);
        else
            sec = t->compute_s * f * (t->accum > 0 ? t->accum : 1) + t->update_s * crowding(c);
        sum += sec;
        compute += t->compute_s * f * (t->accum > 0 ? t->accum : 1);
    }
    r->step_s = sum / t->steps;
    r->compute_s = compute / t->steps;
    if (t->local_steps > 0) r->exposed_s = r->comm_s; /* the averaging hides behind nothing */
    r->samples_per_step_factor = 1;
    r->pace_rank = -1;
    long most = 0;
    for (int i = 0; i < n; i++)
        if (paced[i] > most) most = paced[i], r->pace_rank = i;
    r->pace_share = most / (double)t->steps;
    free(paced);
    return rc;
}
