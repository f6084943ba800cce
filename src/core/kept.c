/* kept.c - the process-wide registry of memory kept past its communicator (kept.h): a list under one
 * lock, held across fork() so that a child never inherits it locked or half-changed. */
#include "kept.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct kept_block {
    struct kept_block *next;
    void *base;
    size_t len;
    tally__kept_free_fn release;
} kept_block;

static pthread_mutex_t kept_mu = PTHREAD_MUTEX_INITIALIZER;
static kept_block *kept_list;
static pthread_once_t kept_once = PTHREAD_ONCE_INIT;

static void kept_lock(void) { pthread_mutex_lock(&kept_mu); }
static void kept_unlock(void) { pthread_mutex_unlock(&kept_mu); }
static void kept_watch_forks(void) { pthread_atfork(kept_lock, kept_unlock, kept_unlock); }

int tally__kept_add(void *base, size_t len, tally__kept_free_fn release) {
    pthread_once(&kept_once, kept_watch_forks);
    kept_block *k = malloc(sizeof *k);
    if (!k) return -1;
    *k = (kept_block){.base = base, .len = len, .release = release};
    kept_lock();
    k->next = kept_list;
    kept_list = k;
    kept_unlock();
    return 0;
}

int tally__kept_release(void *base) {
    kept_block *k = NULL;
    kept_lock();
    for (kept_block **at = &kept_list; *at; at = &(*at)->next)
        if ((*at)->base == base) {
            k = *at;
            *at = k->next;
            break;
        }
    kept_unlock();
    if (!k) return 0;
    k->release(k->base, k->len);
    free(k);
    return 1;
}
