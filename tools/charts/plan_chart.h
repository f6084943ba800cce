/* plan_chart.h - `tally plan --svg FILE`: the planner's speed-up against ranks as a chart (svg_chart.h),
 * with the ideal line and Amdahl's ceiling, beside cmd_plan.c's scaling table. */
#ifndef TALLY_TOOLS_PLAN_CHART_H
#define TALLY_TOOLS_PLAN_CHART_H

#include "../../src/plan/plan.h"

/* Speed-up over one rank for n = 1, 2, 4, ... and c->workers (the table's rows): Amdahl's S(n) with the
 * parallel fraction at N = c->workers, and the model's samples/s at n over that at 1; the line S = n and
 * the ceiling 1/(1-P). `what` names the job in the title. 0, or a TALLY_E_* code with tally_last_error(). */
int tally_plan_chart(const char *path, const tally__plan_cfg *c, const char *what);

#endif
