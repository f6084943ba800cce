/* train_report.c - what the CLI shows of a training run on rank 0: the progress bar (or plain lines off a
 * terminal) and the epoch lines from the trainer's events, the closing summary, and the same as JSON. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../src/core/clock.h"
#include "../src/core/err.h"
#include "../src/core/file.h"
#include "../src/nn/blas_core.h"
#include "../src/nn/gemm_bf16.h"
#include "train_report.h"

#define BAR_WIDTH       24
#define TTY_REDRAW_S    0.1
#define PLAIN_EVERY_PCT 10

void tally__progress_init(tally__progress *p, FILE *out, long total_steps) {
    memset(p, 0, sizeof *p);
    p->out = out;
    p->tty = isatty(fileno(out));
    p->total_steps = total_steps > 0 ? total_steps : 1;
    p->t0 = tally__now_s();
    p->last_pct = -1;
}

static void fmt_hms(char *buf, size_t n, double s) {
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
}

void tally__progress_update(tally__progress *p, long step, int epoch, int epochs, double samples, double loss) {
    /* One step's loss is noisy; a moving average over about the last 50 steps reads better. */
    p->loss_avg = step <= 1 ? loss : 0.98 * p->loss_avg + 0.02 * loss;
    loss = p->loss_avg;
    double now = tally__now_s(), el = now - p->t0;
    int pct = (int)(100.0 * step / p->total_steps);
    if (p->tty ? now - p->last < TTY_REDRAW_S && step < p->total_steps
               : pct / PLAIN_EVERY_PCT == p->last_pct / PLAIN_EVERY_PCT && step < p->total_steps)
        return;
    p->last = now;
    p->last_pct = pct;
    char eta[32], bar[BAR_WIDTH + 1];
    fmt_hms(eta, sizeof eta, step ? el / step * (p->total_steps - step) : 0);
    int fill = (int)((double)BAR_WIDTH * step / p->total_steps);
    for (int i = 0; i < BAR_WIDTH; i++) bar[i] = i < fill ? '#' : '.';
    bar[BAR_WIDTH] = 0;
    double rate = el > 0 ? samples / el * (p->tokens_per_sample ? p->tokens_per_sample : 1) : 0;
    const char *unit = p->tokens_per_sample ? "tokens/s" : "samples/s";
    if (p->tty)
        fprintf(p->out, "\r\033[Kepoch %d/%d [%s] %3d%% step %ld/%ld  ETA %s  %.0f %s  loss %.4f", epoch + 1, epochs,
                bar, pct, step, p->total_steps, eta, rate, unit, loss);
    else
        fprintf(p->out, "epoch %d/%d  %3d%%  step %ld/%ld  ETA %s  %.0f %s  loss %.4f\n", epoch + 1, epochs, pct, step,
                p->total_steps, eta, rate, unit, loss);
    fflush(p->out);
}

void tally__progress_end(tally__progress *p) {
    if (p->out && p->tty && p->last > 0) {
        fputc('\n', p->out);
        fflush(p->out);
        p->last = 0;
    }
}

void tally__progress_observe(void *arg, const tally__train_event *ev) {
    tally__progress *p = arg;
    switch (ev->kind) {
    case TALLY__TRAIN_BEGIN:
        tally__progress_init(p, stdout, ev->total_steps);
        p->tokens_per_sample = ev->tokens_per_sample;
        break;
    case TALLY__TRAIN_STEP: tally__progress_update(p, ev->step, ev->epoch, ev->epochs, ev->samples, ev->loss); break;
    case TALLY__TRAIN_EVALUATED:
        tally__progress_end(p);
        if (ev->tokens_per_sample)
            printf("epoch %d/%d: train loss %.4f, validation loss %.4f (%.4f bits/byte), next-byte accuracy %.4f\n",
                   ev->epoch + 1, ev->epochs, ev->loss, ev->test_loss, ev->test_loss / log(2.0), ev->test_metric);
        else
            printf("epoch %d/%d: train loss %.4f, test %s %.4f, test loss %.4f\n", ev->epoch + 1, ev->epochs, ev->loss,
                   ev->regression ? "mse" : "accuracy", ev->test_metric, ev->test_loss);
        fflush(stdout);
        break;
    case TALLY__TRAIN_END: tally__progress_end(p); break;
    }
}

/* Per-step means of this rank's timers, in milliseconds. */
typedef struct step_ms {
    double step, data, compute, update, wait, comm;
    double compute_sd; /* from step to step */
} step_ms;

static step_ms per_step(const tally__train_result *r) {
    double n = r->steps > 0 ? (double)r->steps : 1;
    return (step_ms){.step = r->train_s / n * 1e3,
                     .data = r->data_s / n * 1e3,
                     .compute = r->compute_s / n * 1e3,
                     .update = r->update_s / n * 1e3,
                     .wait = r->wait_s / n * 1e3,
                     .comm = r->comm_s / n * 1e3,
                     .compute_sd = r->compute_sd_s * 1e3};
}

/* The f32 bytes of a step's gradient reductions over those this codec sent; 0 when nothing was sent. */
static double compression_ratio(const tally__train_result *r) {
    if (!r->codec[0] || !strcmp(r->codec, "none")) return r->grad_bytes ? 1.0 : 0.0;
    return r->grad_bytes ? (double)r->grad_bytes_f32_step * (double)r->steps / (double)r->grad_bytes : 0.0;
}

static double gflops_per_rank(const tally__train_result *r, int world) {
    return r->train_s > 0 ? r->flops_per_sample * r->samples / world / r->train_s * 1e-9 : 0;
}

/* "0:120 1:38 2:4": the non-empty bins of the staleness histogram. */
static void stale_hist(const tally__train_result *r, char *buf, size_t n) {
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < TALLY__TRAIN_STALE_BINS && o + 32 < n; i++)
        if (r->staleness_hist[i])
            o += (size_t)snprintf(buf + o, n - o, "%s%d%s:%ld", o ? " " : "", i,
                                  i == TALLY__TRAIN_STALE_BINS - 1 ? "+" : "", r->staleness_hist[i]);
}

static void summary_async(FILE *out, const tally__train_result *r, const step_ms *ms) {
    char hist[1024];
    stale_hist(r, hist, sizeof hist);
    fprintf(out,
            "  async            parameter server on rank 0 (%s), %d workers (%s), staleness bound %ld (%s); "
            "stale gradients' lr: %s\n",
            r->ps_dedicated ? "dedicated, --ps" : "a thread beside its worker", r->workers,
            r->shared_quota ? "sharing the steps x workers gradients" : "each computing every step", r->staleness,
            r->staleness == 0 ? "synchronous rounds: one averaged step per round" : "each push applied on arrival",
            r->staleness == 0 ? "not damped (always 0)"
            : r->stale_lr     ? "inverse, lr / (1 + staleness)"
                              : "none, lr");
    fprintf(out, "  staleness        %s (gradients by staleness; max %ld); %ld pushes, %ld server steps\n", hist,
            r->max_staleness, r->ps_pushes, r->ps_updates);
    fprintf(out,
            "  waiting          %ld of %ld pulls held back by the bound, %.3f s in all (%.3f ms per pull); this "
            "rank %.3f ms/step in pulls, %.3f in pushes\n",
            r->pulls_waited, r->pulls, r->pull_wait_s, r->pulls ? r->pull_wait_s / r->pulls * 1e3 : 0, ms->wait,
            ms->update);
}

/* --local-steps: the rounds, what averaging cost, and the bytes against synchronous training's. */
static void summary_local(FILE *out, const tally__run_info *in, const tally__train_result *r) {
    double steps = r->steps > 0 ? (double)r->steps : 1, per_step = (double)r->outer_bytes / steps;
    fprintf(out,
            "  local SGD        every %ld steps (outer lr %g, Nesterov momentum %g, sent as %s): %ld averagings, "
            "%.3f s in all, %.1f%% of training time\n",
            r->local_steps, in->outer_lr, in->outer_momentum, in->outer_compress, r->outer_rounds, r->outer_s,
            r->train_s > 0 ? 100 * r->outer_s / r->train_s : 0);
    fprintf(out, "                   %.0f bytes per step per rank; synchronous training's f32 allreduce sends %.0f",
            per_step, (double)r->f32_bytes_step);
    if (per_step > 0)
        fprintf(out, ": %.1fx fewer\n", (double)r->f32_bytes_step / per_step);
    else
        fprintf(out, "\n");
}

#define SUMMARY_RANK_ROWS 16 /* more ranks than this: the rows of the slowest few */

static double rank_ms(const tally__train_result *r, int rank, int what) {
    const double *t = r->rank_times + (size_t)rank * TALLY__TIMES;
    return t[TALLY__TIME_STEPS] > 0 ? t[what] / t[TALLY__TIME_STEPS] * 1e3 : 0;
}

static double rank_work_ms(const tally__train_result *r, int rank) {
    return tally__train_work_per_step(r->rank_times + (size_t)rank * TALLY__TIMES) * 1e3;
}

static void summary_rank_row(FILE *out, const tally__train_result *r, int rank) {
    if (!(r->rank_times[(size_t)rank * TALLY__TIMES + TALLY__TIME_STEPS] > 0)) {
        fprintf(out, "    rank %-9d trains nothing (the parameter server)\n", rank);
        return;
    }
    fprintf(out, "    rank %-9d %.3f / %.3f / %.3f / %.3f\n", rank, rank_ms(r, rank, TALLY__TIME_DATA),
            rank_ms(r, rank, TALLY__TIME_COMPUTE), rank_ms(r, rank, TALLY__TIME_WAIT),
            rank_ms(r, rank, TALLY__TIME_UPDATE));
}

/* Each rank's own times, and the one that held the others up: DDP's allreduce gives every rank the
 * slowest's step time, so only a rank's work (and the others' wait) shows it. */
static void summary_ranks(FILE *out, const tally__train_result *r) {
    if (!r->rank_times || r->world < 2) return;
    tally__train_slowest s = tally__train_find_slowest(r->rank_times, r->world);
    fprintf(out, "  ranks            data / compute / wait / update, ms a step%s\n",
            r->world > SUMMARY_RANK_ROWS ? " (the 4 with most work; every rank in --json)" : "");
    if (r->world <= SUMMARY_RANK_ROWS) {
        for (int k = 0; k < r->world; k++) summary_rank_row(out, r, k);
    } else {
        int shown[4], n = 0;
        for (; n < 4; n++) { /* the n-th most work: a scan per row, as only four are shown */
            int best = -1;
            for (int k = 0; k < r->world; k++) {
                int taken = 0;
                for (int j = 0; j < n; j++) taken |= shown[j] == k;
                if (!taken && (best < 0 || rank_work_ms(r, k) > rank_work_ms(r, best))) best = k;
            }
            shown[n] = best;
            summary_rank_row(out, r, best);
        }
    }
    if (s.rank < 0) return;
    fprintf(out,
            "  slowest rank     %d: %.3f ms of work a step (data + compute + update) against the other ranks' "
            "median %.3f ms: %.3f ms more (%.2fx); the others waited %.3f ms a step\n",
            s.rank, s.work_s * 1e3, s.median_s * 1e3, (s.work_s - s.median_s) * 1e3,
            s.median_s > 0 ? s.work_s / s.median_s : 0, s.others_wait * 1e3);
}

void tally__summary_print(FILE *out, const tally__run_info *in, const tally__train_result *r) {
    step_ms ms = per_step(r);
    double steps = r->steps > 0 ? (double)r->steps : 1;
    fprintf(out, "summary: %s %s (%zu parameters) on %s, %d rank%s over %s, batch %d/rank x accum %d, %s lr %g",
            in->model, in->arch, r->nparams, in->data, in->world, in->world == 1 ? "" : "s", in->transport, in->batch,
            in->accum, in->optimizer, in->lr);
    if (in->decay && strcmp(in->decay, "none")) fprintf(out, " (%s decay)", in->decay);
    if (in->weight_decay > 0) fprintf(out, ", weight decay %g", in->weight_decay);
    if (r->standardized) fprintf(out, ", inputs standardized (mean %.4f, sd %.4f)", r->input_mean, r->input_sd);
    fputc('\n', out);
    if (!r->evaluated)
        fprintf(out, "  test             not evaluated (--no-eval)\n");
    else if (r->tokens_per_sample)
        fprintf(out, "  validation loss  %.4f nats/byte = %.4f bits/byte (next-byte accuracy %.4f) after %d epoch%s\n",
                r->test_loss, r->test_loss / log(2.0), r->test_acc, in->epochs, in->epochs == 1 ? "" : "s");
    else if (r->test_acc >= 0)
        fprintf(out, "  test accuracy    %.4f (test loss %.4f) after %d epoch%s\n", r->test_acc, r->test_loss,
                in->epochs, in->epochs == 1 ? "" : "s");
    else
        fprintf(out, "  test mse         %.6f after %d epoch%s\n", r->test_loss, in->epochs,
                in->epochs == 1 ? "" : "s");
    if (r->tokens_per_sample)
        fprintf(out, "  throughput       %.0f tokens/s (%.1f samples/s of %d tokens; %ld steps, %.2f s)\n",
                r->samples_per_s * r->tokens_per_sample, r->samples_per_s, r->tokens_per_sample, r->steps, r->train_s);
    else
        fprintf(out, "  throughput       %.0f samples/s (%ld steps, %.2f s)\n", r->samples_per_s, r->steps, r->train_s);
    fprintf(out, "  step             %.3f ms = data %.3f + compute %.3f + wait for comm %.3f + update %.3f\n", ms.step,
            ms.data, ms.compute, ms.wait, ms.update);
    summary_ranks(out, r);
    if (in->large_path && in->large_path[0] && in->world > 1) fprintf(out, "  large messages   %s\n", in->large_path);
    if (r->async)
        summary_async(out, r, &ms);
    else if (r->local_steps)
        summary_local(out, in, r);
    else if (in->zero)
        fprintf(out,
                "  communication    %.3f ms/step in collectives, layer by layer (ZeRO stage %d); %.1f%% of step time\n",
                ms.comm, in->zero, ms.step > 0 ? 100 * ms.comm / ms.step : 0);
    else
        fprintf(out,
                "  communication    %.3f ms/step in allreduce, %d bucket%s of <= %g MB %s; %.1f%% of step time, "
                "%.1f%% not hidden\n",
                ms.comm, r->buckets, r->buckets == 1 ? "" : "s", in->bucket_mb,
                !in->overlap     ? "after backward"
                : r->buckets > 1 ? "overlapped with backward"
                                 : "(one: nothing to overlap)",
                ms.step > 0 ? 100 * ms.comm / ms.step : 0, ms.step > 0 ? 100 * ms.wait / ms.step : 0);
    fprintf(out, "  bytes sent       %.0f per step per rank\n", (double)r->bytes_sent / steps);
    if (strcmp(r->codec, "none") && r->codec[0]) {
        double ratio = compression_ratio(r);
        fprintf(out, "  compression      %s: %.0f gradient bytes per step per rank, %.0f in f32: ", r->codec,
                (double)r->grad_bytes / steps, (double)r->grad_bytes_f32_step);
        if (ratio > 0)
            fprintf(out, "%.1fx fewer\n", ratio);
        else
            fprintf(out, "no ratio (nothing sent on one rank)\n");
    }
    size_t state = r->mem_params + r->mem_grads + r->mem_optim;
    fprintf(out,
            "  memory per rank  ZeRO stage %d: parameters %.1f MB + gradients %.1f MB + optimizer %.1f MB = "
            "%.1f MB model state; layer buffers %.1f MB; activations %.1f MB; peak RSS %.1f MB\n",
            in->zero, r->mem_params / 1e6, r->mem_grads / 1e6, r->mem_optim / 1e6, state / 1e6, r->mem_buffers / 1e6,
            r->mem_activations / 1e6, r->peak_rss / 1e6);
    double gf = gflops_per_rank(r, in->world);
    if (r->peak_gflops > 0)
        fprintf(out,
                "  compute          %.1f GFLOP/s per rank, MFU %.2f of single-thread f32 sgemm %.1f GFLOP/s "
                "(OpenBLAS %s kernels)\n",
                gf, gf / r->peak_gflops, r->peak_gflops, tally__blas_core_name());
    if (r->tokens_per_sample)
        fprintf(out,
                "                   %.2f MFLOP per token: 6 x parameters + attention (12 x layers x context x width)\n",
                r->flops_per_sample / r->tokens_per_sample * 1e-6);
    else if (!(r->peak_gflops > 0))
        fprintf(out, "  compute          %.1f GFLOP/s per rank (OpenBLAS %s kernels)\n", gf, tally__blas_core_name());
    if (in->bf16)
        fprintf(out, "  precision        bf16 products in the linear layers (oneDNN %s), f32 elsewhere\n",
                tally__bf16_impl()[0] ? tally__bf16_impl() : "-");
    fprintf(out, "  replicas         %s\n", r->replicas_identical ? "bit-identical on every rank" : "DIFFER");
    if (r->resumed_from >= 0 || r->checkpoints)
        fprintf(out, "  checkpoints      %ld written%s", r->checkpoints, r->resumed_from >= 0 ? "" : "\n");
    if (r->resumed_from >= 0) fprintf(out, "; resumed from step %ld\n", r->resumed_from);
    if (r->skipped_steps)
        fprintf(out, "  skipped steps    %ld (a gradient was NaN or Inf on some rank)\n", r->skipped_steps);
    fflush(out);
}

/* The data set's name can be a user's directory: quotes, backslashes and control bytes escaped. */
static void json_escaped(char *out, size_t n, const char *s) {
    size_t o = 0;
    for (; *s && o + 7 < n; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            o += (size_t)snprintf(out + o, n - o, "\\%c", ch);
        else if (ch < 0x20)
            o += (size_t)snprintf(out + o, n - o, "\\u%04x", ch);
        else
            out[o++] = (char)ch;
    }
    out[o] = 0;
}

/* "ranks": every rank's ms a step; "slowest": the one with most work (null under 2 training ranks). */
static void json_ranks(FILE *f, const tally__train_result *r) {
    fprintf(f, "  \"ranks\": [");
    for (int k = 0; r->rank_times && k < r->world; k++)
        fprintf(
            f, "%s{\"rank\": %d, \"steps\": %.0f, \"data\": %.4f, \"compute\": %.4f, \"wait\": %.4f, \"update\": %.4f}",
            k ? ",\n    " : "", k, r->rank_times[(size_t)k * TALLY__TIMES + TALLY__TIME_STEPS],
            rank_ms(r, k, TALLY__TIME_DATA), rank_ms(r, k, TALLY__TIME_COMPUTE), rank_ms(r, k, TALLY__TIME_WAIT),
            rank_ms(r, k, TALLY__TIME_UPDATE));
    tally__train_slowest s = tally__train_find_slowest(r->rank_times, r->world);
    if (s.rank < 0)
        fprintf(f, "],\n  \"slowest\": null,\n");
    else
        fprintf(f,
                "],\n  \"slowest\": {\"rank\": %d, \"work_ms\": %.4f, \"median_work_ms\": %.4f, "
                "\"others_wait_ms\": %.4f},\n",
                s.rank, s.work_s * 1e3, s.median_s * 1e3, s.others_wait * 1e3);
}

int tally__summary_json(const char *path, const tally__run_info *in, const tally__train_result *r) {
    tally__file_out out; /* no rename over a link, device or FIFO at path: the writer decides by what it is */
    int rc = tally__file_out_open(&out, path);
    if (rc) return rc;
    FILE *f = out.f;
    step_ms ms = per_step(r);
    double steps = r->steps > 0 ? (double)r->steps : 1, gf = gflops_per_rank(r, in->world);
    char hash[65];
    for (int i = 0; i < 32; i++) snprintf(hash + 2 * i, 3, "%02x", r->hash[i]);
    char data[1024];
    json_escaped(data, sizeof data, in->data ? in->data : "");
    fprintf(f, "{\n  \"model\": \"%s\", \"arch\": \"%s\", \"params\": %zu, \"data\": \"%s\",\n", in->model, in->arch,
            r->nparams, data);
    fprintf(f, "  \"world\": %d, \"transport\": \"%s\", \"batch_per_rank\": %d, \"accum\": %d, \"epochs\": %d,\n",
            in->world, in->transport, in->batch, in->accum, in->epochs);
    fprintf(f, "  \"optimizer\": \"%s\", \"lr\": %g, \"decay\": \"%s\", \"weight_decay\": %g,\n", in->optimizer, in->lr,
            in->decay ? in->decay : "none", in->weight_decay);
    fprintf(f, "  \"normalize\": \"%s\",\n", r->standardized ? "mean-std" : "none");
    char large[512];
    json_escaped(large, sizeof large, in->large_path ? in->large_path : "");
    fprintf(f, "  \"large_messages\": \"%s\",\n", large);
    fprintf(f, "  \"overlap\": %s, \"bucket_mb\": %g,\n", in->overlap ? "true" : "false", in->bucket_mb);
    if (!r->evaluated)
        fprintf(f, "  \"test_accuracy\": null, \"test_loss\": null,\n");
    else if (r->test_acc >= 0)
        fprintf(f, "  \"test_accuracy\": %.6f, \"test_loss\": %.6f,\n", r->test_acc, r->test_loss);
    else
        fprintf(f, "  \"test_accuracy\": null, \"test_mse\": %.8f,\n", r->test_loss);
    fprintf(f,
            "  \"train_loss\": %.6f, \"steps\": %ld, \"samples\": %.0f, \"train_seconds\": %.4f, "
            "\"samples_per_s\": %.1f,\n",
            r->last_loss, r->steps, r->samples, r->train_s, r->samples_per_s);
    fprintf(f,
            "  \"step_ms\": {\"total\": %.4f, \"data\": %.4f, \"compute\": %.4f, \"wait\": %.4f, \"update\": %.4f, "
            "\"comm\": %.4f, \"compute_sd\": %.4f},\n",
            ms.step, ms.data, ms.compute, ms.wait, ms.update, ms.comm, ms.compute_sd);
    json_ranks(f, r);
    fprintf(f, "  \"comm_share\": %.4f, \"comm_exposed_share\": %.4f, \"bytes_sent_per_step\": %.0f,\n",
            ms.step > 0 ? ms.comm / ms.step : 0, ms.step > 0 ? ms.wait / ms.step : 0, (double)r->bytes_sent / steps);
    fprintf(f,
            "  \"flops_per_sample\": %.0f, \"gflops_per_rank\": %.3f, \"sgemm_peak_gflops\": %.3f, \"mfu\": %.4f, "
            "\"blas_core\": \"%s\", \"precision\": \"%s\",\n",
            r->flops_per_sample, gf, r->peak_gflops, r->peak_gflops > 0 ? gf / r->peak_gflops : 0,
            tally__blas_core_name(), in->bf16 ? "bf16" : "fp32");
    if (r->tokens_per_sample) { /* a model on text */
        char val[64] = "\"val_loss\": null, \"bits_per_byte\": null";
        if (r->evaluated)
            snprintf(val, sizeof val, "\"val_loss\": %.6f, \"bits_per_byte\": %.6f", r->test_loss,
                     r->test_loss / log(2.0));
        fprintf(f, "  \"tokens_per_sample\": %d, \"tokens_per_s\": %.1f, \"flops_per_token\": %.0f, %s,\n",
                r->tokens_per_sample, r->samples_per_s * r->tokens_per_sample,
                r->flops_per_sample / r->tokens_per_sample, val);
    }
    fprintf(f,
            "  \"zero\": %d, \"memory\": {\"params\": %zu, \"grads\": %zu, \"optim\": %zu, \"buffers\": %zu, "
            "\"activations\": %zu, \"peak_rss\": %zu},\n",
            in->zero, r->mem_params, r->mem_grads, r->mem_optim, r->mem_buffers, r->mem_activations, r->peak_rss);
    fprintf(f,
            "  \"compress\": \"%s\", \"grad_bytes_per_step\": %.0f, \"grad_bytes_f32_per_step\": %.0f, "
            "\"compression_ratio\": %.4f,\n",
            r->codec[0] ? r->codec : "none", (double)r->grad_bytes / steps,
            strcmp(r->codec, "none") && r->codec[0] ? (double)r->grad_bytes_f32_step : (double)r->grad_bytes / steps,
            compression_ratio(r));
    fprintf(f, "  \"resumed_from\": %ld, \"checkpoints\": %ld,\n", r->resumed_from, r->checkpoints);
    if (r->local_steps)
        fprintf(f,
                "  \"local_sgd\": {\"steps\": %ld, \"outer_lr\": %g, \"outer_momentum\": %g, \"outer_compress\": "
                "\"%s\", \"rounds\": %ld, \"averaging_s\": %.4f, \"bytes_per_step\": %.0f, "
                "\"sync_bytes_per_step\": %.0f},\n",
                r->local_steps, in->outer_lr, in->outer_momentum, in->outer_compress, r->outer_rounds, r->outer_s,
                (double)r->outer_bytes / steps, (double)r->f32_bytes_step);
    else
        fprintf(f, "  \"local_sgd\": null,\n");
    if (r->async) {
        char hist[1024];
        size_t o = 0;
        for (int i = 0; i < TALLY__TRAIN_STALE_BINS && i <= r->staleness; i++)
            o += (size_t)snprintf(hist + o, sizeof hist - o, "%s%ld", i ? ", " : "", r->staleness_hist[i]);
        hist[o < sizeof hist ? o : sizeof hist - 1] = 0;
        fprintf(f,
                "  \"async\": {\"staleness\": %ld, \"stale_lr\": \"%s\", \"dedicated_ps\": %s, \"workers\": %d, "
                "\"shared_quota\": %s, "
                "\"staleness_hist\": [%s], \"max_staleness\": %ld, \"pushes\": %ld, \"server_steps\": %ld, "
                "\"pulls\": %ld, \"pulls_waited\": %ld, \"pull_wait_s\": %.4f},\n",
                r->staleness, r->stale_lr ? "inverse" : "none", r->ps_dedicated ? "true" : "false", r->workers,
                r->shared_quota ? "true" : "false", hist, r->max_staleness, r->ps_pushes, r->ps_updates, r->pulls,
                r->pulls_waited, r->pull_wait_s);
    } else {
        fprintf(f, "  \"async\": null,\n");
    }
    fprintf(f, "  \"skipped_steps\": %ld, \"params_sha256\": \"%s\", \"replicas_identical\": %s\n}\n", r->skipped_steps,
            hash, r->replicas_identical ? "true" : "false");
    return tally__file_out_commit(&out);
}
