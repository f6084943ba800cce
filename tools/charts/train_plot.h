/* train_plot.h - `tally train --plot FILE`: rank 0 keeps the history the trainer's events tell (loss each
 * step, the test or validation loss each epoch, the rate) and draws it as SVG at the end (svg_chart.h). */
#ifndef TALLY_TOOLS_TRAIN_PLOT_H
#define TALLY_TOOLS_TRAIN_PLOT_H

#include "../train_report.h"

/* Points kept: past this many, every other one is dropped and the steps kept grow twice as far apart, so
 * a run of any length costs the same memory and its chart the same size. */
#define TALLY_TRAIN_PLOT_KEEP 4096

typedef struct tally_train_plot {
    tally__progress *progress; /* told every event too (the progress line), or NULL under --quiet */
    long first, stride;        /* the steps kept: first + k x stride */
    size_t n;
    double step[TALLY_TRAIN_PLOT_KEEP], loss[TALLY_TRAIN_PLOT_KEEP], smooth[TALLY_TRAIN_PLOT_KEEP];
    double t[TALLY_TRAIN_PLOT_KEEP], samples[TALLY_TRAIN_PLOT_KEEP]; /* training seconds, samples so far */
    double last[5]; /* the newest step's (step, loss, smooth, t, samples): the chart ends there */
    double ema, ema_a;
    double t0, paused_s, last_t; /* the test passes' time is left out of the rate */
    int tokens_per_sample, regression;
    size_t neval;
    double eval_step[TALLY_TRAIN_PLOT_KEEP], eval_loss[TALLY_TRAIN_PLOT_KEEP];
} tally_train_plot;

/* progress: the progress line to keep drawing (NULL: none). p is large: allocate it. */
void tally_train_plot_init(tally_train_plot *p, tally__progress *progress);
/* A tally__train_observer: pass a tally_train_plot as its arg. */
void tally_train_plot_observe(void *p, const tally__train_event *ev);
/* The chart: loss (each step, or a smoothed line over the raw points when there are many; the test or
 * validation loss after each epoch) and the rate (samples/s, tokens/s for a text model) against steps.
 * 0, or a TALLY_E_* code with tally_last_error() saying why. */
int tally_train_plot_write(const tally_train_plot *p, const char *path, const char *title);

#endif
