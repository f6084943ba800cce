/* trace_sync.c - the timeline across ranks: each rank's clock offset from rank 0's, measured at init by
 * round trips over the communicator's own transport, and at the end every rank's spans sent to rank 0,
 * which writes the one file (or, on a broken communicator, each rank its own). */
#include "trace_sync.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/file.h"
#include "../core/trace.h"

#define TRACE_ROUNDS 16 /* round trips per rank: the shortest one's midpoint is the offset */

/* Rank 0's side with rank r: its clock at the middle of the shortest trip, against r's answer. */
static int sync_with(const tally__ctx *c, int r, int64_t *offset, double *rtt) {
    uint64_t best = UINT64_MAX;
    int rc = 0;
    for (int k = 0; k < TRACE_ROUNDS && !rc; k++) {
        uint64_t t0 = tally__now_ns(), tr = 0;
        tally__send s = {r, &t0, sizeof t0};
        tally__recv v = {.peer = r, .dst = &tr, .len = sizeof tr};
        rc = tally__xchg(c, &s, 1, NULL, 0);
        if (!rc) rc = tally__xchg(c, NULL, 0, &v, 1);
        uint64_t t1 = tally__now_ns();
        if (!rc && t1 - t0 < best) {
            best = t1 - t0;
            *offset = (int64_t)(tr - (t0 + (t1 - t0) / 2));
        }
    }
    *rtt = (double)best;
    return rc;
}

/* Rank r's side: answers each trip with its clock, then learns its offset and the origin. */
static int sync_answer(const tally__ctx *c, tally__trace_clock *clk) {
    int rc = 0;
    for (int k = 0; k < TRACE_ROUNDS && !rc; k++) {
        uint64_t t0 = 0;
        tally__recv v = {.peer = 0, .dst = &t0, .len = sizeof t0};
        rc = tally__xchg(c, NULL, 0, &v, 1);
        uint64_t mine = tally__now_ns();
        tally__send s = {0, &mine, sizeof mine};
        if (!rc) rc = tally__xchg(c, &s, 1, NULL, 0);
    }
    int64_t got[2] = {0, 0};
    tally__recv v = {.peer = 0, .dst = got, .len = sizeof got};
    if (!rc) rc = tally__xchg(c, NULL, 0, &v, 1);
    clk->offset_ns = got[0];
    clk->origin_ns = (uint64_t)got[1];
    return rc;
}

int tally__trace_sync(const tally__ctx *c, tally__trace_clock *clk) {
    memset(clk, 0, sizeof *clk);
    int n = c->size, rc = 0;
    if (c->rank != 0) return sync_answer(c, clk);
    clk->origin_ns = tally__now_ns();
    clk->offsets = calloc((size_t)n, sizeof *clk->offsets);
    clk->rtt_ns = calloc((size_t)n, sizeof *clk->rtt_ns);
    if (!clk->offsets || !clk->rtt_ns) return tally__seterr(TALLY_E_NOMEM, "rank 0: no memory for the timeline");
    for (int r = 1; r < n && !rc; r++) {
        rc = sync_with(c, r, &clk->offsets[r], &clk->rtt_ns[r]);
        int64_t tell[2] = {clk->offsets[r], (int64_t)clk->origin_ns};
        tally__send s = {r, tell, sizeof tell};
        if (!rc) rc = tally__xchg(c, &s, 1, NULL, 0);
    }
    return rc;
}

void tally__trace_clock_free(tally__trace_clock *clk) {
    free(clk->offsets);
    free(clk->rtt_ns);
    memset(clk, 0, sizeof *clk);
}

/* ---- writing ---------------------------------------------------------------------------------- */

static int write_all(FILE *f, const char *p, size_t n) { return fwrite(p, 1, n, f) == n ? 0 : -1; }

/* The file's head: what the clocks are and how they were lined up. */
static int write_head(FILE *f, const tally__ctx *c, const tally__trace_clock *clk, int merged) {
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"tally\":\"timeline v1\",\"ranks\":%d,", c->size);
    fprintf(f, "\"clock\":\"CLOCK_MONOTONIC of each rank, less its offset from rank 0's, from rank 0's start\",");
    fprintf(f, "\"merged\":%s,\"clock_offset_us\":[", merged ? "true" : "false");
    for (int r = 0; r < c->size; r++)
        fprintf(f, "%s%.3f", r ? "," : "", clk->offsets ? (double)clk->offsets[r] * 1e-3 : 0.0);
    fprintf(f, "],\"offset_round_trip_us\":[");
    for (int r = 0; r < c->size; r++) fprintf(f, "%s%.3f", r ? "," : "", clk->rtt_ns ? clk->rtt_ns[r] * 1e-3 : 0.0);
    fprintf(f, "]},\n\"traceEvents\":[\n");
    return ferror(f) ? -1 : 0;
}

static int write_tail(FILE *f) {
    fprintf(f, "\n]}\n");
    return ferror(f) ? -1 : 0;
}

static void my_label(const tally__ctx *c, char *label, size_t n) {
    char host[64] = "";
    gethostname(host, sizeof host - 1);
    snprintf(label, n, "rank %d (pid %d, %s; %llu spans dropped)", c->rank, (int)getpid(), host,
             (unsigned long long)tally__trace_dropped());
}

static int open_out(tally__file_out *o, const char *path) {
    return tally__file_out_open(o, path) ? tally__err_wrap(TALLY_E_SYSTEM, "", " (TALLY_TRACE)") : 0;
}

/* Each rank alone, when the communicator cannot carry the spans (PATH.rank<R>), or a world of one. */
static int write_own(const tally__ctx *c, const tally__trace_clock *clk, const char *path) {
    char own[4096], label[160], *json;
    size_t len;
    if (c->size == 1)
        snprintf(own, sizeof own, "%s", path);
    else
        snprintf(own, sizeof own, "%s.rank%d", path, c->rank);
    my_label(c, label, sizeof label);
    int rc = tally__trace_json(c->rank, label, clk->offset_ns, clk->origin_ns, &json, &len);
    if (rc) return rc;
    tally__file_out o = {0};
    if ((rc = open_out(&o, own))) {
        free(json);
        return rc;
    }
    tally__trace_clock none = {.offsets = NULL};
    /* a failed write leaves o.f in error: the commit says why (ENOSPC, EPIPE...) and drops the file */
    (void)(write_head(o.f, c, c->rank == 0 ? clk : &none, 0) || write_all(o.f, json, len) || write_tail(o.f));
    free(json);
    return tally__file_out_commit(&o) ? tally__err_wrap(TALLY_E_SYSTEM, "", " (TALLY_TRACE)") : 0;
}

/* Rank r's spans to rank 0: their length, then the bytes. */
static int send_spans(const tally__ctx *c, const char *json, size_t len) {
    uint64_t n = len;
    tally__send s1 = {0, &n, sizeof n}, s2 = {0, json, len};
    int rc = tally__xchg(c, &s1, 1, NULL, 0);
    return rc ? rc : tally__xchg(c, &s2, 1, NULL, 0);
}

static int recv_spans(const tally__ctx *c, int r, char **json, size_t *len) {
    uint64_t n = 0;
    tally__recv v1 = {.peer = r, .dst = &n, .len = sizeof n};
    int rc = tally__xchg(c, NULL, 0, &v1, 1);
    if (rc) return rc;
    if (n > ((uint64_t)1 << 34) || !(*json = malloc(n ? n : 1)))
        return tally__seterr(TALLY_E_NOMEM, "rank 0: no memory for rank %d's %llu bytes of timeline", r,
                             (unsigned long long)n);
    tally__recv v2 = {.peer = r, .dst = *json, .len = n};
    *len = n;
    return tally__xchg(c, NULL, 0, &v2, 1);
}

/* Rank 0 writes its spans, then each rank's as it arrives; every rank takes part even when rank 0 cannot
 * write, so no rank is left waiting. */
static int write_merged(const tally__ctx *c, const tally__trace_clock *clk, const char *path, const char *mine,
                        size_t mine_len) {
    tally__file_out o = {0};
    char open_why[1024] = "";
    int wrc = open_out(&o, path), rc = 0;
    if (wrc) snprintf(open_why, sizeof open_why, "%s", tally_last_error());
    if (!wrc) wrc = write_head(o.f, c, clk, 1) || write_all(o.f, mine, mine_len) ? TALLY_E_SYSTEM : 0;
    for (int r = 1; r < c->size && !rc; r++) {
        char *json = NULL;
        size_t len = 0;
        rc = recv_spans(c, r, &json, &len);
        if (!rc && !wrc && len && (write_all(o.f, ",\n", 2) || write_all(o.f, json, len))) wrc = TALLY_E_SYSTEM;
        free(json);
    }
    if (!wrc && !rc) write_tail(o.f);
    if (rc) { /* a rank's spans did not come: no file; the message is the exchange's */
        tally__file_out_abort(&o);
        return rc;
    }
    if (!o.f) return tally__seterr(TALLY_E_SYSTEM, "%s", open_why); /* the spans received meanwhile set none */
    /* a failed write leaves o.f in error: the commit says why (ENOSPC, EPIPE...) and drops the file */
    return tally__file_out_commit(&o) ? tally__err_wrap(TALLY_E_SYSTEM, "", " (TALLY_TRACE)") : 0;
}

int tally__trace_write(const tally__ctx *c, const tally__trace_clock *clk, const char *path, int healthy) {
    if (!healthy || c->size == 1) return write_own(c, clk, path);
    char label[160], *json = NULL;
    size_t len = 0;
    my_label(c, label, sizeof label);
    int rc = tally__trace_json(c->rank, label, clk->offset_ns, clk->origin_ns, &json, &len);
    if (rc) { /* still take part, with nothing, so rank 0 is not left waiting */
        json = NULL;
        len = 0;
    }
    int xrc = c->rank == 0 ? write_merged(c, clk, path, json ? json : "", len) : send_spans(c, json ? json : "", len);
    free(json);
    return rc ? rc : xrc;
}
