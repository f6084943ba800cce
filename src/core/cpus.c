/* cpus.c - the CPUs this process may use, from sched_getaffinity (the set taskset or a cgroup gave it),
 * falling back to the online count. */
#include "cpus.h"

#include <sched.h>
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
