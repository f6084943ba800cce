/* cpus.h - how many CPUs this process may run on: its affinity mask (taskset, a cgroup's cpuset), not
 * the machine's count, so a thread count is bounded by what the process can really use. */
#ifndef TALLY_CORE_CPUS_H
#define TALLY_CORE_CPUS_H

#include <stddef.h>

/* CPUs in this process's affinity set; the online count when the set cannot be read; at least 1. */
int tally__cpus_allowed(void);
/* This thread's affinity as a list of ranges, "0-3,8" ("?" when it cannot be read). */
void tally__cpus_list(char *buf, size_t n);

#endif
