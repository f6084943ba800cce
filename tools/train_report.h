/* train_report.h - what the CLI shows of a training run on rank 0: the progress line and epoch lines
 * (an observer of the trainer's events), the closing summary, and the same summary as JSON. */
#ifndef TALLY_TOOLS_TRAIN_REPORT_H
#define TALLY_TOOLS_TRAIN_REPORT_H

#include <stdio.h>

#include "../src/train/trainer.h"

/* Rank 0's progress line: a bar with ETA on a terminal, a plain line now and then otherwise. */
typedef struct tally__progress {
    FILE *out;
    int tty;
    long total_steps;
    double t0, last;
    int last_pct;
    double loss_avg;
    int tokens_per_sample; /* a model on text: rates in tokens/s */
} tally__progress;
void tally__progress_init(tally__progress *p, FILE *out, long total_steps);
void tally__progress_update(tally__progress *p, long step, int epoch, int epochs, double samples, double loss);
void tally__progress_end(tally__progress *p);

/* The summary after training, as text (rank 0's stdout) and as JSON. */
typedef struct tally__run_info {
    const char *model, *data, *transport, *optimizer;
    const char *large_path; /* tally_comm_large_path: what large messages do on this host ("" over tcp) */
    const char *decay;      /* the schedule after warmup: "none", "cosine" or "step" */
    double weight_decay;    /* the optimizer's */
    char arch[128];
    int world, batch, accum, epochs, overlap, zero;
    int bf16; /* --precision bf16 */
    double lr, bucket_mb;
    double outer_lr, outer_momentum; /* --local-steps's outer step */
    const char *outer_compress;      /* and how the averaged change travels ("none", "fp16", "int8") */
} tally__run_info;
void tally__summary_print(FILE *out, const tally__run_info *info, const tally__train_result *r);
int tally__summary_json(const char *path, const tally__run_info *info, const tally__train_result *r);

/* A tally__train_observer drawing on p->out (stdout): pass it with a tally__progress as its arg. */
void tally__progress_observe(void *p, const tally__train_event *ev);

#endif
