/* kept.h - memory tally_mem_keep kept past its communicator, until tally_mem_release: one process-wide
 * registry whatever the memory is (a heap block, a shared mapping), each entry with the way it goes. */
#ifndef TALLY_CORE_KEPT_H
#define TALLY_CORE_KEPT_H

#include <stddef.h>

typedef void (*tally__kept_free_fn)(void *base, size_t len);

/* Lists base (len bytes) until tally__kept_release; 0, or -1 when no memory is left for the entry (the
 * caller then leaks the block rather than free it under the user, who may still hold it). */
int tally__kept_add(void *base, size_t len, tally__kept_free_fn release);

/* Releases base (its entry's release function) when it is listed: 1, else 0. Safe in a forked child:
 * the registry's lock is held across fork() (pthread_atfork), so the child's copy is whole and unlocked,
 * and what it releases there is its own copy of the memory. */
int tally__kept_release(void *base);

#endif
