/* ps_server.c - the parameter server: master parameters and optimizer state, pushes applied as they
 * come (or, at staleness 0, one averaged step per round), pulls answered within the staleness bound. */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../boot/boot.h"
#include "../boot/net.h"
#include "../core/clock.h"
#include "../core/log.h"
#include "ps.h"

#define POLL_MS     200
#define HANDSHAKE_S 10.0 /* a connection that has not proven the token by then is turned away */

typedef enum { W_NEW, W_LIVE, W_DONE, W_DEAD } ps_state;

typedef struct ps_wk {
    int fd;
    ps_state state;
    long clock;             /* complete gradients received from it */
    long pull;              /* the step a pull waits to compute (-1: none) */
    int held;               /* that pull was found waiting for the bound */
    uint64_t pull_t, heard; /* when the pull came, when the last frame came */
    long stale;             /* staleness of the parameters it last pulled */
    long served;            /* the step those parameters were for (-1: none yet) */
    float *stash;           /* S = 0: its gradient for the round in progress */
} ps_wk;

struct tally__ps_server {
    tally__ps_cfg cfg;
    float *params;
    float *grad; /* S >= 1: the push being read; S = 0: the round's mean */
    tally_optim optim;
    int lfd, port;
    uint64_t started;
    ps_wk *w;
    long round;    /* S = 0: the next round to apply */
    long answered; /* pulls answered with parameters */
    tally__ps_stats st;
    int rc; /* the first failure (a worker lost, a timeout) */
    char msg[1024];
    pthread_t thread;
    int thread_on;
};

const char *tally__stale_lr_name(tally__stale_lr s) {
    return s == TALLY__STALE_LR_INVERSE ? "inverse" : s == TALLY__STALE_LR_AUTO ? "auto" : "none";
}

int tally__stale_lr_parse(const char *name) {
    if (!name) return -1;
    if (!strcmp(name, "none")) return TALLY__STALE_LR_NONE;
    if (!strcmp(name, "inverse")) return TALLY__STALE_LR_INVERSE;
    if (!strcmp(name, "auto")) return TALLY__STALE_LR_AUTO;
    return -1;
}

static int rank_of(const tally__ps_server *s, int w) { return s->cfg.rank_base + w; }

/* Remembers the first failure; the server goes on serving the others so none of them hangs. */
static void ps_fail(tally__ps_server *s, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void ps_fail(tally__ps_server *s, int code, const char *fmt, ...) {
    char m[sizeof s->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    tally__log_warn("%s", m);
    if (s->rc) return;
    s->rc = code;
    snprintf(s->msg, sizeof s->msg, "%s", m);
}

static void ps_drop(tally__ps_server *s, int w, int code, const char *what) {
    ps_wk *k = &s->w[w];
    if (k->fd >= 0) close(k->fd);
    k->fd = -1;
    k->state = W_DEAD;
    k->pull = -1;
    if (s->st.dead_rank < 0) {
        s->st.dead_rank = rank_of(s, w);
        s->st.dead_clock = k->clock;
    }
    ps_fail(s, code,
            "parameter server: rank %d (worker %d) lost after %ld applied gradients: %s; nothing of an incomplete "
            "frame was applied, and the other workers go on without it",
            rank_of(s, w), w, k->clock, what);
}

int tally__ps_server_create(tally__ps_server **out, const tally__ps_cfg *cfg) {
    *out = NULL;
    if (cfg->nworkers < 1 || cfg->staleness < 0 || !cfg->init)
        return tally__seterr(TALLY_E_INVALID, "parameter server: %d workers and staleness %ld (need >= 1 and >= 0)",
                             cfg->nworkers, cfg->staleness);
    if (cfg->nparams > UINT32_MAX / sizeof(float))
        return tally__seterr(TALLY_E_INVALID, "parameter server: %zu parameters do not fit one frame (at most %zu)",
                             cfg->nparams, (size_t)(UINT32_MAX / sizeof(float)));
    tally__ps_server *s = calloc(1, sizeof *s);
    if (!s) return tally__seterr(TALLY_E_NOMEM, "parameter server: out of memory");
    s->cfg = *cfg;
    s->lfd = -1;
    s->st.dead_rank = -1;
    size_t bytes = (cfg->nparams ? cfg->nparams : 1) * sizeof(float);
    s->params = malloc(bytes);
    s->grad = malloc(bytes);
    s->w = calloc((size_t)cfg->nworkers, sizeof *s->w);
    int rc = !s->params || !s->grad || !s->w ? tally__seterr(TALLY_E_NOMEM, "parameter server: out of memory") : 0;
    for (int i = 0; !rc && i < cfg->nworkers; i++) {
        s->w[i] = (ps_wk){.fd = -1, .pull = -1, .served = -1};
        if (cfg->staleness == 0 && !(s->w[i].stash = malloc(bytes)))
            rc = tally__seterr(TALLY_E_NOMEM, "parameter server: out of memory for %d gradients", cfg->nworkers);
    }
    if (!rc) {
        memcpy(s->params, cfg->init, cfg->nparams * sizeof(float));
        rc = tally_optim_init(&s->optim, &cfg->optim, cfg->nparams);
    }
    if (!rc) rc = tally__net_listen(cfg->host, 0, cfg->nworkers + 4, &s->lfd);
    if (!rc && (s->port = tally__net_local_port(s->lfd)) < 0)
        rc = tally__seterr(TALLY_E_SYSTEM, "parameter server: cannot read its listening port");
    if (rc) {
        tally__ps_server_free(s);
        return rc;
    }
    s->started = tally__now_ns();
    *out = s;
    return 0;
}

int tally__ps_server_port(const tally__ps_server *s) { return s->port; }
const float *tally__ps_server_params(const tally__ps_server *s) { return s->params; }
const tally__ps_stats *tally__ps_server_stats(const tally__ps_server *s) { return &s->st; }

/* A connection: the token proven, then a hello naming a worker not yet connected. A stranger is
 * turned away without disturbing the run. */
static void ps_accept(tally__ps_server *s) {
    int fd = -1;
    if (tally__net_accept(s->lfd, &fd) || fd < 0) return;
    uint64_t dl = tally__deadline(s->cfg.timeout_s < HANDSHAKE_S ? s->cfg.timeout_s : HANDSHAKE_S);
    tally__ps_hdr h;
    const char *why = NULL;
    int rc = tally__auth_accept(fd, s->cfg.token, s->cfg.token_len, "ps", dl);
    if (!rc) rc = tally__ps_recv_hdr(fd, s->cfg.nparams, &h, dl, &why);
    if (!rc && (h.type != TALLY__PS_HELLO || h.rank < 0 || h.rank >= s->cfg.nworkers || s->w[h.rank].state != W_NEW))
        rc = TALLY_E_PROTOCOL, why = "not the hello of a worker still expected";
    if (rc) {
        tally__log_warn("parameter server: refused a connection: %s", why ? why : tally_last_error());
        close(fd);
        return;
    }
    ps_wk *k = &s->w[h.rank];
    k->fd = fd;
    k->state = W_LIVE;
    k->heard = tally__now_ns();
}

/* The slowest clock among the workers that may still push (one not yet connected counts as 0). */
static long ps_min_clock(const tally__ps_server *s) {
    long m = -1;
    for (int i = 0; i < s->cfg.nworkers; i++)
        if ((s->w[i].state == W_NEW || s->w[i].state == W_LIVE) && (m < 0 || s->w[i].clock < m)) m = s->w[i].clock;
    return m;
}

static void ps_record(tally__ps_server *s, long stale) {
    s->st.hist[stale < TALLY__PS_STALE_BINS - 1 ? stale : TALLY__PS_STALE_BINS - 1]++;
    if (stale > s->st.max_staleness) s->st.max_staleness = stale;
    s->st.pushes++;
}

/* S >= 1: one optimizer step per push, gradient / N, at the rate of the pusher's step, damped. */
static void ps_apply_one(tally__ps_server *s, ps_wk *k, long c) {
    float n = (float)s->cfg.nworkers;
    for (size_t i = 0; i < s->cfg.nparams; i++) s->grad[i] /= n;
    float lr = tally_lr_at(&s->cfg.sched, c);
    if (s->cfg.stale_lr == TALLY__STALE_LR_INVERSE) lr /= (float)(1 + k->stale);
    tally_optim_step(&s->optim, s->params, s->grad, lr);
    s->st.updates++;
    ps_record(s, k->stale);
}

/* S = 0: round r is complete once every worker still in the run has pushed it; its mean (summed in
 * worker order, then divided, as the allreduce's average) makes one step, as synchronous training. */
static void ps_apply_rounds(tally__ps_server *s) {
    for (;;) {
        int contributors = 0, waiting = 0;
        for (int i = 0; i < s->cfg.nworkers; i++) {
            const ps_wk *k = &s->w[i];
            if (k->clock > s->round)
                contributors++;
            else if (k->state == W_NEW || k->state == W_LIVE)
                waiting = 1;
        }
        if (waiting || !contributors) return;
        int first = 1;
        for (int i = 0; i < s->cfg.nworkers; i++) {
            if (s->w[i].clock <= s->round) continue;
            const float *g = s->w[i].stash;
            if (first)
                memcpy(s->grad, g, s->cfg.nparams * sizeof(float));
            else
                for (size_t j = 0; j < s->cfg.nparams; j++) s->grad[j] += g[j];
            first = 0;
        }
        for (size_t j = 0; j < s->cfg.nparams; j++) s->grad[j] /= (float)contributors;
        tally_optim_step(&s->optim, s->params, s->grad, tally_lr_at(&s->cfg.sched, s->round));
        s->st.updates++;
        s->round++;
    }
}

static void ps_on_push(tally__ps_server *s, int w, const tally__ps_hdr *h) {
    ps_wk *k = &s->w[w];
    float *dst = s->cfg.staleness == 0 ? k->stash : s->grad;
    int rc = tally__net_recv_all(k->fd, dst, h->len, tally__deadline(s->cfg.timeout_s));
    if (rc) {
        ps_drop(s, w, TALLY_E_PEER_LOST,
                rc == TALLY_E_TIMEOUT ? "it sent part of a gradient and then nothing until the timeout"
                                      : "it closed its connection in the middle of a gradient");
        return;
    }
    if (s->cfg.staleness == 0) {
        ps_record(s, 0);
        k->clock++;
        ps_apply_rounds(s);
    } else {
        ps_apply_one(s, k, (long)h->clock);
        k->clock++;
    }
}

/* One frame from worker w (poll said it has bytes). */
static void ps_frame(tally__ps_server *s, int w) {
    ps_wk *k = &s->w[w];
    tally__ps_hdr h;
    const char *why = NULL;
    int rc = tally__ps_recv_hdr(k->fd, s->cfg.nparams, &h, tally__deadline(s->cfg.timeout_s), &why);
    if (rc) {
        ps_drop(s, w, rc == TALLY_E_PROTOCOL ? rc : TALLY_E_PEER_LOST,
                rc == TALLY_E_PEER_LOST  ? "it closed its connection without saying goodbye"
                : rc == TALLY_E_PROTOCOL ? why
                                         : "it sent part of a frame header and then nothing");
        return;
    }
    k->heard = tally__now_ns();
    char bad[160];
    snprintf(bad, sizeof bad, "a %s frame for step %llu while at step %ld%s", tally__ps_type_name(h.type),
             (unsigned long long)h.clock, k->clock,
             k->pull >= 0            ? " with a pull outstanding"
             : k->served != k->clock ? " without parameters for it"
                                     : "");
    int in_order = h.rank == w && h.clock == (uint64_t)k->clock;
    if (h.type == TALLY__PS_PULL && in_order && k->pull < 0) {
        k->pull = k->clock;
        k->held = 0;
        k->pull_t = k->heard;
        s->st.pulls++;
    } else if (h.type == TALLY__PS_PUSH && in_order && k->pull < 0 && k->served == k->clock) {
        ps_on_push(s, w, &h);
    } else if (h.type == TALLY__PS_BYE && in_order && k->pull < 0) {
        close(k->fd);
        k->fd = -1;
        k->state = W_DONE;
    } else {
        ps_drop(s, w, TALLY_E_PROTOCOL, bad);
    }
}

/* Answers every pull the bound now allows: step c once the slowest worker has pushed c - S. */
static void ps_answer(tally__ps_server *s) {
    for (int i = 0; i < s->cfg.nworkers; i++) {
        ps_wk *k = &s->w[i];
        if (k->state != W_LIVE || k->pull < 0) continue;
        if (s->cfg.budget > 0 && s->answered >= s->cfg.budget) {
            tally__ps_hdr stop = {.type = TALLY__PS_STOP, .rank = -1, .clock = (uint64_t)k->pull};
            k->pull = -1;
            if (tally__ps_send(k->fd, &stop, NULL, tally__deadline(s->cfg.timeout_s)))
                ps_drop(s, i, TALLY_E_PEER_LOST, "the end of the shared budget could not be sent to it");
            continue;
        }
        long min = ps_min_clock(s);
        if (min < k->pull - s->cfg.staleness) {
            k->held = 1;
            continue;
        }
        long stale = k->pull - min > 0 ? k->pull - min : 0;
        tally__ps_hdr h = {.type = TALLY__PS_PARAMS,
                           .rank = -1,
                           .aux = (uint32_t)stale,
                           .clock = (uint64_t)k->pull,
                           .len = (uint32_t)(s->cfg.nparams * sizeof(float))};
        uint64_t now = tally__now_ns();
        if (k->held) {
            s->st.pulls_waited++;
            s->st.wait_s += (double)(now - k->pull_t) * 1e-9;
        }
        k->stale = stale;
        k->served = k->pull;
        k->pull = -1;
        s->answered++;
        if (tally__ps_send(k->fd, &h, s->params, tally__deadline(s->cfg.timeout_s)))
            ps_drop(s, i, TALLY_E_PEER_LOST, "the parameters it asked for could not be sent to it");
    }
}

/* A worker silent past the timeout while not held back by the bound, or never connected. */
static int ps_check_silence(tally__ps_server *s) {
    uint64_t now = tally__now_ns(), limit = (uint64_t)(s->cfg.timeout_s * 1e9);
    for (int i = 0; i < s->cfg.nworkers; i++) {
        ps_wk *k = &s->w[i];
        if (k->state == W_NEW && now - s->started > limit)
            return tally__seterr(TALLY_E_TIMEOUT,
                                 "parameter server: rank %d (worker %d) did not connect within %.0f s (TALLY_TIMEOUT)",
                                 rank_of(s, i), i, s->cfg.timeout_s);
        if (k->state == W_LIVE && k->pull < 0 && now - k->heard > limit)
            return tally__seterr(TALLY_E_TIMEOUT,
                                 "parameter server: rank %d (worker %d) sent nothing for %.0f s (TALLY_TIMEOUT) at "
                                 "step %ld; is it hung?",
                                 rank_of(s, i), i, s->cfg.timeout_s, k->clock);
    }
    return 0;
}

static int ps_active(const tally__ps_server *s) {
    for (int i = 0; i < s->cfg.nworkers; i++)
        if (s->w[i].state == W_NEW || s->w[i].state == W_LIVE) return 1;
    return 0;
}

static void ps_close_all(tally__ps_server *s) {
    for (int i = 0; i < s->cfg.nworkers; i++)
        if (s->w[i].fd >= 0) close(s->w[i].fd), s->w[i].fd = -1;
}

int tally__ps_server_run(tally__ps_server *s) {
    int n = s->cfg.nworkers, rc = 0;
    struct pollfd *pf = calloc((size_t)n + 1, sizeof *pf);
    int *who = calloc((size_t)n + 1, sizeof *who);
    if (!pf || !who) rc = tally__seterr(TALLY_E_NOMEM, "parameter server: out of memory");
    while (!rc && ps_active(s)) {
        int m = 0, want_new = 0;
        for (int i = 0; i < n; i++) {
            want_new |= s->w[i].state == W_NEW;
            if (s->w[i].state == W_LIVE) pf[m] = (struct pollfd){.fd = s->w[i].fd, .events = POLLIN}, who[m++] = i;
        }
        if (want_new) pf[m] = (struct pollfd){.fd = s->lfd, .events = POLLIN}, who[m++] = -1;
        if (poll(pf, (nfds_t)m, POLL_MS) < 0 && errno != EINTR) {
            rc = tally__seterr(TALLY_E_SYSTEM, "parameter server: poll failed: %s", strerror(errno));
            break;
        }
        for (int j = 0; j < m; j++) {
            if (!(pf[j].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            if (who[j] < 0)
                ps_accept(s);
            else if (s->w[who[j]].state == W_LIVE)
                ps_frame(s, who[j]);
        }
        ps_answer(s);
        rc = ps_check_silence(s);
    }
    free(pf);
    free(who);
    ps_close_all(s);
    if (!rc && s->rc) rc = tally__seterr(s->rc, "%s", s->msg);
    return rc;
}

static void *ps_thread(void *arg) {
    tally__ps_server *s = arg;
    int rc = tally__ps_server_run(s);
    if (rc) {
        s->rc = rc;
        snprintf(s->msg, sizeof s->msg, "%s", tally_last_error());
    }
    return NULL;
}

int tally__ps_server_start(tally__ps_server *s) {
    if (pthread_create(&s->thread, NULL, ps_thread, s))
        return tally__seterr(TALLY_E_SYSTEM, "parameter server: cannot start its thread");
    s->thread_on = 1;
    return 0;
}

int tally__ps_server_join(tally__ps_server *s) {
    if (s->thread_on) pthread_join(s->thread, NULL);
    s->thread_on = 0;
    return s->rc ? tally__seterr(s->rc, "%s", s->msg) : 0;
}

void tally__ps_server_free(tally__ps_server *s) {
    if (!s) return;
    if (s->thread_on) pthread_join(s->thread, NULL);
    ps_close_all(s);
    if (s->lfd >= 0) close(s->lfd);
    for (int i = 0; s->w && i < s->cfg.nworkers; i++) free(s->w[i].stash);
    free(s->w);
    tally_optim_free(&s->optim);
    free(s->params);
    free(s->grad);
    free(s);
}
