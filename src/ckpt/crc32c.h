/* crc32c.h - CRC32C (Castagnoli, reflected polynomial 0x82F63B78) for checkpoint files, computed by
 * ISA-L (crc32_iscsi): the same polynomial as format v1 has always used. */
#ifndef TALLY_CKPT_CRC32C_H
#define TALLY_CKPT_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* CRC32C of buf continued from crc, with the usual pre- and post-inversion kept inside: start with 0,
 * and crc32c(crc32c(0, a), b) == crc32c(0, a followed by b). "123456789" gives 0xE3069283. */
uint32_t tally__crc32c(uint32_t crc, const void *buf, size_t len);

#endif
