/* crc32c.c - CRC32C for checkpoint files through ISA-L's crc32_iscsi (Debian's libisal-dev), which picks
 * the CPU's fastest kernel at run time; this file only keeps tally's convention and lengths over 2 GiB. */
#include "crc32c.h"

#include <isa-l/crc.h>

/* crc32_iscsi takes an int length. */
#define CRC_CHUNK ((size_t)1 << 30)

/* ISA-L's crc32_iscsi works on the raw register: our 0 start is its ~0 start, and its result inverted
 * is ours; so continuing from crc means starting it from ~crc. */
uint32_t tally__crc32c(uint32_t crc, const void *buf, size_t len) {
    const unsigned char *p = buf;
    uint32_t c = ~crc;
    while (len) {
        size_t n = len < CRC_CHUNK ? len : CRC_CHUNK;
        c = crc32_iscsi((unsigned char *)p, (int)n, c);
        p += n;
        len -= n;
    }
    return ~c;
}
