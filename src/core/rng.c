/* rng.c - splitmix64 and xoshiro256** (public-domain algorithms by Vigna), written for the trainer's
 * reproducible shuffles, initialisations and synthetic data. */
#include "rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void tally__rng_seed(tally__rng *r, uint64_t a, uint64_t b) {
    uint64_t x = a ^ (splitmix64(&b) + 0x632BE59BD9B4E019ull);
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t tally__rng_next(tally__rng *r) {
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

uint64_t tally__rng_below(tally__rng *r, uint64_t bound) {
    /* Rejecting the top partial range keeps every value equally likely. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t x;
    do x = tally__rng_next(r);
    while (x >= limit);
    return x % bound;
}

float tally__rng_uniform(tally__rng *r) { return (float)(tally__rng_next(r) >> 40) * (1.0f / 16777216.0f); }

float tally__rng_normal(tally__rng *r) {
    double u1 = ((double)(tally__rng_next(r) >> 11) + 1.0) * (1.0 / 9007199254740993.0); /* (0, 1] */
    double u2 = (double)(tally__rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}
