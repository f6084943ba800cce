/* sim_chart.h - `tally sim --svg FILE`: what sim played, as a chart (svg_chart.h): busbw and time against
 * the sizes of --size, or for --train the step's speed-up and time against the hosts, 1, 2, 4, ... up to H. */
#ifndef TALLY_TOOLS_SIM_CHART_H
#define TALLY_TOOLS_SIM_CHART_H

#include "../../src/sim/sim.h"

/* Speed-up of a step s on n ranks over one rank doing the same work (async: per gradient applied), as
 * `tally sim --train` prints it. */
double tally_sim_speedup(const tally__sim_train *t, int n, const tally__sim_step *s);

/* The collective `coll` played at n sizes (bytes[i], its result r[i]); algo: the one asked for (AUTO:
 * the chart names those picked). 0, or a TALLY_E_* code with tally_last_error(). */
int tally_sim_chart_sizes(const char *path, const tally__sim_cluster *c, const char *coll, int algo,
                          const size_t *bytes, const tally__sim_result *r, int n);
/* Training steps of t played on 1, 2, 4, ... and c->hosts hosts of c->per_host ranks (a layout the cluster
 * refuses, such as --slow naming a rank past it, is left out). */
int tally_sim_chart_hosts(const char *path, const tally__sim_cluster *c, const tally__sim_train *t, double params);

#endif
