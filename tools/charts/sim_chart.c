/* sim_chart.c - `tally sim --svg FILE`: the collective's busbw and time against size as sim printed them,
 * or a training step's speed-up and time as the hosts grow to the cluster's (each layout played in turn). */
#include "sim_chart.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <tally.h>

#include "svg_chart.h"

#define MAX_HOSTS_POINTS 32

double tally_sim_speedup(const tally__sim_train *t, int n, const tally__sim_step *s) {
    double one = t->compute_s * t->accum + t->update_s, speedup = s->step_s > 0 ? n * one / s->step_s : 0;
    return t->async ? speedup * s->samples_per_step_factor : speedup;
}

/* "ring", or under auto "auto (ring, rhd)": the algorithms the cost model picked, each once. */
static void series_name(int algo, const tally__sim_result *r, int n, char *buf, size_t cap) {
    if (algo != TALLY__ALGO_AUTO) {
        snprintf(buf, cap, "%s", tally__algo_name(algo));
        return;
    }
    size_t o = (size_t)snprintf(buf, cap, "auto (");
    int seen[16] = {0}, first = 1;
    for (int i = 0; i < n; i++) {
        int a = r[i].algo >= 0 && r[i].algo < 16 ? r[i].algo : 0;
        if (seen[a]++ || o >= cap) continue;
        o += (size_t)snprintf(buf + o, cap - o, "%s%s", first ? "" : ", ", tally__algo_name(r[i].algo));
        first = 0;
    }
    if (o < cap) snprintf(buf + o, cap - o, ")");
}

int tally_sim_chart_sizes(const char *path, const tally__sim_cluster *c, const char *coll, int algo,
                          const size_t *bytes, const tally__sim_result *r, int n) {
    double x[64], busbw[64], us[64];
    int k = n < 64 ? n : 64;
    for (int i = 0; i < k; i++) {
        x[i] = (double)bytes[i];
        busbw[i] = r[i].busbw / 1e9;
        us[i] = r[i].seconds * 1e6;
    }
    char title[160], name[96];
    snprintf(title, sizeof title, "tally sim %s: %d hosts x %d ranks, f32 (simulated)", coll, c->hosts, c->per_host);
    series_name(algo, r, k, name, sizeof name);
    tally_svg_chart chart = {.title = title, .npanels = 2, .panel_height = 340};
    tally_svg_panel *bw = &chart.panel[0], *tm = &chart.panel[1];
    bw->title = "bus bandwidth against message size";
    bw->x = (tally_svg_axis){.title = "message size (bytes)", .scale = TALLY_SVG_LOG2, .units = TALLY_SVG_BYTES};
    bw->y = (tally_svg_axis){.title = "busbw (GB/s)", .from_zero = 1};
    tally_svg_add(bw, name, x, busbw, (size_t)k);
    tm->title = "time against message size";
    tm->x = bw->x;
    tm->y = (tally_svg_axis){.title = "time (us)", .scale = TALLY_SVG_LOG10};
    tally_svg_add(tm, name, x, us, (size_t)k);
    return tally_svg_write(path, &chart);
}

/* h = 1, 2, 4, ... and H itself. */
static int next_h(int h, int H) { return h >= H ? H + 1 : (2 * h > H ? H : 2 * h); }

int tally_sim_chart_hosts(const char *path, const tally__sim_cluster *c, const tally__sim_train *t, double params) {
    double hosts[MAX_HOSTS_POINTS], ideal[MAX_HOSTS_POINTS], speedup[MAX_HOSTS_POINTS];
    double step_ms[MAX_HOSTS_POINTS], exposed_ms[MAX_HOSTS_POINTS];
    size_t k = 0;
    for (int h = 1; h <= c->hosts && k < MAX_HOSTS_POINTS; h = next_h(h, c->hosts), k++) {
        tally__sim_cluster at = *c;
        at.hosts = h;
        tally__sim_step s;
        int n = h * c->per_host, bad = tally__sim_cluster_check(&at) || tally__sim_train_step(&at, t, &s);
        hosts[k] = h;
        ideal[k] = n;
        speedup[k] = bad ? NAN : tally_sim_speedup(t, n, &s);
        step_ms[k] = bad ? NAN : s.step_s * 1e3;
        exposed_ms[k] = bad ? NAN : s.exposed_s * 1e3;
    }
    char title[192], xtitle[64];
    snprintf(title, sizeof title, "tally sim --train: %.4g M parameters, %s, ZeRO %d, up to %d hosts x %d ranks",
             params / 1e6, t->async ? "async" : "sync", t->zero, c->hosts, c->per_host);
    snprintf(xtitle, sizeof xtitle, "hosts (%d rank%s each)", c->per_host, c->per_host == 1 ? "" : "s");
    int log_x = c->hosts >= 8;
    tally_svg_chart chart = {.title = title, .npanels = 2, .panel_height = 340};
    tally_svg_panel *sp = &chart.panel[0], *tp = &chart.panel[1];
    sp->title = "speed-up over one rank against hosts (simulated)";
    sp->x = (tally_svg_axis){.title = xtitle, .scale = log_x ? TALLY_SVG_LOG2 : TALLY_SVG_LINEAR};
    sp->y = (tally_svg_axis){.title = "speed-up", .scale = log_x ? TALLY_SVG_LOG2 : TALLY_SVG_LINEAR, .from_zero = 1};
    tally_svg_series *id = tally_svg_add(sp, "ideal (the ranks)", hosts, ideal, k);
    id->dash = 1;
    id->colour = 8;
    tally_svg_add(sp, "simulated speed-up", hosts, speedup, k)->colour = 1;
    tp->title = "step time against hosts (simulated)";
    tp->x = sp->x;
    tp->y = (tally_svg_axis){.title = "time (ms)", .from_zero = 1};
    tally_svg_add(tp, "step", hosts, step_ms, k)->colour = 1;
    tally_svg_add(tp, "communication exposed", hosts, exposed_ms, k)->colour = 2;
    return tally_svg_write(path, &chart);
}
