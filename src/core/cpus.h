/* cpus.h - how many CPUs this process may run on: its affinity mask (taskset, a cgroup's cpuset), not
 * the machine's count, so a thread count is bounded by what the process can really use. */
#ifndef TALLY_CORE_CPUS_H
#define TALLY_CORE_CPUS_H

#include <sched.h>
#include <stddef.h>
#include <stdint.h>

/* CPUs in this process's affinity set; the online count when the set cannot be read; at least 1. */
int tally__cpus_allowed(void);
/* This thread's affinity as a list of ranges, "0-3,8" ("?" when it cannot be read). */
void tally__cpus_list(char *buf, size_t n);

/* The CPU this thread runs on + 1, 0 when unknown (glibc reads it from rseq: a load, no system call). */
unsigned tally__cpus_current(void);
/* Moves this thread to a CPU of its affinity set not in `busy` (the k-th such, k = salt mod their
 * number, so threads moving at once spread) and gives the set back at once: the kernel migrates a
 * thread whose set excludes its CPU, and restoring the set keeps it exactly as bound (or unbound) as
 * its launcher made it. Returns the CPU moved to, or -1 when every CPU of the set is busy. */
int tally__cpus_move_off(const cpu_set_t *busy, int salt);

/* How long a waiter has been yielding to a peer on its own CPU: yields further apart than 5 ms belong to
 * different spells and start the sum again. */
typedef struct tally__crowding {
    uint64_t ns, at; /* the spell's idle time so far, and tally__now_ns() of its latest yield */
} tally__crowding;
/* Counts one more such yield, now. 1 when the spell has lasted 0.1 ms: time for one of the two to move
 * (the count starts again). */
int tally__crowding_yield(tally__crowding *c, uint64_t now);

#endif
