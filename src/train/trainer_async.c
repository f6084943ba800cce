/* trainer_async.c - one rank's asynchronous run (--mode async): rank 0 hosts the parameter server, workers
 * pull, compute on their shard and push under the staleness bound; then all get the server's parameters. */
#include <math.h>
#include <openssl/rand.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "../boot/boot.h"
#include "../core/clock.h"
#include "../core/err.h"
#include "../coll/coll.h"
#include "../dp/codec.h"
#include "../ps/ps.h"
#include "train_seam.h"
#include "trainer_int.h"

_Static_assert(TALLY__TRAIN_STALE_BINS == TALLY__PS_STALE_BINS, "the result holds the server's histogram");

typedef struct async_run {
    train_run r;
    int nworkers, worker; /* worker index of this rank; -1 for a rank 0 that only serves */
    tally__boot_env env;  /* the job's address and token */
    const char *host;     /* where the server listens and the workers connect */
    tally__ps_server *ps; /* rank 0 */
    tally__ps_worker wk;
    double data_s, compute_s, push_s, loss;
    long steps; /* this worker's steps (with a shared quota, its share) */
} async_run;

static int async_refuse(const tally__train_cfg *cfg, int rank, int size) {
    const char *what =
        cfg->sync.zero        ? "--zero (the server holds the whole optimizer state; shards are not done)"
        : cfg->sync.accum > 1 ? "--accum > 1 (push one gradient per batch instead, or use --mode sync)"
        : cfg->ckpt.dir       ? "--ckpt (the server's state is not checkpointed)"
        : cfg->sync.codec.kind != TALLY__CODEC_NONE ? "--compress (pushes and pulls carry f32 gradients and parameters)"
        : cfg->check_replicas > 0                   ? "--check-replicas (workers hold different parameters by design)"
        : tally__train_seam_corrupts()              ? "--inject-nan or --inject-flip"
        : cfg->opt.clip > 0        ? "--clip (the server applies each push as it comes: no global norm)"
        : cfg->sync.decay_matrices ? "--weight-decay-on matrices (the server's optimizer decays every parameter)"
                                   : NULL;
    if (what) return tally__seterr(TALLY_E_INVALID, "rank %d: --mode async does not work with %s", rank, what);
    if (cfg->async.staleness < 0)
        return tally__seterr(TALLY_E_INVALID, "rank %d: --staleness %ld: the bound must be >= 0 (0 is synchronous)",
                             rank, cfg->async.staleness);
    if (cfg->async.ps_dedicated && size < 2)
        return tally__seterr(TALLY_E_INVALID,
                             "rank %d: --ps makes rank 0 a server that does not train, so it needs "
                             "at least 2 ranks (-n 2 or more)",
                             rank);
    return 0;
}

/* Where rank 0 listens (the communicator's bind, else its rendezvous host, loopback for a world of one)
 * and the token the workers prove (a fresh random one for a world of one, which has none). */
static int async_address(async_run *a) {
    int rc = tally__boot_env_from_config(tally__comm_config(a->r.comm), &a->env);
    if (rc) return rc;
    a->host = a->env.host[0] ? a->env.host : "127.0.0.1";
    if (!a->env.token_len) {
        if (a->r.size > 1)
            return tally__seterr(TALLY_E_BOOT, "rank %d: no job token for the parameter server", a->r.rank);
        unsigned char t[16];
        if (RAND_bytes(t, sizeof t) != 1) return tally__seterr(TALLY_E_SYSTEM, "OpenSSL RAND_bytes failed");
        for (size_t i = 0; i < sizeof t; i++) snprintf(a->env.token + 2 * i, 3, "%02x", t[i]);
        a->env.token_len = 2 * sizeof t;
    }
    return 0;
}

static int async_setup(async_run *a, tally__train_result *res) {
    train_run *r = &a->r;
    const tally__train_cfg *cfg = r->cfg;
    int rc = tally__train_load_data(r, res);
    if (rc) return rc;
    tally__model_cfg mc;
    tally__train_model_cfg(r, &mc);
    if (r->tokens) {
        r->steps_per_epoch = tally__train_text_steps_per_epoch(r, mc.in_dim, a->nworkers);
    } else {
        /* The same shards as synchronous training over the workers: worker w is rank w of nworkers. */
        int w = a->worker >= 0 ? a->worker : 0;
        if ((rc = tally_sampler_init(&r->sampler, r->train.n, w, a->nworkers, cfg->seed, 1))) return rc;
        r->steps_per_epoch = (long)(tally_sampler_len(&r->sampler) / (size_t)cfg->batch);
        if (r->steps_per_epoch < 1)
            return tally__seterr(TALLY_E_INVALID,
                                 "rank %d: %zu training samples per worker cannot fill one batch of %d; use a smaller "
                                 "--batch or fewer ranks",
                                 r->rank, tally_sampler_len(&r->sampler), cfg->batch);
    }
    /* Every rank draws the same initial parameters from the seed; the server starts from rank 0's. */
    if ((rc = tally__model_init(&r->model, &mc, cfg->batch, cfg->seed, NULL, 0))) return rc;
    if ((rc = tally__train_precision(cfg, &r->model, r->rank))) return rc;
    if ((rc = tally__train_check_input(r))) return rc;
    if ((rc = tally__train_prepare_steps(r, res, a->nworkers))) return rc;
    return async_address(a);
}

/* --stale-lr auto: no damping where the schedule decays the rate (bench/ssp.sh: at S = 3 under cosine
 * decay, 1.05 points better than lr / (1 + s) after 5 epochs), lr / (1 + s) at a constant rate. */
static tally__stale_lr async_stale_lr(const async_run *a) {
    int s = a->r.cfg->async.stale_lr;
    if (s != TALLY__STALE_LR_AUTO) return (tally__stale_lr)s;
    return a->r.sched.decay != TALLY_DECAY_NONE ? TALLY__STALE_LR_NONE : TALLY__STALE_LR_INVERSE;
}

static int async_server_create(async_run *a) {
    const tally__train_cfg *cfg = a->r.cfg;
    tally__ps_cfg pc = {.nworkers = a->nworkers,
                        .rank_base = cfg->async.ps_dedicated,
                        .staleness = cfg->async.staleness,
                        .stale_lr = async_stale_lr(a),
                        .nparams = a->r.model.nparams,
                        .init = a->r.model.params,
                        .optim = cfg->opt.optim,
                        .sched = a->r.sched,
                        .token = a->env.token,
                        .token_len = a->env.token_len,
                        .host = a->env.bind[0] ? a->env.bind : a->host,
                        .timeout_s = tally__comm_timeout_s(a->r.comm),
                        .budget = cfg->async.shared_quota ? a->r.sched.total_steps * a->nworkers : 0};
    return tally__ps_server_create(&a->ps, &pc);
}

/* One step of worker clock c: pull, forward and backward on this worker's batch, push. */
static int async_step(async_run *a, long c) {
    train_run *r = &a->r;
    const tally__train_cfg *cfg = r->cfg;
    long in_epoch = c % r->steps_per_epoch, stale;
    if (in_epoch == 0 && !r->tokens) tally_sampler_set_epoch(&r->sampler, (int)(c / r->steps_per_epoch));
    int rc = tally__ps_worker_pull(&a->wk, c, r->model.params, &stale);
    if (rc) return rc; /* or TALLY__PS_STOPPED */
    uint64_t t0 = tally__now_ns();
    if (r->tokens) {
        tally__train_text_batch(r, c, 0, a->worker, a->nworkers); /* worker clock c: its own windows */
    } else {
        for (int s = 0; s < cfg->batch; s++)
            r->idx[s] = tally_sampler_index(&r->sampler, (size_t)(in_epoch * cfg->batch + s));
        tally__train_gather(r, &r->train, r->idx, cfg->batch);
    }
    uint64_t t1 = tally__now_ns();
    tally__train_straggle(cfg, r->rank, c);
    memset(r->model.grads, 0, r->model.nparams * sizeof(float));
    float loss;
    if ((rc = tally__model_forward(&r->model, r->xb, r->yb, r->tb, cfg->batch, &r->hooks, &loss)) ||
        (rc = tally__model_backward(&r->model, r->yb, r->tb, cfg->batch, &r->hooks)))
        return rc;
    if (!isfinite(loss))
        return tally__seterr(TALLY_E_NONFINITE,
                             "rank %d: the loss of step %ld is %g; --mode async stops on a "
                             "non-finite loss rather than push its gradient (lower --lr)",
                             r->rank, c, (double)loss);
    uint64_t t2 = tally__now_ns();
    rc = tally__ps_worker_push(&a->wk, c, r->model.grads);
    a->data_s += (double)(t1 - t0) * 1e-9;
    a->compute_s += (double)(t2 - t1) * 1e-9;
    a->push_s += (double)(tally__now_ns() - t2) * 1e-9;
    a->loss = loss;
    return rc;
}

static int async_work(async_run *a, int port, tally__train_result *res) {
    train_run *r = &a->r;
    long total = r->sched.total_steps;
    int rc = tally__ps_worker_connect(&a->wk, a->host, port, a->env.token, a->env.token_len, a->worker, r->rank,
                                      r->model.nparams, tally__comm_timeout_s(a->r.comm));
    if (rc) return rc;
    tally__train_tell(r, &(tally__train_event){.kind = TALLY__TRAIN_BEGIN, .total_steps = total});
    double epoch_loss = 0;
    long c = 0, limit = r->cfg->async.shared_quota ? total * a->nworkers : total; /* the server says stop */
    for (; c < limit && !rc; c++) {
        if ((rc = async_step(a, c)) == TALLY__PS_STOPPED) {
            rc = 0;
            break;
        }
        if (!rc) {
            epoch_loss += a->loss;
            long in_epoch = c % r->steps_per_epoch + 1;
            res->last_loss = epoch_loss / (double)in_epoch; /* the epoch so far */
            if (in_epoch == r->steps_per_epoch) epoch_loss = 0;
            (void)tally__train_seam_halt(r->rank, c + 1); /* kills; no halt */
            tally__train_tell(r, &(tally__train_event){.kind = TALLY__TRAIN_STEP,
                                                       .step = c + 1 < total ? c + 1 : total,
                                                       .total_steps = total,
                                                       .epoch = (int)(c / r->steps_per_epoch),
                                                       .epochs = r->epochs,
                                                       .samples = (double)(c + 1) * r->cfg->batch * a->nworkers,
                                                       .loss = a->loss});
        }
    }
    tally__train_tell(
        r, &(tally__train_event){.kind = TALLY__TRAIN_END, .step = c < total ? c : total, .total_steps = total});
    a->steps = c;
    if (!rc) rc = tally__ps_worker_bye(&a->wk, c);
    tally__ps_worker_close(&a->wk);
    return rc;
}

/* Rank 0 serves (on a thread while it also works, or alone with --ps) and the others work; then rank 0
 * tells every rank whether the server succeeded and hands out its parameters. */
static int async_train(async_run *a, tally__train_result *res) {
    train_run *r = &a->r;
    int32_t port = 0;
    int rc = r->rank == 0 ? async_server_create(a) : 0;
    if (!rc && r->rank == 0) port = tally__ps_server_port(a->ps);
    if (!rc) rc = tally_broadcast(r->comm, &port, 1, TALLY_I32, 0);
    if (rc) return rc;
    uint64_t t0 = tally__now_ns();
    if (r->rank == 0 && a->worker < 0) {
        rc = tally__ps_server_run(a->ps);
    } else if (r->rank == 0) {
        rc = tally__ps_server_start(a->ps);
        int wrc = rc ? rc : async_work(a, port, res);
        char wwhy[1024];
        snprintf(wwhy, sizeof wwhy, "%s", tally_last_error());
        rc = tally__ps_server_join(a->ps);
        if (wrc) rc = tally__seterr(wrc, "%s", wwhy);
    } else {
        rc = async_work(a, port, res);
        if (rc) return rc; /* rank 0 reports the lost worker; the collectives below would fail */
    }
    int32_t status = rc;
    char why[1024]; /* the server's verdict, not the broadcast's (which fails too when a rank died) */
    snprintf(why, sizeof why, "%s", rc ? tally_last_error() : "");
    int brc = tally_broadcast(r->comm, &status, 1, TALLY_I32, 0);
    if (rc) return tally__seterr(rc, "%s", why);
    if (brc) return brc;
    if (status)
        return tally__seterr(status, "rank %d: the parameter server on rank 0 failed (%s); rank 0's message says why",
                             r->rank, tally_strerror(status));
    if (r->rank == 0) memcpy(r->model.params, tally__ps_server_params(a->ps), r->model.nparams * sizeof(float));
    if ((rc = tally_broadcast(r->comm, r->model.params, r->model.nparams, TALLY_F32, 0))) return rc;
    res->train_s = (double)(tally__now_ns() - t0) * 1e-9;
    return 0;
}

static void async_result(const async_run *a, tally__train_result *res) {
    const train_run *r = &a->r;
    const tally__train_cfg *cfg = r->cfg;
    res->async = 1;
    res->staleness = cfg->async.staleness;
    res->stale_lr = async_stale_lr(a);
    res->ps_dedicated = cfg->async.ps_dedicated;
    res->workers = a->nworkers;
    res->steps = a->worker >= 0 ? a->steps : r->sched.total_steps;
    res->samples = (double)r->sched.total_steps * cfg->batch * a->nworkers;
    res->shared_quota = cfg->async.shared_quota;
    res->samples_per_s = res->train_s > 0 ? res->samples / res->train_s : 0;
    res->data_s = a->data_s;
    res->compute_s = a->compute_s;
    res->update_s = a->push_s;
    res->wait_s = a->wk.wait_s;
    res->bytes_sent = a->worker >= 0 ? (unsigned long long)res->steps * r->model.nparams * sizeof(float) : 0;
    res->mem_params = r->model.params_bytes;
    res->mem_grads = r->model.grads_bytes;
    res->mem_activations = r->model.activation_bytes;
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) res->peak_rss = (size_t)ru.ru_maxrss * 1024;
    if (!a->ps) return;
    const tally__ps_stats *st = tally__ps_server_stats(a->ps);
    memcpy(res->staleness_hist, st->hist, sizeof st->hist);
    res->max_staleness = st->max_staleness;
    res->ps_pushes = st->pushes;
    res->ps_updates = st->updates;
    res->pulls = st->pulls;
    res->pulls_waited = st->pulls_waited;
    res->pull_wait_s = st->wait_s;
    int moments = cfg->opt.optim.kind == TALLY_OPTIM_ADAMW ? 2 : cfg->opt.optim.momentum != 0.0f ? 1 : 0;
    res->mem_optim = (size_t)moments * r->model.nparams * sizeof(float); /* the server's state */
}

int tally__train_async(tally_comm *comm, const tally__train_cfg *cfg, tally__train_result *res) {
    int rank = tally_comm_rank(comm), size = tally_comm_size(comm);
    int rc = async_refuse(cfg, rank, size);
    if (rc) return rc;
    async_run a = {.r = {.cfg = cfg, .comm = comm, .rank = rank, .size = size},
                   .nworkers = size - (cfg->async.ps_dedicated ? 1 : 0),
                   .worker = rank - (cfg->async.ps_dedicated ? 1 : 0)};
    a.wk.fd = -1;
    rc = async_setup(&a, res);
    if (!rc) rc = tally__train_blas_threads(cfg, rank);
    if (!rc) rc = async_train(&a, res);
    if (!rc && cfg->eval) rc = tally__train_evaluate(&a.r, res);
    if (!rc) rc = tally__train_fingerprint(&a.r, res);
    if (!rc) async_result(&a, res);
    if (!rc) rc = tally__train_gather_times(&a.r, res, a.worker >= 0);
    char why[1024]; /* freeing resets the thread's message */
    snprintf(why, sizeof why, "%s", rc ? tally_last_error() : "");
    tally__ps_server_free(a.ps);
    tally__train_teardown(&a.r);
    if (rc) tally__seterr(rc, "%s", why);
    return rc;
}
