/* alloc.h - the trainer's allocations of large arrays (data sets, parameters, gradients, optimizer
 * state, shards): 64-byte aligned, and asking for huge pages once they span one; and scratch kept from
 * one use to the next (a fresh large block is a fresh mmap, whose first touch faults every page in). */
#ifndef TALLY_CORE_ALLOC_H
#define TALLY_CORE_ALLOC_H

#include <stdatomic.h>
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

/* One block, grown to the largest asked for; lent to one taker at a time (a second taker meanwhile, or a
 * context without one, gets malloc's). */
typedef struct tally__scratch {
    void *buf;
    size_t cap;
    _Atomic int lent;
} tally__scratch;

/* bytes of scratch (NULL: no memory). s may be NULL. */
void *tally__scratch_take(tally__scratch *s, size_t bytes);
/* Gives back what take returned (p may be NULL). */
void tally__scratch_give(tally__scratch *s, void *p);
/* Frees the kept block (s may be NULL). */
void tally__scratch_fini(tally__scratch *s);

/* ---- memory tally_mem_keep kept past its communicator, until tally_mem_release: one process-wide
 * registry whatever the memory is (a heap block, a shared mapping), each entry with the way it goes. */
typedef void (*tally__kept_free_fn)(void *base, size_t len);

/* Lists base (len bytes) until tally__kept_release; 0, or -1 when no memory is left for the entry (the
 * caller then leaks the block rather than free it under the user, who may still hold it). */
int tally__kept_add(void *base, size_t len, tally__kept_free_fn release);

/* Releases base (its entry's release function) when it is listed: 1, else 0. Safe in a forked child:
 * the registry's lock is held across fork() (pthread_atfork), so the child's copy is whole and unlocked,
 * and what it releases there is its own copy of the memory. */
int tally__kept_release(void *base);

#endif
