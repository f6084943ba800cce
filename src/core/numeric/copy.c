/* copy.c - tally__copy_out: memcpy below TALLY__COPY_STREAM_MIN, above it (and tally__copy_stream always)
 * SSE2's non-temporal stores (x86-64's baseline, so no dispatch), fenced so the bytes are out before any
 * flag that follows. */
#include "copy.h"

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <emmintrin.h>

/* dst 16-byte aligned; n a multiple of 64. */
static void copy_stream(unsigned char *dst, const unsigned char *src, size_t n) {
    for (size_t k = 0; k < n; k += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + k)), b = _mm_loadu_si128((const __m128i *)(src + k + 16)),
                c = _mm_loadu_si128((const __m128i *)(src + k + 32)),
                d = _mm_loadu_si128((const __m128i *)(src + k + 48));
        _mm_stream_si128((__m128i *)(dst + k), a);
        _mm_stream_si128((__m128i *)(dst + k + 16), b);
        _mm_stream_si128((__m128i *)(dst + k + 32), c);
        _mm_stream_si128((__m128i *)(dst + k + 48), d);
    }
    _mm_sfence(); /* weakly ordered: out before the caller's next store (a flag a peer reads) */
}
#endif

static int overlapping(const void *a, const void *b, size_t n) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + n && y < x + n;
}

void tally__copy_stream(void *dst, const void *src, size_t n) {
#if defined(__x86_64__)
    unsigned char *d = dst;
    const unsigned char *s = src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (head > n) head = n;
    memcpy(d, s, head);
    size_t body = (n - head) & ~(size_t)63;
    copy_stream(d + head, s + head, body);
    memcpy(d + head + body, s + head + body, n - head - body);
#else
    memcpy(dst, src, n);
#endif
}

void tally__copy_out(void *dst, const void *src, size_t n) {
    if (!n || dst == src) return;
    if (n >= TALLY__COPY_STREAM_MIN && !overlapping(dst, src, n))
        tally__copy_stream(dst, src, n);
    else
        memmove(dst, src, n);
}
