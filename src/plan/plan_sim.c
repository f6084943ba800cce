/* plan_sim.c - where the planner hands over to the simulator: layouts its closed forms cannot answer
 * (levels, an oversubscribed fabric, stragglers) are played step by step by src/sim. */
#include <stdio.h>
#include <string.h>

#include "plan.h"

int tally__plan_needs_sim(const tally__plan_cfg *c, int n, char *why, size_t len) {
    const char *part[3];
    int k = 0;
    if (tally__plan_has_levels(c, n)) part[k++] = "hierarchical layout";
    if (c->hosts > 1 && c->sim.fabric == TALLY__SIM_FAT_TREE && c->sim.oversub > 1 && n > c->per_host)
        part[k++] = "oversubscribed fabric";
    if (c->sim.nslow > 0 || c->sim.compute_sd > 0) part[k++] = "stragglers";
    size_t used = 0;
    if (len) why[0] = '\0';
    for (int i = 0; i < k && used < len; i++)
        used += (size_t)snprintf(why + used, len - used, "%s%s", i ? ", " : "", part[i]);
    return k > 0;
}

/* The cluster the plan describes: its hosts (or one host of n ranks), links and fabric. */
static tally__sim_cluster cluster_of(const tally__plan_cfg *c, int n) {
    tally__sim_cluster s = c->sim;
    int spread = c->hosts > 1 && c->per_host > 0 && n > c->per_host && n % c->per_host == 0;
    s.hosts = spread ? n / c->per_host : 1;
    s.per_host = spread ? c->per_host : n;
    s.shm = c->cost;
    if (s.crowded_alpha < s.shm.alpha) s.crowded_alpha = s.shm.alpha;
    s.nic_rate = 1.0 / c->net.beta;
    s.nic_payload = 1; /* the plan's network bandwidth is its data's, as its closed forms take it */
    s.nic_alpha = c->net.alpha;
    for (int i = 0; i < s.nslow; i++) /* a slow rank past a smaller n of the scaling table is not there */
        if (s.slow[i].rank >= n) s.slow[i--] = s.slow[--s.nslow];
    return s;
}

int tally__plan_simulate(const tally__plan_cfg *c, int n, const tally__plan_step *s, tally__plan_simulated *out) {
    memset(out, 0, sizeof *out);
    tally__sim_cluster cl = cluster_of(c, n);
    int K = c->accum > 0 ? c->accum : 1;
    tally__sim_train t = {.grad_bytes = tally__plan_grad_bytes(c),
                          .bucket_bytes = c->bucket_bytes,
                          .nlayers = c->nlayers > 0 ? c->nlayers : 1,
                          .zero = c->zero,
                          .accum = K,
                          .compute_s = s->compute / K,
                          .update_s = c->zero >= 1 ? s->update * n : s->update,
                          .steps = cl.nslow > 0 || cl.compute_sd > 0 ? 20 : 1,
                          .algo = c->algo,
                          .method = TALLY__SIM_AUTO};
    tally__sim_step r;
    int rc = tally__sim_train_step(&cl, &t, &r);
    if (rc) return rc;
    *out = (tally__plan_simulated){.step_s = r.step_s,
                                   .comm_s = r.comm_s,
                                   .exposed_s = r.exposed_s,
                                   .samples_per_s = r.step_s > 0 ? n * (double)c->batch * K / r.step_s : 0,
                                   .method = r.big.method,
                                   .algo = r.big.algo,
                                   .pace_rank = r.pace_rank,
                                   .pace_share = r.pace_share};
    return 0;
}
