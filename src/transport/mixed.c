/* mixed.c - one communicator over two backends: shared memory to the ranks on this host (the host
 * communicator's shm transport, borrowed), TCP to the ranks on the others; an exchange with both. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport.h"

/* An exchange that has peers of both kinds runs its TCP half on a helper thread while the caller runs
 * the shm half: each backend blocks until its part is complete, and one half done before the other
 * could wait on a peer that waits in turn for the half not yet started (a ring step sends on one kind
 * and receives on the other). */
typedef struct mixed_tp {
    tally__tp base; /* ctx: the world's (rank, size, boot, fault, sig), as the tcp transport's */
    tally__tp *tcp; /* owned */
    tally__tp *shm; /* borrowed: rank = local index; NULL when no other rank shares this host */
    int *local_of;  /* [size]: the peer's local index on this host, or -1 on another host */
    int *world_of;  /* [local ranks]: the world rank of each local index */
    int nlocal;
    tally__send *ls, *ts; /* scratch: the halves of one exchange, size entries each */
    tally__recv *lr, *tr;
    pthread_t th;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int job; /* 1: a TCP half is posted; -1: the thread leaves */
    int done, nts, ntr, rc;
    _Atomic int local_busy; /* the shm half runs: its own wait record speaks for this rank */
    char why[1024];         /* the helper's message (its own thread's) */
} mixed_tp;

static void *mixed_helper(void *arg) {
    mixed_tp *m = arg;
    pthread_mutex_lock(&m->mu);
    for (;;) {
        while (m->job == 0) pthread_cond_wait(&m->cv, &m->mu);
        if (m->job < 0) break;
        m->job = 0;
        pthread_mutex_unlock(&m->mu);
        int rc = m->tcp->ops->exchange(m->tcp, m->ts, m->nts, m->tr, m->ntr);
        pthread_mutex_lock(&m->mu);
        m->rc = rc;
        if (rc) snprintf(m->why, sizeof m->why, "%s", tally_last_error());
        m->done = 1;
        pthread_cond_broadcast(&m->cv);
    }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

/* The host communicator's message names "rank L (world rank W)"; on the world it is rank W. */
static void mixed_world_words(char *msg, size_t cap) {
    char out[1024];
    size_t o = 0;
    const char *p = msg;
    while (*p && o + 1 < sizeof out) {
        int l, w, used = 0;
        if (!strncmp(p, "rank ", 5) && sscanf(p, "rank %d (world rank %d)%n", &l, &w, &used) == 2 && used > 0) {
            o += (size_t)snprintf(out + o, sizeof out - o, "rank %d", w);
            if (o >= sizeof out) o = sizeof out - 1;
            p += used;
            continue;
        }
        out[o++] = *p++;
    }
    if (o >= cap) o = cap - 1;
    memcpy(msg, out, o);
    msg[o] = '\0';
}

/* The shm half, stamped with the world's fingerprint (the transport stamps what ctx.sig points at; the
 * host communicator's own calls never run while a world exchange does: both are the world's). A fault
 * it meets is raised on the world, naming the world rank, so the TCP half and every rank end too. */
static int mixed_local(mixed_tp *m, int ns, int nr) {
    const tally__sig *own = m->shm->ctx.sig;
    m->shm->ctx.sig = m->base.ctx.sig;
    atomic_store_explicit(&m->local_busy, 1, memory_order_relaxed);
    int rc = m->shm->ops->exchange(m->shm, m->ls, ns, m->lr, nr);
    atomic_store_explicit(&m->local_busy, 0, memory_order_relaxed);
    m->shm->ctx.sig = own;
    if (!rc) return 0;
    char msg[sizeof m->base.ctx.fault->msg];
    snprintf(msg, sizeof msg, "%s", tally_last_error());
    mixed_world_words(msg, sizeof msg);
    int culprit = m->shm->ctx.fault->culprit;
    culprit = culprit >= 0 && culprit < m->nlocal ? m->world_of[culprit] : -1;
    return tally__fault_raise(m->base.ctx.fault, rc, culprit, "%s", msg);
}

/* The TCP half stalled (peer >= 0) or moved on (-1): the host's ranks read it in our shm wait record,
 * unless the shm half is waiting too, whose own record they follow. The TCP half is posted only after
 * local_busy is set, and ends before the next exchange sets it again: the two never write at once. */
static void mixed_tell(void *arg, int peer) {
    mixed_tp *m = arg;
    if (peer >= 0 && atomic_load_explicit(&m->local_busy, memory_order_relaxed)) return;
    tally__shm_wait_elsewhere(m->shm, peer >= 0, m->base.ctx.sig->seq);
}

static int mixed_both(mixed_tp *m, int nls, int nlr, int nts, int ntr) {
    atomic_store_explicit(&m->local_busy, 1, memory_order_relaxed);
    pthread_mutex_lock(&m->mu);
    m->nts = nts;
    m->ntr = ntr;
    m->done = 0;
    m->job = 1;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    int rc = mixed_local(m, nls, nlr);
    pthread_mutex_lock(&m->mu);
    while (!m->done) pthread_cond_wait(&m->cv, &m->mu); /* bounded: the TCP half ends on the fault */
    int trc = m->rc;
    pthread_mutex_unlock(&m->mu);
    if (rc) return rc;
    if (trc) tally__seterr(trc, "%s", m->why);
    return trc;
}

static int mixed_exchange(tally__tp *tp, const tally__send *s, int ns, const tally__recv *r, int nr) {
    mixed_tp *m = (mixed_tp *)tp;
    int nls = 0, nlr = 0, nts = 0, ntr = 0;
    for (int i = 0; i < ns; i++) {
        int l = m->local_of[s[i].peer];
        if (l < 0) {
            m->ts[nts++] = s[i];
        } else {
            m->ls[nls] = s[i];
            m->ls[nls++].peer = l;
        }
    }
    for (int i = 0; i < nr; i++) {
        int l = m->local_of[r[i].peer];
        if (l < 0) {
            m->tr[ntr++] = r[i];
        } else {
            m->lr[nlr] = r[i];
            m->lr[nlr++].peer = l;
        }
    }
    if (nls + nlr == 0) return m->tcp->ops->exchange(m->tcp, m->ts, nts, m->tr, ntr);
    if (nts + ntr == 0) return mixed_local(m, nls, nlr);
    return mixed_both(m, nls, nlr, nts, ntr);
}

static void mixed_destroy(tally__tp *tp) {
    mixed_tp *m = (mixed_tp *)tp;
    if (m->base.ctx.note && m->base.ctx.note->arg == m) *m->base.ctx.note = (tally__wait_note){0};
    if (m->started) {
        pthread_mutex_lock(&m->mu);
        m->job = -1;
        pthread_cond_broadcast(&m->cv);
        pthread_mutex_unlock(&m->mu);
        pthread_join(m->th, NULL);
    }
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->cv);
    if (m->tcp) {
        m->tcp->abandon = tp->abandon;
        m->tcp->ops->destroy(m->tcp);
    }
    free(m->local_of);
    free(m->world_of);
    free(m->ls);
    free(m->ts);
    free(m->lr);
    free(m->tr);
    free(m);
}

static const tally__tp_ops mixed_ops = {.name = "shm+tcp", .exchange = mixed_exchange, .destroy = mixed_destroy};

int tally__mixed_create(tally__tp *tcp, tally__tp *shm, const int *local_of, tally__tp **out) {
    *out = NULL;
    int n = tcp->ctx.size;
    mixed_tp *m = calloc(1, sizeof *m);
    if (!m) return tally__seterr(TALLY_E_NOMEM, "rank %d: no memory for the shm+tcp transport", tcp->ctx.rank);
    m->base.ops = &mixed_ops;
    m->base.ctx = tcp->ctx;
    m->shm = shm;
    if (shm) memcpy(m->base.large, shm->large, sizeof m->base.large); /* the tcp half has no choice to name */
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->cv, NULL);
    m->local_of = malloc((size_t)n * sizeof *m->local_of);
    m->world_of = malloc((size_t)n * sizeof *m->world_of);
    m->ls = malloc((size_t)n * sizeof *m->ls);
    m->ts = malloc((size_t)n * sizeof *m->ts);
    m->lr = malloc((size_t)n * sizeof *m->lr);
    m->tr = malloc((size_t)n * sizeof *m->tr);
    if (!m->local_of || !m->world_of || !m->ls || !m->ts || !m->lr || !m->tr) {
        mixed_destroy(&m->base);
        return tally__seterr(TALLY_E_NOMEM, "rank %d: no memory for the shm+tcp transport", tcp->ctx.rank);
    }
    for (int r = 0; r < n; r++) {
        m->local_of[r] = shm ? local_of[r] : -1;
        if (m->local_of[r] >= 0) m->world_of[m->local_of[r]] = r;
        m->nlocal += m->local_of[r] >= 0;
    }
    if (shm && pthread_create(&m->th, NULL, mixed_helper, m)) {
        mixed_destroy(&m->base);
        return tally__seterr(TALLY_E_SYSTEM, "rank %d: cannot start the shm+tcp transport's thread", tcp->ctx.rank);
    }
    m->started = shm != NULL;
    if (shm && m->base.ctx.note) *m->base.ctx.note = (tally__wait_note){.tell = mixed_tell, .arg = m};
    m->tcp = tcp; /* taken over only on success: the caller still owns it on failure */
    *out = &m->base;
    return 0;
}
