/* cpus.c - the CPUs this process may use, from sched_getaffinity (the set taskset or a cgroup gave it),
 * falling back to the online count. */
#include "cpus.h"

#include <sched.h>
#include <stdio.h>
#include <unistd.h>

int tally__cpus_allowed(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

void tally__cpus_list(char *buf, size_t n) {
    cpu_set_t set;
    size_t o = 0;
    buf[0] = '\0';
    if (sched_getaffinity(0, sizeof set, &set) != 0) {
        snprintf(buf, n, "?");
        return;
    }
    for (int c = 0; c < CPU_SETSIZE && o < n; c++) {
        if (!CPU_ISSET(c, &set)) continue;
        int e = c;
        while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, &set)) e++;
        o += (size_t)snprintf(buf + o, n - o, e > c ? "%s%d-%d" : "%s%d", o ? "," : "", c, e);
        c = e;
    }
}
