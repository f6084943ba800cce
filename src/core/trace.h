/* trace.h - the timeline (TALLY_TRACE=FILE, `--trace FILE`): this process's spans in a bounded ring, each
 * on the track of the thread that ran it, and their Chrome trace-event JSON with the clock moved to rank 0's. */
#ifndef TALLY_CORE_TRACE_H
#define TALLY_CORE_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "clock.h"

/* Nonzero while recording: the one branch a span costs when the timeline is off. */
extern int tally__trace_on;

#define TALLY__TRACE_MAX (1u << 26) /* tally_config.trace_events' upper bound (TALLY_TRACE_EVENTS) */

/* One argument of a span: a number, or (str not NULL) a string that outlives the trace (a literal). */
typedef struct tally__trace_arg {
    const char *key;
    const char *str;
    int64_t num;
} tally__trace_arg;

/* Starts recording into a ring of `events` spans (the world's init, when its config names a trace file;
 * the ring is process-wide: a later world adds to it); TALLY_E_NOMEM. */
int tally__trace_start(size_t events);
/* Stops recording and frees the ring. */
void tally__trace_stop(void);
static inline uint64_t tally__trace_now(void) { return tally__now_ns(); }
/* A span [t0, t1] (tally__trace_now) of the calling thread; name is copied (its first 39 bytes), cat and
 * the args' keys and strings are kept as pointers. Thread-safe. */
void tally__trace_span(const char *cat, const char *name, uint64_t t0, uint64_t t1, const tally__trace_arg *args,
                       int nargs);
/* Names the calling thread's track ("main", "comm"); a track without a name is "thread K". */
void tally__trace_thread(const char *name);
/* Spans the ring lost to newer ones. */
uint64_t tally__trace_dropped(void);
/* This process's events as JSON objects joined by ",\n" (none after the last): the track names (pid = rank, labelled
 * `label`), then the spans oldest first, with ts in microseconds since origin_ns of rank 0's clock, where
 * rank 0's clock reads this one's less offset_ns. *out is malloc'd. 0 or TALLY_E_NOMEM. */
int tally__trace_json(int rank, const char *label, int64_t offset_ns, uint64_t origin_ns, char **out, size_t *len);

#endif
