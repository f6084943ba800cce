/* plan_chart.c - `tally plan --svg FILE`: the scaling table of cmd_plan.c drawn: Amdahl's speed-up and the
 * model's against ranks (log 2), the ideal S = n, and the ceiling 1/(1-P) as a labelled line. */
#include "plan_chart.h"

#include <math.h>
#include <stdio.h>

#include "svg_chart.h"

#define MAX_POINTS    32
#define CEILING_REACH 8 /* a ceiling more than this many times N above the chart is said, not drawn */

/* n = 1, 2, 4, ... and N itself, as the table has them. */
static int next_n(int n, int N) { return n >= N ? N + 1 : (2 * n > N ? N : 2 * n); }

int tally_plan_chart(const char *path, const tally__plan_cfg *c, const char *what) {
    tally__plan_step s = tally__plan_step_time(c, c->workers);
    double P = tally__plan_parallel_fraction(&s), ceiling = tally__plan_ceiling(P);
    double base = tally__plan_step_time(c, 1).samples_per_s;
    double n[MAX_POINTS], amdahl[MAX_POINTS], model[MAX_POINTS];
    size_t k = 0;
    for (int r = 1; r <= c->workers && k < MAX_POINTS; r = next_n(r, c->workers), k++) {
        n[k] = r;
        amdahl[k] = tally__plan_amdahl(P, r);
        model[k] = base > 0 ? tally__plan_step_time(c, r).samples_per_s / base : NAN;
    }
    char title[256], panel[160], ceil_label[96];
    snprintf(title, sizeof title, "tally plan: %s, ZeRO %d, up to %d ranks", what, c->zero, c->workers);
    int drawn = isfinite(ceiling) && ceiling <= CEILING_REACH * (double)c->workers;
    if (!isfinite(ceiling))
        snprintf(panel, sizeof panel, "speed-up against ranks (P = %.4f at N = %d: no ceiling)", P, c->workers);
    else if (drawn)
        snprintf(panel, sizeof panel, "speed-up against ranks (P = %.4f at N = %d)", P, c->workers);
    else
        snprintf(panel, sizeof panel, "speed-up against ranks (P = %.4f at N = %d; ceiling %.4gx, above the chart)", P,
                 c->workers, ceiling);
    snprintf(ceil_label, sizeof ceil_label, "Amdahl ceiling 1/(1-P) = %.4gx", ceiling);
    tally_svg_chart chart = {.title = title, .npanels = 1, .panel_height = 420};
    tally_svg_panel *p = &chart.panel[0];
    p->title = panel;
    int log_axes = c->workers >= 8; /* ranks in powers of two: equal steps on the page */
    p->x = (tally_svg_axis){.title = "ranks (n)", .scale = log_axes ? TALLY_SVG_LOG2 : TALLY_SVG_LINEAR};
    p->y = (tally_svg_axis){.title = "speed-up over one rank",
                            .scale = log_axes ? TALLY_SVG_LOG2 : TALLY_SVG_LINEAR,
                            .from_zero = !log_axes};
    tally_svg_series *ideal = tally_svg_add(p, "ideal S(n) = n", n, n, k);
    ideal->dash = 1;
    ideal->colour = 8;
    tally_svg_add(p, "Amdahl S(n)", n, amdahl, k)->colour = 1;
    tally_svg_add(p, "model (samples/s ratio)", n, model, k)->colour = 2;
    if (drawn) tally_svg_add_ref(p, ceil_label, ceiling);
    return tally_svg_write(path, &chart);
}
