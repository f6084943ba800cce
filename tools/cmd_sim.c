/* cmd_sim.c - `tally sim`: reads the cluster (flags, a config file, or --calibrate on this machine) and
 * what to play (collectives over sizes, or training steps), asks src/sim, prints text or JSON. */
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tally.h>
#include <unistd.h>

#include "../src/core/file.h"
#include "../src/core/parse.h"
#include "../src/core/sig.h"
#include "../src/core/units.h"
#include "../src/dp/sync.h"
#include "../src/plan/plan.h"
#include "../src/sim/sim.h"
#include "../src/train/local_sgd.h"
#include "cmd.h"
#include "flags.h"
#include "charts/sim_chart.h"

#define MAX_SIZES 64

typedef struct sim_setting {
    char *key, *value;
} sim_setting;

typedef struct sim_opts {
    tally__sim_cluster c;
    int coll, algo, method, json, calibrate, train;
    const char *save; /* --save FILE: the cluster as a config file */
    const char *svg;  /* --svg FILE: what was played as a chart (sim_chart.c) */
    size_t size[MAX_SIZES];
    int nsizes;
    tally__sim_train t;
    double params;
    /* --calibrate measures over the cluster as given before it, then sets again, in order, what was given
     * after it: flags, and a --config file's settings as its one read found them (a file read again could
     * say something else, and its slow ranks would be added twice) */
    tally__sim_cluster before;
    sim_setting *after;
    size_t nafter, cap;
} sim_opts;

static void sim_usage(FILE *out) {
    char algos[256];
    tally__algo_names(algos, sizeof algos, TALLY__ALGO_WITH_AUTO | TALLY__ALGO_WITH_HIER, "|", "|");
    fprintf(out,
            "usage: tally sim [--config FILE] [--hosts H] [--ranks-per-host M] [--cores C]\n"
            "                 [--shm-latency 5us] [--shm-bandwidth 10GB/s] [--reduce-bandwidth 10GB/s]\n"
            "                 [--cache-bandwidth 14GB/s --cache-bytes 4M [--shm-bandwidth-bytes 64M]]\n"
            "                 [--crowded-latency 20us] [--call-overhead 0.3us] [--tcp-bandwidth 2GB/s]\n"
            "                 [--shared-cores yes|no]\n"
            "                 [--nic 25Gbps] [--nic-latency 20us] [--nic-payload 0.94] [--fabric full|fat-tree]\n"
            "                 [--hosts-per-leaf K] [--oversub X] [--calibrate]\n"
            "                 [--coll allreduce|reduce-scatter|allgather|broadcast|barrier]\n"
            "                 [--algo %s] [--size 1K,1M,64M] [--method auto|event|fast]\n"
            "                 [--train --params P [--layers L] --compute 120ms [--update 5ms] [--zero 0..3]\n"
            "                  [--accum K] [--bucket-mb M] [--mode sync|async] [--staleness S] [--steps 20]\n"
            "                  [--compute-sd 0.05] [--slow RANK:FACTOR]... [--seed N]\n"
            "                  [--local-steps H [--outer-compress none|fp16|int8]]] [--save FILE] [--json]\n"
            "                 [--svg FILE]\n"
            "Simulates collectives and training steps on a cluster described on paper: H hosts of M ranks\n"
            "(rank = host x M + local), the shm link inside a host (its latency, copy and reduction rates, C\n"
            "CPUs its ranks share; where its ranks outnumber them, a message waits --crowded-latency for the\n"
            "sleeping waiter's wake-up; --shared-cores yes: all hosts share the C CPUs, as test hosts made of\n"
            "network namespaces do), tcp's CPU cost at each end (--tcp-bandwidth: bytes a core moves; 0 by\n"
            "default, as RDMA), each host's NIC (each way; --nic-payload: the share of its rate data gets, 0.94\n"
            "for TCP over Ethernet at MTU 1500, the rest being headers) and the fabric (full bisection, or a\n"
            "fat tree of K hosts per leaf switch whose uplinks carry 1/X of its hosts' links). The algorithms\n"
            "run as the library runs them: their own code is traced step by step, and every flow shares the\n"
            "links it crosses fairly (the event level), or, for schedules every rank runs alike (ring, rhd on\n"
            "a power of two, hier's levels) on large layouts, one step pattern is counted once (the fast path).\n"
            "  --config FILE: 'key = value' lines, the keys these flags' names; flags after it override it.\n"
            "  --calibrate: this machine's shm link (2 ranks: the library's ping-pong, beta fitted to a timed\n"
            "  allreduce of the largest --size, and --cache-bandwidth to one of 1 MiB where that is faster;\n"
            "  again with both ranks on one CPU for --crowded-latency; a 4-byte allreduce for --call-overhead,\n"
            "  what a call costs besides its messages), its CPUs, and tcp on loopback (--nic-latency, and\n"
            "  --tcp-bandwidth: what the stack costs a core); flags and --config files after --calibrate\n"
            "  override what it measured. --save FILE writes the cluster (measured or given) as a file for\n"
            "  --config.\n"
            "  --cache-bandwidth: the copy rate of vectors of at most --cache-bytes (in cache); sizes up to\n"
            "  --shm-bandwidth-bytes take a rate between, in log size.\n"
            "  --train: steps of a model of P parameters (fp32 gradients) in L equal layers; --compute is one\n"
            "  micro-batch's forward and backward on one rank; --slow 3:1.5 makes rank 3 1.5x slower;\n"
            "  --compute-sd draws each rank's compute each step; --mode async: a parameter server on rank 0;\n"
            "  --local-steps H: local SGD (tally train's), each rank on its own clock for H steps, then one\n"
            "  allreduce of the parameters (--outer-compress fp16 or int8: half or a quarter of the bytes),\n"
            "  played beside synchronous training on the same cluster to say which to pick.\n"
            "Prints time, algorithm and bus bandwidth, the busiest link of each kind, and the critical path (the\n"
            "link and the rank that set the pace).\n"
            "  --svg FILE: a chart of busbw and time against the sizes played; with --train, of the step's\n"
            "  speed-up and time on 1, 2, 4, ... up to H hosts (each layout played in turn).\n",
            algos);
}

enum {
    O_CONFIG = 256,
    O_CLUSTER, /* every cluster key: handled by tally__sim_cluster_set under the flag's name */
    O_COLL,
    O_ALGO,
    O_SIZE,
    O_METHOD,
    O_TRAIN,
    O_PARAMS,
    O_LAYERS,
    O_COMPUTE,
    O_UPDATE,
    O_ZERO,
    O_ACCUM,
    O_BUCKET,
    O_MODE,
    O_STALE,
    O_STEPS,
    O_LOCAL,
    O_OUTER_COMPRESS,
    O_CALIB,
    O_SAVE,
    O_JSON,
    O_SVG,
};

static const struct option sim_longs[] = {{"config", 1, 0, O_CONFIG},
                                          {"hosts", 1, 0, O_CLUSTER},
                                          {"ranks-per-host", 1, 0, O_CLUSTER},
                                          {"cores", 1, 0, O_CLUSTER},
                                          {"shm-latency", 1, 0, O_CLUSTER},
                                          {"crowded-latency", 1, 0, O_CLUSTER},
                                          {"call-overhead", 1, 0, O_CLUSTER},
                                          {"shm-bandwidth-bytes", 1, 0, O_CLUSTER},
                                          {"cache-bandwidth", 1, 0, O_CLUSTER},
                                          {"cache-bytes", 1, 0, O_CLUSTER},
                                          {"tcp-bandwidth", 1, 0, O_CLUSTER},
                                          {"shared-cores", 1, 0, O_CLUSTER},
                                          {"shm-bandwidth", 1, 0, O_CLUSTER},
                                          {"reduce-bandwidth", 1, 0, O_CLUSTER},
                                          {"nic", 1, 0, O_CLUSTER},
                                          {"nic-latency", 1, 0, O_CLUSTER},
                                          {"nic-payload", 1, 0, O_CLUSTER},
                                          {"fabric", 1, 0, O_CLUSTER},
                                          {"hosts-per-leaf", 1, 0, O_CLUSTER},
                                          {"oversub", 1, 0, O_CLUSTER},
                                          {"compute-sd", 1, 0, O_CLUSTER},
                                          {"slow", 1, 0, O_CLUSTER},
                                          {"seed", 1, 0, O_CLUSTER},
                                          {"coll", 1, 0, O_COLL},
                                          {"algo", 1, 0, O_ALGO},
                                          {"size", 1, 0, O_SIZE},
                                          {"method", 1, 0, O_METHOD},
                                          {"train", 0, 0, O_TRAIN},
                                          {"params", 1, 0, O_PARAMS},
                                          {"layers", 1, 0, O_LAYERS},
                                          {"compute", 1, 0, O_COMPUTE},
                                          {"update", 1, 0, O_UPDATE},
                                          {"zero", 1, 0, O_ZERO},
                                          {"accum", 1, 0, O_ACCUM},
                                          {"bucket-mb", 1, 0, O_BUCKET},
                                          {"mode", 1, 0, O_MODE},
                                          {"staleness", 1, 0, O_STALE},
                                          {"steps", 1, 0, O_STEPS},
                                          {"local-steps", 1, 0, O_LOCAL},
                                          {"outer-compress", 1, 0, O_OUTER_COMPRESS},
                                          {"calibrate", 0, 0, O_CALIB},
                                          {"save", 1, 0, O_SAVE},
                                          {"json", 0, 0, O_JSON},
                                          {"svg", 1, 0, O_SVG},
                                          {"help", 0, 0, 'h'},
                                          {0, 0, 0, 0}};

static const char *const coll_names[] = {"allreduce", "reduce-scatter", "allgather", "broadcast", "barrier", NULL};
static const char *const method_names[] = {"auto", "event", "fast", NULL};

static int parse_sizes(const char *flag, const char *v, sim_opts *o) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", v);
    o->nsizes = 0;
    for (char *tok = buf, *comma;; tok = comma + 1) {
        uint64_t b;
        if ((comma = strchr(tok, ','))) *comma = '\0';
        if (o->nsizes == MAX_SIZES) return tally__parse_fail(flag, v, "lists too many sizes", "it takes at most 64");
        if (!*tok) return tally__parse_fail(flag, v, "has an empty size", "it takes sizes such as 1K,1M,64M");
        if (tally__parse_bytes(flag, tok, 0, (uint64_t)1 << 40, &b)) return -1;
        o->size[o->nsizes++] = (size_t)b;
        if (!comma) return 0;
    }
}

static int int_flag(const char *flag, const char *v, long long lo, long long hi, int *out) {
    long long x;
    int rc = tally__parse_int(flag, v, lo, hi, &x);
    if (!rc) *out = (int)x;
    return rc;
}

static int time_flag(const char *flag, const char *v, double *out) {
    if (tally__units_time(v, out))
        return tally__parse_fail(flag, v, "is not a time", "it takes a time: 120ms, 2.5s, 800us");
    return 0;
}

/* A setting given after --calibrate, kept to be set again over what it measures: 0, or -1 out of memory. */
static int keep_after(void *ctx, const char *key, const char *value) {
    sim_opts *o = ctx;
    if (o->nafter == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 16;
        sim_setting *a = realloc(o->after, cap * sizeof *a);
        if (!a) return -1;
        o->after = a, o->cap = cap;
    }
    char *k = strdup(key), *v = strdup(value);
    if (!k || !v) return free(k), free(v), -1;
    o->after[o->nafter++] = (sim_setting){k, v};
    return 0;
}

static int config_flag(sim_opts *o, const char *flag, const char *v) {
    if (!(o->calibrate ? tally__sim_cluster_read_seen(&o->c, v, keep_after, o) : tally__sim_cluster_read(&o->c, v)))
        return 0;
    char why[512];
    snprintf(why, sizeof why, "it takes a readable file of 'key = value' lines (%s)", tally_last_error());
    return tally__parse_fail(flag, v, "cannot be used", why);
}

static int cluster_flag(sim_opts *o, const char *flag, const char *v) {
    int rc = tally__sim_cluster_set(&o->c, flag + 2, v);
    if (rc) return rc == 1 ? -1 : rc;
    if (o->calibrate && keep_after(o, flag + 2, v))
        return tally__parse_fail(flag, v, "cannot be kept for after --calibrate", "out of memory");
    return 0;
}

static int sim_flag(int ch, const char *flag, const char *v, void *ctx) {
    sim_opts *o = ctx;
    static const char *const modes[] = {"sync", "async", NULL};
    int rc;
    double x;
    switch (ch) {
    case O_CONFIG: return config_flag(o, flag, v);
    case O_CLUSTER: return cluster_flag(o, flag, v);
    case O_COLL: return tally__parse_word(flag, v, coll_names, &o->coll);
    case O_ALGO:
        if ((o->algo = tally__algo_parse(v)) < 0) {
            char names[256], why[300];
            tally__algo_names(names, sizeof names, TALLY__ALGO_WITH_AUTO | TALLY__ALGO_WITH_HIER, ", ", " or ");
            snprintf(why, sizeof why, "it takes %s", names);
            return tally__parse_fail(flag, v, "is not an algorithm", why);
        }
        return 0;
    case O_SIZE: return parse_sizes(flag, v, o);
    case O_METHOD: return tally__parse_word(flag, v, method_names, &o->method);
    case O_TRAIN: return o->train = 1, 0;
    case O_PARAMS:
        if (tally__units_count(v, &o->params) || !(o->params >= 1) || o->params > 1e13)
            return tally__parse_fail(flag, v, "is not a parameter count", "it takes 1 .. 10T (K/M/G/T: 7.5G)");
        return 0;
    case O_LAYERS: return int_flag(flag, v, 1, 100000, &o->t.nlayers);
    case O_COMPUTE: return time_flag(flag, v, &o->t.compute_s);
    case O_UPDATE: return time_flag(flag, v, &o->t.update_s);
    case O_ZERO: return int_flag(flag, v, 0, 3, &o->t.zero);
    case O_ACCUM: return int_flag(flag, v, 1, 100000, &o->t.accum);
    case O_BUCKET:
        if ((rc = tally__parse_real(flag, v, 0, 1, 1e6, &x))) return rc;
        o->t.bucket_bytes = x * 1048576.0;
        return 0;
    case O_MODE: return tally__parse_word(flag, v, modes, &o->t.async);
    case O_STALE: return int_flag(flag, v, 0, 1000000, &o->t.staleness);
    case O_STEPS: return int_flag(flag, v, 1, 100000, &o->t.steps);
    case O_LOCAL: return int_flag(flag, v, 1, 100000, &o->t.local_steps);
    case O_OUTER_COMPRESS: {
        int k;
        if ((rc = tally__parse_word(flag, v, tally__outer_compress_words, &k))) return rc;
        o->t.outer_ratio = tally__outer_compress_ratio(k);
        return 0;
    }
    case O_CALIB:
        if (!o->calibrate) o->before = o->c; /* a second --calibrate changes nothing */
        return o->calibrate = 1, 0;
    case O_SAVE: return *v ? (o->save = v, 0) : tally__parse_fail(flag, v, "is empty", "it takes a file to write");
    case O_JSON: return o->json = 1, 0;
    case O_SVG: return *v ? (o->svg = v, 0) : tally__parse_fail(flag, v, "is empty", "it takes a file to write");
    }
    return -1;
}

static int sim_parse(int argc, char **argv, sim_opts *o) {
    memset(o, 0, sizeof *o);
    tally__sim_cluster_default(&o->c);
    o->coll = TALLY__ALLREDUCE;
    o->size[o->nsizes++] = 64 << 20;
    o->t = (tally__sim_train){
        .bucket_bytes = TALLY__SYNC_BUCKET_MB_DEFAULT * 1048576.0, .nlayers = 1, .accum = 1, .steps = 20};
    const tally_flags f = {
        .cmd = "sim", .shorts = "h", .longs = sim_longs, .first = 1, .one = sim_flag, .usage = sim_usage};
    int rc = tally_flags_parse(&f, argc, argv, o);
    if (rc) return rc;
    if (tally__sim_cluster_check(&o->c)) return tally_flags_usage_error("sim", "%s", tally_last_error() + 5);
    if (o->train && !(o->params > 0 && o->t.compute_s > 0))
        return tally_flags_usage_error("sim", "--train needs --params and --compute (one micro-batch on one rank)");
    if (!o->train && (o->params > 0 || o->t.compute_s > 0))
        return tally_flags_usage_error("sim", "--params and --compute describe a training step: add --train");
    if (o->t.outer_ratio > 0 && !o->t.local_steps)
        return tally_flags_usage_error("sim", "--outer-compress needs --local-steps H");
    if (o->t.local_steps && (o->t.async || o->t.zero))
        return tally_flags_usage_error("sim", "--local-steps does not go with --mode async or --zero 1-3");
    if (o->t.local_steps && !o->train) return tally_flags_usage_error("sim", "--local-steps needs --train");
    if (o->t.local_steps) { /* whole rounds, at least four: a short last one would weigh as much as a whole */
        int rounds = (o->t.steps + o->t.local_steps - 1) / o->t.local_steps;
        o->t.steps = (rounds < 4 ? 4 : rounds) * o->t.local_steps;
        if (o->t.steps > 100000) o->t.steps = 100000 / o->t.local_steps * o->t.local_steps;
    }
    o->t.grad_bytes = 4 * o->params;
    o->t.algo = o->algo;
    o->t.method = o->method;
    return 0;
}

/* ---- --calibrate ---- */

#define SIM_CACHE_BYTES (1 << 20) /* the calibration's vector that stays in cache */

/* shm's link on c: alpha, beta at the size S, the cache's rate, and the call's own overhead. */
static int measure_shm(tally__sim_cluster *c, double S) {
    double ar = 0;
    tally__cost m;
    if (tally_plan_calibrate_link("shm", S, TALLY_SUM, &m, &ar)) return -1;
    if (ar > 0) m.beta = tally__plan_fit_beta(&m, 2, S, ar);
    c->shm = m;
    c->beta_bytes = S;
    /* A vector that stays in the caches: on this VM its rate moves 2.5x with where the hypervisor runs
     * the two CPUs (sharing a cache or not) while the large one's barely does, so it is measured too. It
     * is kept only where faster: slower, it is the in-place path's cost per call, which the slot path
     * that smaller messages take does not pay (2 ranks at 256 KiB then beat 1 MiB's rate by 1.25x). */
    tally__cost mid;
    double at_mid = 0;
    if (tally_plan_calibrate_link("shm", SIM_CACHE_BYTES, TALLY_SUM, &mid, &at_mid)) return -1;
    double fitted = at_mid > 0 ? tally__plan_fit_beta(&m, 2, SIM_CACHE_BYTES, at_mid) : m.beta;
    int faster = fitted < m.beta;
    c->cache_beta = faster ? fitted : 0;
    c->cache_bytes = faster ? SIM_CACHE_BYTES : 0;
    /* a 4-byte allreduce: what the model lacks of its time is the call's own overhead */
    tally__cost unused;
    double tiny = 0;
    if (tally_plan_calibrate_link("shm", 4, TALLY_SUM, &unused, &tiny)) return -1;
    tally__sim_cluster two = *c;
    two.hosts = 1, two.per_host = 2, two.cores = 2, two.call_s = 0;
    tally__sim_coll q = {.coll = TALLY__ALLREDUCE, .bytes = 4, .dtype = TALLY_F32};
    tally__sim_result r;
    if (!tally__sim_collective(&two, &q, &r) && tiny > r.seconds) c->call_s = tiny - r.seconds;
    return 0;
}

/* tcp on loopback: its latency is the stack's, and its fitted beta what each end's CPU spends a byte */
static int measure_tcp(tally__sim_cluster *c, double S) {
    double ar = 0;
    tally__cost t;
    if (tally_plan_calibrate_link("tcp", S, TALLY_SUM, &t, &ar)) return -1;
    if (ar > 0) t.beta = tally__plan_fit_beta(&t, 2, S, ar);
    c->nic_alpha = t.alpha;
    c->tcp_cpu = t.beta;
    return 0;
}

/* The CPUs we may run on, and shm's latency with both ranks on one of them. */
static int measure_cpus(tally__sim_cluster *c) {
    cpu_set_t all, one;
    if (sched_getaffinity(0, sizeof all, &all)) return fprintf(stderr, "tally sim: calibrate: no CPU set\n"), -1;
    c->cores = CPU_COUNT(&all);
    CPU_ZERO(&one);
    for (int i = 0; i < CPU_SETSIZE; i++)
        if (CPU_ISSET(i, &all)) {
            CPU_SET(i, &one);
            break;
        }
    /* both ranks on one CPU (the launcher binds within our set): the ping-pong then waits for wake-ups */
    tally__cost crowded;
    double ar1 = 0;
    int rc =
        sched_setaffinity(0, sizeof one, &one) ? -1 : tally_plan_calibrate_link("shm", 0, TALLY_SUM, &crowded, &ar1);
    sched_setaffinity(0, sizeof all, &all);
    if (rc) return -1;
    c->crowded_alpha = crowded.alpha;
    return 0;
}

/* Measured first, then what was given after --calibrate, in order, so that it overrides what was measured.
 * Each setting was taken at the parse, on the same slow ranks as here: none can fail now. */
static int sim_calibrate(sim_opts *o) {
    size_t most = 0;
    for (int i = 0; i < o->nsizes; i++) most = o->size[i] > most ? o->size[i] : most;
    double S = most > (1u << 20) ? (double)most : 16.0 * 1048576;
    tally__sim_cluster c = o->before;
    if (measure_shm(&c, S) || measure_tcp(&c, S) || measure_cpus(&c)) return -1;
    for (size_t i = 0; i < o->nafter; i++)
        if (tally__sim_cluster_set(&c, o->after[i].key, o->after[i].value))
            return fprintf(stderr, "tally sim: --%s %s after --calibrate: %s\n", o->after[i].key, o->after[i].value,
                           tally_last_error()),
                   -1;
    o->c = c;
    return 0;
}

/* The cluster as a file --config reads back: every setting, times in seconds, rates in bytes/s. Written as
 * every output is (tally__file_out: a file replaced whole, a device or FIFO in place, no one else's link). */
static int save_cluster(const sim_opts *o) {
    const tally__sim_cluster *c = &o->c;
    tally__file_out out;
    if (tally__file_out_open(&out, o->save)) return fprintf(stderr, "tally sim: --save: %s\n", tally_last_error()), -1;
    FILE *f = out.f;
    fprintf(f, "# tally sim's cluster%s\n", o->calibrate ? ", its links measured on this machine (--calibrate)" : "");
    fprintf(f, "hosts = %d\nranks-per-host = %d\ncores = %d\nshared-cores = %s\n", c->hosts, c->per_host, c->cores,
            c->shared_cores ? "yes" : "no");
    fprintf(f, "shm-latency = %.9gs\nshm-bandwidth = %.9gB/s\nshm-bandwidth-bytes = %.0f\n", c->shm.alpha,
            1 / c->shm.beta, c->beta_bytes);
    if (c->cache_bytes > 0 && c->cache_beta > 0)
        fprintf(f, "cache-bandwidth = %.9gB/s\ncache-bytes = %.0f\n", 1 / c->cache_beta, c->cache_bytes);
    if (c->shm.gamma > 0) fprintf(f, "reduce-bandwidth = %.9gB/s\n", 1 / c->shm.gamma);
    fprintf(f, "crowded-latency = %.9gs\ncall-overhead = %.9gs\n", c->crowded_alpha, c->call_s);
    fprintf(f, "nic = %.9gB/s\nnic-latency = %.9gs\nnic-payload = %.9g\n", c->nic_rate, c->nic_alpha, c->nic_payload);
    if (c->tcp_cpu > 0) fprintf(f, "tcp-bandwidth = %.9gB/s\n", 1 / c->tcp_cpu);
    fprintf(f, "fabric = %s\nhosts-per-leaf = %d\noversub = %.9g\n",
            c->fabric == TALLY__SIM_FAT_TREE ? "fat-tree" : "full", c->hosts_per_leaf, c->oversub);
    if (tally__file_out_commit(&out)) return fprintf(stderr, "tally sim: --save: %s\n", tally_last_error()), -1;
    return 0;
}

/* ---- output ---- */

static void human_bytes(double b, char *buf, size_t n) {
    const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) b /= 1024, u++;
    snprintf(buf, n, b == floor(b) ? "%.0f %s" : "%.1f %s", b, unit[u]);
}

static void human_time(double s, char *buf, size_t n) {
    if (s < 1e-3)
        snprintf(buf, n, "%.1f us", s * 1e6);
    else if (s < 1)
        snprintf(buf, n, "%.2f ms", s * 1e3);
    else
        snprintf(buf, n, "%.3f s", s);
}

static void where(const tally__sim_cluster *c, int kind, int at, char *buf, size_t n) {
    if (kind < 0 || at < 0)
        snprintf(buf, n, "none");
    else
        snprintf(buf, n, "%s of %s %d", tally__sim_kind_name(kind), kind >= TALLY__SIM_UP ? "leaf" : "host", at);
}

static void print_cluster(const sim_opts *o) {
    const tally__sim_cluster *c = &o->c;
    printf("cluster: %d hosts x %d ranks = %d; shm %.2f us (%.1f us crowded), %.2f GB/s copy, %.2f GB/s reduce, "
           "%d CPUs %s\n",
           c->hosts, c->per_host, c->hosts * c->per_host, c->shm.alpha * 1e6, c->crowded_alpha * 1e6,
           1e-9 / c->shm.beta, c->shm.gamma > 0 ? 1e-9 / c->shm.gamma : 0.0,
           c->cores > 0      ? c->cores
           : c->shared_cores ? c->hosts * c->per_host
                             : c->per_host,
           c->shared_cores ? "shared by all hosts" : "a host");
    if (c->hosts > 1) {
        printf("         NIC %.3g Gbit/s (data %.0f%%), %.1f us a message, tcp %s%.2f GB/s a core; ",
               c->nic_rate * 8e-9, c->nic_payload * 100, c->nic_alpha * 1e6,
               c->tcp_cpu > 0 ? "" : "free: ", c->tcp_cpu > 0 ? 1e-9 / c->tcp_cpu : 0.0);
        if (c->shared_cores) printf("the hosts share the CPUs; ");
        if (c->fabric == TALLY__SIM_FAT_TREE)
            printf("fat tree, %d hosts a leaf, %g:1 oversubscribed\n", c->hosts_per_leaf, c->oversub);
        else
            printf("full bisection\n");
    }
}

static void print_result_text(const sim_opts *o, size_t bytes, const tally__sim_result *r) {
    char sz[32], tm[32], crit[64], busy[64];
    human_bytes((double)bytes, sz, sizeof sz);
    human_time(r->seconds, tm, sizeof tm);
    where(&o->c, r->crit_kind, r->crit_at, crit, sizeof crit);
    int bk = -1;
    for (int k = 0; k < TALLY__SIM_KINDS; k++)
        if (r->util_at[k] >= 0 && (bk < 0 || r->util[k] > r->util[bk])) bk = k;
    if (bk >= 0) {
        char w[48];
        where(&o->c, bk, r->util_at[bk], w, sizeof w);
        snprintf(busy, sizeof busy, "%s %.0f%%", w, 100 * r->util[bk]);
    } else {
        snprintf(busy, sizeof busy, "none");
    }
    char algo[24];
    if (r->algo == TALLY__ALGO_HIER)
        snprintf(algo, sizeof algo, "hier(%s,%s)", tally__algo_name(r->level_algo[0]),
                 tally__algo_name(r->level_algo[1]));
    else
        snprintf(algo, sizeof algo, "%s", tally__algo_name(r->algo));
    printf("%10s  %-16s %-5s %10s  %9.3f  %9.3f  %-26s %s", sz, algo, method_names[r->method], tm, r->algbw / 1e9,
           r->busbw / 1e9, busy, crit);
    if (r->crit_rank >= 0) printf(", rank %d", r->crit_rank);
    printf("\n");
}

static void print_result_json(const sim_opts *o, size_t bytes, const tally__sim_result *r, int first) {
    printf("%s\n    {\"bytes\": %zu, \"algo\": \"%s\", \"method\": \"%s\", \"seconds\": %.9g, \"algbw\": %.6g, "
           "\"busbw\": %.6g,",
           first ? "" : ",", bytes, tally__algo_name(r->algo), method_names[r->method], r->seconds, r->algbw, r->busbw);
    if (r->algo == TALLY__ALGO_HIER)
        printf(" \"levels\": [\"%s\", \"%s\"],", tally__algo_name(r->level_algo[0]),
               tally__algo_name(r->level_algo[1]));
    printf(" \"utilisation\": {");
    int any = 0;
    for (int k = 0; k < TALLY__SIM_KINDS; k++)
        if (r->util_at[k] >= 0)
            printf("%s\"%s\": {\"busiest\": %.4f, \"at\": %d}", any++ ? ", " : "", tally__sim_kind_name(k), r->util[k],
                   r->util_at[k]);
    printf("}, \"critical\": {\"link\": \"%s\", \"at\": %d, \"link_share\": %.4f, \"rank\": %d, \"rank_share\": %.4f}, "
           "\"messages\": %ld, \"steps\": %ld}",
           r->crit_kind >= 0 ? tally__sim_kind_name(r->crit_kind) : "none", r->crit_at, r->crit_link_share,
           r->crit_rank, r->crit_rank_share, r->messages, r->steps);
}

/* --svg's message names the file; 0 or 1. */
static int chart_done(const sim_opts *o, int rc) {
    if (rc) fprintf(stderr, "tally sim: --svg %s: %s\n", o->svg, tally_last_error());
    return rc ? 1 : 0;
}

static int run_collectives(const sim_opts *o) {
    tally__sim_result kept[MAX_SIZES];
    size_t bytes[MAX_SIZES];
    if (o->json)
        printf("{\"hosts\": %d, \"ranks_per_host\": %d, \"cores\": %d, \"shm\": {\"alpha\": %.9g, \"beta\": %.9g, "
               "\"gamma\": %.9g, \"crowded_alpha\": %.9g, \"call\": %.9g, \"cache_beta\": %.9g, \"cache_bytes\": "
               "%.9g}, \"tcp_cpu\": %.9g, \"nic_rate\": %.9g, "
               "\"nic_alpha\": %.9g, \"nic_payload\": %.9g, "
               "\"collective\": \"%s\", \"results\": [",
               o->c.hosts, o->c.per_host, o->c.cores, o->c.shm.alpha, o->c.shm.beta, o->c.shm.gamma, o->c.crowded_alpha,
               o->c.call_s, o->c.cache_beta, o->c.cache_bytes, o->c.tcp_cpu, o->c.nic_rate, o->c.nic_alpha,
               o->c.nic_payload, coll_names[o->coll]);
    else {
        print_cluster(o);
        printf("%s, f32:\n%10s  %-16s %-5s %10s  %9s  %9s  %-26s %s\n", coll_names[o->coll], "size", "algorithm", "how",
               "time", "algbw GB/s", "busbw GB/s", "busiest link", "critical path");
    }
    for (int i = 0; i < o->nsizes; i++) {
        tally__sim_coll q = {
            .coll = o->coll, .algo = o->algo, .bytes = o->size[i] / 4 * 4, .dtype = TALLY_F32, .method = o->method};
        tally__sim_result r;
        if (tally__sim_collective(&o->c, &q, &r)) {
            if (o->json) printf("]}\n");
            fprintf(stderr, "tally sim: %s\n", tally_last_error());
            return 1;
        }
        if (o->json)
            print_result_json(o, q.bytes, &r, i == 0);
        else
            print_result_text(o, q.bytes, &r);
        kept[i] = r;
        bytes[i] = q.bytes;
    }
    if (o->json) printf("\n]}\n");
    if (!o->svg) return 0;
    fflush(stdout);
    return chart_done(o, tally_sim_chart_sizes(o->svg, &o->c, coll_names[o->coll], o->algo, bytes, kept, o->nsizes));
}

static int run_train_chart(const sim_opts *o) {
    if (!o->svg) return 0;
    fflush(stdout);
    return chart_done(o, tally_sim_chart_hosts(o->svg, &o->c, &o->t, o->params));
}

/* --local-steps: synchronous training's step on the same cluster, to say which is faster. */
static int run_sync_beside(const sim_opts *o, tally__sim_step *sync) {
    tally__sim_train t = o->t;
    t.local_steps = 0;
    if (!tally__sim_train_step(&o->c, &t, sync)) return 0;
    fprintf(stderr, "tally sim: %s\n", tally_last_error());
    return 1;
}

static void print_local(const sim_opts *o, const tally__sim_step *s, const tally__sim_step *sync) {
    char a[32], b[32];
    human_time(s->big.seconds, a, sizeof a);
    human_time(sync->step_s, b, sizeof b);
    printf("  local SGD: every %d steps the ranks meet and average the parameters in %s (%s a round; no rank\n"
           "  waits for another inside it, so the round's slowest sum of steps sets its pace)\n",
           o->t.local_steps, tally__outer_ratio_name(o->t.outer_ratio), a);
    printf("  synchronous training on this cluster: step %s; local SGD runs at %.2fx its speed: %s\n", b,
           s->step_s > 0 ? sync->step_s / s->step_s : 0,
           s->step_s < sync->step_s * 0.95 ? "pick local SGD where its loss per step holds (BENCHMARKS.md)"
                                           : "pick sync: averaging less often buys little here");
}

static int run_train(const sim_opts *o) {
    tally__sim_step s, sync = {0};
    if (tally__sim_train_step(&o->c, &o->t, &s)) {
        fprintf(stderr, "tally sim: %s\n", tally_last_error());
        return 1;
    }
    if (o->t.local_steps && run_sync_beside(o, &sync)) return 1;
    int n = o->c.hosts * o->c.per_host;
    double speedup = tally_sim_speedup(&o->t, n, &s);
    if (o->json) {
        printf("{\"hosts\": %d, \"ranks_per_host\": %d, \"mode\": \"%s\", \"zero\": %d, \"step_s\": %.9g, "
               "\"compute_s\": %.9g, \"comm_s\": %.9g, \"exposed_s\": %.9g, \"collectives\": %d, \"speedup\": %.6g, "
               "\"pace_rank\": %d, \"pace_share\": %.4f, ",
               o->c.hosts, o->c.per_host,
               o->t.async         ? "async"
               : o->t.local_steps ? "local"
                                  : "sync",
               o->t.zero, s.step_s, s.compute_s, s.comm_s, s.exposed_s, s.colls, speedup, s.pace_rank, s.pace_share);
        if (o->t.local_steps)
            printf("\"local_steps\": %d, \"outer_compress\": \"%s\", \"sync_step_s\": %.9g, \"pick\": \"%s\", ",
                   o->t.local_steps, tally__outer_ratio_name(o->t.outer_ratio), sync.step_s,
                   s.step_s < sync.step_s * 0.95 ? "local" : "sync");
        printf("\"largest\": ");
        print_result_json(o, s.big_bytes, &s.big, 1);
        printf("}\n");
        return run_train_chart(o);
    }
    print_cluster(o);
    char a[32], b[32], c[32], d[32];
    human_time(s.step_s, a, sizeof a);
    human_time(s.compute_s, b, sizeof b);
    human_time(s.comm_s, c, sizeof c);
    human_time(s.exposed_s, d, sizeof d);
    printf("training step (%s, ZeRO %d, %.4g M parameters, %d layers, accum %d):\n",
           o->t.async         ? "async"
           : o->t.local_steps ? "local SGD"
                              : "sync",
           o->t.zero, o->params / 1e6, o->t.nlayers, o->t.accum);
    printf("  step %s: compute %s (the slowest rank), collectives %s (%d), exposed %s\n", a, b, c, s.colls, d);
    printf("  speed-up over one rank: %.2f on %d ranks (%.0f%% efficiency)\n", speedup, n, 100 * speedup / n);
    if (s.pace_rank >= 0)
        printf("  pace: rank %d was the slowest in %.0f%% of the steps\n", s.pace_rank, 100 * s.pace_share);
    if (o->t.local_steps) print_local(o, &s, &sync);
    if (!o->t.async && s.big.seconds > 0) {
        printf("  the largest collective:\n");
        print_result_text(o, s.big_bytes, &s.big);
    }
    return run_train_chart(o);
}

static void sim_free(sim_opts *o) {
    for (size_t i = 0; i < o->nafter; i++) free(o->after[i].key), free(o->after[i].value);
    free(o->after);
    free(o);
}

int tally_cmd_sim(int argc, char **argv) {
    sim_opts *o = calloc(1, sizeof *o);
    if (!o) return fprintf(stderr, "tally sim: out of memory\n"), 1;
    int rc = sim_parse(argc, argv, o);
    if (rc) {
        sim_free(o);
        return rc == 1 ? 0 : 2;
    }
    if (o->calibrate && sim_calibrate(o)) rc = 1;
    if (!rc && o->save && save_cluster(o)) rc = 1;
    if (!rc) rc = o->train ? run_train(o) : run_collectives(o);
    sim_free(o);
    return rc;
}
