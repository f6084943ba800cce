/* clock.h - monotonic time and deadlines for bounded waits. */
#ifndef TALLY_CORE_CLOCK_H
#define TALLY_CORE_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t tally__now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}
static inline double tally__now_s(void) { return (double)tally__now_ns() * 1e-9; }
/* A deadline `seconds` from now, in tally__now_ns() units. */
static inline uint64_t tally__deadline(double seconds) { return tally__now_ns() + (uint64_t)(seconds * 1e9); }

#endif
