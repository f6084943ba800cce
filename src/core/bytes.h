/* bytes.h - integers in a fixed byte order on the wire and on disk: big-endian for the rendezvous and the
 * parameter server's frames (network order), little-endian for checkpoint files (format v1). */
#ifndef TALLY_CORE_BYTES_H
#define TALLY_CORE_BYTES_H

#include <stdint.h>

static inline void tally__put_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16), p[2] = (unsigned char)(v >> 8),
    p[3] = (unsigned char)v;
}
static inline uint32_t tally__get_be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static inline void tally__put_be64(unsigned char *p, uint64_t v) {
    tally__put_be32(p, (uint32_t)(v >> 32));
    tally__put_be32(p + 4, (uint32_t)v);
}
static inline uint64_t tally__get_be64(const unsigned char *p) {
    return (uint64_t)tally__get_be32(p) << 32 | tally__get_be32(p + 4);
}

static inline void tally__put_le32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline void tally__put_le64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline uint32_t tally__get_le32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static inline uint64_t tally__get_le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

#endif
