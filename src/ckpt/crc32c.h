/* crc32c.h - CRC32C (Castagnoli, reflected polynomial 0x82F63B78) for checkpoint files: a portable
 * slicing-by-8 version and the SSE4.2 crc32 instruction, chosen once by what the CPU has. */
#ifndef TALLY_TRAIN_CRC32C_H
#define TALLY_TRAIN_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* CRC32C of buf continued from crc, with the usual pre- and post-inversion kept inside: start with 0,
 * and crc32c(crc32c(0, a), b) == crc32c(0, a followed by b). "123456789" gives 0xE3069283. */
uint32_t tally__crc32c(uint32_t crc, const void *buf, size_t len);

/* The two implementations, for tests: the table-driven one always works; the hardware one only where
 * tally__crc32c_hw_available() says 1 (it returns 0 on other CPUs and architectures). */
uint32_t tally__crc32c_sw(uint32_t crc, const void *buf, size_t len);
uint32_t tally__crc32c_hw(uint32_t crc, const void *buf, size_t len);
int tally__crc32c_hw_available(void);

#endif
