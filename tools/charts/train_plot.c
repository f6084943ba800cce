/* train_plot.c - `tally train --plot FILE`: the history of a run kept from the trainer's events on rank 0
 * (bounded, however long the run) and drawn at the end: loss and test loss, and the rate, against steps. */
#include "train_plot.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/core/clock.h"
#include "../../src/core/err.h"
#include "svg_chart.h"

#define MANY_STEPS  200 /* past this, the raw losses become faint points under a smoothed line */
#define RATE_WINDOW 100 /* the rate at a point is taken over about 1/100 of the points kept */

void tally_train_plot_init(tally_train_plot *p, tally__progress *progress) {
    memset(p, 0, sizeof *p);
    p->progress = progress;
    p->stride = 1;
    p->last[0] = -1;
}

/* Halves what is kept: every other point stays, so the steps kept are twice as far apart. */
static void thin(double *const cols[], int ncols, size_t *n) {
    for (int c = 0; c < ncols; c++)
        for (size_t i = 0; 2 * i < *n; i++) cols[c][i] = cols[c][2 * i];
    *n = (*n + 1) / 2;
}

static void keep_step(tally_train_plot *p, const double v[5]) {
    memcpy(p->last, v, sizeof p->last);
    long step = (long)v[0];
    if (p->n == 0) p->first = step;
    if ((step - p->first) % p->stride) return;
    if (p->n == TALLY_TRAIN_PLOT_KEEP) {
        double *const cols[] = {p->step, p->loss, p->smooth, p->t, p->samples};
        thin(cols, 5, &p->n);
        p->stride *= 2;
        if ((step - p->first) % p->stride) return;
    }
    double *const cols[] = {p->step, p->loss, p->smooth, p->t, p->samples};
    for (int c = 0; c < 5; c++) cols[c][p->n] = v[c];
    p->n++;
}

static void keep_eval(tally_train_plot *p, const tally__train_event *ev) {
    if (p->neval == TALLY_TRAIN_PLOT_KEEP) {
        double *const cols[] = {p->eval_step, p->eval_loss};
        thin(cols, 2, &p->neval);
    }
    p->eval_step[p->neval] = (double)ev->step;
    p->eval_loss[p->neval++] = ev->test_loss;
    p->regression = ev->regression;
}

void tally_train_plot_observe(void *arg, const tally__train_event *ev) {
    tally_train_plot *p = arg;
    if (p->progress) tally__progress_observe(p->progress, ev);
    double now = tally__now_s();
    switch (ev->kind) {
    case TALLY__TRAIN_BEGIN: {
        p->t0 = p->last_t = now;
        p->tokens_per_sample = ev->tokens_per_sample;
        double span = ev->total_steps / 25.0 > 10 ? ev->total_steps / 25.0 : 10; /* the smoothing's reach, in steps */
        p->ema_a = 2 / (span + 1);
        break;
    }
    case TALLY__TRAIN_STEP: {
        if (isfinite(ev->loss))
            p->ema = p->n == 0 || !isfinite(p->ema) ? ev->loss : p->ema + p->ema_a * (ev->loss - p->ema);
        p->last_t = now;
        double v[5] = {(double)ev->step, ev->loss, p->ema, now - p->t0 - p->paused_s, ev->samples};
        keep_step(p, v);
        break;
    }
    case TALLY__TRAIN_EVALUATED:
        p->paused_s += now - p->last_t; /* the test pass is not training: the next step's rate leaves it out */
        p->last_t = now;
        keep_eval(p, ev);
        break;
    case TALLY__TRAIN_END: break;
    }
}

/* The kept points and the newest step (when it was not kept) into cols: step, loss, smooth, t, samples. */
static size_t gather(const tally_train_plot *p, double *cols[5]) {
    const double *src[] = {p->step, p->loss, p->smooth, p->t, p->samples};
    for (int c = 0; c < 5; c++) memcpy(cols[c], src[c], p->n * sizeof(double));
    size_t n = p->n;
    if (p->last[0] >= 0 && (n == 0 || cols[0][n - 1] != p->last[0])) {
        for (int c = 0; c < 5; c++) cols[c][n] = p->last[c];
        n++;
    }
    return n;
}

/* Samples (or tokens) a second over a window of points; the first point has none before it. */
static void rates(const tally_train_plot *p, double *const cols[5], size_t n, double *rate) {
    size_t w = n / RATE_WINDOW > 1 ? n / RATE_WINDOW : 1;
    double per = p->tokens_per_sample > 0 ? p->tokens_per_sample : 1;
    for (size_t i = 0; i < n; i++) {
        size_t j = i >= w ? i - w : 0;
        double dt = cols[3][i] - cols[3][j];
        rate[i] = i > 0 && dt > 0 ? (cols[4][i] - cols[4][j]) / dt * per : NAN;
    }
}

static void loss_panel(const tally_train_plot *p, tally_svg_panel *lp, double *const cols[5], size_t n, char *raw_name,
                       size_t cap) {
    int text = p->tokens_per_sample > 0;
    lp->title = "loss against steps";
    lp->x = (tally_svg_axis){.title = "step"};
    lp->y = (tally_svg_axis){.title = text ? "loss (nats per byte)" : "loss"};
    if (n <= MANY_STEPS) {
        tally_svg_add(lp, "train loss", cols[0], cols[1], n)->colour = 1;
    } else {
        if (p->stride > 1)
            snprintf(raw_name, cap, "train loss (every %ldth step)", p->stride);
        else
            snprintf(raw_name, cap, "train loss (each step)");
        tally_svg_series *raw = tally_svg_add(lp, raw_name, cols[0], cols[1], n);
        raw->no_line = raw->faint = 1;
        raw->colour = 1;
        tally_svg_add(lp, "train loss (smoothed)", cols[0], cols[2], n)->colour = 1;
    }
    const char *eval = text ? "validation loss" : p->regression ? "test loss (mse)" : "test loss";
    tally_svg_series *e = tally_svg_add(lp, eval, p->eval_step, p->eval_loss, p->neval);
    e->colour = 2;
    e->marks = TALLY_SVG_MARK_ALWAYS;
}

int tally_train_plot_write(const tally_train_plot *p, const char *path, const char *title) {
    size_t cap = p->n + 1;
    double *mem = malloc(6 * cap * sizeof(double));
    if (!mem) return tally__seterr(TALLY_E_NOMEM, "%s: out of memory for the chart", path);
    double *cols[5] = {mem, mem + cap, mem + 2 * cap, mem + 3 * cap, mem + 4 * cap}, *rate = mem + 5 * cap;
    size_t n = gather(p, cols);
    rates(p, cols, n, rate);
    tally_svg_chart c = {.title = title, .npanels = 2, .panel_height = 340};
    char raw_name[64];
    loss_panel(p, &c.panel[0], cols, n, raw_name, sizeof raw_name);
    tally_svg_panel *rp = &c.panel[1];
    int text = p->tokens_per_sample > 0;
    rp->title = text ? "throughput (tokens/s) against steps" : "throughput (samples/s) against steps";
    rp->x = (tally_svg_axis){.title = "step"};
    rp->y = (tally_svg_axis){.title = text ? "tokens/s" : "samples/s", .from_zero = 1};
    tally_svg_add(rp, text ? "tokens/s" : "samples/s", cols[0], rate, n)->colour = 3;
    int rc = tally_svg_write(path, &c);
    free(mem);
    return rc;
}
