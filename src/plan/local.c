/* local.c - local SGD in the planner: a step whose averaging comes every H steps, and which mode (sync,
 * or local SGD at some H and wire format) a model on a link would be trained in. */
#include <math.h>

#include "plan.h"

tally__plan_local tally__plan_local_step(const tally__plan_cfg *c, int n, int H, double ratio) {
    tally__plan_step sync = tally__plan_step_time(c, n);
    tally__plan_local l = {.H = H, .ratio = ratio > 0 ? ratio : 1};
    double bytes = 4.0 * (double)c->params * l.ratio; /* the parameters' change, from f32 */
    tally__plan_comm avg = n > 1 ? tally__plan_allreduce_on(c, c->algo, n, bytes) : (tally__plan_comm){0};
    l.comm = avg.seconds / H; /* at the round's end, behind nothing */
    l.bytes_per_step = (avg.sent > 0 ? avg.sent : 0) / H;
    l.t_step = sync.compute + sync.update + l.comm;
    l.comm_share = l.t_step > 0 ? l.comm / l.t_step : 0;
    l.samples_per_s = l.t_step > 0 ? n * (double)c->batch * (c->accum > 0 ? c->accum : 1) / l.t_step : 0;
    return l;
}

double tally__plan_sync_comm_share(const tally__plan_step *s) {
    return s->t_pred > 0 ? (s->t_pred - s->compute - s->update) / s->t_pred : 0;
}

tally__plan_local tally__plan_pick_mode(const tally__plan_cfg *c, int n) {
    tally__plan_step sync = tally__plan_step_time(c, n);
    if (n < 2 || tally__plan_sync_comm_share(&sync) <= TALLY__PLAN_COMM_SHARE_OK) return (tally__plan_local){.H = 0};
    const double ratios[] = {1, 0.25};
    tally__plan_local last = {0};
    for (int r = 0; r < 2; r++)
        for (int H = 2; H <= TALLY__PLAN_LOCAL_MAX_H; H *= 2) {
            last = tally__plan_local_step(c, n, H, ratios[r]);
            if (last.comm_share <= TALLY__PLAN_COMM_SHARE_OK) return last;
        }
    return last; /* the most it can do: the largest H, in int8 */
}
