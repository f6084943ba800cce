/* alloc.h - the trainer's allocations of large arrays (data sets, parameters, gradients, optimizer
 * state, shards): 64-byte aligned, and asking for huge pages once they span one. */
#ifndef TALLY_TRAIN_ALLOC_H
#define TALLY_TRAIN_ALLOC_H

#include <stddef.h>

/* Uninitialised; 64-byte aligned; from 2 MiB up, 2 MiB aligned and advised to use huge pages (sweeps
 * and random row gathers cost a page walk per 4 KiB otherwise, under a hypervisor's nested paging
 * above all). Never NULL for 0 bytes unless out of memory. Free with free(). */
void *tally__alloc_big(size_t bytes);
/* The same, zeroed. */
void *tally__alloc_zeroed(size_t bytes);

#endif
