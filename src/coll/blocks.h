/* blocks.h - how the algorithms cut a vector: n near-equal blocks (the first count % n one element
 * longer), pipeline segments of a fixed byte size, and when a vector is too small to be worth cutting. */
#ifndef TALLY_COLL_BLOCKS_H
#define TALLY_COLL_BLOCKS_H

#include <stddef.h>

/* Pipelined algorithms (tree, ring broadcast) move segments of this many bytes: large enough that the
 * per-message latency is amortised, small enough that a segment just written is still in cache. */
#define TALLY__SEG_BYTES ((size_t)128 << 10)

/* rhd switches from halving-doubling to full-vector recursive doubling at or below this many bytes
 * (or when there are fewer elements than ranks): there the latency of the extra rounds dominates. */
#define TALLY__RHD_SMALL_BYTES ((size_t)16 << 10)

/* Elements in block b of `count` cut into n blocks. */
static inline size_t tally__blk_count(size_t count, int n, int b) {
    return count / (size_t)n + ((size_t)b < count % (size_t)n);
}

/* First element of block b (b may be n: the end of the vector). */
static inline size_t tally__blk_start(size_t count, int n, int b) {
    size_t q = count / (size_t)n, r = count % (size_t)n, bb = (size_t)b;
    return bb * q + (bb < r ? bb : r);
}

/* Elements per pipeline segment for elements of `esize` bytes (at least one). */
static inline size_t tally__seg_elems(size_t esize) {
    size_t e = TALLY__SEG_BYTES / esize;
    return e ? e : 1;
}

/* Number of pipeline segments of a vector of `count` elements (at least one). */
static inline size_t tally__seg_count(size_t count, size_t esize) {
    size_t e = tally__seg_elems(esize);
    return count ? (count + e - 1) / e : 1;
}

/* Byte address of element `i` of a buffer of `esize`-byte elements (const or not: callers know which). */
static inline char *tally__at(const void *buf, size_t i, size_t esize) { return (char *)buf + i * esize; }

/* The largest power of two <= n (n >= 1), and ceil(log2 n). */
static inline int tally__pow2_floor(int n) {
    int p = 1;
    while (p * 2 <= n) p *= 2;
    return p;
}
static inline int tally__log2_ceil(int n) {
    int l = 0;
    while ((1 << l) < n) l++;
    return l;
}

#endif
