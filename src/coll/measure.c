/* measure.c - alpha and beta from a ping-pong between ranks 0 and 1 over the real transport, gamma from
 * timing the reduction kernel; rank 0's figures are broadcast so the model is identical everywhere. */
#include "measure.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/clock.h"
#include "../core/env.h"
#include "../core/parse.h"
#include "../core/numeric/reduce.h"

enum { TALLY__PING_SMALL = 8, TALLY__PING_LARGE = 4 << 20 };

/* One round trip: rank 0 sends `len` bytes, rank 1 answers with 8 bytes. */
static int tally__round_trip(const tally__ctx *c, void *buf, size_t len) {
    char ack[8] = {0};
    int peer = 1 - c->rank;
    tally__send s1 = {peer, buf, len}, s2 = {peer, ack, sizeof ack};
    tally__recv r1 = {.peer = peer, .dst = buf, .len = len}, r2 = {.peer = peer, .dst = ack, .len = sizeof ack};
    int rc;
    if (c->rank == 0) {
        if ((rc = tally__xchg(c, &s1, 1, NULL, 0))) return rc;
        return tally__xchg(c, NULL, 0, &r2, 1);
    }
    if ((rc = tally__xchg(c, NULL, 0, &r1, 1))) return rc;
    return tally__xchg(c, &s2, 1, NULL, 0);
}

/* Seconds of one round trip of `len` bytes: after a warm-up, the best mean of `rounds` rounds of `iters`
 * trips, so one bad moment (a peer descheduled, a page fault) does not become the cost model's figure
 * for the whole job. Both ranks make the same trips, whatever rank 0 measures. */
static int tally__time_trips(const tally__ctx *c, void *buf, size_t len, int rounds, int iters, double *sec) {
    int rc;
    for (int i = 0; i < 3; i++)
        if ((rc = tally__round_trip(c, buf, len))) return rc;
    *sec = 0;
    for (int k = 0; k < rounds; k++) {
        uint64_t t0 = tally__now_ns();
        for (int i = 0; i < iters; i++)
            if ((rc = tally__round_trip(c, buf, len))) return rc;
        double mean = (double)(tally__now_ns() - t0) * 1e-9 / iters;
        if (k == 0 || mean < *sec) *sec = mean;
    }
    return 0;
}

static int tally__ping_pong(const tally__ctx *c, double *alpha, double *beta) {
    char *buf = calloc(1, TALLY__PING_LARGE);
    if (!buf) return tally__seterr(TALLY_E_NOMEM, "rank %d: no memory to measure the links", c->rank);
    double small = 0, large = 0;
    int rc = tally__time_trips(c, buf, TALLY__PING_SMALL, 5, 40, &small);
    if (!rc) rc = tally__time_trips(c, buf, TALLY__PING_LARGE, 3, 3, &large);
    free(buf);
    if (rc) return rc;
    *alpha = small / 2;
    *beta = (large - small) / TALLY__PING_LARGE;
    if (*beta <= 0) *beta = 1e-12; /* a noisy machine can make the difference vanish */
    return 0;
}

/* Seconds per byte to reduce f32 vectors that fit in cache, as the pipelined algorithms do. */
static int tally__time_reduce(double *gamma) {
    size_t n = 64 << 10;
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    if (!a || !b) {
        free(a);
        free(b);
        return tally__seterr(TALLY_E_NOMEM, "no memory to measure the reduction speed");
    }
    for (size_t i = 0; i < n; i++) a[i] = b[i] = 1.0f;
    tally__reduce(a, a, b, n, TALLY_F32, TALLY_SUM);
    uint64_t t0 = tally__now_ns();
    for (int i = 0; i < 20; i++) tally__reduce(a, a, b, n, TALLY_F32, TALLY_SUM);
    *gamma = (double)(tally__now_ns() - t0) * 1e-9 / (20.0 * n * sizeof *a);
    free(a);
    free(b);
    return 0;
}

int tally__measure_cost(const tally__ctx *c, tally__boot *boot, const tally_config *cfg, tally__cost *out) {
    if (cfg->cost_beta_gbps > 0) { /* checked: the three are given together */
        *out = (tally__cost){.alpha = cfg->cost_alpha_us * 1e-6,
                             .beta = 1e-9 / cfg->cost_beta_gbps,
                             .gamma = 1e-9 / cfg->cost_gamma_gbps};
        return 0;
    }
    if (c->size == 1) return 0;
    double v[3] = {0, 0, 0};
    int rc;
    if (c->rank < 2 && (rc = tally__ping_pong(c, &v[0], &v[1]))) return rc;
    if (c->rank == 0 && (rc = tally__time_reduce(&v[2]))) return rc;
    if ((rc = tally__boot_bcast(boot, v, sizeof v, 0))) return rc;
    *out = (tally__cost){.alpha = v[0], .beta = v[1], .gamma = v[2]};
    return 0;
}
