/* plan_report.h - what `tally plan` prints of a plan: the text report (memory, communication by
 * algorithm, step time, scaling) and the same as JSON; cmd_plan.c parses the flags and asks the planner. */
#ifndef TALLY_TOOLS_PLAN_REPORT_H
#define TALLY_TOOLS_PLAN_REPORT_H

#include <tally.h>

#include "../src/nn/model.h"
#include "../src/plan/calibrate.h"
#include "../src/plan/plan.h"

typedef struct plan_opts {
    tally__plan_cfg cfg;
    int have_params, have_workers, have_flops, layers;
    int model; /* tally__model_kind, -1 without --model */
    tally__model_cfg mcfg;
    tally__model_desc desc;
    int show_all; /* --algo all: every algorithm in the table */
    int json, calibrate;
    const char *calibrate_rank; /* hidden: run as one rank of the link measurement */
    double calibrate_bytes;     /* hidden: the allreduce those ranks time (the plan's S) */
    tally_op calibrate_op;      /* hidden: sum or avg (what the trainer does; the default) */
    const char *flops_source, *link_source;
    const char *svg; /* --svg FILE: the scaling as a chart (plan_chart.c) */
} plan_opts;

/* The plan on stdout as text, or as JSON; k: what --calibrate measured, or NULL. */
void tally__plan_print_text(const plan_opts *o, const tally__plan_calib *k);
void tally__plan_print_json(const plan_opts *o, const tally__plan_calib *k);

/* --svg: the scaling as a chart; 0, or 1 after saying on stderr why it could not be written. */
int tally__plan_print_chart(const plan_opts *o);

#endif
