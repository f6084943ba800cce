/* place.c - the CPUs each local rank is bound to: the inherited affinity set (taskset, a cgroup's cpuset)
 * ordered by physical core from sysfs, rank r on the r-th block when the ranks fit, else nobody pinned. */
#include "place.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/core/parse.h"

int tally_place_parse(const char *name, const char *s, int *bind_core) {
    static const char *const words[] = {"core", "none", NULL};
    int w = 0;
    if (s && tally__parse_word(name, s, words, &w)) return -1;
    *bind_core = w == 0;
    return 0;
}

/* A CPU's (package, core) from sysfs; -1 when sysfs does not say (then every CPU counts as a core). */
static long core_key(int cpu) {
    char path[96];
    long pkg = 0, core = -1;
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", cpu);
    FILE *f = fopen(path, "r");
    if (f) {
        if (fscanf(f, "%ld", &pkg) != 1) pkg = 0;
        fclose(f);
    }
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/core_id", cpu);
    if ((f = fopen(path, "r"))) {
        if (fscanf(f, "%ld", &core) != 1) core = -1;
        fclose(f);
    }
    return core < 0 ? -1 : pkg * 1000000 + core;
}

/* The allowed CPUs, one thread of every core first (in CPU order), then the second threads, ... */
static int ordered_cpus(int *out, int cap, int *cores) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
    int n = 0;
    long keys[CPU_SETSIZE];
    for (int c = 0; c < CPU_SETSIZE && n < cap; c++)
        if (CPU_ISSET(c, &set)) keys[n] = core_key(c), out[n++] = c;
    int done[CPU_SETSIZE] = {0}, *order = malloc((size_t)n * sizeof *order), k = 0;
    if (!order) return -1;
    *cores = 0;
    for (int round = 0; k < n; round++) /* round t takes each core's t-th thread */
        for (int i = 0; i < n; i++) {
            if (done[i]) continue;
            int seen = 0; /* threads of this core already taken before i */
            for (int j = 0; j < i; j++) seen += keys[j] >= 0 && keys[j] == keys[i];
            if (keys[i] >= 0 ? seen == round : round == 0) {
                order[k++] = out[i];
                done[i] = 1;
                *cores += round == 0;
            }
        }
    memcpy(out, order, (size_t)n * sizeof *out);
    free(order);
    return n;
}

int tally_place_plan(int n, int per, int bind_core, tally_place *p) {
    memset(p, 0, sizeof *p);
    p->n = n;
    p->per = per > 0 ? per : 1;
    p->order = malloc(CPU_SETSIZE * sizeof *p->order);
    if (!p->order) return -1;
    int allowed = ordered_cpus(p->order, CPU_SETSIZE, &p->cores);
    if (allowed < 0) {
        tally_place_free(p);
        return -1;
    }
    p->allowed = allowed;
    p->pinned = bind_core && (long)n * p->per <= allowed;
    return 0;
}

void tally_place_free(tally_place *p) {
    free(p->order);
    p->order = NULL;
}
