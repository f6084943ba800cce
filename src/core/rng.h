/* rng.h - the trainer's deterministic random numbers (splitmix64 seeding a xoshiro256** stream):
 * the same seed gives the same numbers on every rank and every machine. */
#ifndef TALLY_CORE_RNG_H
#define TALLY_CORE_RNG_H

#include <stdint.h>

typedef struct tally__rng {
    uint64_t s[4];
} tally__rng;

/* Seeds a stream from any number of 64-bit words (e.g. seed, epoch, purpose). */
void tally__rng_seed(tally__rng *r, uint64_t a, uint64_t b);
uint64_t tally__rng_next(tally__rng *r);
/* Uniform in [0, bound), without modulo bias. bound > 0. */
uint64_t tally__rng_below(tally__rng *r, uint64_t bound);
/* Uniform float in [0, 1). */
float tally__rng_uniform(tally__rng *r);
/* Standard normal (Box-Muller; deterministic, uses two draws). */
float tally__rng_normal(tally__rng *r);

#endif
