/* cmd_plan.c - `tally plan`: parses the flags (or measures this machine with --calibrate), asks the
 * planner (src/plan/plan.c) for memory, communication, step time and scaling, prints text or JSON. */
#include <cblas.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <tally.h>
#include <tally/optim.h>
#include <unistd.h>

#include "../src/core/clock.h"
#include "../src/core/numeric/dtype.h"
#include "../src/core/sig.h"
#include "../src/nn/model.h"
#include "../src/plan/calibrate.h"
#include "../src/core/units.h"
#include "../src/plan/plan.h"
#include "../src/train/trainer.h"
#include "../src/core/parse.h"
#include "cmd.h"
#include "flags.h"
#include "launch.h"
#include "charts/plan_chart.h"

#include "plan_report.h"

/* The defaults the help names, from where they are written (plan.c's defaults, the models' table). */
static void plan_usage(FILE *out) {
    char algos[256];
    tally__algo_names(algos, sizeof algos, TALLY__ALGO_WITH_HIER | TALLY__ALGO_ALLREDUCE_ONLY, "|", "|");
    tally__plan_cfg d;
    tally__plan_cfg_default(&d);
    tally__model_cfg gpt = {.kind = TALLY__MODEL_GPT};
    tally__model_info_of(TALLY__MODEL_GPT)->defaults(&gpt);
    fprintf(
        out,
        "usage: tally plan --params P [--layers L] --workers N [--optimizer sgd|adam] [--precision fp32|mixed]\n"
        "                  [--zero 0..3] [--batch B] [--accum K] [--flops-per-sample F | --model mlp|cnn|linear|gpt\n"
        "                  [--hidden W1,W2,...] [--layers L --width C --heads H --context T]] [--compute GFLOPS]\n"
        "                  [--bandwidth RATE] [--latency TIME] [--hosts H --ranks-per-host M]\n"
        "                  [--net-bandwidth RATE] [--net-latency TIME] [--fabric full|fat-tree]\n"
        "                  [--hosts-per-leaf K] [--oversub X] [--slow RANK:FACTOR]... [--compute-sd F]\n"
        "                  [--algo %s|all] [--bucket-mb M] [--local-steps H [--outer-compress none|fp16|int8]]\n"
        "                  [--calibrate] [--json]\n"
        "                  [--svg FILE]\n"
        "Predicts, before a run: memory per rank for each ZeRO stage, communication per step for each\n"
        "allreduce algorithm (alpha-beta-gamma, the library's own cost model), step time with and without\n"
        "overlap, and Amdahl's speed-up over N = 1, 2, 4, ... up to --workers.\n"
        "  --params accepts K/M/G/T (1e3..1e12: 7.5G); --layers: how many (equal) layers hold them.\n"
        "  --model takes P, the layers, FLOPs/sample and activations from tally train's models; for gpt,\n"
        "  --layers, --width, --heads and --context shape it (default %d, %d, %d, %d; a sample is a\n"
        "  window of --context byte tokens, its FLOPs 6 x parameters + attention per token).\n"
        "  --bandwidth: 25Gbps (bits), 10GB/s (bytes; MiB/s binary); --latency: 5us, 1.5ms, 100ns.\n"
        "  --compute: GFLOP/s of one rank (default %g); FLOPs/sample default 6P without --model.\n"
        "  --calibrate measures this machine instead of taking flags: compute (the model's own layers\n"
        "  with --model, else single-thread sgemm), the optimizer update, and alpha/beta/gamma of the shm\n"
        "  and tcp links (2 local ranks each; shm's used when N fits this host's CPUs, else tcp's).\n"
        "  --hosts H --ranks-per-host M: H hosts of M ranks (N = H x M); --bandwidth and --latency are then\n"
        "  the link inside a host, --net-bandwidth and --net-latency the one between hosts (%gGbps, %gus),\n"
        "  and the hierarchical algorithm (hier, as the library runs it) is weighed beside the flat ones.\n"
        "  --fabric fat-tree --hosts-per-leaf K --oversub X: K hosts a leaf switch, uplinks at 1/X of their\n"
        "  links; --slow RANK:FACTOR (again for more), --compute-sd F: stragglers. Layouts the closed forms\n"
        "  cannot answer (hosts of 2 or more ranks, an oversubscribed fat tree, stragglers) are also played\n"
        "  by tally sim, and the plan says so: \"T simulated\".\n"
        "  Communication modes: synchronous training against local SGD (tally train --local-steps) at\n"
        "  H = 4, 16, 64 and --local-steps' own H, and the mode the plan picks: sync while its exposed\n"
        "  communication is at most %.0f%% of a step, else the smallest H whose averaging is (f32, then int8).\n"
        "  --svg FILE: the speed-up against ranks as a chart: Amdahl's S(n), the model's, S = n, and the\n"
        "  ceiling 1/(1-P).\n"
        "  Defaults: adam, fp32, zero 0, batch %d, accum %d, %gGbps, %gus, reduce at %g GB/s, buckets of %g MiB,\n"
        "  --algo all.\n",
        algos, gpt.layers, gpt.embd, gpt.heads, gpt.in_dim, d.gflops, 8 / d.net.beta / 1e9, d.net.alpha * 1e6,
        100 * TALLY__PLAN_COMM_SHARE_OK, d.batch, d.accum, 8 / d.cost.beta / 1e9, d.cost.alpha * 1e6,
        1 / d.cost.gamma / 1e9, d.bucket_bytes / 1048576);
}

/* ---- flags ---- */

enum {
    O_PARAMS = 256,
    O_LAYERS,
    O_WORKERS,
    O_OPT,
    O_PREC,
    O_ZERO,
    O_BATCH,
    O_FLOPS,
    O_MODEL,
    O_HIDDEN,
    O_COMPUTE,
    O_BW,
    O_LAT,
    O_ALGO,
    O_ACCUM,
    O_BUCKET,
    O_JSON,
    O_CALIB,
    O_CALIB_RANK,
    O_CALIB_BYTES,
    O_CALIB_OP,
    O_WIDTH,
    O_HEADS,
    O_CONTEXT,
    O_HOSTS,
    O_PER_HOST,
    O_NET_BW,
    O_NET_LAT,
    O_LOCAL,
    O_OUTER_COMPRESS,
    O_SIM, /* the fabric and the stragglers: tally__sim_cluster_set under the flag's own name */
    O_SVG
};

static const struct option plan_longs[] = {{"params", 1, 0, O_PARAMS},
                                           {"layers", 1, 0, O_LAYERS},
                                           {"workers", 1, 0, O_WORKERS},
                                           {"optimizer", 1, 0, O_OPT},
                                           {"precision", 1, 0, O_PREC},
                                           {"zero", 1, 0, O_ZERO},
                                           {"batch", 1, 0, O_BATCH},
                                           {"flops-per-sample", 1, 0, O_FLOPS},
                                           {"model", 1, 0, O_MODEL},
                                           {"hidden", 1, 0, O_HIDDEN},
                                           {"compute", 1, 0, O_COMPUTE},
                                           {"bandwidth", 1, 0, O_BW},
                                           {"latency", 1, 0, O_LAT},
                                           {"algo", 1, 0, O_ALGO},
                                           {"accum", 1, 0, O_ACCUM},
                                           {"local-steps", 1, 0, O_LOCAL},
                                           {"outer-compress", 1, 0, O_OUTER_COMPRESS},
                                           {"bucket-mb", 1, 0, O_BUCKET},
                                           {"json", 0, 0, O_JSON},
                                           {"calibrate", 0, 0, O_CALIB},
                                           {"calibrate-rank", 1, 0, O_CALIB_RANK},
                                           {"calibrate-bytes", 1, 0, O_CALIB_BYTES},
                                           {"calibrate-op", 1, 0, O_CALIB_OP},
                                           {"width", 1, 0, O_WIDTH},
                                           {"heads", 1, 0, O_HEADS},
                                           {"context", 1, 0, O_CONTEXT},
                                           {"hosts", 1, 0, O_HOSTS},
                                           {"ranks-per-host", 1, 0, O_PER_HOST},
                                           {"net-bandwidth", 1, 0, O_NET_BW},
                                           {"net-latency", 1, 0, O_NET_LAT},
                                           {"fabric", 1, 0, O_SIM},
                                           {"hosts-per-leaf", 1, 0, O_SIM},
                                           {"oversub", 1, 0, O_SIM},
                                           {"slow", 1, 0, O_SIM},
                                           {"compute-sd", 1, 0, O_SIM},
                                           {"svg", 1, 0, O_SVG},
                                           {"help", 0, 0, 'h'},
                                           {0, 0, 0, 0}};

/* A whole number in [lo, hi] (K/M/G/T allowed). */
static int parse_int(const char *s, double lo, double hi, int *out) {
    double v;
    if (tally__units_count(s, &v) || v != floor(v) || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

static int parse_hidden(const char *s, tally__model_cfg *m) {
    return tally__model_parse_hidden(s, m->hidden, &m->nhidden);
}

static int parse_optimizer(const char *s, tally__plan_cfg *c) {
    if (!strcmp(s, "sgd")) return c->optimizer = TALLY_OPTIM_SGD, 0;
    if (!strcmp(s, "adam") || !strcmp(s, "adamw")) return c->optimizer = TALLY_OPTIM_ADAMW, 0;
    return -1;
}

static int parse_precision(const char *s, tally__plan_cfg *c) {
    if (!strcmp(s, "fp32")) return c->precision = TALLY__PLAN_FP32, 0;
    if (!strcmp(s, "mixed")) return c->precision = TALLY__PLAN_MIXED, 0;
    return -1;
}

static int parse_algo(const char *s, plan_opts *o) {
    if (!strcmp(s, "all") || !strcmp(s, "auto")) return o->show_all = 1, o->cfg.algo = TALLY__ALGO_AUTO, 0;
    int a = tally__algo_parse(s);
    if (a <= TALLY__ALGO_AUTO || !tally__plan_weighs(a)) return -1;
    o->show_all = 0;
    o->cfg.algo = a;
    return 0;
}

static int parse_bandwidth(const char *s, tally__cost *m) {
    double bps;
    if (tally__units_rate(s, &bps)) return -1;
    m->beta = 1.0 / bps;
    return 0;
}

static int plan_parse_one(int ch, const char *a, plan_opts *o) {
    tally__plan_cfg *c = &o->cfg;
    double v;
    switch (ch) {
    case O_PARAMS:
        if (tally__units_count(a, &v) || v < 1 || v > 1e15) return -1;
        c->params = (unsigned long long)llround(v);
        return o->have_params = 1, 0;
    case O_LAYERS: return parse_int(a, 1, 1e6, &o->layers);
    case 'n':
    case O_WORKERS: return parse_int(a, 1, 1 << 24, &c->workers) ? -1 : (o->have_workers = 1, 0);
    case O_OPT: return parse_optimizer(a, c);
    case O_PREC: return parse_precision(a, c);
    case O_ZERO: return parse_int(a, 0, 3, &c->zero);
    case O_BATCH: return parse_int(a, 1, 1 << 24, &c->batch);
    case O_ACCUM: return parse_int(a, 1, 1 << 24, &c->accum);
    case O_FLOPS:
        if (tally__units_count(a, &c->flops_per_sample) || c->flops_per_sample <= 0) return -1;
        return o->have_flops = 1, 0;
    case O_MODEL: return (o->model = tally__model_parse(a)) < 0 ? -1 : 0;
    case O_HIDDEN: return parse_hidden(a, &o->mcfg);
    case O_COMPUTE: return tally__units_gflops(a, &c->gflops);
    case O_BW: return parse_bandwidth(a, &c->cost);
    case O_LAT: return tally__units_time(a, &c->cost.alpha);
    case O_ALGO: return parse_algo(a, o);
    case O_BUCKET:
        if (tally__units_count(a, &v) || v <= 0) return -1;
        return c->bucket_bytes = v * 1048576.0, 0;
    case O_JSON: return o->json = 1, 0;
    case O_CALIB: return o->calibrate = 1, 0;
    case O_CALIB_RANK: return o->calibrate_rank = a, 0;
    case O_CALIB_BYTES: return tally__units_count(a, &o->calibrate_bytes);
    case O_CALIB_OP: {
        int op = tally_op_parse(a);
        /* the calibration's allreduce is of f32: a bitwise op would be refused */
        return op < 0 || !tally__dtype_op_valid(TALLY_F32, op) ? -1 : (o->calibrate_op = (tally_op)op, 0);
    }
    case O_WIDTH: return parse_int(a, 1, 1 << 20, &o->mcfg.embd);
    case O_HEADS: return parse_int(a, 1, 1 << 16, &o->mcfg.heads);
    case O_CONTEXT: return parse_int(a, 1, 1 << 24, &o->mcfg.in_dim);
    case O_HOSTS: return parse_int(a, 1, 1 << 20, &c->hosts);
    case O_PER_HOST: return parse_int(a, 1, 1 << 16, &c->per_host);
    case O_NET_BW: return parse_bandwidth(a, &c->net);
    case O_NET_LAT: return tally__units_time(a, &c->net.alpha);
    case O_SVG: return *a ? (o->svg = a, 0) : -1;
    case O_LOCAL: return parse_int(a, 1, TALLY__PLAN_LOCAL_MAX_H * 1024, &c->local_steps);
    case O_OUTER_COMPRESS: {
        int k = tally__outer_compress_parse(a);
        return k < 0 ? -1 : (c->outer_ratio = tally__outer_compress_ratio(k), 0);
    }
    default: return -1;
    }
}

/* What each flag takes, for the message when a value is refused. */
static const char *plan_accepts(int ch) {
    switch (ch) {
    case O_PARAMS:
        return "it takes a count of parameters in 1..1e15, with K, M, G or T (powers of 1000; Ki.. of 1024): 7.5G";
    case O_LAYERS: return "it takes a whole number in 1..1000000";
    case 'n':
    case O_WORKERS: return "it takes a whole number of ranks in 1..16777216 (K, M allowed)";
    case O_OPT: return "it takes sgd or adam";
    case O_PREC: return "it takes fp32 or mixed";
    case O_ZERO: return "it takes 0, 1, 2 or 3";
    case O_BATCH:
    case O_ACCUM: return "it takes a whole number in 1..16777216";
    case O_FLOPS: return "it takes a count > 0, with K, M, G or T: 4.2M";
    case O_MODEL: return "it takes linear, mlp, cnn or gpt";
    case O_WIDTH:
    case O_HEADS:
    case O_CONTEXT: return "it takes a whole number (K, M allowed)";
    case O_HOSTS: return "it takes a whole number of hosts in 1..1048576";
    case O_PER_HOST: return "it takes a whole number of ranks per host in 1..65536";
    case O_NET_BW: return "it takes a rate > 0 whose unit says bits or bytes: 10Gbps, 1.25GB/s";
    case O_NET_LAT: return "it takes a time >= 0 with its unit: 20us, 1.5ms";
    case O_HIDDEN: return "it takes up to 16 comma-separated widths, each a whole number in 1..1048576 (512,256)";
    case O_COMPUTE: return "it takes GFLOP/s > 0 (a bare number), or a rate with its unit: 100, 1.5TFLOPS";
    case O_BW: return "it takes a rate > 0 whose unit says bits or bytes: 25Gbps, 10GB/s, 800MiB/s";
    case O_LAT: return "it takes a time >= 0 with its unit: 5us, 1.5ms, 100ns, 2s";
    case O_ALGO: {
        static char takes[320];
        char names[256];
        tally__algo_names(names, sizeof names, TALLY__ALGO_WITH_HIER | TALLY__ALGO_ALLREDUCE_ONLY, ", ", ", ");
        snprintf(takes, sizeof takes, "it takes %s (with --hosts) or all", names);
        return takes;
    }
    case O_BUCKET: return "it takes a number of MiB > 0 (K, M, G, T allowed)";
    case O_SVG: return "it takes a file to write";
    case O_LOCAL: return "it takes a whole number of steps in 1..524288";
    case O_OUTER_COMPRESS: return "it takes none, fp16 or int8";
    default: return "see tally plan --help";
    }
}

static int plan_flag(int ch, const char *flag, const char *a, void *ctx) {
    if (ch == O_SIM) return tally__sim_cluster_set(&((plan_opts *)ctx)->cfg.sim, flag + 2, a);
    if (!plan_parse_one(ch, a, ctx)) return 0;
    return tally__parse_fail(flag, a, "is not accepted", plan_accepts(ch));
}

/* Combinations that cannot mean anything: say which and return -1. */
static int plan_check(plan_opts *o) {
    const char *why = NULL;
    tally__plan_cfg *c = &o->cfg;
    if ((c->hosts > 0) != (c->per_host > 0))
        why = "--hosts and --ranks-per-host go together";
    else if (c->hosts > 0 && o->have_workers && c->workers != c->hosts * c->per_host)
        why = "--workers must be --hosts x --ranks-per-host (or left out)";
    else if (c->hosts > 0 && (double)c->hosts * c->per_host > (1 << 24))
        why = "--hosts x --ranks-per-host is more than 16777216 ranks";
    else if (c->outer_ratio > 0 && !c->local_steps)
        why = "--outer-compress needs --local-steps H";
    else if (c->hosts == 0 && c->algo == TALLY__ALGO_HIER)
        why = "--algo hier needs --hosts and --ranks-per-host";
    else if (c->hosts == 0 && c->sim.fabric == TALLY__SIM_FAT_TREE)
        why = "--fabric fat-tree needs --hosts and --ranks-per-host";
    for (int i = 0; !why && i < c->sim.nslow; i++)
        if (c->sim.slow[i].rank >= (c->hosts > 0 ? c->hosts * c->per_host : c->workers))
            why = "--slow names a rank past the world (ranks are 0 .. N-1)";
    if (!why && c->hosts > 0 && !o->have_workers) c->workers = c->hosts * c->per_host, o->have_workers = 1;
    if (why)
        ;
    else if (!o->have_workers)
        why = "--workers N (or --hosts and --ranks-per-host) is required";
    else if (o->model < 0 && !o->have_params)
        why = "--params P (or --model) is required";
    else if (o->model >= 0 && o->have_params)
        why = "give --params or --model, not both";
    else if (o->model >= 0 && o->have_flops)
        why = "give --flops-per-sample or --model, not both";
    else if (o->model >= 0 && o->layers && o->model != TALLY__MODEL_GPT)
        why = "--layers comes from --model (but for --model gpt, where it is the blocks)";
    else if ((o->mcfg.embd || o->mcfg.heads || o->mcfg.in_dim) && o->model != TALLY__MODEL_GPT)
        why = "--width, --heads and --context need --model gpt";
    else if (o->mcfg.nhidden && o->model >= 0 && !tally__model_info_of(o->model)->takes_hidden)
        why = "--hidden needs --model mlp";
    if (why) tally_flags_usage_error("plan", "%s", why);
    return why ? -1 : 0;
}

/* 0 to run, 1 for --help (printed), 2 after a message about a bad flag or combination. */
static int plan_parse(int argc, char **argv, plan_opts *o) {
    memset(o, 0, sizeof *o);
    tally__plan_cfg_default(&o->cfg);
    o->model = -1;
    o->calibrate_op = TALLY_AVG;
    o->show_all = 1;
    const tally_flags f = {
        .cmd = "plan", .shorts = "n:h", .longs = plan_longs, .first = 1, .one = plan_flag, .usage = plan_usage};
    int rc = tally_flags_parse(&f, argc, argv, o);
    if (rc || o->calibrate_rank) return rc;
    return plan_check(o) ? 2 : 0;
}

/* ---- the model ---- */

/* tally train's models on its default data: 28x28 images in 10 classes, the least-squares set of 8
 * features that a model needing it trains on, or byte tokens (vocabulary 256, the --context given). */
static void plan_model_cfg(plan_opts *o) {
    tally__model_cfg *m = &o->mcfg;
    m->kind = (tally__model_kind)o->model;
    const tally__model_info *info = tally__model_info_of(m->kind);
    if (info->data == TALLY__DATA_TOKENS) {
        m->layers = o->layers;
        m->outputs = 256;
        if (info->defaults) info->defaults(m);
        return;
    }
    int lsq = info->data == TALLY__DATA_LEAST_SQUARES;
    m->in_dim = lsq ? TALLY__TRAIN_LINEAR_FEATURES : 784;
    m->channels = 1;
    m->height = m->width = 28;
    m->outputs = lsq ? 1 : 10;
    if (info->defaults) info->defaults(m);
}

/* P, the layers, FLOPs/sample and activations: from --model, or from --params/--layers. */
static int plan_fill(plan_opts *o) {
    tally__plan_cfg *c = &o->cfg;
    if (o->model >= 0) {
        plan_model_cfg(o);
        if (tally__model_describe(&o->mcfg, c->batch, &o->desc)) {
            fprintf(stderr, "tally plan: %s\n", tally_last_error());
            return -1;
        }
        c->params = o->desc.nparams;
        c->nlayers = o->desc.nlayers;
        c->largest = o->desc.largest_layer;
        c->tied = o->desc.tied_floats;
        c->flops_per_sample = o->desc.flops_per_sample;
        c->activation_bytes = (double)o->desc.activation_bytes;
        return 0;
    }
    c->nlayers = o->layers;
    c->largest = o->layers ? tally__plan_shard(c->params, o->layers) : 0;
    if (!o->have_flops) c->flops_per_sample = 6.0 * (double)c->params; /* 2 forward + 4 backward per weight */
    return 0;
}

/* ---- --calibrate ---- */

/* The seals the memory file for the ranks' results carries: a descriptor without them is not that file
 * (a regular file, another memory file, or the launcher's /dev/null on 0..2). */
#define CALIB_SEALS (F_SEAL_SHRINK | F_SEAL_SEAL)

/* Descriptor `fd_arg` as the memory file tally plan made for its ranks: the descriptor, or -1 said. */
static int calibrate_rank_fd(const char *fd_arg) {
    char *end;
    errno = 0;
    long fd = strtol(fd_arg, &end, 10);
    struct stat st;
    if (end != fd_arg && !*end && !errno && fd >= 3 && fd <= INT_MAX && fstat((int)fd, &st) == 0 &&
        S_ISREG(st.st_mode) && fcntl((int)fd, F_GET_SEALS) == CALIB_SEALS)
        return (int)fd;
    fprintf(stderr,
            "tally plan: calibrate: --calibrate-rank %s is not the memory file tally plan --calibrate made for "
            "its ranks (the flag is for those ranks alone: run tally plan --calibrate)\n",
            fd_arg);
    return -1;
}

/* Hidden mode: one of the 2 ranks tally_launch started; the communicator measures its links at init,
 * then the ranks time one allreduce of the plan's gradients; rank 0 writes what it found into descriptor
 * `fd_arg`, the memory file its parent made and it inherited (no name anyone else could swap). */
static int plan_calibrate_rank(const char *fd_arg, double bytes, tally_op op) {
    int fd = calibrate_rank_fd(fd_arg);
    if (fd < 0) return 1;
    tally_comm *comm;
    if (tally_comm_init(&comm)) {
        fprintf(stderr, "tally plan: calibrate: %s\n", tally_last_error());
        return 1;
    }
    double ar = bytes > 0 ? tally__plan_time_allreduce(comm, bytes, op) : 0;
    int rc = 0;
    if (tally_comm_rank(comm) == 0) {
        const tally__cost *m = tally__comm_cost(comm);
        char line[128];
        int n = snprintf(line, sizeof line, "%.9e %.9e %.9e %.9e\n", m->alpha, m->beta, m->gamma, ar);
        ssize_t w = pwrite(fd, line, (size_t)n, 0);
        rc = w != n;
        if (rc)
            fprintf(stderr, "tally plan: calibrate: cannot hand the results over: %s\n",
                    w < 0 ? strerror(errno) : "short write");
    }
    tally_comm_free(comm);
    return rc;
}

/* The memory file for the ranks' results, sealed as they check (CALIB_SEALS), on a descriptor of 3 or more
 * that they inherit: memfd_create takes the lowest free one, which is 0, 1 or 2 when tally was started
 * with one closed, and a rank's launcher puts /dev/null and its pipes there. The descriptor, or -1 said. */
static int calibrate_memfd(void) {
    int fd = memfd_create("tally-plan-calibrate", MFD_ALLOW_SEALING); /* no MFD_CLOEXEC: the ranks inherit it */
    int high = fd < 0 || fcntl(fd, F_ADD_SEALS, CALIB_SEALS) ? -1 : fcntl(fd, F_DUPFD, 3); /* F_DUPFD: inherited */
    int e = errno;
    if (fd >= 0) close(fd);
    if (high < 0)
        fprintf(stderr, "tally plan: calibrate: cannot make a memory file for the ranks' results: %s\n", strerror(e));
    return high;
}

/* The ranks' results come back through a memory file (memfd) their parent made and they inherit: opened
 * once, used by its descriptor, named nowhere, so nothing in TMPDIR can be swapped for it. */
int tally_plan_calibrate_link(const char *transport, double bytes, tally_op op, tally__cost *out, double *allreduce_s) {
    *out = (tally__cost){0}; /* the file has alpha, beta and gamma: the rest (share) must not be stack garbage */
    int fd = calibrate_memfd();
    if (fd < 0) return -1;
    char fd_arg[16], size[32];
    snprintf(fd_arg, sizeof fd_arg, "%d", fd);
    snprintf(size, sizeof size, "%.0f", bytes);
    char *argv[] = {
        "/proc/self/exe",          "plan", "--calibrate-rank", fd_arg, "--calibrate-bytes", size, "--calibrate-op",
        (char *)tally_op_name(op), NULL};
    tally_launch_opts lo = {.n = 2, .transport = transport, .timeout_s = 60, .name = "tally plan"};
    int rc = tally_launch(&lo, argv);
    char got[256];
    ssize_t n = rc ? -1 : pread(fd, got, sizeof got - 1, 0);
    got[n > 0 ? n : 0] = '\0';
    close(fd);
    if (rc || sscanf(got, "%lf %lf %lf %lf", &out->alpha, &out->beta, &out->gamma, allreduce_s) != 4) {
        fprintf(stderr, "tally plan: calibrate: measuring the %s link failed\n", transport);
        return -1;
    }
    return 0;
}

/* Links first (two ranks of this binary each): tally_launch wants a process without threads, and BLAS
 * may start some; then the library's measurements of compute and the update. */
static int plan_calibrate(plan_opts *o, tally__plan_calib *k) {
    memset(k, 0, sizeof *k);
    double S = tally__plan_grad_bytes(&o->cfg);
    if (tally_plan_calibrate_link("shm", S, TALLY_AVG, &k->shm, &k->shm_allreduce_s) ||
        tally_plan_calibrate_link("tcp", S, TALLY_AVG, &k->tcp, &k->tcp_allreduce_s))
        return -1;
    if (tally__plan_calibrate(&o->cfg, o->model >= 0 ? &o->mcfg : NULL, k)) {
        fprintf(stderr, "tally plan: calibrate: %s\n", tally_last_error());
        return -1;
    }
    return 0;
}

int tally_cmd_plan(int argc, char **argv) {
    plan_opts o;
    int prc = plan_parse(argc, argv, &o);
    if (prc) return prc == 1 ? 0 : 2;
    if (o.calibrate_rank) return plan_calibrate_rank(o.calibrate_rank, o.calibrate_bytes, o.calibrate_op);
    if (plan_fill(&o)) return 1;
    tally__plan_calib k;
    o.flops_source = "--compute";
    o.link_source = "--latency, --bandwidth; gamma assumed";
    if (o.calibrate) {
        if (plan_calibrate(&o, &k)) return 1;
        o.flops_source = o.model >= 0 ? "calibrated: the model's layers, timed" : "calibrated: single-thread sgemm";
        o.link_source = k.used[0] == 's' ? "calibrated: shm" : "calibrated: tcp";
    }
    if (o.json)
        tally__plan_print_json(&o, o.calibrate ? &k : NULL);
    else
        tally__plan_print_text(&o, o.calibrate ? &k : NULL);
    return o.svg ? tally__plan_print_chart(&o) : 0;
}
