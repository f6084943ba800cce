/* alloc.h - the trainer's allocations of large arrays (data sets, parameters, gradients, optimizer
 * state, shards): 64-byte aligned, and asking for huge pages once they span one. */
#ifndef TALLY_CORE_ALLOC_H
#define TALLY_CORE_ALLOC_H

#include <stddef.h>

/* Uninitialised; 64-byte aligned; from 2 MiB up, 2 MiB aligned and advised to use huge pages (sweeps
 * and random row gathers cost a page walk per 4 KiB otherwise, under a hypervisor's nested paging
 * above all). Never NULL for 0 bytes unless out of memory. Free with free(). */
void *tally__alloc_big(size_t bytes);
/* The same, zeroed. */
void *tally__alloc_zeroed(size_t bytes);

/* Where a buffer that the communicator's peers read in place comes from (tally_mem_alloc): handed
 * down by the layer that owns the communicator, so the ones below need not know it. */
typedef struct tally__mem_source {
    void *(*alloc)(void *ctx, size_t bytes);
    void (*release)(void *ctx, void *p);
    void *ctx;
} tally__mem_source;

#endif
