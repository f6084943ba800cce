/* ps_worker.c - a worker's connection to the parameter server: connect and prove the token, pull the
 * parameters for a step (waiting while the staleness bound holds it back), push its gradient, goodbye. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../boot/boot.h"
#include "../boot/net.h"
#include "../core/clock.h"
#include "ps.h"

static int wk_io_err(const tally__ps_worker *w, int rc, const char *what) {
    if (rc == TALLY_E_TIMEOUT)
        return tally__seterr(rc, "rank %d: the parameter server did not answer a %s within %.0f s (TALLY_TIMEOUT)",
                             w->rank, what, w->timeout_s);
    if (rc == TALLY_E_PEER_LOST)
        return tally__seterr(rc,
                             "rank %d: the parameter server closed the connection during a %s (see rank 0's "
                             "error: another worker may have died)",
                             w->rank, what);
    return tally__seterr(rc == TALLY_E_PROTOCOL ? rc : TALLY_E_SYSTEM, "rank %d: %s with the parameter server failed",
                         w->rank, what);
}

int tally__ps_worker_connect(tally__ps_worker *w, const char *host, int port, const void *token, size_t token_len,
                             int worker, int rank, size_t nparams, double timeout_s) {
    *w = (tally__ps_worker){.fd = -1, .worker = worker, .rank = rank, .nparams = nparams, .timeout_s = timeout_s};
    uint64_t dl = tally__deadline(timeout_s);
    int rc = tally__net_connect(host, port, dl, &w->fd);
    if (!rc) rc = tally__auth_connect(w->fd, token, token_len, "ps", dl);
    tally__ps_hdr h = {.type = TALLY__PS_HELLO, .rank = worker};
    if (!rc && (rc = tally__ps_send(w->fd, &h, NULL, dl))) rc = wk_io_err(w, rc, "hello");
    if (rc) {
        char why[512];
        snprintf(why, sizeof why, "%s", tally_last_error());
        tally__ps_worker_close(w);
        return tally__seterr(rc, "rank %d: cannot join the parameter server at %s:%d: %s", rank, host, port, why);
    }
    return 0;
}

int tally__ps_worker_pull(tally__ps_worker *w, long clock, float *params, long *staleness) {
    uint64_t t0 = tally__now_ns(), dl = tally__deadline(w->timeout_s);
    tally__ps_hdr h = {.type = TALLY__PS_PULL, .rank = w->worker, .clock = (uint64_t)clock};
    int rc = tally__ps_send(w->fd, &h, NULL, dl);
    if (rc) return wk_io_err(w, rc, "pull");
    const char *why = NULL;
    /* The answer comes when the slowest worker is close enough: as long as the timeout, no longer. */
    rc = tally__ps_recv_hdr(w->fd, w->nparams, &h, dl, &why);
    if (rc == TALLY_E_PROTOCOL)
        return tally__seterr(rc, "rank %d: malformed answer from the parameter server: %s", w->rank, why);
    if (!rc && h.type == TALLY__PS_STOP && h.clock == (uint64_t)clock) return TALLY__PS_STOPPED;
    if (!rc && (h.type != TALLY__PS_PARAMS || h.clock != (uint64_t)clock))
        return tally__seterr(TALLY_E_PROTOCOL,
                             "rank %d: the parameter server answered a pull for step %ld with a %s "
                             "frame for step %llu",
                             w->rank, clock, tally__ps_type_name(h.type), (unsigned long long)h.clock);
    if (!rc) rc = tally__net_recv_all(w->fd, params, h.len, dl);
    if (rc) return wk_io_err(w, rc, "pull");
    *staleness = (long)h.aux;
    w->wait_s += (double)(tally__now_ns() - t0) * 1e-9;
    return 0;
}

int tally__ps_worker_push(tally__ps_worker *w, long clock, const float *grads) {
    tally__ps_hdr h = {.type = TALLY__PS_PUSH,
                       .rank = w->worker,
                       .clock = (uint64_t)clock,
                       .len = (uint32_t)(w->nparams * sizeof(float))};
    int rc = tally__ps_send(w->fd, &h, grads, tally__deadline(w->timeout_s));
    return rc ? wk_io_err(w, rc, "push") : 0;
}

int tally__ps_worker_bye(tally__ps_worker *w, long clock) {
    tally__ps_hdr h = {.type = TALLY__PS_BYE, .rank = w->worker, .clock = (uint64_t)clock};
    int rc = tally__ps_send(w->fd, &h, NULL, tally__deadline(w->timeout_s));
    return rc ? wk_io_err(w, rc, "goodbye") : 0;
}

void tally__ps_worker_close(tally__ps_worker *w) {
    if (w->fd >= 0) close(w->fd);
    w->fd = -1;
}
