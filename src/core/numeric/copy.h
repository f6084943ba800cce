/* copy.h - copies of a collective's own block into an output that tally does not read back: large ones
 * with non-temporal stores, which skip reading the destination in first and leave the caches alone. */
#ifndef TALLY_CORE_COPY_H
#define TALLY_CORE_COPY_H

#include <stddef.h>

/* From this many bytes a copy streams: one that size would leave little in a core's caches anyway. */
#define TALLY__COPY_STREAM_MIN ((size_t)16 << 20)

/* Copies n bytes from src to dst, which may overlap (then as memmove). */
void tally__copy_out(void *dst, const void *src, size_t n);
/* Copies n bytes with non-temporal stores whatever n (the caller knows the whole output is large); dst and
 * src must not overlap. Fenced, as tally__copy_out. */
void tally__copy_stream(void *dst, const void *src, size_t n);

#endif
