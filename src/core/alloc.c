/* alloc.c - large, aligned allocations with huge-page advice, shared by the data sets, the model,
 * the optimizers and ZeRO's shards. */
#include "alloc.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define HUGE_PAGE (2u << 20)

static size_t alloc_align(size_t bytes) { return bytes >= HUGE_PAGE ? HUGE_PAGE : 64; }

static size_t alloc_rounded(size_t bytes) {
    size_t align = alloc_align(bytes);
    return bytes ? (bytes + align - 1) / align * align : align;
}

void *tally__alloc_big(size_t bytes) {
    if (bytes > (size_t)-1 - HUGE_PAGE) return NULL;
    size_t align = alloc_align(bytes), rounded = alloc_rounded(bytes);
    void *p = aligned_alloc(align, rounded);
    if (p && align == HUGE_PAGE) madvise(p, rounded, MADV_HUGEPAGE); /* advice only */
    return p;
}

void *tally__alloc_zeroed(size_t bytes) {
    void *p = tally__alloc_big(bytes);
    if (p) memset(p, 0, alloc_rounded(bytes));
    return p;
}
