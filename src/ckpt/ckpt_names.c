/* ckpt_names.c - the rules a checkpoint's table entries follow, shared by writer and loader: dtypes and
 * shape sizes, valid names and how a doubtful one is quoted, and the index that finds a tensor by name. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_int.h"
#include "crc32c.h"

uint32_t tally__ckpt_head_crc_of(const unsigned char *head, uint32_t count) {
    /* The stored CRC fields are left out: a CRC run over bytes that end in their own CRC comes out the
     * same for every such run, so it would not tell one valid table from another. */
    uint32_t c = tally__crc32c(0, head, TALLY__CKPT_H_CRC);
    for (uint32_t i = 0; i < count; i++)
        c = tally__crc32c(c, head + TALLY__CKPT_HEADER_BYTES + (size_t)i * TALLY__CKPT_ENTRY_BYTES, TALLY__CKPT_E_CRC);
    return c;
}

size_t tally__ckpt_dtype_size(uint32_t dtype) {
    switch (dtype) {
    case TALLY_F32: return 4;
    case TALLY_F64: return 8;
    case TALLY_I64: return 8;
    case TALLY_U8: return 1;
    default: return 0;
    }
}

int tally__ckpt_shape_bytes(uint32_t dtype, uint32_t ndim, const uint64_t *shape, uint64_t *bytes) {
    uint64_t b = tally__ckpt_dtype_size(dtype);
    if (!b || ndim > TALLY__CKPT_MAX_DIMS) return -1;
    for (uint32_t d = 0; d < ndim; d++)
        if (__builtin_mul_overflow(b, shape[d], &b)) return -1;
    *bytes = b;
    return 0;
}

static int printable(unsigned char c) { return c >= 0x20 && c <= 0x7E; }

const char *tally__ckpt_name_defect(const unsigned char field[64], char *why, size_t cap) {
    const unsigned char *nul = memchr(field, 0, 64);
    if (!nul) return snprintf(why, cap, "is not NUL-terminated within its 64 bytes"), why;
    size_t len = (size_t)(nul - field);
    if (len == 0) return snprintf(why, cap, "is empty"), why;
    for (size_t i = 0; i < len; i++)
        if (!printable(field[i]))
            return snprintf(why, cap, "has byte 0x%02x at position %zu, which is not printable ASCII", field[i], i),
                   why;
    for (size_t i = len; i < 64; i++)
        if (field[i])
            return snprintf(why, cap, "has byte 0x%02x at position %zu, after its end, where only NULs belong",
                            field[i], i),
                   why;
    return NULL;
}

void tally__ckpt_name_quote(const unsigned char *field, size_t max, char *out, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < max && field[i] && o + 5 < cap; i++) {
        if (printable(field[i]) && field[i] != '\'' && field[i] != '\\')
            out[o++] = (char)field[i];
        else
            o += (size_t)snprintf(out + o, cap - o, "\\x%02x", field[i]);
    }
    if (cap) out[o < cap ? o : cap - 1] = '\0';
}

static uint32_t name_hash(const char *s) { /* FNV-1a */
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

int tally__ckpt_index_build(ckpt_index *x, const tally__ckpt_tensor *t, int n, int *dup_of) {
    uint32_t size = 16;
    while (size < 2u * (uint32_t)n) size *= 2;
    x->slot = calloc(size, sizeof *x->slot);
    x->mask = size - 1;
    if (!x->slot) return -1;
    for (int i = 0; i < n; i++) {
        uint32_t h = name_hash(t[i].name) & x->mask;
        for (; x->slot[h]; h = (h + 1) & x->mask) {
            if (!strcmp(t[x->slot[h] - 1].name, t[i].name)) {
                *dup_of = (int)x->slot[h] - 1;
                return i;
            }
        }
        x->slot[h] = (uint32_t)i + 1;
    }
    return n;
}

int tally__ckpt_index_find(const ckpt_index *x, const tally__ckpt_tensor *t, const char *name) {
    if (!x->slot) return -1;
    for (uint32_t h = name_hash(name) & x->mask; x->slot[h]; h = (h + 1) & x->mask)
        if (!strcmp(t[x->slot[h] - 1].name, name)) return (int)x->slot[h] - 1;
    return -1;
}

void tally__ckpt_index_free(ckpt_index *x) {
    free(x->slot);
    x->slot = NULL;
}
