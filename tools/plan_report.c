/* plan_report.c - `tally plan`'s output: the text report and the JSON, from the options and the plan
 * cmd_plan.c filled (formatting only; the figures are the planner's). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tally.h>
#include <tally/optim.h>

#include "../src/core/sig.h"
#include "../src/nn/model.h"
#include "../src/plan/calibrate.h"
#include "../src/core/units.h"
#include "../src/plan/plan.h"
#include "../src/train/local_sgd.h"
#include "charts/plan_chart.h"
#include "plan_report.h"

/* ---- text output ---- */

static const char *fmt_bytes(double b, char *buf) {
    static const char *const units[] = {"B", "KB", "MB", "GB", "TB", "PB"};
    int u = 0;
    while (b >= 999.95 && u < 5) b /= 1000, u++;
    snprintf(buf, 24, u ? "%.1f %s" : "%.0f %s", b, units[u]);
    return buf;
}

static const char *fmt_time(double s, char *buf) {
    if (s == 0)
        snprintf(buf, 24, "0");
    else if (s < 1e-3)
        snprintf(buf, 24, "%.2f us", s * 1e6);
    else if (s < 1)
        snprintf(buf, 24, "%.3f ms", s * 1e3);
    else
        snprintf(buf, 24, "%.3f s", s);
    return buf;
}

static const char *fmt_count(double v, char *buf) {
    static const char *const units[] = {"", " K", " M", " G", " T"};
    int u = 0;
    while (v >= 999.5 && u < 4) v /= 1000, u++;
    snprintf(buf, 24, u ? "%.2f%s" : "%.0f%s", v, units[u]);
    return buf;
}

static const char *optim_name(int optimizer) { return optimizer == TALLY_OPTIM_ADAMW ? "adam" : "sgd"; }

static void print_header(const plan_opts *o) {
    const tally__plan_cfg *c = &o->cfg;
    char b1[24], b2[24], b3[24];
    printf("tally plan: %llu parameters (%s), %d workers, %s, %s, ZeRO stage %d, batch %d x accum %d per rank\n",
           c->params, fmt_count((double)c->params, b1), c->workers, optim_name(c->optimizer),
           c->precision == TALLY__PLAN_MIXED ? "mixed precision" : "fp32", c->zero, c->batch, c->accum);
    if (o->model >= 0) {
        char arch[128];
        tally__model_arch(&o->mcfg, arch, sizeof arch);
        printf("  model %s %s: %d layers, largest %zu parameters, %s FLOP/sample, activations %s at batch %d\n",
               tally__model_name((tally__model_kind)o->model), arch, o->desc.nlayers, o->desc.largest_layer,
               fmt_count(c->flops_per_sample, b1), fmt_bytes(c->activation_bytes, b2), c->batch);
        if (tally__model_info_of((tally__model_kind)o->model)->data == TALLY__DATA_TOKENS)
            printf("  a sample is %d tokens: %s FLOP/token (6 x parameters + attention, 12 x layers x context x "
                   "width)\n",
                   o->mcfg.in_dim, fmt_count(c->flops_per_sample / o->mcfg.in_dim, b3));
    } else {
        printf("  %s FLOP/sample (%s); %s\n", fmt_count(c->flops_per_sample, b1),
               o->have_flops ? "--flops-per-sample" : "6P: 2 forward + 4 backward per parameter",
               o->layers ? "layers of equal size"
               : c->precision == TALLY__PLAN_FP32
                   ? "largest layer unknown (--layers): ZeRO 2-3 layer buffers left out"
                   : "layers unknown (--layers): ZeRO 2-3 collectives on the whole vector");
    }
    printf("  links (%s): alpha %s, beta 1/(%s/s), gamma 1/(%s/s) reduced; compute %.1f GFLOP/s per rank (%s)\n",
           o->link_source, fmt_time(c->cost.alpha, b1), fmt_bytes(1 / c->cost.beta, b2),
           fmt_bytes(1 / c->cost.gamma, b3), c->gflops, o->flops_source);
    if (c->hosts > 0)
        printf("  layout: %d hosts x %d ranks; those links inside a host, between hosts (--net-latency, "
               "--net-bandwidth) alpha %s, beta 1/(%s/s); flat algorithms across hosts take the slower of the two\n",
               c->hosts, c->per_host, fmt_time(c->net.alpha, b1), fmt_bytes(1 / c->net.beta, b2));
}

/* One link's figures, and its measured allreduce of S beside what the model says of it. */
static void print_link(const char *name, const tally__cost *m, double ping_beta, double measured, double S) {
    char a[24], b[24], p[24], g[24], t1[24], sz[24];
    printf("  %-9s alpha %s (ping-pong), beta 1/(%s/s) fitted to a real allreduce of %s on 2 ranks (%s)\n"
           "            [ping-pong beta 1/(%s/s)], gamma 1/(%s/s)\n",
           name, fmt_time(m->alpha, a), fmt_bytes(1 / m->beta, b), fmt_bytes(S, sz), fmt_time(measured, t1),
           fmt_bytes(1 / ping_beta, p), fmt_bytes(1 / m->gamma, g));
}

static void print_calib(const plan_opts *o, const tally__plan_calib *k) {
    printf("\ncalibration (this machine):\n");
    if (k->model_gflops > 0)
        printf("  compute   %.1f GFLOP/s: the model's forward + backward at batch %d, timed on one BLAS thread\n"
               "            (%.2f of the single-thread sgemm peak, %.1f GFLOP/s)\n",
               k->model_gflops, o->cfg.batch, k->model_gflops / k->sgemm_gflops, k->sgemm_gflops);
    else
        printf("  compute   %.1f GFLOP/s: single-thread sgemm peak, used as is (real layers reach less: see MFU\n"
               "            in tally train's summary; --model times the layers themselves)\n",
               k->sgemm_gflops);
    printf("  update    %.3f ns per parameter (optimizer step + clearing the gradients, timed%s)\n",
           k->update_s_per_param * 1e9, k->model_gflops > 0 ? " after backward" : "");
    double S = tally__plan_grad_bytes(&o->cfg);
    print_link("shm", &k->shm, k->shm_ping_beta, k->shm_allreduce_s, S);
    print_link("tcp", &k->tcp, k->tcp_ping_beta, k->tcp_allreduce_s, S);
    printf("  using %s's figures: N = %d is %s the %ld CPUs of this host\n", k->used, o->cfg.workers,
           k->used[0] == 's' ? "within" : "more than", k->cpus);
}

static void print_memory(const plan_opts *o) {
    const tally__plan_cfg *c = &o->cfg;
    char b[8][24];
    printf("\nmemory per rank (GB = 1e9 bytes; %s)\n",
           c->precision == TALLY__PLAN_MIXED
               ? (c->optimizer == TALLY_OPTIM_ADAMW
                      ? "mixed: fp16 params and grads, 12 bytes/param of fp32 master + m + v"
                      : "mixed: fp16 params and grads, 8 bytes/param of fp32 master + momentum")
               : (c->optimizer == TALLY_OPTIM_ADAMW ? "fp32, as tally train: Adam keeps m and v, 8 bytes/param"
                                                    : "fp32, as tally train: SGD momentum, 4 bytes/param"));
    printf("  %-4s %11s %11s %11s %11s %11s %11s %11s\n", "zero", "params", "grads", "optimizer", "buffers", "state",
           "activations", "total");
    for (int z = 0; z <= 3; z++) {
        tally__plan_mem m = tally__plan_memory(c, z, c->workers);
        printf("  %-4d %11s %11s %11s %11s %11s %11s %11s%s\n", z, fmt_bytes(m.params, b[0]), fmt_bytes(m.grads, b[1]),
               fmt_bytes(m.optim, b[2]), fmt_bytes(m.buffers, b[3]), fmt_bytes(m.state, b[4]),
               o->model >= 0 ? fmt_bytes(m.activations, b[5]) : "-", fmt_bytes(m.total, b[6]),
               z == c->zero ? "  <-" : "");
    }
    printf("  state = params + grads + optimizer + buffers (stage 2: a layer's gradients staged; stage 3:\n"
           "  a gathered layer, then its gradients; two, as tally train overlaps); shards are ceil(P/N)%s\n",
           o->model >= 0 ? "; activations: what tally train allocates at this batch" : "");
}

static void print_algos(const plan_opts *o) {
    const tally__plan_cfg *c = &o->cfg;
    int n = c->workers;
    double S = tally__plan_grad_bytes(c);
    char b[4][24];
    printf("\ncommunication per step: allreduce of S = %s of gradients over N = %d\n", fmt_bytes(S, b[0]), n);
    printf("  %-7s %10s %12s %12s %12s\n", "algo", "rounds", "bytes/rank", "sent/rank", "time");
    for (int a = tally__algo_next(TALLY__ALGO_AUTO); a >= 0; a = tally__algo_next(a)) {
        if ((!o->show_all && a != c->algo) || (a == TALLY__ALGO_HIER && !tally__plan_has_levels(c, n))) continue;
        if (!tally__plan_weighs(a)) continue;
        tally__plan_comm r = tally__plan_allreduce_on(c, a, n, S);
        printf("  %-7s %10.0f %12s %12s %12s\n", tally__algo_name(a), r.rounds, fmt_bytes(r.bytes, b[0]),
               r.sent >= 0 ? fmt_bytes(r.sent, b[1]) : "-", fmt_time(r.seconds, b[2]));
    }
    printf("  rounds, bytes/rank: messages and bytes in sequence at the busiest rank, the alpha and beta terms\n"
           "  of the library's cost model (ring 2(N-1), 2S(N-1)/N; direct: the root receives, then sends,\n"
           "  2(N-1)S); sent/rank: what that rank sends as the code does (tally train's \"bytes sent\");\n"
           "  time: alpha-beta-gamma.%s\n",
           tally__plan_has_levels(c, n) ? " hier: reduce-scatter in each host, the shard's allreduce between\n"
                                          "  hosts, all-gather in each host, each level's cheapest algorithm"
                                        : "");
}

static const char *const zero_what[4] = {"allreduce in buckets, overlapped with backward",
                                         "reduce-scatter + all-gather per layer, once a step",
                                         "reduce-scatter per layer each micro-batch, all-gather once",
                                         "all-gather per layer for forward and backward, reduce-scatter"};

static void print_zero_comm(const plan_opts *o) {
    const tally__plan_cfg *c = &o->cfg;
    char b[3][24];
    printf("\ncommunication per step by ZeRO stage (%s):\n",
           c->algo == TALLY__ALGO_AUTO ? "each collective by the cheapest algorithm, as the library picks"
                                       : tally__algo_name(c->algo));
    printf("  %-4s %10s %12s %12s  %s\n", "zero", "rounds", "bytes/rank", "time", "collectives");
    for (int z = 0; z <= 3; z++) {
        tally__plan_comm r = tally__plan_step_comm(c, z, c->algo, c->workers);
        printf("  %-4d %10.0f %12s %12s  %s\n", z, r.rounds, fmt_bytes(r.bytes, b[0]), fmt_time(r.seconds, b[1]),
               zero_what[z]);
    }
}

static const char *const sim_method[] = {"auto", "event level", "fast path"};

/* What the simulator makes of a layout the closed forms cannot answer, and which it used. */
static void print_simulated(const plan_opts *o, const tally__plan_step *s) {
    const tally__plan_cfg *c = &o->cfg;
    char why[128], b[2][24];
    if (!tally__plan_needs_sim(c, c->workers, why, sizeof why)) {
        printf("  (closed forms: a layout they answer; tally sim plays the rest)\n");
        return;
    }
    tally__plan_simulated r;
    if (tally__plan_simulate(c, c->workers, s, &r)) {
        printf("  T simulated    %12s  tally sim could not play it: %s\n", "-", tally_last_error());
        return;
    }
    printf("  T simulated    %12s  tally sim (%s, %s for the largest collective): %s, which the\n"
           "                              closed forms above do not see; communication %s exposed\n",
           fmt_time(r.step_s, b[0]), sim_method[r.method], tally__algo_name(r.algo), why,
           fmt_time(r.exposed_s > 0 ? r.exposed_s : 0, b[1]));
    printf("                              = %.*f samples/s", r.samples_per_s < 100 ? 2 : 0, r.samples_per_s);
    if (r.pace_rank >= 0) printf("; rank %d set the pace in %.0f%% of the steps", r.pace_rank, 100 * r.pace_share);
    printf("\n");
}

static void print_step(const plan_opts *o, const tally__plan_step *s) {
    const tally__plan_cfg *c = &o->cfg;
    char b[4][24];
    printf("\nstep time on each of N = %d ranks (ZeRO %d, %s%s), %d x %d samples per rank:\n", c->workers, c->zero,
           tally__algo_name(s->algo), c->algo == TALLY__ALGO_AUTO ? ": the cheapest" : "", c->batch, c->accum);
    printf("  compute        %12s  %s FLOP/sample x %d x %d at %.1f GFLOP/s (forward 1/3, backward 2/3)\n",
           fmt_time(s->compute, b[0]), fmt_count(c->flops_per_sample, b[1]), c->batch, c->accum, c->gflops);
    printf("  update         %12s  the optimizer over %s parameters (%s)\n", fmt_time(s->update, b[0]),
           fmt_count((double)(c->zero ? tally__plan_shard(c->params, c->workers) : c->params), b[1]),
           c->update_s_per_param > 0 ? "measured rate" : "its memory traffic at 3/gamma bytes/s");
    printf("  comm           %12s", fmt_time(s->comm, b[0]));
    if (c->zero == 0)
        printf("  %d bucket%s of <= %s\n", s->buckets, s->buckets == 1 ? "" : "s", fmt_bytes(c->bucket_bytes, b[1]));
    else
        printf("  in line: ZeRO's collectives run inside the passes and the step\n");
    printf("  T no overlap   %12s  compute + comm + update\n", fmt_time(s->t_sum, b[0]));
    printf("  T full overlap %12s  compute - backward + max(backward, comm) + update: communication can only\n"
           "                              hide behind backward (2/3 of the FLOPs) of the step's last micro-batch\n",
           fmt_time(s->t_max, b[0]));
    printf("  T predicted    %12s  %s\n", fmt_time(s->t_pred, b[0]),
           c->zero ? "no overlap" : "as the engine overlaps: all buckets but the last, which waits for backward");
    printf("                              = %.*f samples/s over %d rank%s\n", s->samples_per_s < 100 ? 2 : 0,
           s->samples_per_s, c->workers, c->workers == 1 ? "" : "s");
    print_simulated(o, s);
}

/* The same plan at accum 1, to show what accumulating changes: compute x K; communication once per
 * step at stages 0-1, every micro-batch at stages 2-3 (gradients are sharded as backward makes them). */
static void print_accum(const plan_opts *o, const tally__plan_step *s) {
    tally__plan_cfg one = o->cfg;
    one.accum = 1;
    tally__plan_step s1 = tally__plan_step_time(&one, o->cfg.workers);
    printf("  --accum %d: compute x %d, %s: communication %.1f%% of T no overlap\n"
           "              (%.1f%% at accum 1), %.6g samples/s (%.6g at accum 1)\n",
           o->cfg.accum, o->cfg.accum,
           o->cfg.zero >= 2 ? "ZeRO 2-3 still reduce-scatter every micro-batch" : "gradients reduced once per step",
           s->t_sum > 0 ? 100 * s->comm / s->t_sum : 0, s1.t_sum > 0 ? 100 * s1.comm / s1.t_sum : 0, s->samples_per_s,
           s1.samples_per_s);
}

/* n = 1, 2, 4, ... and N itself. */
static int next_n(int n, int N) { return n >= N ? N + 1 : (2 * n > N ? N : 2 * n); }

static void print_scaling(const plan_opts *o, const tally__plan_step *s) {
    const tally__plan_cfg *c = &o->cfg;
    double P = tally__plan_parallel_fraction(s), ceil_s = tally__plan_ceiling(P);
    char b[2][24];
    printf("\nscaling (Amdahl): P = N c / (N c + s) = %.4f at N = %d, where c = %s of work per rank that splits\n"
           "  across ranks (forward + backward%s) and s = %s that does not (exposed communication%s);\n"
           "  S(n) = 1 / ((1-P) + P/n), ceiling 1/(1-P) = ",
           P, c->workers, fmt_time(s->parallel, b[0]), c->zero ? ", the sharded update" : "", fmt_time(s->serial, b[1]),
           c->zero ? "" : ", the update every rank repeats");
    if (isfinite(ceil_s))
        printf("%.1fx\n", ceil_s);
    else
        printf("unbounded\n");
    printf("  %8s %12s %18s %16s\n", "n", "Amdahl S(n)", "samples/s (model)", "speed-up (model)");
    double base = tally__plan_step_time(c, 1).samples_per_s;
    for (int n = 1; n <= c->workers; n = next_n(n, c->workers)) {
        tally__plan_step sn = tally__plan_step_time(c, n);
        printf("  %8d %12.2f %18.*f %16.2f\n", n, tally__plan_amdahl(P, n), sn.samples_per_s < 100 ? 2 : 0,
               sn.samples_per_s, base > 0 ? sn.samples_per_s / base : 0);
    }
    printf("  samples/s (model): n x batch x accum / T predicted at n ranks, straight from the model\n");
}

/* ---- communication modes: sync against local SGD ---- */

/* The rows: H = 4, 16, 64 in f32, H = 16 in int8, and --local-steps' own when it is none of those. */
#define PLAN_MODES 6
static int mode_rows(const tally__plan_cfg *c, int *H, double *ratio) {
    int n = 0;
    const int hs[] = {4, 16, 64, 16};
    const double rs[] = {1, 1, 1, 0.25};
    double mine = c->outer_ratio > 0 ? c->outer_ratio : 1;
    int seen = 0;
    for (int i = 0; i < 4; i++) {
        H[n] = hs[i], ratio[n++] = rs[i];
        seen |= c->local_steps == hs[i] && mine == rs[i];
    }
    if (c->local_steps > 0 && !seen) H[n] = c->local_steps, ratio[n++] = mine;
    return n;
}

static void print_modes(const plan_opts *o, const tally__plan_step *s) {
    const tally__plan_cfg *c = &o->cfg;
    int H[PLAN_MODES];
    double ratio[PLAN_MODES];
    int n = mode_rows(c, H, ratio);
    char b[3][24];
    double sync_sent = tally__plan_step_comm(c, c->zero, c->algo, c->workers).sent;
    printf("\ncommunication modes on N = %d ranks (speed only; averaging less often costs loss per step):\n",
           c->workers);
    printf("  %-28s %16s %12s %11s %12s %8s\n", "mode", "bytes/step/rank", "T step", "comm share", "samples/s",
           "vs sync");
    printf("  %-28s %16s %12s %10.1f%% %12.*f %8s\n", c->zero ? "sync (ZeRO)" : "sync, every step",
           sync_sent >= 0 ? fmt_bytes(sync_sent, b[0]) : "-", fmt_time(s->t_pred, b[1]),
           100 * tally__plan_sync_comm_share(s), s->samples_per_s < 100 ? 2 : 0, s->samples_per_s, "1.00x");
    for (int i = 0; i < n; i++) {
        tally__plan_local l = tally__plan_local_step(c, c->workers, H[i], ratio[i]);
        char name[48];
        snprintf(name, sizeof name, "local SGD, H = %d, %s", H[i], tally__outer_ratio_name(ratio[i]));
        printf("  %-28s %16s %12s %10.1f%% %12.*f %7.2fx\n", name, fmt_bytes(l.bytes_per_step, b[0]),
               fmt_time(l.t_step, b[1]), 100 * l.comm_share, l.samples_per_s < 100 ? 2 : 0, l.samples_per_s,
               s->samples_per_s > 0 ? l.samples_per_s / s->samples_per_s : 0);
    }
    tally__plan_local p = tally__plan_pick_mode(c, c->workers);
    if (!p.H)
        printf("  pick: sync: communication is %.1f%% of its step (at most %.0f%%), so averaging less often would buy "
               "little\n",
               100 * tally__plan_sync_comm_share(s), 100 * TALLY__PLAN_COMM_SHARE_OK);
    else
        printf("  pick: local SGD (tally train --local-steps %d%s): sync's step is %.1f%% communication; there\n"
               "        averaging is %.1f%% of a step, %.2fx sync's samples/s\n",
               p.H, p.ratio == 0.25 ? " --outer-compress int8" : "", 100 * tally__plan_sync_comm_share(s),
               100 * p.comm_share, s->samples_per_s > 0 ? p.samples_per_s / s->samples_per_s : 0);
}

void tally__plan_print_text(const plan_opts *o, const tally__plan_calib *k) {
    print_header(o);
    if (k) print_calib(o, k);
    print_memory(o);
    print_algos(o);
    print_zero_comm(o);
    tally__plan_step s = tally__plan_step_time(&o->cfg, o->cfg.workers);
    print_step(o, &s);
    print_accum(o, &s);
    print_scaling(o, &s);
    print_modes(o, &s);
}

/* ---- JSON ---- */

static void json_num(const char *key, double v, const char *sep) {
    if (isfinite(v))
        printf("\"%s\": %.10g%s", key, v, sep);
    else
        printf("\"%s\": null%s", key, sep);
}

static void json_local(const char *mode, const tally__plan_local *l, const char *sep) {
    printf("    {\"mode\": \"%s\", \"local_steps\": %d, \"outer_compress\": \"%s\", ", mode, l->H,
           l->H ? tally__outer_ratio_name(l->ratio) : "none");
    json_num("bytes_per_step", l->bytes_per_step, ", ");
    json_num("step_s", l->t_step, ", ");
    json_num("comm_share", l->comm_share, ", ");
    json_num("samples_per_s", l->samples_per_s, "}");
    printf("%s\n", sep);
}

static void json_modes(const tally__plan_cfg *c, const tally__plan_step *s) {
    int H[PLAN_MODES];
    double ratio[PLAN_MODES];
    int n = mode_rows(c, H, ratio);
    tally__plan_local sync = {.bytes_per_step = tally__plan_step_comm(c, c->zero, c->algo, c->workers).sent,
                              .t_step = s->t_pred,
                              .comm_share = tally__plan_sync_comm_share(s),
                              .samples_per_s = s->samples_per_s};
    printf(",\n  \"modes\": [\n");
    json_local("sync", &sync, ",");
    for (int i = 0; i < n; i++) {
        tally__plan_local l = tally__plan_local_step(c, c->workers, H[i], ratio[i]);
        json_local("local", &l, i + 1 < n ? "," : "");
    }
    tally__plan_local p = tally__plan_pick_mode(c, c->workers);
    if (!p.H) p = sync;
    printf("  ],\n  \"pick\":\n");
    json_local(p.H ? "local" : "sync", &p, "");
}

static void json_memory(const tally__plan_cfg *c) {
    printf("  \"memory\": [\n");
    for (int z = 0; z <= 3; z++) {
        tally__plan_mem m = tally__plan_memory(c, z, c->workers);
        printf("    {\"zero\": %d, ", z);
        json_num("params", m.params, ", ");
        json_num("grads", m.grads, ", ");
        json_num("optimizer", m.optim, ", ");
        json_num("buffers", m.buffers, ", ");
        json_num("state", m.state, ", ");
        json_num("activations", m.activations, ", ");
        json_num("total", m.total, "}");
        printf("%s\n", z < 3 ? "," : "");
    }
    printf("  ],\n");
}

static void json_comm(const plan_opts *o) {
    const tally__plan_cfg *c = &o->cfg;
    double S = tally__plan_grad_bytes(c);
    printf("  \"comm\": {");
    json_num("gradient_bytes", S, ", \"algorithms\": [\n");
    int first = 1;
    for (int a = tally__algo_next(TALLY__ALGO_AUTO); a >= 0; a = tally__algo_next(a)) {
        if ((!o->show_all && a != c->algo) || (a == TALLY__ALGO_HIER && !tally__plan_has_levels(c, c->workers)))
            continue;
        if (!tally__plan_weighs(a)) continue;
        tally__plan_comm r = tally__plan_allreduce_on(c, a, c->workers, S);
        printf("%s    {\"algo\": \"%s\", ", first ? "" : ",\n", tally__algo_name(a));
        json_num("rounds", r.rounds, ", ");
        json_num("bytes", r.bytes, ", ");
        json_num("sent", r.sent >= 0 ? r.sent : NAN, ", "); /* null: not computed (hier) */
        json_num("seconds", r.seconds, "}");
        first = 0;
    }
    printf("\n  ], \"zero\": [\n");
    for (int z = 0; z <= 3; z++) {
        tally__plan_comm r = tally__plan_step_comm(c, z, c->algo, c->workers);
        printf("    {\"zero\": %d, ", z);
        json_num("rounds", r.rounds, ", ");
        json_num("bytes", r.bytes, ", ");
        json_num("seconds", r.seconds, "}");
        printf("%s\n", z < 3 ? "," : "");
    }
    printf("  ]},\n");
}

static void json_step(const tally__plan_step *s) {
    printf("  \"step\": {\"algo\": \"%s\", ", tally__algo_name(s->algo));
    json_num("compute_s", s->compute, ", ");
    json_num("forward_s", s->forward, ", ");
    json_num("backward_s", s->backward, ", ");
    json_num("update_s", s->update, ", ");
    json_num("comm_s", s->comm, ", ");
    json_num("t_sum_s", s->t_sum, ", ");
    json_num("t_max_s", s->t_max, ", ");
    json_num("t_pred_s", s->t_pred, ", ");
    json_num("samples_per_s", s->samples_per_s, "},\n");
}

static void json_simulated(const tally__plan_cfg *c, const tally__plan_step *s) {
    char why[128];
    tally__plan_simulated r;
    if (!tally__plan_needs_sim(c, c->workers, why, sizeof why) || tally__plan_simulate(c, c->workers, s, &r)) {
        printf("  \"simulated\": null,\n");
        return;
    }
    printf("  \"simulated\": {\"why\": \"%s\", \"method\": \"%s\", \"algo\": \"%s\", \"pace_rank\": %d, ", why,
           r.method == TALLY__SIM_FAST ? "fast" : "event", tally__algo_name(r.algo), r.pace_rank);
    json_num("step_s", r.step_s, ", ");
    json_num("exposed_s", r.exposed_s, ", ");
    json_num("samples_per_s", r.samples_per_s, "},\n");
}

static void json_amdahl(const tally__plan_cfg *c, const tally__plan_step *s) {
    double P = tally__plan_parallel_fraction(s);
    printf("  \"amdahl\": {");
    json_num("parallel_fraction", P, ", ");
    json_num("ceiling", tally__plan_ceiling(P), ", \"table\": [\n");
    double base = tally__plan_step_time(c, 1).samples_per_s;
    for (int n = 1; n <= c->workers; n = next_n(n, c->workers)) {
        tally__plan_step sn = tally__plan_step_time(c, n);
        printf("%s    {\"n\": %d, ", n > 1 ? ",\n" : "", n);
        json_num("speedup", tally__plan_amdahl(P, n), ", ");
        json_num("samples_per_s", sn.samples_per_s, ", ");
        json_num("model_speedup", base > 0 ? sn.samples_per_s / base : 0, "}");
    }
    printf("\n  ]}");
}

static void json_calib(const tally__plan_calib *k) {
    printf(",\n  \"calibration\": {");
    json_num("sgemm_gflops", k->sgemm_gflops, ", ");
    json_num("update_s_per_param", k->update_s_per_param, ", ");
    json_num("model_gflops", k->model_gflops, ", ");
    json_num("shm_allreduce_s", k->shm_allreduce_s, ", ");
    json_num("tcp_allreduce_s", k->tcp_allreduce_s, ", ");
    printf("\"shm\": {");
    json_num("alpha", k->shm.alpha, ", ");
    json_num("beta", k->shm.beta, ", ");
    json_num("gamma", k->shm.gamma, "}, \"tcp\": {");
    json_num("alpha", k->tcp.alpha, ", ");
    json_num("beta", k->tcp.beta, ", ");
    json_num("gamma", k->tcp.gamma, "}, ");
    printf("\"cpus\": %ld, \"used\": \"%s\"}", k->cpus, k->used);
}

void tally__plan_print_json(const plan_opts *o, const tally__plan_calib *k) {
    const tally__plan_cfg *c = &o->cfg;
    printf("{\n  \"params\": %llu, \"layers\": %d, \"largest_layer\": %llu, \"workers\": %d, \"optimizer\": \"%s\",\n",
           c->params, c->nlayers, c->largest, c->workers, optim_name(c->optimizer));
    printf("  \"precision\": \"%s\", \"zero\": %d, \"batch\": %d, \"accum\": %d, ",
           c->precision == TALLY__PLAN_MIXED ? "mixed" : "fp32", c->zero, c->batch, c->accum);
    if (o->model >= 0) printf("\"model\": \"%s\", ", tally__model_name((tally__model_kind)o->model));
    json_num("flops_per_sample", c->flops_per_sample, ",\n  ");
    json_num("compute_gflops", c->gflops, ", ");
    json_num("alpha_s", c->cost.alpha, ", ");
    json_num("beta_s_per_byte", c->cost.beta, ", ");
    json_num("gamma_s_per_byte", c->cost.gamma, ",\n");
    json_memory(c);
    json_comm(o);
    tally__plan_step s = tally__plan_step_time(c, c->workers);
    json_step(&s);
    json_simulated(c, &s);
    json_amdahl(c, &s);
    json_modes(c, &s);
    if (k) json_calib(k);
    printf("\n}\n");
}

int tally__plan_print_chart(const plan_opts *o) {
    char what[192], b[24];
    if (o->model >= 0) {
        char arch[128];
        tally__model_arch(&o->mcfg, arch, sizeof arch);
        snprintf(what, sizeof what, "%s %s", tally__model_name((tally__model_kind)o->model), arch);
    } else {
        snprintf(what, sizeof what, "%s parameters", fmt_count((double)o->cfg.params, b));
    }
    if (!tally_plan_chart(o->svg, &o->cfg, what)) return 0;
    fprintf(stderr, "tally plan: --svg %s: %s\n", o->svg, tally_last_error());
    return 1;
}
