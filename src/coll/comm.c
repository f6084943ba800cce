/* comm.c - the communicator: made from its config or from a split's rendezvous (rendezvous,
 * transport, measured cost model, monitor) and the public collective entry points that validate,
 * fingerprint and dispatch (to a flat algorithm, or to the world's levels). */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../boot/boot.h"
#include "../boot/host_cpus.h"
#include "../core/clock.h"
#include "../core/cpus.h"
#include "../core/alloc.h"
#include "../core/numeric/dtype.h"
#include "../core/log.h"
#include "../core/numeric/reduce.h"
#include "../core/trace.h"
#include "../p2p/p2p.h"
#include "algo.h"
#include "async.h"
#include "coll.h"
#include "config.h"
#include "flight.h"
#include "trace_sync.h"
#include "measure.h"

struct tally_comm {
    tally__ctx ctx;
    tally__scratch scratch; /* the ctx's */
    tally_config cfg;       /* what it was made with (a split: its parent's), checked */
    tally__fault fault;
    tally__boot *boot;
    tally__sig sig; /* the collective in flight; the transport stamps it on every message */
    uint64_t seq;
    uint64_t bytes_sent; /* payload of every collective since init (not the set-up measurements) */
    int forced_algo;     /* cfg.algo, or TALLY__ALGO_AUTO */
    double timeout_s;    /* cfg.timeout */
    tally__cost cost;
    uint64_t logged[TALLY__COLL_COUNT]; /* log2-size buckets whose choice was logged (TALLY_DEBUG) */
    /* Each collective's last choice, bytes << 8 | algo (0: none): a program repeats its sizes, and asking
     * every descriptor's cost formula again took 5% of an 8-byte allreduce. The cost and the levels are
     * fixed once the communicator is made (set_levels empties it). */
    _Atomic uint64_t chosen[TALLY__COLL_COUNT];
    struct tally__plain_mem *plain; /* tally_mem_alloc blocks where the transport has no mem ops */
    /* The owner's reference (dropped by free or abort) plus one per call in flight: whoever drops the
     * last one destroys the communicator, so abort never frees it under a call on another thread. */
    _Atomic int refs;
    _Atomic int aborted;     /* tally_comm_abort: tear down without goodbyes */
    int *world;              /* a split's: each rank's rank in the world, which its messages name; NULL: the world */
    tally__levels levels;    /* the world's, when its ranks span hosts alike (levels.h NULL: none) */
    tally_comm *host;        /* the world's host communicator (its shm is the transport's, and the levels'
                           * host level), freed after the world's monitor and levels; NULL: none */
    tally__wait_note note;   /* the transport's tcp waits, told to the host's ranks (shm+tcp sets it) */
    tally__async_slot async; /* the non-blocking calls' queue and thread, from the first one on */
    tally__flight flight;    /* the last collectives, written when one fails for a peer (flight.c) */
    int traced;              /* this world started the timeline (TALLY_TRACE) and writes it when freed */
    tally__trace_clock clk;  /* its clock against rank 0's */
    tally__po *po;           /* point-to-point: its post office (src/p2p), apart from the collectives' order */
    tally__proc proc;        /* the process that made it: another one (a forked child) may not use it */
};

/* How long tally_comm_abort waits for calls in flight to see the fault and leave (they do within
 * milliseconds: every wait checks the fault); past it the last of them destroys the communicator. */
#define TALLY__ABORT_WAIT_S 0.9

/* A tally_mem_alloc block from plain memory (tcp, self): listed so tally_mem_free can reject others. */
typedef struct tally__plain_mem {
    struct tally__plain_mem *next;
    void *p;
    int kept; /* tally_mem_keep: the communicator's destroy hands it to the kept registry, not to free() */
} tally__plain_mem;

/* Guards every communicator's plain list: tally_mem_alloc, _free and _keep may come from several threads
 * at once (a Python finalizer frees on whichever thread collects). Not on any data path. */
static pthread_mutex_t tally__plain_mu = PTHREAD_MUTEX_INITIALIZER;

static void tally__plain_free_kept(void *base, size_t len) {
    (void)len;
    free(base);
}

/* Communicators alive in this process: the first one made while none is sets what is process-wide. */
static _Atomic int tally__live;

/* ---- the process a communicator belongs to ----------------------------------------------------- */

/* Bumped in the child of every fork() once a communicator was made (pthread_atfork): what was stamped
 * with another value belongs to an ancestor process. The check is one relaxed load, no system call. */
static _Atomic unsigned tally__fork_gen;
static _Atomic int tally__fork_pid; /* this process's id, kept with the generation (no getpid per stamp) */
static pthread_once_t tally__fork_once = PTHREAD_ONCE_INIT;

static void tally__forked(void) {
    atomic_store_explicit(&tally__fork_pid, (int)getpid(), memory_order_relaxed);
    atomic_fetch_add_explicit(&tally__fork_gen, 1, memory_order_relaxed);
}

static void tally__fork_watch(void) {
    atomic_store_explicit(&tally__fork_pid, (int)getpid(), memory_order_relaxed);
    pthread_atfork(NULL, NULL, tally__forked);
}

void tally__proc_stamp(tally__proc *p) {
    pthread_once(&tally__fork_once, tally__fork_watch);
    p->gen = atomic_load_explicit(&tally__fork_gen, memory_order_relaxed);
    p->pid = atomic_load_explicit(&tally__fork_pid, memory_order_relaxed);
}

int tally__proc_foreign(const tally__proc *p, const char *fn, const char *what) {
    if (p->gen == atomic_load_explicit(&tally__fork_gen, memory_order_relaxed)) return 0;
    return tally__seterr(TALLY_E_INVALID,
                         "%s: %s made in process %d, used in process %d: a forked child must make its own "
                         "communicator (tally_comm_init); the parent's is left to the parent, untouched",
                         fn, what, p->pid, (int)getpid());
}

int tally__comm_foreign(const tally_comm *c, const char *fn) {
    return c ? tally__proc_foreign(&c->proc, fn, "communicator") : 0;
}

static const char *tally__isa_name(int isa) {
    static const char *const names[] = {"auto", "scalar", "avx2", "avx512"};
    return isa >= TALLY_ISA_AUTO && isa <= TALLY_ISA_AVX512 ? names[isa] : "auto";
}

/* Log level, log callback and the reduction kernels' instruction set are one per process: taken from
 * the config of a communicator made while no other one lives, and the callback let go of when the last
 * one is freed (its user pointer may not outlive the program's communicators). */
static void tally__comm_alive(const tally_config *cfg) {
    if (atomic_fetch_add(&tally__live, 1) > 0 || !cfg) return;
    tally__log_configure(cfg->log_level, cfg->log_fn, cfg->log_user);
    tally__reduce_set_isa(tally__isa_name(cfg->isa));
}

static void tally__comm_gone(void) {
    if (atomic_fetch_sub(&tally__live, 1) == 1) tally__log_configure(tally__debug_level(), NULL, NULL);
}

static int tally__pick_transport(tally_comm *c, double timeout_s, int crowded, tally__tp **tp) {
    tally__tp_ctx tctx = {.rank = c->ctx.rank,
                          .size = c->ctx.size,
                          .boot = c->boot,
                          .fault = &c->fault,
                          .timeout_s = timeout_s,
                          .sig = &c->sig,
                          .note = &c->note,
                          .awaited = &c->flight.awaited,
                          .cfg = &c->cfg};
    if (c->ctx.size == 1) return tally__self_create(&tctx, tp);
    int rc = tally__host_crowded(c->boot, c->ctx.rank, c->ctx.size, &tctx.crowded, &tctx.cpus);
    if (rc) return rc;
    tctx.crowded |= crowded;
    int want = c->cfg.transport, single_host = tally__boot_single_host(c->boot);
    if (want == TALLY_TRANSPORT_AUTO) want = single_host ? TALLY_TRANSPORT_SHM : TALLY_TRANSPORT_TCP;
    if (want == TALLY_TRANSPORT_SHM) {
        if (!single_host)
            return tally__seterr(TALLY_E_INVALID,
                                 "rank %d: TALLY_TRANSPORT=shm (tally_config.transport) but the ranks are on more "
                                 "than one host; use tcp or auto",
                                 c->ctx.rank);
        return tally__shm_create(&tctx, tp);
    }
    /* Several streams only where a pair is on two hosts: inside one, a second connection over loopback
     * adds copies, not bandwidth. */
    return tally__stripe_create(&tctx, single_host ? 1 : c->cfg.tcp_streams, tp);
}

static void tally__comm_destroy(tally_comm *c) {
    if (c->ctx.tp && atomic_load(&c->aborted)) c->ctx.tp->abandon = 1;
    while (c->plain) {
        tally__plain_mem *m = c->plain;
        c->plain = m->next;
        if (!m->kept)
            free(m->p);
        else
            tally__kept_add(m->p, 0, tally__plain_free_kept); /* no room to list it: leaked, never freed */
        free(m);
    }
    if (c->ctx.tp) c->ctx.tp->ops->destroy(c->ctx.tp);
    tally__scratch_fini(&c->scratch);
    tally__po_free(c->po); /* before the boot layer, whose fault wake-up its thread polled */
    if (c->boot) tally__boot_free(c->boot);
    /* After the monitor stopped: nothing records a fault into the levels' records any more. */
    if (c->levels.h) c->levels.release(c->levels.h, atomic_load(&c->aborted));
    if (c->host && atomic_load(&c->aborted))
        tally_comm_abort(c->host); /* the world went without goodbyes: so does its host */
    else if (c->host)
        tally_comm_free(c->host);
    tally__flight_fini(&c->flight);
    free(c->world);
    free(c);
    tally__comm_gone();
}

/* TALLY_TRACE on a world: the timeline starts, and every rank's clock is set against rank 0's (every
 * rank takes part even without memory for its spans, so none is left waiting). */
static int tally__comm_trace_begin(tally_comm *c) {
    int rc = tally__trace_start((size_t)c->cfg.trace_events);
    int src = tally__trace_sync(&c->ctx, &c->clk);
    c->traced = !rc && !src;
    if (c->traced) tally__trace_thread("main");
    return rc ? rc : src;
}

/* The world that started the timeline writes it: rank 0 gathers the ranks' spans over the communicator
 * while it works, or each rank writes its own when it does not. */
static int tally__comm_trace_end(tally_comm *c) {
    if (!c->traced) return 0;
    c->traced = 0;
    int healthy = atomic_load(&c->fault.code) == 0;
    c->sig = (tally__sig){.seq = c->seq + 1, .coll = TALLY__SETUP, .root = -1};
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", tally_last_error());
    int rc = tally__trace_write(&c->ctx, &c->clk, c->cfg.trace_file, healthy);
    tally__trace_stop();
    tally__trace_clock_free(&c->clk);
    if (!rc) tally__seterr(0, "%s", keep); /* teardown keeps the message of what failed before */
    return rc;
}

static int tally__comm_setup(tally_comm *c, const tally__boot_env *given, const tally_comm *parent) {
    tally__boot_env env;
    int rc = 0;
    if (given)
        env = *given;
    else
        rc = tally__boot_env_from_config(&c->cfg, &env);
    if (rc) return rc;
    tally__boot_env_knobs(&c->cfg, &env);
    c->ctx.rank = env.rank;
    c->ctx.size = env.size;
    c->timeout_s = c->cfg.timeout;
    c->forced_algo = tally__config_algo(&c->cfg);
    if (!given) {
        tally__log_set_rank(env.rank); /* a split's messages keep the world's rank */
        tally__boot_env_say(&env);
    }
    if ((rc = tally__boot_init(&c->boot, &env, &c->fault, c->timeout_s))) return rc;
    const tally__peer *first = tally__boot_peers(c->boot);
    tally__flight_init(&c->flight, c->ctx.rank, c->ctx.size, tally__comm_world_rank(c, c->ctx.rank),
                       tally__comm_world_rank(c, 0), parent ? &parent->flight : NULL, parent ? parent->seq : 0,
                       first[0].hostname, first[0].pid, first[0].job, c->cfg.flight_depth, c->cfg.flight_dir);
    if ((rc = tally__pick_transport(c, c->timeout_s, env.crowded, &c->ctx.tp))) return rc;
    tally__flight_set_transport(&c->flight, c->ctx.tp->ops->name);
    c->sig = (tally__sig){.coll = TALLY__SETUP, .root = -1};
    if ((rc = tally__measure_cost(&c->ctx, c->boot, &c->cfg, &c->cost))) return rc;
    c->cost.pull = c->ctx.tp->pull;
    c->cost.pull_min = c->ctx.tp->pull_min;
    if (c->ctx.tp->ctx.crowded && tally__boot_single_host(c->boot)) c->cost.cpus = c->ctx.tp->ctx.cpus;
    if (!given && c->cfg.trace_file[0] && (rc = tally__comm_trace_begin(c))) return rc;
    tally__po_cfg po = {c->ctx.rank, c->ctx.size, c->boot, &c->fault, c->timeout_s, c->cfg.shm_cma};
    if ((rc = tally__po_open(&po, &c->po))) return rc; /* its port is published before the monitor starts */
    if ((rc = tally__boot_start_monitor(c->boot))) return rc;
    if ((rc = tally__po_start(c->po))) return rc;
    c->ctx.sent = &c->bytes_sent;
    c->ctx.scratch = &c->scratch;
    char cpus[128];
    tally__cpus_list(cpus, sizeof cpus);
    tally__log_debug(1,
                     "rank %d of %d: CPUs %s, transport %s, alpha %.2f us, beta %.3f GB/s, gamma %.3f GB/s, "
                     "algo %s",
                     c->ctx.rank, c->ctx.size, cpus, c->ctx.tp->ops->name, c->cost.alpha * 1e6,
                     1e-9 / (c->cost.beta > 0 ? c->cost.beta : 1e-30),
                     1e-9 / (c->cost.gamma > 0 ? c->cost.gamma : 1e-30), tally__algo_name(c->forced_algo));
    return 0;
}

/* cfg was checked (tally__config_take), or is the parent's (a split's: env and parent given). */
static int tally__comm_make(const tally_comm *parent, const tally_config *cfg, const tally__boot_env *env, int *world,
                            tally_comm **out) {
    tally__sig_name_algos(tally__algo_name); /* the transports' messages name the algorithms */
    tally_comm *c = calloc(1, sizeof *c);
    if (!c) {
        free(world);
        if (env && env->has_listener) close(env->listen_fd);
        return tally__seterr(TALLY_E_NOMEM, "tally_comm_init: out of memory");
    }
    tally__comm_alive(env ? NULL : cfg);
    tally__proc_stamp(&c->proc);
    c->cfg = *cfg;
    tally__fault_init(&c->fault);
    atomic_init(&c->refs, 1);
    c->world = world;
    c->fault.world = world;
    c->fault.world_n = env ? env->size : 0;
    int rc = tally__comm_setup(c, env, parent);
    if (rc) {
        tally__comm_destroy(c);
        return rc;
    }
    *out = c;
    return 0;
}

int tally__comm_make_world(const tally_config *cfg, tally_comm **out) {
    *out = NULL;
    return tally__comm_make(NULL, cfg, NULL, NULL, out);
}

void tally__comm_set_levels(tally_comm *c, const tally__levels *l, tally_comm *host, tally_comm *cross, double alpha,
                            double beta, int share) {
    c->levels = *l;
    for (int k = 0; k < TALLY__COLL_COUNT; k++) atomic_store_explicit(&c->chosen[k], 0, memory_order_relaxed);
    tally__fault_link(&c->fault, 0, &host->fault);
    tally__fault_link(&c->fault, 1, &cross->fault);
    if (alpha > c->cost.alpha) c->cost.alpha = alpha;
    if (beta > c->cost.beta) c->cost.beta = beta;
    c->cost.share = share;
}

int tally__comm_forced_algo(const tally_comm *c) { return c->forced_algo; }

void tally__comm_keep_host(tally_comm *c, tally_comm *host) {
    c->host = host;
    tally__fault_link(&c->fault, 0, &host->fault);
}

int tally__comm_mix_transport(tally_comm *c, const int *local_of) {
    tally__tp *mixed;
    tally__tp *shm = c->host && c->host->ctx.size > 1 ? c->host->ctx.tp : NULL;
    int rc = tally__mixed_create(c->ctx.tp, shm, local_of, &mixed);
    if (rc) return rc;
    c->ctx.tp = mixed;
    tally__flight_set_transport(&c->flight, mixed->ops->name);
    tally__log_debug(1, "rank %d: transport shm+tcp: shm to the %d ranks of this host, tcp to the other %d",
                     c->ctx.rank, shm ? shm->ctx.size : 1, c->ctx.size - (shm ? shm->ctx.size : 1));
    return 0;
}

int tally__comm_create(const tally_comm *parent, const tally__boot_env *env, int *world, tally_comm **out) {
    *out = NULL;
    return tally__comm_make(parent, &parent->cfg, env, world, out);
}

const tally_config *tally__comm_config(const tally_comm *c) { return &c->cfg; }

const tally__boot *tally__comm_boot(const tally_comm *c) { return c->boot; }

int tally__comm_crowded(const tally_comm *c) { return c->ctx.tp ? c->ctx.tp->ctx.crowded : 0; }

int tally__comm_world_rank(const tally_comm *c, int rank) { return c->world ? c->world[rank] : rank; }

TALLY_API int tally_comm_rank(const tally_comm *c) { return c ? c->ctx.rank : TALLY_E_INVALID; }
TALLY_API int tally_comm_size(const tally_comm *c) { return c ? c->ctx.size : TALLY_E_INVALID; }

/* A call begins on c: the communicator stays alive until it leaves, whatever other threads do. */
static void tally__enter(tally_comm *c) {
    if (c) atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed);
}

/* A call ends (or the owner lets go): the last one out destroys the communicator. Returns rc. */
/* A split's message names each rank it mentions by its world rank too. Returns rc. */
static int tally__name_world_err(const tally_comm *c, int rc) {
    if (rc && c && c->world) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", tally_last_error());
        tally__err_name_world(msg, sizeof msg, c->world, c->ctx.size);
        tally__seterr(rc, "%s", msg);
    }
    return rc;
}

static int tally__leave(tally_comm *c, int rc) {
    tally__name_world_err(c, rc);
    if (c && atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) == 1) tally__comm_destroy(c);
    return rc;
}

void tally__comm_hold(tally_comm *c) { tally__enter(c); }
int tally__comm_release(tally_comm *c, int rc) { return tally__leave(c, rc); }
tally__po *tally__comm_po(const tally_comm *c) { return c->po; }

static void tally__comm_stop_async(tally_comm *c, int abandon) {
    if (!c->async.e) return;
    c->async.ops->stop(c->async.e, abandon);
    c->async.e = NULL;
}

/* Writes the flight records (once); a directory refused as another user's is said in the log as well as
 * in the message of the call that failed, if any: the records the user will look for are not there. */
static void tally__comm_flight_dump(tally_comm *c, const char *reason, int culprit, const char *msg) {
    if (!tally__flight_dump(&c->flight, reason, culprit, msg) || c->flight.why == TALLY__FL_WHY_ERRNO) return;
    char why[2 * TALLY__FLIGHT_PATH];
    tally__flight_why(&c->flight, why, sizeof why);
    tally__log_warn("flight records not written: %s", why);
}

/* Teardown leaves the thread's message alone (as free() leaves errno): a caller tearing down after a
 * failure still reads why it failed. */
TALLY_API int tally_comm_free(tally_comm *c) {
    if (c && c->proc.gen != atomic_load_explicit(&tally__fork_gen, memory_order_relaxed))
        return tally__comm_foreign(c, "tally_comm_free"); /* the parent's to free: nothing here is touched */
    if (c) tally__comm_stop_async(c, 0); /* its requests complete first, as a blocking call would have */
    if (c) tally__po_shutdown(c->po, 0); /* the sends too; receives still pending fail */
    int trc = c ? tally__comm_trace_end(c) : 0;
    /* A fault the monitor recorded while no call ran (a peer died between collectives) still leaves the
     * records. */
    int code = c ? atomic_load(&c->fault.code) : 0;
    if (tally__flight_wants(code))
        tally__comm_flight_dump(c, tally__flight_reason(code), c->fault.culprit, c->fault.msg);
    return tally__leave(c, trc);
}

TALLY_API int tally_comm_abort(tally_comm *c) {
    tally__clearerr();
    if (!c) return 0;
    int foreign = tally__comm_foreign(c, "tally_comm_abort"); /* no fault told to the parent's peers */
    if (foreign) return foreign;
    atomic_store(&c->aborted, 1);
    /* Raised like any fault: the calls in flight here return it, and the peers are told (through rank 0,
     * or the shared segment) rather than left to wait for TALLY_TIMEOUT. */
    tally__fault_raise(&c->fault, TALLY_E_ABORTED, c->ctx.rank,
                       "rank %d aborted the communicator (tally_comm_abort); it cannot be used on any rank: free it "
                       "and create a new one",
                       c->ctx.rank);
    tally__comm_stop_async(c, 1); /* queued requests fail at once on the fault; the running one within ms */
    tally__po_shutdown(c->po, 1); /* and the point-to-point ones */
    struct timespec nap = {0, 1000000};
    double waited = 0;
    while (atomic_load_explicit(&c->refs, memory_order_acquire) > 1 && waited < TALLY__ABORT_WAIT_S) {
        nanosleep(&nap, NULL);
        waited += 1e-3;
    }
    /* A call still in flight writes the records itself when it fails (one writer at a time), and may
     * still add spans: the timeline is written (each rank its own file) only once no call is left. */
    if (atomic_load_explicit(&c->refs, memory_order_acquire) == 1) {
        tally__comm_flight_dump(c, "ABORTED", c->ctx.rank, "tally_comm_abort on this rank");
        tally__comm_trace_end(c);
    }
    tally__clearerr(); /* the abort itself succeeded */
    return tally__leave(c, 0);
}

const tally__cost *tally__comm_cost(const tally_comm *c) { return &c->cost; }

double tally__comm_timeout_s(const tally_comm *c) { return c->timeout_s; }

TALLY_API unsigned long long tally_comm_bytes_sent(const tally_comm *c) { return c ? c->bytes_sent : 0; }

TALLY_API const char *tally_comm_transport(const tally_comm *c) {
    return c && c->ctx.tp ? c->ctx.tp->ops->name : "none";
}

TALLY_API const char *tally_comm_large_path(const tally_comm *c) { return c && c->ctx.tp ? c->ctx.tp->large : ""; }

TALLY_API size_t tally_comm_mem_min(const tally_comm *c) { return c && c->ctx.tp ? c->ctx.tp->mem_min : 0; }

/* TALLY_ALGO=hier applies to what has levels (allreduce, reduce-scatter, all-gather); broadcast and
 * barrier then take the cost model's flat choice, as does a collective a forced flat algorithm has not.
 * Without it the levels are taken when the model says they are cheaper. */
static int tally__choose_afresh(const tally_comm *c, int coll, size_t bytes) {
    double by_level = c->levels.h ? c->levels.cost(c->levels.h, coll, bytes) : HUGE_VAL;
    if (c->forced_algo == TALLY__ALGO_HIER && by_level < HUGE_VAL) return TALLY__ALGO_HIER;
    const tally__algo_desc *forced = tally__algo_get(c->forced_algo);
    if (forced && tally__algo_has(forced, coll)) return c->forced_algo;
    return tally__algo_choose_levels(&c->cost, by_level, coll, c->ctx.size, bytes);
}

/* The choice, from the collective's last one when the size repeats (an atomic word: any thread may ask). */
static int tally__choose(const tally_comm *c, int coll, size_t bytes) {
    _Atomic uint64_t *slot = (_Atomic uint64_t *)&c->chosen[coll];
    uint64_t last = atomic_load_explicit(slot, memory_order_relaxed);
    if (last && last >> 8 == bytes) return (int)(last & 0xff);
    int algo = tally__choose_afresh(c, coll, bytes);
    if (bytes < ((uint64_t)1 << 56) && algo > 0 && algo < 256)
        atomic_store_explicit(slot, (uint64_t)bytes << 8 | (uint64_t)algo, memory_order_relaxed);
    return algo;
}

TALLY_API const char *tally_comm_algo_for(const tally_comm *c, size_t bytes) {
    if (!c) return "none";
    return tally__algo_name(tally__choose(c, TALLY__ALLREDUCE, bytes));
}

static void tally__log_choice(tally_comm *c, int coll, size_t bytes, int algo) {
    if (tally__debug_level() < 1) return;
    int bucket = 0;
    while (bucket < 63 && ((size_t)1 << bucket) < bytes) bucket++;
    if (c->logged[coll] & (1ull << bucket)) return;
    c->logged[coll] |= 1ull << bucket;
    const tally__algo_desc *forced = tally__algo_get(c->forced_algo);
    if (forced && !tally__algo_has(forced, coll)) {
        tally__log_debug(1, "%s of %zu bytes on %d ranks: %s (TALLY_ALGO=%s has no %s: the model's choice)",
                         tally__coll_name(coll), bytes, c->ctx.size, tally__algo_name(algo), forced->name,
                         tally__coll_name(coll));
        return;
    }
    if (c->forced_algo != TALLY__ALGO_AUTO) {
        tally__log_debug(1, "%s of %zu bytes on %d ranks: %s (forced by TALLY_ALGO)", tally__coll_name(coll), bytes,
                         c->ctx.size, tally__algo_name(algo));
        return;
    }
    char model[1024];
    size_t used = 0;
    for (int a = 1; a <= tally__algo_count() && used < sizeof model; a++) {
        if (!tally__algo_has(tally__algo_get(a), coll)) continue; /* not every algorithm runs every collective */
        used += (size_t)snprintf(model + used, sizeof model - used, "%s%s %.1f us", used ? ", " : "",
                                 tally__algo_name(a), 1e6 * tally__algo_cost(&c->cost, a, coll, c->ctx.size, bytes));
    }
    double by_level = c->levels.h ? c->levels.cost(c->levels.h, coll, bytes) : HUGE_VAL;
    if (by_level < HUGE_VAL && used < sizeof model) {
        char levels[512];
        c->levels.explain(c->levels.h, coll, bytes, levels, sizeof levels);
        used += (size_t)snprintf(model + used, sizeof model - used, "; hier %.1f us = %s", 1e6 * by_level, levels);
    }
    tally__log_debug(1, "%s of %zu bytes on %d ranks: %s (model: %s)", tally__coll_name(coll), bytes, c->ctx.size,
                     tally__algo_name(algo), model);
}

/* Checks the arguments every collective shares and that the communicator is healthy. */
static int tally__check_common(tally_comm *c, const char *fn, size_t count, int dtype, int op) {
    tally__clearerr();
    if (!c) return tally__seterr(TALLY_E_INVALID, "%s: communicator is NULL", fn);
    if (!tally__dtype_valid(dtype))
        return tally__seterr(TALLY_E_INVALID, "%s on rank %d: invalid dtype %d", fn, c->ctx.rank, dtype);
    if (!tally__op_valid(op))
        return tally__seterr(TALLY_E_INVALID, "%s on rank %d: invalid op %d", fn, c->ctx.rank, op);
    if (!tally__dtype_op_valid(dtype, op))
        return tally__seterr(TALLY_E_INVALID, "%s on rank %d: op %s does not take dtype %s: %s takes %s", fn,
                             c->ctx.rank, tally_op_name(op), tally_dtype_name(dtype), tally_op_name(op),
                             tally__op_takes(op));
    if (count > ((size_t)1 << 50) / tally_dtype_size((tally_dtype)dtype))
        return tally__seterr(TALLY_E_INVALID, "%s on rank %d: count %zu is too large", fn, c->ctx.rank, count);
    int f = tally__fault_check(&c->fault);
    if (f) return f; /* a fault is sticky: the communicator cannot be used again */
    return 0;
}

static int tally__need_buf(const tally_comm *c, const char *fn, const char *what, const void *p, size_t count) {
    if (count > 0 && !p)
        return tally__seterr(TALLY_E_INVALID, "%s on rank %d: %s buffer is NULL with count %zu", fn, c->ctx.rank, what,
                             count);
    return 0;
}

/* Stamps the fingerprint and picks the algorithm of the collective about to start. */
static int tally__begin(tally_comm *c, int coll, size_t count, int dtype, int op, int root, size_t bytes) {
    int algo = tally__choose(c, coll, bytes);
    c->sig = (tally__sig){.seq = ++c->seq,
                          .count = count,
                          .root = root,
                          .coll = (uint8_t)coll,
                          .dtype = (uint8_t)dtype,
                          .op = (uint8_t)op,
                          .algo = (uint8_t)algo};
    tally__flight_begin(&c->flight, &c->sig);
    tally__log_choice(c, coll, bytes, algo);
    return algo;
}

/* A collective with nothing to move still meets its peers, so a mismatch is caught, not hidden: in the
 * chosen algorithm's barrier, or, by level (the levels have none), in the dissemination rounds. */
static int tally__empty(tally_comm *c, int algo) {
    const tally__algo_desc *d = tally__algo_get(algo);
    return d ? d->barrier(&c->ctx) : tally__agree(&c->ctx, NULL, 0, TALLY_U8, 0);
}

/* The chosen algorithm has no such collective only when none has: a table without it. */
static int tally__no_algo(const tally_comm *c, int coll) {
    return tally__seterr(TALLY_E_INVALID, "rank %d: no algorithm in the table runs %s", c->ctx.rank,
                         tally__coll_name(coll));
}

/* A reducing collective of the chosen flat algorithm: AVG is reduced as SUM and divided here, once for
 * every algorithm, unless its descriptor says it divides itself. */
static int tally__reduce_by(tally_comm *c, const tally__algo_desc *d, tally__algo_reduce_fn fn, int coll,
                            const void *send, void *recv, size_t count, tally_dtype t, tally_op op) {
    if (!fn) return tally__no_algo(c, coll);
    tally_op rop = op == TALLY_AVG && !(d->takes_avg & (1u << coll)) ? TALLY_SUM : op;
    int rc = fn(&c->ctx, send, recv, count, t, rop);
    if (!rc && rop != op) tally__avg_finish(recv, count, t, c->ctx.size);
    return rc;
}

/* A level's collective failed: the world fails with its message (sticky, and told to every rank, whose
 * levels then stop waiting too). */
static int tally__levels_failed(tally_comm *c, int rc) {
    if (!rc) return 0;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", tally_last_error());
    return tally__fault_raise(&c->fault, rc, -1, "%s", msg);
}

/* What rooted.c's bodies share with the ones here (coll.h). */
const tally__ctx *tally__comm_ctx(const tally_comm *c) { return &c->ctx; }
int tally__comm_check(tally_comm *c, const char *fn, size_t count, int dtype, int op) {
    return tally__check_common(c, fn, count, dtype, op);
}
int tally__comm_need_buf(const tally_comm *c, const char *fn, const char *what, const void *p, size_t count) {
    return tally__need_buf(c, fn, what, p, count);
}
int tally__comm_begin(tally_comm *c, int coll, size_t count, int dtype, int op, int root, size_t bytes) {
    return tally__begin(c, coll, count, dtype, op, root, bytes);
}
int tally__comm_empty(tally_comm *c, int algo) { return tally__empty(c, algo); }
int tally__comm_no_algo(const tally_comm *c, int coll) { return tally__no_algo(c, coll); }

static void tally__copy_if_apart(void *dst, const void *src, size_t bytes) {
    if (dst != src && bytes) memmove(dst, src, bytes);
}

static int tally__allreduce_body(tally_comm *c, const void *send, void *recv, size_t count, tally_dtype t,
                                 tally_op op) {
    static const char fn[] = "tally_allreduce";
    int rc = tally__check_common(c, fn, count, t, op);
    if (!rc) rc = tally__need_buf(c, fn, "send", send, count);
    if (!rc) rc = tally__need_buf(c, fn, "recv", recv, count);
    if (rc) return rc;
    size_t bytes = count * tally_dtype_size(t);
    int algo = tally__begin(c, TALLY__ALLREDUCE, count, t, op, -1, bytes);
    if (c->ctx.size == 1) {
        tally__copy_if_apart(recv, send, bytes);
        return 0;
    }
    if (count == 0) return tally__empty(c, algo);
    if (algo == TALLY__ALGO_HIER)
        return tally__levels_failed(c, c->levels.allreduce(c->levels.h, send, recv, count, t, op));
    const tally__algo_desc *d = tally__algo_get(algo);
    return tally__reduce_by(c, d, d->allreduce, TALLY__ALLREDUCE, send, recv, count, t, op);
}

static int tally__reduce_scatter_body(tally_comm *c, const void *send, void *recv, size_t recvcount, tally_dtype t,
                                      tally_op op) {
    static const char fn[] = "tally_reduce_scatter";
    int rc = tally__check_common(c, fn, recvcount, t, op);
    if (!rc) rc = tally__need_buf(c, fn, "send", send, recvcount);
    if (!rc) rc = tally__need_buf(c, fn, "recv", recv, recvcount);
    if (rc) return rc;
    size_t esize = tally_dtype_size(t), n = (size_t)c->ctx.size;
    int algo = tally__begin(c, TALLY__REDUCE_SCATTER, recvcount, t, op, -1, recvcount * esize * n);
    if (c->ctx.size == 1) {
        tally__copy_if_apart(recv, send, recvcount * esize);
        return 0;
    }
    if (recvcount == 0) return tally__empty(c, algo);
    if (algo == TALLY__ALGO_HIER)
        return tally__levels_failed(c, c->levels.reduce_scatter(c->levels.h, send, recv, recvcount, t, op));
    const tally__algo_desc *d = tally__algo_get(algo);
    return tally__reduce_by(c, d, d->reduce_scatter, TALLY__REDUCE_SCATTER, send, recv, recvcount, t, op);
}

static int tally__allgather_body(tally_comm *c, const void *send, void *recv, size_t sendcount, tally_dtype t) {
    static const char fn[] = "tally_allgather";
    int rc = tally__check_common(c, fn, sendcount, t, TALLY_SUM);
    if (!rc) rc = tally__need_buf(c, fn, "send", send, sendcount);
    if (!rc) rc = tally__need_buf(c, fn, "recv", recv, sendcount);
    if (rc) return rc;
    size_t esize = tally_dtype_size(t), n = (size_t)c->ctx.size;
    int algo = tally__begin(c, TALLY__ALLGATHER, sendcount, t, TALLY_SUM, -1, sendcount * esize * n);
    if (c->ctx.size == 1) {
        tally__copy_if_apart(recv, send, sendcount * esize);
        return 0;
    }
    if (sendcount == 0) return tally__empty(c, algo);
    if (algo == TALLY__ALGO_HIER)
        return tally__levels_failed(c, c->levels.allgather(c->levels.h, send, recv, sendcount, t));
    const tally__algo_desc *d = tally__algo_get(algo);
    return d->allgather ? d->allgather(&c->ctx, send, recv, sendcount, t) : tally__no_algo(c, TALLY__ALLGATHER);
}

static int tally__broadcast_body(tally_comm *c, void *buf, size_t count, tally_dtype t, int root) {
    static const char fn[] = "tally_broadcast";
    int rc = tally__check_common(c, fn, count, t, TALLY_SUM);
    if (!rc) rc = tally__need_buf(c, fn, "data", buf, count);
    if (!rc && (root < 0 || root >= c->ctx.size))
        rc = tally__seterr(TALLY_E_INVALID, "%s on rank %d: root %d is out of range [0, %d)", fn, c->ctx.rank, root,
                           c->ctx.size);
    if (rc) return rc;
    int algo = tally__begin(c, TALLY__BROADCAST, count, t, TALLY_SUM, root, count * tally_dtype_size(t));
    if (c->ctx.size == 1) return 0;
    if (count == 0) return tally__empty(c, algo);
    const tally__algo_desc *d = tally__algo_get(algo); /* never hier: the levels have no broadcast */
    return d->broadcast ? d->broadcast(&c->ctx, buf, count, t, root) : tally__no_algo(c, TALLY__BROADCAST);
}

static int tally__barrier_body(tally_comm *c) {
    int rc = tally__check_common(c, "tally_barrier", 0, TALLY_U8, TALLY_SUM);
    if (rc) return rc;
    int algo = tally__begin(c, TALLY__BARRIER, 0, TALLY_U8, TALLY_SUM, -1, 0);
    if (c->ctx.size == 1) return 0;
    return tally__empty(c, algo);
}

static int tally__dispatch(tally_comm *c, const tally__call *a) {
    switch (a->coll) {
    case TALLY__ALLREDUCE: return tally__allreduce_body(c, a->send, a->recv, a->count, a->t, a->op);
    case TALLY__REDUCE_SCATTER: return tally__reduce_scatter_body(c, a->send, a->recv, a->count, a->t, a->op);
    case TALLY__ALLGATHER: return tally__allgather_body(c, a->send, a->recv, a->count, a->t);
    case TALLY__BROADCAST: return tally__broadcast_body(c, a->recv, a->count, a->t, a->root);
    case TALLY__BARRIER: return tally__barrier_body(c);
    default: return a->body ? a->body(c, a) : tally__seterr(TALLY_E_INVALID, "tally: unknown collective %d", a->coll);
    }
}

/* The failure that broke the job: this rank's flight records are written (once) and the message says
 * where. */
static void tally__flight_record_fault(tally_comm *c, int rc) {
    if (!c->flight.on) return;
    int code = atomic_load(&c->fault.code);
    tally__comm_flight_dump(c, tally__flight_reason(rc), code ? c->fault.culprit : -1, tally_last_error());
    char where[3 * TALLY__FLIGHT_PATH];
    int err = atomic_load(&c->flight.written);
    if (err == 1)
        snprintf(where, sizeof where, "; this rank's last collectives are in %s (`tally flight %s` merges the ranks')",
                 c->flight.path, c->flight.dir);
    else if (err > 1) {
        char why[2 * TALLY__FLIGHT_PATH];
        tally__flight_why(&c->flight, why, sizeof why);
        snprintf(where, sizeof where, "; its flight records were not written: %s", why);
    } else
        return; /* another thread is writing them */
    tally__err_wrap(rc, "", where);
}

/* The bytes of a collective as its algorithm is chosen: the whole vector (a block times the ranks for
 * reduce-scatter, all-gather, gather, scatter and all-to-all; none for alltoallv, whose counts differ). */
static size_t tally__call_bytes(const tally_comm *c, const tally__call *a) {
    int coll = a->coll, blocks = coll == TALLY__REDUCE_SCATTER || coll == TALLY__ALLGATHER || coll == TALLY__GATHER ||
                                 coll == TALLY__SCATTER || coll == TALLY__ALLTOALL;
    if (coll == TALLY__BARRIER || coll == TALLY__ALLTOALLV || !tally__dtype_valid(a->t)) return 0;
    return a->count * tally_dtype_size(a->t) * (blocks ? (size_t)c->ctx.size : 1);
}

/* A call the failed communicator refused before it began still goes in the records, with the fingerprint
 * it would have had: without it, a rank told of the failure looks like one that never came. Its root was
 * not checked (the fault is, first): one out of range is recorded as none, which the reader takes. */
static void tally__flight_refused(tally_comm *c, const tally__call *a) {
    int coll = a->coll, bar = coll == TALLY__BARRIER;
    int reduces = coll == TALLY__ALLREDUCE || coll == TALLY__REDUCE_SCATTER || coll == TALLY__REDUCE;
    int rooted = coll == TALLY__BROADCAST || coll == TALLY__REDUCE || coll == TALLY__GATHER || coll == TALLY__SCATTER;
    size_t bytes = tally__call_bytes(c, a);
    tally__sig s = {.seq = c->seq + 1,
                    .count = bar || coll == TALLY__ALLTOALLV ? 0 : a->count,
                    .root = rooted && a->root >= 0 && a->root < c->ctx.size ? a->root : -1,
                    .coll = (uint8_t)coll,
                    .dtype = (uint8_t)(bar ? TALLY_U8 : a->t),
                    .op = (uint8_t)(reduces ? a->op : TALLY_SUM),
                    .algo = (uint8_t)tally__choose(c, coll, bytes)};
    tally__flight_begin(&c->flight, &s);
}

/* The timeline's span of a collective that began: its bytes, sequence number, algorithm and transport. */
static void tally__trace_call(const tally_comm *c, const tally__call *a, uint64_t t0, int rc) {
    tally__trace_arg args[] = {{"bytes", NULL, (int64_t)tally__call_bytes(c, a)},
                               {"seq", NULL, (int64_t)c->sig.seq},
                               {"algo", tally__algo_name(c->sig.algo), 0},
                               {"transport", c->ctx.tp ? c->ctx.tp->ops->name : "self", 0}};
    tally__trace_span(rc ? "coll-failed" : "coll", tally__coll_name(a->coll), t0, tally__trace_now(), args, 4);
}

static int tally__body(tally_comm *c, const tally__call *a) {
    uint64_t t0 = tally__trace_on ? tally__trace_now() : 0, seq0 = c ? c->seq : 0;
    int rc = tally__dispatch(c, a);
    if (!c) return rc;
    if (tally__trace_on && c->seq != seq0) tally__trace_call(c, a, t0, rc);
    if (tally__flight_wants(rc) && !c->flight.open) tally__flight_refused(c, a);
    if (c->flight.open) {
        int code = rc ? atomic_load(&c->fault.code) : 0;
        tally__flight_end(&c->flight, rc, code ? c->fault.culprit : -1);
    }
    if (tally__flight_wants(rc)) tally__flight_record_fault(c, rc);
    return rc;
}

int tally__comm_run(tally_comm *c, const tally__call *a) { return tally__name_world_err(c, tally__body(c, a)); }

tally__async_slot *tally__comm_async(tally_comm *c) { return &c->async; }

/* A blocking call runs here, unless non-blocking ones are pending: then it waits its turn behind them. */
int tally__comm_call(tally_comm *c, const tally__call *a) {
    if (c && c->proc.gen != atomic_load_explicit(&tally__fork_gen, memory_order_relaxed)) {
        char fn[48];
        snprintf(fn, sizeof fn, "tally_%s", tally__coll_name(a->coll));
        return tally__comm_foreign(c, fn);
    }
    tally__enter(c);
    int rc =
        c && c->async.e && c->async.ops->pending(c->async.e) ? c->async.ops->through(c->async.e, a) : tally__body(c, a);
    return tally__leave(c, rc);
}

TALLY_API int tally_allreduce(tally_comm *c, const void *send, void *recv, size_t count, tally_dtype t, tally_op op) {
    tally__call a = {
        .coll = TALLY__ALLREDUCE, .send = send, .recv = recv, .count = count, .t = t, .op = op, .root = -1};
    return tally__comm_call(c, &a);
}

TALLY_API int tally_reduce_scatter(tally_comm *c, const void *send, void *recv, size_t recvcount, tally_dtype t,
                                   tally_op op) {
    tally__call a = {
        .coll = TALLY__REDUCE_SCATTER, .send = send, .recv = recv, .count = recvcount, .t = t, .op = op, .root = -1};
    return tally__comm_call(c, &a);
}

TALLY_API int tally_allgather(tally_comm *c, const void *send, void *recv, size_t sendcount, tally_dtype t) {
    tally__call a = {
        .coll = TALLY__ALLGATHER, .send = send, .recv = recv, .count = sendcount, .t = t, .op = TALLY_SUM, .root = -1};
    return tally__comm_call(c, &a);
}

TALLY_API int tally_broadcast(tally_comm *c, void *buf, size_t count, tally_dtype t, int root) {
    tally__call a = {
        .coll = TALLY__BROADCAST, .send = buf, .recv = buf, .count = count, .t = t, .op = TALLY_SUM, .root = root};
    return tally__comm_call(c, &a);
}

TALLY_API int tally_barrier(tally_comm *c) {
    tally__call a = {.coll = TALLY__BARRIER, .t = TALLY_U8, .op = TALLY_SUM, .root = -1};
    return tally__comm_call(c, &a);
}

/* ---- memory peers can read in place ----------------------------------------------------------- */

static void *tally__plain_alloc(tally_comm *c, size_t bytes) {
    size_t len = bytes ? (bytes + 63) / 64 * 64 : 64;
    tally__plain_mem *m = malloc(sizeof *m);
    void *p = len >= bytes ? aligned_alloc(64, len) : NULL;
    if (!m || !p) {
        free(m);
        free(p);
        tally__seterr(TALLY_E_NOMEM, "tally_mem_alloc on rank %d: out of memory for %zu bytes", c->ctx.rank, bytes);
        return NULL;
    }
    pthread_mutex_lock(&tally__plain_mu);
    *m = (tally__plain_mem){c->plain, p, 0};
    c->plain = m;
    pthread_mutex_unlock(&tally__plain_mu);
    return p;
}

static int tally__plain_free(tally_comm *c, void *ptr) {
    tally__plain_mem *m = NULL;
    pthread_mutex_lock(&tally__plain_mu);
    for (tally__plain_mem **at = &c->plain; *at; at = &(*at)->next)
        if ((*at)->p == ptr) {
            m = *at;
            *at = m->next;
            break;
        }
    pthread_mutex_unlock(&tally__plain_mu);
    if (m) {
        free(m->p);
        free(m);
        return 0;
    }
    return tally__seterr(TALLY_E_INVALID,
                         "tally_mem_free on rank %d: %p did not come from tally_mem_alloc on this "
                         "communicator (or was freed already)",
                         c->ctx.rank, ptr);
}

TALLY_API void *tally_mem_alloc(tally_comm *c, size_t bytes) {
    tally__clearerr();
    if (!c || !c->ctx.tp) {
        tally__seterr(TALLY_E_INVALID, "tally_mem_alloc: communicator is NULL");
        return NULL;
    }
    if (tally__comm_foreign(c, "tally_mem_alloc")) return NULL;
    tally__enter(c);
    const tally__tp_ops *ops = c->ctx.tp->ops;
    void *p = ops->mem_alloc ? ops->mem_alloc(c->ctx.tp, bytes) : tally__plain_alloc(c, bytes);
    tally__leave(c, 0);
    return p;
}

TALLY_API int tally_mem_free(tally_comm *c, void *ptr) {
    if (!c || !c->ctx.tp) return tally__seterr(TALLY_E_INVALID, "tally_mem_free: communicator is NULL");
    if (!ptr) return 0;
    int foreign = tally__comm_foreign(c, "tally_mem_free");
    if (foreign) return foreign;
    tally__enter(c);
    const tally__tp_ops *ops = c->ctx.tp->ops;
    return tally__leave(c, ops->mem_free ? ops->mem_free(c->ctx.tp, ptr) : tally__plain_free(c, ptr));
}

TALLY_API int tally_mem_keep(tally_comm *c, void *ptr) {
    tally__clearerr();
    if (!c || !c->ctx.tp) return tally__seterr(TALLY_E_INVALID, "tally_mem_keep: communicator is NULL");
    int rc = tally__comm_foreign(c, "tally_mem_keep");
    if (rc) return rc;
    tally__enter(c);
    const tally__tp_ops *ops = c->ctx.tp->ops;
    if (ops->mem_alloc) {
        rc = ops->mem_keep
                 ? ops->mem_keep(c->ctx.tp, ptr)
                 : tally__seterr(TALLY_E_UNSUPPORTED, "tally_mem_keep: transport %s cannot keep buffers", ops->name);
        return tally__leave(c, rc);
    }
    pthread_mutex_lock(&tally__plain_mu);
    tally__plain_mem *m = c->plain;
    while (m && m->p != ptr) m = m->next;
    if (m) m->kept = 1;
    pthread_mutex_unlock(&tally__plain_mu);
    if (!m)
        rc = tally__seterr(TALLY_E_INVALID,
                           "tally_mem_keep on rank %d: %p did not come from tally_mem_alloc on this communicator (or "
                           "was freed already)",
                           c->ctx.rank, ptr);
    return tally__leave(c, rc);
}

TALLY_API int tally_mem_release(void *ptr) {
    if (!ptr || tally__kept_release(ptr)) return 0;
    return tally__seterr(TALLY_E_INVALID,
                         "tally_mem_release: %p is no buffer tally_mem_keep kept past its communicator (one whose "
                         "communicator lives is released with tally_mem_free)",
                         ptr);
}
