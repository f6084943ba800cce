/* hier.c - the hierarchical collectives: the levels made from the world's peer table (hosts in order of
 * their first rank, local ranks in world order), each level's own communicator and cost, and the
 * reduce-scatter / allreduce / all-gather compositions over them. */
#include "hier.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../boot/boot.h"
#include "../core/err.h"
#include "../core/numeric/reduce.h"

int tally__hier_layout(const tally__peer *p, int size, int *host, int *local, int *per_host) {
    int hosts = tally__hosts_of(p, size, host, local);
    *per_host = hosts > 0 && size % hosts == 0 ? size / hosts : 0;
    for (int h = 0, count; h < hosts && *per_host; h++) {
        count = 0;
        for (int r = 0; r < size; r++) count += host[r] == h;
        if (count != *per_host) *per_host = 0;
    }
    return hosts;
}

void tally__hier_free(tally__hier *h) {
    if (!h) return;
    tally_comm_free(h->cross); /* the host level is the world's (tally__comm_keep_host) */
    free(h->world_of);
    free(h->tmp);
    free(h);
}

/* Both levels' alpha, beta and gamma, the largest over the world: every rank then predicts alike. */
static int agree_costs(tally_comm *world, tally__hier *h) {
    const tally__cost *hc = tally__comm_cost(h->host), *cc = tally__comm_cost(h->cross);
    double v[6] = {hc->alpha, hc->beta, hc->gamma, cc->alpha, cc->beta, cc->gamma};
    int rc = tally_allreduce(world, v, v, 6, TALLY_F64, TALLY_MAX);
    if (rc) return rc;
    h->host_cost = (tally__cost){.alpha = v[0], .beta = v[1], .gamma = v[2]};
    h->cross_cost = (tally__cost){.alpha = v[3], .beta = v[4], .gamma = v[5]};
    tally__hier_share_link(h);
    return 0;
}

void tally__hier_share_link(tally__hier *h) {
    h->cross_busy = h->cross_cost;
    h->cross_busy.beta *= h->per_host;
}

int tally__hier_init(tally_comm *world, const tally__boot *boot, tally_comm *host_comm, tally__hier **out) {
    *out = NULL;
    int size = tally_comm_size(world), rank = tally_comm_rank(world);
    tally__hier *h = calloc(1, sizeof *h);
    int *host = malloc((size_t)size * sizeof *host), *local = malloc((size_t)size * sizeof *local), rc = 0;
    if (!h || !host || !local || !(h->world_of = malloc((size_t)size * sizeof *h->world_of))) {
        rc = tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory for the hierarchy of %d ranks", rank, size);
        goto out;
    }
    if ((h->hosts = tally__hier_layout(tally__boot_peers(boot), size, host, local, &h->per_host)) < 0) {
        rc = tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory for the hierarchy of %d ranks", rank, size);
        goto out;
    }
    if (h->hosts < 2 || h->per_host < 2) goto out; /* no levels: *out stays NULL */
    for (int r = 0; r < size; r++) h->world_of[host[r] * h->per_host + local[r]] = r;
    h->local = local[rank];
    h->host_index = host[rank];
    h->host = host_comm;
    if (!(rc = tally_comm_split(world, local[rank], host[rank], &h->cross)) && !(rc = agree_costs(world, h))) {
        *out = h;
        h = NULL;
    }
out:
    tally__hier_free(h);
    free(host);
    free(local);
    return rc;
}

void tally__hier_steps(const tally__hier *h, int coll, size_t bytes, tally__hier_step s[3]) {
    memset(s, 0, 3 * sizeof *s);
    if (coll == TALLY__ALLREDUCE || coll == TALLY__REDUCE_SCATTER)
        s[0] = (tally__hier_step){TALLY__REDUCE_SCATTER, h->per_host, 0, bytes, &h->host_cost, 0};
    s[1] = (tally__hier_step){coll, h->hosts, 0, bytes / (size_t)h->per_host, &h->cross_busy, 0};
    if (coll == TALLY__ALLREDUCE || coll == TALLY__ALLGATHER)
        s[2] = (tally__hier_step){TALLY__ALLGATHER, h->per_host, 0, bytes, &h->host_cost, 0};
    for (int k = 0; k < 3; k++)
        if (s[k].cost) { /* the level's own communicator picks as the model does */
            s[k].algo = tally__algo_choose(s[k].cost, s[k].coll, s[k].n, s[k].bytes);
            s[k].seconds = tally__algo_cost(s[k].cost, s[k].algo, s[k].coll, s[k].n, s[k].bytes);
        }
}

/* A pipelined allreduce in `chunks` chunks of the steps s (each chunk's): the host level runs hier.c's
 * order, the level between hosts each chunk once it is reduce-scattered, an all-gather once its chunk has
 * crossed; the later of the two lanes' ends. */
static double pipe_seconds(const tally__hier_step s[3], int chunks) {
    double host = 0, cross = 0, crossed[TALLY__HIER_CHUNKS_MAX];
    for (int k = 0, gather, j; k < 2 * chunks; k++) {
        tally__hier_pipe_step(k, chunks, &gather, &j);
        if (gather) {
            host = fmax(host, crossed[j]) + s[2].seconds;
        } else {
            host += s[0].seconds;
            crossed[j] = cross = fmax(cross, host) + s[1].seconds;
        }
    }
    return fmax(host, cross);
}

/* The steps the model prices coll by: a pipelined allreduce's for one chunk, else the whole call's.
 * Returns the chunks (0: not pipelined). */
static int priced_steps(const tally__hier *h, int coll, size_t bytes, tally__hier_step s[3]) {
    int chunks = coll == TALLY__ALLREDUCE ? tally__hier_chunks(h, bytes) : 0;
    tally__hier_steps(h, coll, chunks ? bytes / (size_t)chunks : bytes, s);
    return chunks;
}

double tally__hier_cost(const tally__hier *h, int coll, size_t bytes) {
    if (coll != TALLY__ALLREDUCE && coll != TALLY__REDUCE_SCATTER && coll != TALLY__ALLGATHER) return HUGE_VAL;
    tally__hier_step s[3];
    int chunks = priced_steps(h, coll, bytes, s);
    return chunks ? pipe_seconds(s, chunks) : s[0].seconds + s[1].seconds + s[2].seconds;
}

void tally__hier_explain(const tally__hier *h, int coll, size_t bytes, char *buf, size_t n) {
    static const char *const where[3] = {"in each host", "between hosts", "in each host"};
    static const char *const coll_name[] = {[TALLY__ALLREDUCE] = "allreduce",
                                            [TALLY__REDUCE_SCATTER] = "reduce-scatter",
                                            [TALLY__ALLGATHER] = "all-gather"};
    tally__hier_step s[3];
    int chunks = priced_steps(h, coll, bytes, s);
    size_t used = 0;
    buf[0] = '\0';
    if (chunks) used = (size_t)snprintf(buf, n, "%d chunks, the levels overlapped, each: ", chunks);
    for (int k = 0, first = 1; k < 3 && used < n; k++)
        if (s[k].cost) {
            used += (size_t)snprintf(buf + used, n - used, "%s%s %s %s %.1f us on %d ranks", first ? "" : " + ",
                                     coll_name[s[k].coll], where[k], tally__algo_name(s[k].algo), 1e6 * s[k].seconds,
                                     s[k].n);
            first = 0;
        }
}

static void *scratch(tally__hier *h, size_t bytes) {
    if (bytes <= h->tmp_bytes) return h->tmp;
    void *p = realloc(h->tmp, bytes);
    if (!p) return NULL;
    h->tmp = p;
    h->tmp_bytes = bytes;
    return p;
}

/* Large vectors go in tally__hier_chunks contiguous chunks (each a multiple of M elements), so that a chunk
 * crosses the hosts on the cross communicator's own thread (a non-blocking allreduce: the one thread of
 * that communicator, not one per call) while the next one is reduce-scattered and the last one
 * all-gathered in the host: the levels then overlap instead of waiting for one another. The host
 * communicator's calls keep one order on every rank (RS 0, RS 1, AG 0, RS 2, AG 1, ...), the cross
 * communicator's too (AR 0, AR 1, ...). */
int tally__hier_chunks(const tally__hier *h, size_t bytes) {
    if (bytes < TALLY__HIER_PIPE_MIN_BYTES) return 0;
    size_t shard = bytes / (size_t)h->per_host;
    int algo = tally__algo_choose(&h->cross_busy, TALLY__ALLREDUCE, h->hosts, shard);
    double by_time =
        ceil(tally__algo_cost(&h->cross_busy, algo, TALLY__ALLREDUCE, h->hosts, shard) / TALLY__HIER_CHUNK_SECONDS);
    size_t most = bytes / TALLY__HIER_CHUNK_MIN_BYTES;
    if (most > TALLY__HIER_CHUNKS_MAX) most = TALLY__HIER_CHUNKS_MAX;
    if (!(by_time >= TALLY__HIER_CHUNKS_MIN)) return TALLY__HIER_CHUNKS_MIN; /* NaN too */
    return by_time > (double)most ? (int)most : (int)by_time;
}

void tally__hier_pipe_step(int k, int chunks, int *gather, int *chunk) {
    /* RS 0, then (RS j, AG j-1) for j = 1.., then the last AG */
    *gather = k > 0 && (k % 2 == 0 || k == 2 * chunks - 1);
    *chunk = k == 0 ? 0 : k == 2 * chunks - 1 ? chunks - 1 : *gather ? k / 2 - 1 : (k + 1) / 2;
}

typedef struct pipe {
    tally__hier *h;
    char *piece; /* `chunks` shards of `shard` elements (the last may be shorter) */
    size_t shard, q, es;
    int chunks;
    tally_dtype t;
    tally_op op;
    tally_request *cross[TALLY__HIER_CHUNKS_MAX]; /* chunk j's allreduce between hosts, posted once it is scattered */
} pipe_t;

static size_t chunk_len(const pipe_t *p, int j) { return tally__hier_chunk_len(p->q, p->shard, j); }

static char *pipe_shard(const pipe_t *p, int j) { return p->piece + (size_t)j * p->shard * p->es; }

/* The host steps of chunk j (elements M x shard from j x M x shard). */
static int pipe_rs(pipe_t *p, const char *send, int j) {
    size_t n = chunk_len(p, j), M = (size_t)p->h->per_host, at = (size_t)j * M * p->shard * p->es;
    return n ? tally_reduce_scatter(p->h->host, send + at, pipe_shard(p, j), n, p->t, p->op) : 0;
}

static int pipe_ag(pipe_t *p, char *recv, int j) {
    size_t n = chunk_len(p, j), M = (size_t)p->h->per_host, at = (size_t)j * M * p->shard * p->es;
    return n ? tally_allgather(p->h->host, pipe_shard(p, j), recv + at, n, p->t) : 0;
}

static int pipe_post_cross(pipe_t *p, int j) {
    size_t n = chunk_len(p, j);
    return n ? tally_iallreduce(p->h->cross, pipe_shard(p, j), pipe_shard(p, j), n, p->t, p->op, &p->cross[j]) : 0;
}

/* Chunk j's cross allreduce done (0 when it was never posted); its error, with its message. */
static int pipe_wait_cross(pipe_t *p, int j) {
    if (!p->cross[j]) return 0;
    int rc = tally_wait(p->cross[j]);
    tally_request_free(p->cross[j]);
    p->cross[j] = NULL;
    return rc;
}

static int pipe_run(pipe_t *p, const char *send, char *recv) {
    int rc = 0;
    for (int k = 0, gather, j; k < 2 * p->chunks && !rc; k++) {
        tally__hier_pipe_step(k, p->chunks, &gather, &j);
        if (gather) {
            if (!(rc = pipe_wait_cross(p, j))) rc = pipe_ag(p, recv, j);
        } else if (!(rc = pipe_rs(p, send, j))) {
            rc = pipe_post_cross(p, j);
        }
    }
    /* After a failure the chunks already posted still end before the scratch is reused; the first
     * error is the one reported. */
    char why[1024];
    if (rc) snprintf(why, sizeof why, "%s", tally_last_error());
    for (int j = 0; j < p->chunks; j++) {
        int rj = pipe_wait_cross(p, j);
        if (rj && !rc) {
            rc = rj;
            snprintf(why, sizeof why, "%s", tally_last_error());
        }
    }
    return rc ? tally__seterr(rc, "%s", why) : 0;
}

/* The part of M equal shards of q elements: reduce-scatter, the shard across hosts, all-gather. */
static int hier_shards(tally__hier *h, const void *send, void *recv, size_t q, tally_dtype t, tally_op rop) {
    size_t es = tally_dtype_size(t), M = (size_t)h->per_host;
    char *piece = scratch(h, q * es);
    if (!piece) return tally__seterr(TALLY_E_NOMEM, "hierarchical allreduce: out of memory for a shard of %zu", q);
    int chunks = tally__hier_chunks(h, q * M * es);
    if (chunks) {
        pipe_t p = {.h = h,
                    .piece = piece,
                    .shard = (q + (size_t)chunks - 1) / (size_t)chunks,
                    .q = q,
                    .es = es,
                    .chunks = chunks,
                    .t = t,
                    .op = rop};
        return pipe_run(&p, send, recv);
    }
    int rc;
    if ((rc = tally_reduce_scatter(h->host, send, piece, q, t, rop)) ||
        (rc = tally_allreduce(h->cross, piece, piece, q, t, rop)))
        return rc;
    return tally_allgather(h->host, piece, recv, q, t);
}

int tally__hier_allreduce(tally__hier *h, const void *send, void *recv, size_t count, tally_dtype t, tally_op op) {
    size_t es = tally_dtype_size(t), M = (size_t)h->per_host, q = count / M, tail = count - q * M;
    tally_op rop = op == TALLY_AVG ? TALLY_SUM : op;
    int rc = 0;
    if (q && (rc = hier_shards(h, send, recv, q, t, rop))) return rc;
    if (tail) { /* fewer than M elements left: reduced whole at both levels */
        const char *s = (const char *)send + q * M * es;
        char *d = (char *)recv + q * M * es;
        if ((rc = tally_allreduce(h->host, s, d, tail, t, rop)) || (rc = tally_allreduce(h->cross, d, d, tail, t, rop)))
            return rc;
    }
    if (op == TALLY_AVG) tally__avg_finish(recv, count, t, h->hosts * h->per_host);
    return 0;
}

/* Block (host g, local i) of a rank-major array of world blocks, moved to or from the level-major
 * order [local i][host g] the two steps need. */
static void reorder(const tally__hier *h, char *level_major, char *world_major, size_t block, int to_level) {
    for (int i = 0; i < h->per_host; i++)
        for (int g = 0; g < h->hosts; g++) {
            char *lm = level_major + ((size_t)i * h->hosts + g) * block;
            char *wm = world_major + (size_t)h->world_of[g * h->per_host + i] * block;
            if (to_level)
                memcpy(lm, wm, block);
            else
                memcpy(wm, lm, block);
        }
}

int tally__hier_reduce_scatter(tally__hier *h, const void *send, void *recv, size_t recvcount, tally_dtype t,
                               tally_op op) {
    size_t es = tally_dtype_size(t), block = recvcount * es, N = (size_t)h->hosts * h->per_host;
    size_t host_part = (size_t)h->hosts * block; /* what each local rank keeps after the host's step */
    tally_op rop = op == TALLY_AVG ? TALLY_SUM : op;
    char *lm = scratch(h, N * block + host_part);
    if (!lm) return tally__seterr(TALLY_E_NOMEM, "hierarchical reduce-scatter: out of memory for %zu bytes", N * block);
    reorder(h, lm, (char *)send, block, 1);
    char *mine = lm + N * block;
    int rc = tally_reduce_scatter(h->host, lm, mine, (size_t)h->hosts * recvcount, t, rop);
    if (!rc) rc = tally_reduce_scatter(h->cross, mine, recv, recvcount, t, rop);
    if (!rc && op == TALLY_AVG) tally__avg_finish(recv, recvcount, t, (int)N);
    return rc;
}

int tally__hier_allgather(tally__hier *h, const void *send, void *recv, size_t sendcount, tally_dtype t) {
    size_t es = tally_dtype_size(t), block = sendcount * es, N = (size_t)h->hosts * h->per_host;
    size_t host_part = (size_t)h->hosts * block;
    char *lm = scratch(h, N * block + host_part);
    if (!lm) return tally__seterr(TALLY_E_NOMEM, "hierarchical all-gather: out of memory for %zu bytes", N * block);
    char *mine = lm + N * block;
    int rc = tally_allgather(h->cross, send, mine, sendcount, t);
    if (!rc) rc = tally_allgather(h->host, mine, lm, (size_t)h->hosts * sendcount, t);
    if (!rc) reorder(h, lm, recv, block, 0);
    return rc;
}

static double lv_cost(const void *h, int coll, size_t bytes) { return tally__hier_cost(h, coll, bytes); }
static void lv_explain(const void *h, int coll, size_t bytes, char *buf, size_t n) {
    tally__hier_explain(h, coll, bytes, buf, n);
}
static int lv_allreduce(void *h, const void *s, void *r, size_t n, tally_dtype t, tally_op op) {
    return tally__hier_allreduce(h, s, r, n, t, op);
}
static int lv_reduce_scatter(void *h, const void *s, void *r, size_t n, tally_dtype t, tally_op op) {
    return tally__hier_reduce_scatter(h, s, r, n, t, op);
}
static int lv_allgather(void *h, const void *s, void *r, size_t n, tally_dtype t) {
    return tally__hier_allgather(h, s, r, n, t);
}
static void lv_release(void *arg, int abandon) {
    tally__hier *h = arg;
    if (abandon) { /* the world was aborted: its levels go without goodbyes too */
        tally_comm_abort(h->cross);
        h->cross = NULL;
    }
    tally__hier_free(h);
}

tally__levels tally__hier_levels(tally__hier *h) {
    return (tally__levels){.h = h,
                           .cost = lv_cost,
                           .explain = lv_explain,
                           .allreduce = lv_allreduce,
                           .reduce_scatter = lv_reduce_scatter,
                           .allgather = lv_allgather,
                           .release = lv_release};
}
