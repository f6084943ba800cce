/* crc32c.c - CRC32C: slicing-by-8 tables built once, the SSE4.2 instruction on x86 when the CPU has
 * it, and the dispatch between them. */
#include "crc32c.h"

#include <pthread.h>
#include <stdatomic.h>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define CRC_X86 1
#include <nmmintrin.h>
#endif

#define CRC_POLY 0x82F63B78u

/* crc_table[k][b]: the CRC of byte b followed by k zero bytes, so 8 lookups advance 8 bytes at once. */
static uint32_t crc_table[8][256];
static pthread_once_t crc_table_once = PTHREAD_ONCE_INIT;

static void crc_table_build(void) {
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int i = 0; i < 8; i++) c = (c >> 1) ^ (CRC_POLY & (0u - (c & 1u)));
        crc_table[0][b] = c;
    }
    for (int k = 1; k < 8; k++)
        for (uint32_t b = 0; b < 256; b++)
            crc_table[k][b] = (crc_table[k - 1][b] >> 8) ^ crc_table[0][crc_table[k - 1][b] & 0xFFu];
}

/* Little-endian loads whatever the host, so the tables stay valid on any byte order. */
static inline uint32_t load_le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

uint32_t tally__crc32c_sw(uint32_t crc, const void *buf, size_t len) {
    pthread_once(&crc_table_once, crc_table_build);
    const unsigned char *p = buf;
    uint32_t c = ~crc;
    for (; len && ((uintptr_t)p & 7u); len--) c = (c >> 8) ^ crc_table[0][(c ^ *p++) & 0xFFu];
    for (; len >= 8; len -= 8, p += 8) {
        uint32_t lo = load_le32(p) ^ c, hi = load_le32(p + 4);
        c = crc_table[7][lo & 0xFFu] ^ crc_table[6][(lo >> 8) & 0xFFu] ^ crc_table[5][(lo >> 16) & 0xFFu] ^
            crc_table[4][lo >> 24] ^ crc_table[3][hi & 0xFFu] ^ crc_table[2][(hi >> 8) & 0xFFu] ^
            crc_table[1][(hi >> 16) & 0xFFu] ^ crc_table[0][hi >> 24];
    }
    for (; len; len--) c = (c >> 8) ^ crc_table[0][(c ^ *p++) & 0xFFu];
    return ~c;
}

#ifdef CRC_X86
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const unsigned char *p, size_t len) {
    uint32_t c = ~crc;
    for (; len && ((uintptr_t)p & 7u); len--) c = _mm_crc32_u8(c, *p++);
#ifdef __x86_64__
    uint64_t c64 = c;
    for (; len >= 8; len -= 8, p += 8) {
        uint64_t w;
        __builtin_memcpy(&w, p, 8);
        c64 = _mm_crc32_u64(c64, w);
    }
    c = (uint32_t)c64;
#endif
    for (; len >= 4; len -= 4, p += 4) {
        uint32_t w;
        __builtin_memcpy(&w, p, 4);
        c = _mm_crc32_u32(c, w);
    }
    for (; len; len--) c = _mm_crc32_u8(c, *p++);
    return ~c;
}

int tally__crc32c_hw_available(void) {
    __builtin_cpu_init(); /* we may run before libgcc's own constructor */
    return __builtin_cpu_supports("sse4.2") != 0;
}

uint32_t tally__crc32c_hw(uint32_t crc, const void *buf, size_t len) { return crc_hw(crc, buf, len); }
#else
int tally__crc32c_hw_available(void) { return 0; }

/* Never chosen here; kept so tests link everywhere. */
uint32_t tally__crc32c_hw(uint32_t crc, const void *buf, size_t len) { return tally__crc32c_sw(crc, buf, len); }
#endif

typedef uint32_t (*crc_fn)(uint32_t, const void *, size_t);
static _Atomic(crc_fn) crc_chosen;

uint32_t tally__crc32c(uint32_t crc, const void *buf, size_t len) {
    crc_fn f = atomic_load_explicit(&crc_chosen, memory_order_relaxed);
    if (!f) { /* racing first callers store the same answer */
        f = tally__crc32c_hw_available() ? tally__crc32c_hw : tally__crc32c_sw;
        atomic_store_explicit(&crc_chosen, f, memory_order_relaxed);
    }
    return f(crc, buf, len);
}
