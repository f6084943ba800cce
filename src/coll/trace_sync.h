/* trace_sync.h - the timeline across ranks (trace_sync.c): clock offsets measured at init, and the spans
 * gathered to rank 0 at the end. */
#ifndef TALLY_COLL_TRACE_SYNC_H
#define TALLY_COLL_TRACE_SYNC_H

#include <stdint.h>

#include "coll.h"

typedef struct tally__trace_clock {
    int64_t offset_ns;  /* this rank's clock less rank 0's */
    uint64_t origin_ns; /* rank 0's clock when the timeline began: ts 0 */
    int64_t *offsets;   /* rank 0: each rank's offset */
    double *rtt_ns;     /* rank 0: the round trip each offset was taken from */
} tally__trace_clock;

/* Collective (the communicator's sig must name a set-up exchange, the same on every rank). */
int tally__trace_sync(const tally__ctx *c, tally__trace_clock *clk);
/* Writes the timeline: healthy, rank 0 gathers every rank's spans into path (collective); else each rank
 * writes its own to path.rank<R>. A world of one writes path. */
int tally__trace_write(const tally__ctx *c, const tally__trace_clock *clk, const char *path, int healthy);
void tally__trace_clock_free(tally__trace_clock *clk);

#endif
