/* mock_tp.c - the threads-in-one-process transport the algorithm tests run on. Sends are rendezvous
 * (an exchange returns only once its messages were taken), so an algorithm that only works with buffering fails. */
#include "mock_tp.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/numeric/dtype.h"
#include "core/numeric/reduce.h"

typedef struct mock_msg {
    struct mock_msg *next;
    void *data;
    size_t len;
    int queued;   /* still in the mailbox (not yet taken by the receiver) */
    int consumed; /* the receiver finished with it */
    int refs;     /* sender + mailbox/receiver; freed at 0 */
} mock_msg;

typedef struct mock_rank {
    tally__tp tp; /* first: the algorithms see a tally__tp* */
    mock_world *w;
    int rank;
    pthread_cond_t wake; /* a message for us arrived, or one of ours was taken */
    mock_stats st;
    pthread_t thread;
} mock_rank;

struct mock_world {
    int n;
    double timeout_s;
    pthread_mutex_t mu;
    mock_msg **head, **tail; /* mailbox [src * n + dst], FIFO */
    mock_rank *ranks;
    int failed;
    char why[1024];
    /* The thread pool: each run bumps gen; ranks run fn and count themselves done. */
    pthread_cond_t go, done;
    unsigned gen;
    int ndone, quit;
    mock_rank_fn fn;
    void *arg;
    int *rc;
};

/* Records the first failure (under mu) and wakes every rank so they stop waiting. */
static void mock_fail_locked(mock_world *w, const char *fmt, ...) {
    if (!w->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(w->why, sizeof w->why, fmt, ap);
        va_end(ap);
        w->failed = 1;
    }
    for (int r = 0; r < w->n; r++) pthread_cond_broadcast(&w->ranks[r].wake);
}

static int overlap(const void *a, size_t alen, const void *b, size_t blen) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return alen && blen && x < y + blen && y < x + alen;
}

/* transport.h's rules for one exchange, plus one more: no send may read bytes a receive of the same
 * exchange writes (a single-copy transport would let the peer read them mid-write). */
static const char *mock_rules(const mock_rank *me, const tally__send *s, int ns, const tally__recv *r, int nr) {
    int n = me->w->n;
    for (int i = 0; i < ns; i++) {
        if (s[i].peer < 0 || s[i].peer >= n || s[i].peer == me->rank) return "send to an invalid peer";
        if (s[i].len && !s[i].buf) return "send of a NULL buffer";
        for (int j = 0; j < i; j++)
            if (s[j].peer == s[i].peer) return "two sends to one peer";
    }
    for (int i = 0; i < nr; i++) {
        if (r[i].peer < 0 || r[i].peer >= n || r[i].peer == me->rank) return "recv from an invalid peer";
        if (r[i].len && !r[i].dst) return "recv into a NULL buffer";
        if (r[i].src) {
            size_t es = tally_dtype_size(r[i].dtype);
            if (!es || r[i].len % es) return "reducing recv with a bad dtype or a length not a multiple of it";
            if (r[i].op == TALLY_AVG || !tally__dtype_op_valid((int)r[i].dtype, (int)r[i].op))
                return "reducing recv with AVG (the caller divides) or an op its dtype does not take";
            if (r[i].src != r[i].dst && overlap(r[i].src, r[i].len, r[i].dst, r[i].len))
                return "reducing recv whose src partly overlaps its dst";
        }
        for (int j = 0; j < i; j++) {
            if (r[j].peer == r[i].peer) return "two recvs from one peer";
            if (overlap(r[i].dst, r[i].len, r[j].dst, r[j].len)) return "two recvs write overlapping bytes";
        }
        for (int j = 0; j < ns; j++)
            if (overlap(r[i].dst, r[i].len, s[j].buf, s[j].len)) return "a send reads bytes a recv writes";
    }
    return NULL;
}

static void mock_msg_unref_locked(mock_msg *m) {
    if (--m->refs == 0) {
        free(m->data);
        free(m);
    }
}

static mock_msg *mock_post(mock_rank *me, const tally__send *s) {
    mock_world *w = me->w;
    mock_msg *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->data = malloc(s->len ? s->len : 1);
    if (!m->data) {
        free(m);
        return NULL;
    }
    if (s->len) memcpy(m->data, s->buf, s->len);
    m->len = s->len;
    m->refs = 2;
    m->queued = 1;
    size_t box = (size_t)me->rank * w->n + s->peer;
    if (w->tail[box])
        w->tail[box]->next = m;
    else
        w->head[box] = m;
    w->tail[box] = m;
    me->st.sends++;
    me->st.bytes_sent += s->len;
    pthread_cond_signal(&w->ranks[s->peer].wake);
    return m;
}

static mock_msg *mock_take_locked(mock_world *w, int src, int dst) {
    size_t box = (size_t)src * w->n + dst;
    mock_msg *m = w->head[box];
    if (!m) return NULL;
    w->head[box] = m->next;
    if (!m->next) w->tail[box] = NULL;
    m->next = NULL;
    m->queued = 0;
    return m;
}

/* Removes a message the receiver never took (the run failed); the caller drops the mailbox's reference. */
static void mock_unlink_locked(mock_world *w, int src, int dst, mock_msg *m) {
    size_t box = (size_t)src * w->n + dst;
    mock_msg **pp = &w->head[box], *prev = NULL;
    while (*pp && *pp != m) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (!*pp) return;
    *pp = m->next;
    if (w->tail[box] == m) w->tail[box] = prev;
    m->queued = 0;
}

/* Delivers one taken message into recv r (outside the lock: the reduction is the slow part). */
static void mock_deliver(const tally__recv *r, const mock_msg *m) {
    if (!r->src) {
        if (r->len) memcpy(r->dst, m->data, r->len);
        return;
    }
    tally__reduce(r->dst, r->src, m->data, r->len / tally_dtype_size(r->dtype), r->dtype, r->op);
}

static struct timespec mock_deadline(double s) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    long long ns = t.tv_nsec + (long long)(s * 1e9);
    t.tv_sec += (time_t)(ns / 1000000000);
    t.tv_nsec = (long)(ns % 1000000000);
    return t;
}

/* Says what a timed-out exchange still waits for. */
static void mock_timeout_locked(mock_rank *me, const tally__send *s, mock_msg **sent, int ns, const tally__recv *r,
                                const char *got, int nr) {
    for (int i = 0; i < nr; i++)
        if (!got[i]) {
            mock_fail_locked(me->w, "rank %d timed out in exchange #%llu waiting for a %zu-byte message from rank %d",
                             me->rank, me->st.exchanges, r[i].len, r[i].peer);
            return;
        }
    for (int i = 0; i < ns; i++)
        if (!sent[i]->consumed) {
            mock_fail_locked(me->w,
                             "rank %d timed out in exchange #%llu waiting for rank %d to take its %zu-byte message",
                             me->rank, me->st.exchanges, s[i].peer, s[i].len);
            return;
        }
}

/* Receives what has arrived; returns the number of recvs still pending. Called and returns with mu held,
 * but drops it while delivering: *again says so (a wake-up may have come meanwhile). */
static int mock_progress_locked(mock_rank *me, const tally__recv *r, char *got, int nr, int *again) {
    mock_world *w = me->w;
    int pending = 0;
    *again = 0;
    for (int i = 0; i < nr && !w->failed; i++) {
        if (got[i]) continue;
        mock_msg *m = mock_take_locked(w, r[i].peer, me->rank);
        if (!m) {
            pending++;
            continue;
        }
        if (m->len != r[i].len) {
            mock_fail_locked(w, "rank %d posted a %zu-byte recv from rank %d, which sent %zu bytes (exchange #%llu)",
                             me->rank, r[i].len, r[i].peer, m->len, me->st.exchanges);
        } else {
            pthread_mutex_unlock(&w->mu);
            mock_deliver(&r[i], m);
            pthread_mutex_lock(&w->mu);
            *again = 1;
        }
        got[i] = 1;
        m->consumed = 1;
        pthread_cond_signal(&w->ranks[r[i].peer].wake);
        mock_msg_unref_locked(m);
    }
    return pending;
}

static int mock_exchange(tally__tp *tp, const tally__send *s, int ns, const tally__recv *r, int nr) {
    mock_rank *me = (mock_rank *)tp;
    mock_world *w = me->w;
    mock_msg *sent[128];
    char got[128] = {0};
    if (ns > 128 || nr > 128 || ns < 0 || nr < 0) return TALLY_E_INVALID;
    pthread_mutex_lock(&w->mu);
    me->st.exchanges++;
    const char *bad = mock_rules(me, s, ns, r, nr);
    if (bad)
        mock_fail_locked(w, "rank %d broke a transport rule in exchange #%llu: %s", me->rank, me->st.exchanges, bad);
    int posted = 0;
    for (; posted < ns && !w->failed; posted++)
        if (!(sent[posted] = mock_post(me, &s[posted]))) mock_fail_locked(w, "rank %d: mock out of memory", me->rank);
    struct timespec deadline = mock_deadline(w->timeout_s);
    int rc = 0;
    for (;;) {
        if (w->failed) {
            rc = TALLY_E_ABORTED;
            break;
        }
        int again, pending = mock_progress_locked(me, r, got, nr, &again);
        for (int i = 0; i < posted; i++) pending += !sent[i]->consumed;
        if (w->failed) continue;
        if (!pending) break;
        if (again) continue;
        if (pthread_cond_timedwait(&me->wake, &w->mu, &deadline) == ETIMEDOUT) {
            mock_timeout_locked(me, s, sent, posted, r, got, nr);
            rc = TALLY_E_TIMEOUT;
            break;
        }
    }
    for (int i = 0; i < posted; i++) {
        mock_msg *m = sent[i];
        if (m->queued) { /* never taken: drop the mailbox's reference with ours */
            mock_unlink_locked(w, me->rank, s[i].peer, m);
            m->refs--;
        }
        mock_msg_unref_locked(m);
    }
    pthread_mutex_unlock(&w->mu);
    return rc;
}

static void mock_destroy(tally__tp *tp) { (void)tp; }

static const tally__tp_ops mock_ops = {.name = "mock", .exchange = mock_exchange, .destroy = mock_destroy};

/* A rank's thread: waits for each run, runs fn, reports done. */
static void *mock_thread(void *arg) {
    mock_rank *me = arg;
    mock_world *w = me->w;
    unsigned seen = 0;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (w->gen == seen && !w->quit) pthread_cond_wait(&w->go, &w->mu);
        if (w->quit) break;
        seen = w->gen;
        mock_rank_fn fn = w->fn;
        void *arg2 = w->arg;
        pthread_mutex_unlock(&w->mu);
        tally__ctx ctx = {.rank = me->rank, .size = w->n, .tp = &me->tp};
        int rc = fn(&ctx, arg2);
        pthread_mutex_lock(&w->mu);
        if (w->rc) w->rc[me->rank] = rc;
        if (++w->ndone == w->n) pthread_cond_signal(&w->done);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static void mock_condattr(pthread_cond_t *c) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(c, &a);
    pthread_condattr_destroy(&a);
}

mock_world *mock_world_new(int n, double timeout_s) {
    if (n < 2 || n > 64) return NULL;
    mock_world *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->n = n;
    w->timeout_s = timeout_s;
    w->head = calloc((size_t)n * n, sizeof *w->head);
    w->tail = calloc((size_t)n * n, sizeof *w->tail);
    w->ranks = calloc((size_t)n, sizeof *w->ranks);
    if (!w->head || !w->tail || !w->ranks) {
        free(w->head);
        free(w->tail);
        free(w->ranks);
        free(w);
        return NULL;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->go, NULL);
    pthread_cond_init(&w->done, NULL);
    for (int r = 0; r < n; r++) {
        mock_rank *m = &w->ranks[r];
        m->w = w;
        m->rank = r;
        m->tp.ops = &mock_ops;
        m->tp.ctx = (tally__tp_ctx){.rank = r, .size = n, .timeout_s = timeout_s};
        mock_condattr(&m->wake);
    }
    for (int r = 0; r < n; r++) pthread_create(&w->ranks[r].thread, NULL, mock_thread, &w->ranks[r]);
    return w;
}

void mock_world_free(mock_world *w) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->quit = 1;
    pthread_cond_broadcast(&w->go);
    pthread_mutex_unlock(&w->mu);
    for (int r = 0; r < w->n; r++) {
        pthread_join(w->ranks[r].thread, NULL);
        pthread_cond_destroy(&w->ranks[r].wake);
    }
    pthread_cond_destroy(&w->go);
    pthread_cond_destroy(&w->done);
    pthread_mutex_destroy(&w->mu);
    free(w->head);
    free(w->tail);
    free(w->ranks);
    free(w);
}

int mock_run(mock_world *w, mock_rank_fn fn, void *arg, int *rc) {
    pthread_mutex_lock(&w->mu);
    w->failed = 0;
    w->why[0] = 0;
    for (int r = 0; r < w->n; r++) w->ranks[r].st = (mock_stats){0};
    w->fn = fn;
    w->arg = arg;
    w->rc = rc;
    w->ndone = 0;
    w->gen++;
    pthread_cond_broadcast(&w->go);
    while (w->ndone < w->n) pthread_cond_wait(&w->done, &w->mu);
    int failed = w->failed;
    pthread_mutex_unlock(&w->mu);
    return failed ? -1 : 0;
}

const char *mock_failure(const mock_world *w) { return w->why; }

mock_stats mock_stats_of(const mock_world *w, int r) { return w->ranks[r].st; }

void mock_fan_out(mock_world *w, int on) {
    for (int r = 0; r < w->n; r++) {
        w->ranks[r].tp.fan_out = on;
        w->ranks[r].tp.ctx.crowded = on;
    }
}
