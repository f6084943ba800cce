/* stripe.c - several TCP connections per pair of ranks on different hosts (TALLY_TCP_STREAMS): K tcp
 * meshes, large messages to other hosts cut into K stripes that the K meshes carry at once. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../boot/boot.h"
#include "../boot/fdlimit.h"
#include "../core/log.h"
#include "transport.h"

/* Streams per pair across hosts: 1 unless the config says (TALLY_DEFAULT_TCP_STREAMS, tally.h), since
 * across 2 test hosts (network namespaces) at 1 and 10 Gbit/s and unlimited, 2 and 4 streams were no
 * faster than 1, and 1-3% slower at 1 Gbit/s (BENCHMARKS.md, "Across test hosts"): more streams are for
 * per-flow limits those links do not have. At most TALLY__TCP_STREAMS_MAX (transport.h). */
/* Messages of this many bytes and more to a peer on another host are striped; smaller ones go whole on
 * stream 0. A stripe costs a thread hand-off (some 10-50 us on a busy core) and a header per stream:
 * at 256 KiB that is a few percent of the message's 2 ms at 1 Gbit/s, and below it the wire time
 * shrinks toward the hand-off's. */
#define STRIPE_MIN (256u << 10)
/* Stripes start at multiples of this: a multiple of every dtype's size, so a reducing receive cuts at
 * element boundaries, and the sender, which knows no dtype, cuts the same bytes from the length alone. */
#define STRIPE_UNIT 64u

/* One per stream: its part of an exchange, and past stream 0 the helper thread that runs the part. */
typedef struct stripe_lane {
    struct stripe_tp *t;
    tally__tp *tp;
    pthread_t th;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int posted, done, quit; /* a part waits to run; the part ran (rc, why); destroy: leave */
    tally__send *s;         /* [size] the part's sends and receives */
    tally__recv *r;
    int ns, nr;
    int rc;
    char why[1024]; /* the helper's message, which is its own thread's */
} stripe_lane;

typedef struct stripe_tp {
    tally__tp base;
    int k;
    tally__tp **streams; /* [k] plain tcp transports, one mesh each */
    stripe_lane *lanes;  /* [k]: lanes[0] holds stream 0's part (run on the caller's thread) */
    char *remote;        /* [size] the peer is on another host */
} stripe_tp;

/* Stripe i of a len-byte message cut in k: whole units shared out evenly (the first ones one more when
 * they do not divide), the tail under a unit on the last stripe. */
static void stripe_cut(size_t len, int k, int i, size_t *off, size_t *n) {
    size_t units = len / STRIPE_UNIT, base = units / (size_t)k, extra = units % (size_t)k, ui = (size_t)i;
    *off = STRIPE_UNIT * (ui * base + (ui < extra ? ui : extra));
    *n = STRIPE_UNIT * (base + (ui < extra)) + (i == k - 1 ? len % STRIPE_UNIT : 0);
}

static int stripe_wide(const stripe_tp *t, int peer, size_t len) { return t->remote[peer] && len >= STRIPE_MIN; }

/* Shares the exchange out: each lane gets its stripe of every wide message, lane 0 the narrow ones too. */
static void stripe_split(stripe_tp *t, const tally__send *s, int ns, const tally__recv *r, int nr) {
    for (int i = 0; i < t->k; i++) t->lanes[i].ns = t->lanes[i].nr = 0;
    for (int j = 0; j < ns; j++) {
        if (!stripe_wide(t, s[j].peer, s[j].len)) {
            t->lanes[0].s[t->lanes[0].ns++] = s[j];
            continue;
        }
        for (int i = 0; i < t->k; i++) {
            size_t off, n;
            stripe_cut(s[j].len, t->k, i, &off, &n);
            stripe_lane *l = &t->lanes[i];
            l->s[l->ns++] = (tally__send){.peer = s[j].peer, .buf = (const char *)s[j].buf + off, .len = n};
        }
    }
    for (int j = 0; j < nr; j++) {
        if (!stripe_wide(t, r[j].peer, r[j].len)) {
            t->lanes[0].r[t->lanes[0].nr++] = r[j];
            continue;
        }
        for (int i = 0; i < t->k; i++) {
            size_t off, n;
            stripe_cut(r[j].len, t->k, i, &off, &n);
            stripe_lane *l = &t->lanes[i];
            tally__recv p = r[j];
            p.dst = (char *)r[j].dst + off;
            p.src = r[j].src ? (const char *)r[j].src + off : NULL;
            p.len = n;
            l->r[l->nr++] = p;
        }
    }
}

/* Runs a lane's part on this thread. A failure that raised no fault (a poll() error) is raised here: the
 * other streams' parts would otherwise wait for stripes that will not come, and a communicator whose
 * streams fell out of step cannot go on anyway. */
static int stripe_run(stripe_lane *l) {
    tally__fault *f = l->t->base.ctx.fault;
    int rc = l->tp->ops->exchange(l->tp, l->s, l->ns, l->r, l->nr);
    if (!rc) return 0;
    snprintf(l->why, sizeof l->why, "%s", tally_last_error());
    if (!tally__fault_check(f)) tally__fault_raise(f, rc, -1, "%s", l->why);
    return rc;
}

static void *stripe_helper(void *arg) {
    stripe_lane *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->posted && !l->quit) pthread_cond_wait(&l->cv, &l->mu);
        if (!l->posted) break; /* quit */
        l->posted = 0;
        pthread_mutex_unlock(&l->mu);
        int rc = stripe_run(l); /* ends on the fault at the latest, which any stream's failure raises */
        pthread_mutex_lock(&l->mu);
        l->rc = rc;
        l->done = 1;
        pthread_cond_broadcast(&l->cv);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

static int stripe_exchange(tally__tp *tp, const tally__send *s, int ns, const tally__recv *r, int nr) {
    stripe_tp *t = (stripe_tp *)tp;
    int rc = tally__fault_check(t->base.ctx.fault), wide = 0;
    if (rc) return rc;
    /* Before anything is cut: a part refused on one stream while the others ran would leave the peers'
     * stripes unmatched. */
    if ((rc = tally__tp_check_rules(&t->base.ctx, "tcp", s, ns, r, nr))) return rc;
    for (int j = 0; j < ns && !wide; j++) wide = stripe_wide(t, s[j].peer, s[j].len);
    for (int j = 0; j < nr && !wide; j++) wide = stripe_wide(t, r[j].peer, r[j].len);
    if (!wide) return t->streams[0]->ops->exchange(t->streams[0], s, ns, r, nr);
    stripe_split(t, s, ns, r, nr);
    for (int i = 1; i < t->k; i++) {
        stripe_lane *l = &t->lanes[i];
        if (!l->ns && !l->nr) continue;
        pthread_mutex_lock(&l->mu);
        l->posted = 1;
        l->done = 0;
        pthread_cond_signal(&l->cv);
        pthread_mutex_unlock(&l->mu);
    }
    int rc0 = stripe_run(&t->lanes[0]), first = 0;
    for (int i = 1; i < t->k; i++) {
        stripe_lane *l = &t->lanes[i];
        if (!l->ns && !l->nr) continue;
        pthread_mutex_lock(&l->mu);
        while (!l->done) pthread_cond_wait(&l->cv, &l->mu); /* bounded: its exchange ends on the fault */
        int lrc = l->rc;
        pthread_mutex_unlock(&l->mu);
        if (lrc && !rc0 && !first) first = i;
    }
    if (!rc0 && !first) return 0;
    if ((rc = tally__fault_check(t->base.ctx.fault))) return rc; /* every stream's failure is the fault */
    if (rc0) return tally__seterr(rc0, "%s", t->lanes[0].why);
    return tally__seterr(t->lanes[first].rc, "%s", t->lanes[first].why);
}

static void stripe_destroy(tally__tp *tp) {
    stripe_tp *t = (stripe_tp *)tp;
    if (!t) return;
    for (int i = 1; t->lanes && i < t->k; i++) {
        stripe_lane *l = &t->lanes[i];
        if (!l->started) continue;
        pthread_mutex_lock(&l->mu);
        l->quit = 1;
        pthread_cond_signal(&l->cv);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->th, NULL);
    }
    for (int i = 0; t->lanes && i < t->k; i++) {
        pthread_mutex_destroy(&t->lanes[i].mu);
        pthread_cond_destroy(&t->lanes[i].cv);
        free(t->lanes[i].s);
        free(t->lanes[i].r);
    }
    for (int i = 0; t->streams && i < t->k; i++)
        if (t->streams[i]) {
            t->streams[i]->abandon = t->base.abandon; /* an abort closes every stream at once */
            t->streams[i]->ops->destroy(t->streams[i]);
        }
    free(t->lanes);
    free(t->streams);
    free(t->remote);
    free(t);
}

static const tally__tp_ops tally__stripe_ops = {.name = "tcp", .exchange = stripe_exchange, .destroy = stripe_destroy};

static int stripe_alloc(const tally__tp_ctx *ctx, int k, stripe_tp **out) {
    stripe_tp *t = calloc(1, sizeof *t);
    *out = t;
    if (!t) return TALLY_E_NOMEM;
    t->base.ops = &tally__stripe_ops;
    t->base.ctx = *ctx;
    t->k = k;
    t->streams = calloc((size_t)k, sizeof *t->streams);
    t->lanes = calloc((size_t)k, sizeof *t->lanes);
    t->remote = calloc((size_t)ctx->size, 1);
    if (!t->streams || !t->lanes || !t->remote) return TALLY_E_NOMEM;
    for (int i = 0; i < k; i++) {
        stripe_lane *l = &t->lanes[i];
        l->t = t;
        pthread_mutex_init(&l->mu, NULL);
        pthread_cond_init(&l->cv, NULL);
        l->s = calloc((size_t)ctx->size, sizeof *l->s);
        l->r = calloc((size_t)ctx->size, sizeof *l->r);
        if (!l->s || !l->r) return TALLY_E_NOMEM;
    }
    const tally__peer *peers = tally__boot_peers(ctx->boot);
    for (int p = 0; p < ctx->size; p++) t->remote[p] = peers[p].hostid != peers[ctx->rank].hostid;
    return 0;
}

/* Checked on every rank before the first mesh: room for the descriptors (the boot layer made room for
 * one connection per peer; the k-1 meshes more need as many again each, and a listener while they are
 * built), the memory and the helper threads. Every rank learns which ranks fell short, so none is left
 * waiting in a mesh that a rank which failed here never joins. */
enum { STRIPE_READY, STRIPE_NO_FDS, STRIPE_NO_THREADS, STRIPE_NO_MEMORY };

static int stripe_ready(const tally__tp_ctx *ctx, stripe_tp *t, int k, int32_t mine) {
    static const char *const lacks[] = {"", "file descriptors (raise its RLIMIT_NOFILE or set TALLY_TCP_STREAMS lower)",
                                        "threads", "memory"};
    tally__fd_limit lim = {0};
    if (mine == STRIPE_READY && tally__fd_room((long)(k - 1) * (ctx->size - 1) + 1, &lim)) mine = STRIPE_NO_FDS;
    for (int i = 1; i < k && mine == STRIPE_READY; i++) {
        if (pthread_create(&t->lanes[i].th, NULL, stripe_helper, &t->lanes[i])) mine = STRIPE_NO_THREADS;
        t->lanes[i].started = mine == STRIPE_READY;
    }
    int32_t *all = calloc((size_t)ctx->size, sizeof *all);
    int rc = all ? tally__boot_allgather(ctx->boot, &mine, all, sizeof mine) : TALLY_E_NOMEM, other = -1;
    for (int r = 0; !rc && r < ctx->size && other < 0; r++)
        if (all[r] != STRIPE_READY) other = r;
    int why = other >= 0 && all[other] > 0 && all[other] <= STRIPE_NO_MEMORY ? all[other] : STRIPE_NO_MEMORY;
    free(all);
    if (rc == TALLY_E_NOMEM || mine == STRIPE_NO_MEMORY)
        return tally__seterr(TALLY_E_NOMEM, "rank %d: tcp transport: out of memory", ctx->rank);
    if (rc) return rc;
    if (mine == STRIPE_NO_FDS) {
        char adv[420];
        tally__fd_advice(&lim, adv, sizeof adv);
        return tally__seterr(TALLY_E_SYSTEM,
                             "rank %d: TALLY_TCP_STREAMS=%d needs about %ld file descriptors on rank %d (%d "
                             "connections to each of %d peers) but %s; or set TALLY_TCP_STREAMS lower (1: one "
                             "connection per pair)",
                             ctx->rank, k, lim.want, ctx->rank, k, ctx->size - 1, adv);
    }
    if (mine == STRIPE_NO_THREADS)
        return tally__seterr(TALLY_E_SYSTEM, "rank %d: tcp transport: cannot start the threads of TALLY_TCP_STREAMS=%d",
                             ctx->rank, k);
    if (other >= 0)
        return tally__seterr(TALLY_E_SYSTEM,
                             "rank %d: rank %d cannot have TALLY_TCP_STREAMS=%d (%d connections to each peer): it "
                             "lacks %s",
                             ctx->rank, other, k, k, lacks[why]);
    return 0;
}

int tally__stripe_create(const tally__tp_ctx *ctx, int k, tally__tp **out) {
    *out = NULL;
    if (k <= 1) return tally__tcp_create(ctx, out);
    if (!ctx || ctx->size < 2 || k > TALLY__TCP_STREAMS_MAX || !ctx->boot || !ctx->fault || !ctx->sig)
        return tally__seterr(TALLY_E_INVALID, "tcp transport: bad context for %d streams", k);
    stripe_tp *t = NULL;
    int32_t mine = stripe_alloc(ctx, k, &t) ? STRIPE_NO_MEMORY : STRIPE_READY;
    int rc = stripe_ready(ctx, t, k, mine);
    /* Every rank builds the meshes in the same order: each is collective over all ranks. */
    for (int i = 0; i < k && !rc; i++) {
        rc = tally__tcp_create(ctx, &t->streams[i]);
        t->lanes[i].tp = t->streams[i];
    }
    if (rc) {
        stripe_destroy(t ? &t->base : NULL);
        return rc;
    }
    if (ctx->rank == 0)
        tally__log_debug(1, "tcp: %d streams per pair across hosts, messages of %u bytes and more striped", k,
                         STRIPE_MIN);
    *out = &t->base;
    return 0;
}
