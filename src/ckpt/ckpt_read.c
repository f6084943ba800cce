/* ckpt_read.c - the checkpoint loader: verifies an image (header, every table entry, layout, names, data
 * CRCs, padding) before anything is used; reads files whole; follows LATEST; looks tensors up by name. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/err.h"
#include "../core/file.h"
#include "ckpt_int.h"
#include "crc32c.h"

struct tally__ckpt {
    const unsigned char *base;
    size_t len;
    void *owned; /* base, read from a file and ours to free, or NULL when the caller owns the memory */
    int count;
    int64_t step;
    uint32_t head_crc;
    tally__ckpt_tensor *t;
    ckpt_index index;
    char label[];
};

/* "checkpoint LABEL: " + the formatted text, as TALLY_E_CORRUPT. */
__attribute__((format(printf, 2, 3))) static int bad(const char *label, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return tally__seterr(TALLY_E_CORRUPT, "checkpoint %s: %s", label, msg);
}

static void shape_text(const tally__ckpt_tensor *t, char *out, size_t cap) {
    size_t o = (size_t)snprintf(out, cap, "[");
    for (int d = 0; d < t->ndim && o < cap; d++)
        o += (size_t)snprintf(out + o, cap - o, "%s%" PRIu64, d ? ", " : "", t->shape[d]);
    if (o < cap) snprintf(out + o, cap - o, "]");
}

/* ---- verification ---- */

static int check_header(const unsigned char *p, size_t len, const char *L, uint32_t *count, int64_t *step) {
    if (len < TALLY__CKPT_HEADER_BYTES)
        return bad(L, "the file is %zu bytes, shorter than the 64-byte header: it is truncated", len);
    if (memcmp(p, TALLY__CKPT_MAGIC, 8))
        return bad(L, "it does not start with '" TALLY__CKPT_MAGIC "': not a tally checkpoint, or its first bytes "
                      "are corrupt");
    uint32_t stored = tally__get_le32(p + TALLY__CKPT_H_CRC), computed = tally__crc32c(0, p, TALLY__CKPT_H_CRC);
    if (stored != computed)
        return bad(L, "header CRC32C mismatch (stored 0x%08" PRIx32 ", computed 0x%08" PRIx32 "): the file is corrupt",
                   stored, computed);
    uint32_t version = tally__get_le32(p + TALLY__CKPT_H_VERSION);
    if (version != TALLY__CKPT_VERSION)
        return bad(L,
                   "format version %" PRIu32 ", but this tally reads version %u: load it with the tally that wrote it",
                   version, TALLY__CKPT_VERSION);
    uint32_t hb = tally__get_le32(p + TALLY__CKPT_H_HEADER_BYTES), eb = tally__get_le32(p + TALLY__CKPT_H_ENTRY_BYTES);
    if (hb != TALLY__CKPT_HEADER_BYTES || eb != TALLY__CKPT_ENTRY_BYTES)
        return bad(L,
                   "header of %" PRIu32 " bytes and entries of %" PRIu32 " bytes, but version 1 has 64 and 128: "
                   "the file is malformed",
                   hb, eb);
    for (unsigned i = TALLY__CKPT_H_RESERVED; i < TALLY__CKPT_H_CRC; i++)
        if (p[i]) return bad(L, "reserved header byte %u is 0x%02x, not zero: the file is malformed", i, p[i]);
    uint64_t file_bytes = tally__get_le64(p + TALLY__CKPT_H_FILE_BYTES);
    if (file_bytes > len)
        return bad(L, "the header says the file is %" PRIu64 " bytes, but it is %zu: it is truncated", file_bytes, len);
    if (file_bytes < len)
        return bad(L, "the header says the file is %" PRIu64 " bytes, but it is %zu: %" PRIu64 " trailing bytes",
                   file_bytes, len, (uint64_t)len - file_bytes);
    *count = tally__get_le32(p + TALLY__CKPT_H_COUNT);
    if (*count > TALLY__CKPT_MAX_TENSORS)
        return bad(L, "tensor count %" PRIu32 " exceeds the limit of %u: the file is malformed", *count,
                   TALLY__CKPT_MAX_TENSORS);
    uint64_t table = tally__get_le64(p + TALLY__CKPT_H_TABLE_BYTES), want = (uint64_t)*count * TALLY__CKPT_ENTRY_BYTES;
    if (table != want)
        return bad(L,
                   "table size %" PRIu64 " is not tensor count %" PRIu32 " x 128 = %" PRIu64 ": the file is malformed",
                   table, *count, want);
    if (table > len - TALLY__CKPT_HEADER_BYTES)
        return bad(L,
                   "the table of %" PRIu32 " entries (%" PRIu64 " bytes) does not fit in the %zu-byte file: it is "
                   "malformed or truncated",
                   *count, table, len);
    uint64_t s = tally__get_le64(p + TALLY__CKPT_H_STEP);
    if (s > (uint64_t)INT64_MAX) return bad(L, "step %" PRIu64 " is out of range: the file is malformed", s);
    *step = (int64_t)s;
    return 0;
}

/* Entry i's fields that do not depend on its place: CRC, name, dtype, shape, size. Fills t. */
static int check_entry_fields(const unsigned char *e, int i, const char *L, tally__ckpt_tensor *t) {
    unsigned char idx[4];
    tally__put_le32(idx, (uint32_t)i);
    uint32_t stored = tally__get_le32(e + TALLY__CKPT_E_CRC);
    uint32_t computed = tally__crc32c(tally__crc32c(0, idx, 4), e, TALLY__CKPT_E_CRC);
    char q[64 * 4 + 1], why[128];
    if (stored != computed || tally__ckpt_name_defect(e, why, sizeof why)) tally__ckpt_name_quote(e, 64, q, sizeof q);
    if (stored != computed)
        return bad(L,
                   "tensor #%d (name as read '%s'): table entry CRC32C mismatch (stored 0x%08" PRIx32
                   ", computed 0x%08" PRIx32 "): the file is corrupt",
                   i, q, stored, computed);
    if (tally__ckpt_name_defect(e, why, sizeof why))
        return bad(L, "tensor #%d (name as read '%s'): its name %s: the file is malformed", i, q, why);
    const char *name = (const char *)e; /* valid from here on */
    uint32_t dtype = tally__get_le32(e + TALLY__CKPT_E_DTYPE), ndim = tally__get_le32(e + TALLY__CKPT_E_NDIM);
    if (!tally__ckpt_dtype_size(dtype))
        return bad(L, "tensor '%s' (#%d): dtype code %" PRIu32 " is not f32, f64, i64 or u8: the file is malformed",
                   name, i, dtype);
    if (ndim > TALLY__CKPT_MAX_DIMS)
        return bad(L, "tensor '%s' (#%d): ndim %" PRIu32 " exceeds %d: the file is malformed", name, i, ndim,
                   TALLY__CKPT_MAX_DIMS);
    *t = (tally__ckpt_tensor){.name = name, .dtype = (tally_dtype)dtype, .ndim = (int)ndim};
    for (int d = 0; d < TALLY__CKPT_MAX_DIMS; d++) {
        t->shape[d] = tally__get_le64(e + TALLY__CKPT_E_SHAPE + 8 * d);
        if (d >= (int)ndim && t->shape[d])
            return bad(L,
                       "tensor '%s' (#%d): shape[%d] is %" PRIu64 " but ndim is %" PRIu32 ": unused dimensions "
                       "must be 0; the file is malformed",
                       name, i, d, t->shape[d], ndim);
    }
    char shape[160];
    shape_text(t, shape, sizeof shape);
    uint64_t want, bytes = tally__get_le64(e + TALLY__CKPT_E_BYTES);
    if (tally__ckpt_shape_bytes(dtype, ndim, t->shape, &want))
        return bad(L, "tensor '%s' (#%d): shape %s of %s elements overflows 64 bits: the file is malformed", name, i,
                   shape, tally_dtype_name(t->dtype));
    if (bytes != want)
        return bad(L,
                   "tensor '%s' (#%d): it records %" PRIu64 " data bytes, but %s %s needs %" PRIu64 ": the file "
                   "is malformed",
                   name, i, bytes, tally_dtype_name(t->dtype), shape, want);
    if (bytes > SIZE_MAX) return bad(L, "tensor '%s' (#%d): %" PRIu64 " bytes do not fit in memory", name, i, bytes);
    t->bytes = (size_t)bytes;
    return 0;
}

/* Entry i's place: aligned, inside the file, right after the previous tensor's padding (*pos). */
static int check_entry_place(size_t len, const unsigned char *e, int i, const char *L, const tally__ckpt_tensor *prev,
                             uint64_t data_start, uint64_t *pos) {
    uint64_t off = tally__get_le64(e + TALLY__CKPT_E_OFFSET), bytes = tally__get_le64(e + TALLY__CKPT_E_BYTES);
    const char *name = (const char *)e;
    if (off % TALLY__CKPT_ALIGN)
        return bad(L, "tensor '%s' (#%d): data offset %" PRIu64 " is not a multiple of 64: the file is malformed", name,
                   i, off);
    if (off > len || bytes > len - off || ckpt_align(bytes) > len - off)
        return bad(L,
                   "tensor '%s' (#%d): its data (offset %" PRIu64 ", %" PRIu64 " bytes, padded to 64) runs past "
                   "the end of the %zu-byte file: it is malformed or truncated",
                   name, i, off, bytes, len);
    if (off < data_start)
        return bad(L,
                   "tensor '%s' (#%d): data offset %" PRIu64 " overlaps the header and table, which end at %" PRIu64
                   ": the file is malformed",
                   name, i, off, data_start);
    if (off < *pos)
        return bad(L,
                   "tensor '%s' (#%d): data offset %" PRIu64 " overlaps tensor '%s' (#%d), whose data and "
                   "padding end at %" PRIu64 ": the file is malformed",
                   name, i, off, prev->name, i - 1, *pos);
    if (off > *pos)
        return bad(L,
                   "tensor '%s' (#%d): data offset %" PRIu64 " leaves a gap after %" PRIu64 ", where the previous "
                   "data and padding end: the file is malformed",
                   name, i, off, *pos);
    *pos = off + ckpt_align(bytes);
    return 0;
}

static int check_data(const unsigned char *p, const unsigned char *e, int i, const char *L,
                      const tally__ckpt_tensor *t) {
    uint64_t off = tally__get_le64(e + TALLY__CKPT_E_OFFSET);
    uint32_t stored = tally__get_le32(e + TALLY__CKPT_E_DATA_CRC), computed = tally__crc32c(0, p + off, t->bytes);
    if (stored != computed)
        return bad(L,
                   "tensor '%s' (#%d): data CRC32C mismatch (stored 0x%08" PRIx32 ", computed 0x%08" PRIx32 "): the "
                   "file is corrupt",
                   t->name, i, stored, computed);
    for (uint64_t k = off + t->bytes; k < off + ckpt_align(t->bytes); k++)
        if (p[k])
            return bad(L,
                       "tensor '%s' (#%d): padding byte at offset %" PRIu64 " after its data is 0x%02x, not "
                       "zero: the file is corrupt",
                       t->name, i, k, p[k]);
    return 0;
}

static int check_all(tally__ckpt *c, const char *L) {
    const unsigned char *p = c->base, *table = p + TALLY__CKPT_HEADER_BYTES;
    uint64_t data_start = TALLY__CKPT_HEADER_BYTES + (uint64_t)c->count * TALLY__CKPT_ENTRY_BYTES, pos = data_start;
    for (int i = 0; i < c->count; i++) {
        const unsigned char *e = table + (size_t)i * TALLY__CKPT_ENTRY_BYTES;
        int rc = check_entry_fields(e, i, L, &c->t[i]);
        if (!rc) rc = check_entry_place(c->len, e, i, L, i ? &c->t[i - 1] : NULL, data_start, &pos);
        if (rc) return rc;
        c->t[i].data = p + tally__get_le64(e + TALLY__CKPT_E_OFFSET);
    }
    if (pos != c->len)
        return bad(L,
                   "the tensors' data and padding end at %" PRIu64 ", but the file is %zu bytes: %" PRIu64
                   " trailing bytes; the file is malformed",
                   pos, c->len, (uint64_t)c->len - pos);
    int dup_of = -1, dup = tally__ckpt_index_build(&c->index, c->t, c->count, &dup_of);
    if (dup < 0) return tally__seterr(TALLY_E_NOMEM, "checkpoint %s: out of memory for its name index", L);
    if (dup < c->count)
        return bad(L, "tensor '%s' (#%d) has the same name as tensor #%d: the file is malformed", c->t[dup].name, dup,
                   dup_of);
    for (int i = 0; i < c->count; i++) {
        int rc = check_data(p, table + (size_t)i * TALLY__CKPT_ENTRY_BYTES, i, L, &c->t[i]);
        if (rc) return rc;
    }
    c->head_crc = tally__ckpt_head_crc_of(p, (uint32_t)c->count);
    return 0;
}

int tally__ckpt_parse(const void *buf, size_t len, const char *label, tally__ckpt **out) {
    if (!out) return tally__seterr(TALLY_E_INVALID, "tally__ckpt_parse: out is NULL");
    *out = NULL;
    if (!label) label = "(in memory)";
    if (!buf && len) return tally__seterr(TALLY_E_INVALID, "checkpoint %s: buffer is NULL", label);
    static const unsigned char empty[1];
    const unsigned char *p = buf ? buf : empty;
    uint32_t count = 0;
    int64_t step = 0;
    int rc = check_header(p, len, label, &count, &step);
    if (rc) return rc;
    /* The table fits in len, so what is allocated here is at most about the size of the image. */
    size_t lab = strlen(label) + 1;
    tally__ckpt *c = calloc(1, sizeof *c + lab);
    if (c) c->t = calloc(count ? count : 1, sizeof *c->t);
    if (!c || !c->t) {
        free(c);
        return tally__seterr(TALLY_E_NOMEM, "checkpoint %s: out of memory for a table of %" PRIu32 " tensors", label,
                             count);
    }
    memcpy(c->label, label, lab);
    c->base = p;
    c->len = len;
    c->count = (int)count;
    c->step = step;
    rc = check_all(c, label);
    if (rc) {
        tally__ckpt_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

void tally__ckpt_close(tally__ckpt *c) {
    if (!c) return;
    free(c->owned);
    tally__ckpt_index_free(&c->index);
    free(c->t);
    free(c);
}

/* ---- files ---- */

/* Reads fd (size bytes, already known) whole and verifies it under label; closes nothing. Read, not
 * mapped: a file truncated while mapped kills the process with SIGBUS at the first page past its end,
 * where a read names the file (tally__file_read_all); verification touches every byte anyway. */
static int read_and_parse(int fd, size_t size, const char *label, tally__ckpt **out) {
    if (size == 0) return tally__ckpt_parse(NULL, 0, label, out);
    char what[4200];
    snprintf(what, sizeof what, "checkpoint %s", label);
    unsigned char *m = NULL;
    int rc = tally__file_read_all(fd, what, size, &m);
    if (rc) return rc;
    rc = tally__ckpt_parse(m, size, label, out);
    if (rc) {
        free(m);
        return rc;
    }
    (*out)->owned = m;
    return 0;
}

/* The size tally__file_open_read saw, as a length this process can hold. */
static int whole_size(uint64_t bytes, const char *label, size_t *size) {
    if (bytes >= SIZE_MAX) return tally__seterr(TALLY_E_UNSUPPORTED, "checkpoint %s: too large to read here", label);
    *size = (size_t)bytes;
    return 0;
}

int tally__ckpt_open(const char *path, tally__ckpt **out) {
    if (!out || !path) return tally__seterr(TALLY_E_INVALID, "tally__ckpt_open: path or out is NULL");
    *out = NULL;
    char label[4200];
    snprintf(label, sizeof label, "checkpoint %s", path);
    uint64_t bytes = 0;
    int fd, rc = tally__file_open_read(AT_FDCWD, path, label, &fd, &bytes);
    if (rc) return rc;
    size_t size = 0;
    rc = whole_size(bytes, path, &size);
    if (!rc) rc = read_and_parse(fd, size, path, out);
    close(fd);
    return rc;
}

/* The file LATEST names, checked against the manifest. */
static int open_named(int dirfd, const char *dir, const ckpt_manifest *m, tally__ckpt **out) {
    char label[4096];
    size_t dl = strlen(dir);
    while (dl > 1 && dir[dl - 1] == '/') dl--;
    snprintf(label, sizeof label, "%.*s/%s", (int)dl, dir, m->file);
    char what[4200];
    snprintf(what, sizeof what, "checkpoint %s", label);
    uint64_t bytes = 0;
    int fd, rc = tally__file_open_read(dirfd, m->file, what, &fd, &bytes);
    if (rc == TALLY_E_SYSTEM && errno == ENOENT)
        return bad(label,
                   "LATEST names this file but it does not exist: it was removed by hand or by another "
                   "program; restore it, or remove %.*s/LATEST to start without a checkpoint",
                   (int)dl, dir);
    if (rc) return rc;
    size_t size = 0;
    rc = whole_size(bytes, label, &size);
    if (!rc && size != m->bytes)
        rc = bad(label, "the file is %zu bytes but LATEST says %" PRIu64 ": it was truncated or replaced", size,
                 m->bytes);
    if (!rc) rc = read_and_parse(fd, size, label, out);
    close(fd);
    if (rc) return rc;
    if ((*out)->step != m->step || (*out)->head_crc != m->head_crc) {
        rc = bad(label,
                 "it holds step %" PRId64 " with header CRC32C 0x%08" PRIx32 ", but LATEST says step %" PRId64
                 " with 0x%08" PRIx32 ": the file was replaced after it was committed",
                 (*out)->step, (*out)->head_crc, m->step, m->head_crc);
        tally__ckpt_close(*out);
        *out = NULL;
    }
    return rc;
}

int tally__ckpt_open_latest(const char *dir, tally__ckpt **out) {
    if (!out || !dir) return tally__seterr(TALLY_E_INVALID, "tally__ckpt_open_latest: dir or out is NULL");
    *out = NULL;
    char label[4200];
    snprintf(label, sizeof label, "checkpoint directory %s", dir);
    int dirfd, rc = tally__file_open_dir(dir, label, &dirfd);
    if (rc && errno == ENOENT)
        return tally__seterr(TALLY__CKPT_NONE, "no checkpoint in %s: the directory does not exist", dir);
    if (rc) return rc;
    ckpt_manifest m;
    rc = tally__ckpt_manifest_read(dirfd, dir, &m);
    if (rc == 0) rc = open_named(dirfd, dir, &m, out);
    close(dirfd);
    return rc;
}

/* ---- lookups ---- */

int tally__ckpt_count(const tally__ckpt *c) { return c->count; }
int64_t tally__ckpt_step(const tally__ckpt *c) { return c->step; }
const char *tally__ckpt_label(const tally__ckpt *c) { return c->label; }
uint32_t tally__ckpt_head_crc(const tally__ckpt *c) { return c->head_crc; }

const tally__ckpt_tensor *tally__ckpt_at(const tally__ckpt *c, int i) {
    return i >= 0 && i < c->count ? &c->t[i] : NULL;
}

const tally__ckpt_tensor *tally__ckpt_find(const tally__ckpt *c, const char *name) {
    int i = name ? tally__ckpt_index_find(&c->index, c->t, name) : -1;
    return i < 0 ? NULL : &c->t[i];
}

static int same_shape(const tally__ckpt_tensor *t, tally_dtype dtype, int ndim, const uint64_t *shape) {
    if (t->dtype != dtype || t->ndim != ndim) return 0;
    for (int d = 0; d < ndim; d++)
        if (t->shape[d] != shape[d]) return 0;
    return 1;
}

static size_t elements(int ndim, const uint64_t *shape) {
    size_t n = 1;
    for (int d = 0; d < ndim; d++) n *= (size_t)shape[d];
    return n;
}

int tally__ckpt_get(const tally__ckpt *c, const char *name, tally_dtype dtype, int ndim, const uint64_t *shape,
                    const void **data) {
    const tally__ckpt_tensor *t = tally__ckpt_find(c, name);
    if (!t)
        return tally__seterr(TALLY_E_INVALID,
                             "checkpoint %s: no tensor '%s': it was written by another model or configuration",
                             c->label, name ? name : "(null)");
    if (ndim < 0 || ndim > TALLY__CKPT_MAX_DIMS)
        return tally__seterr(TALLY_E_INVALID, "tally__ckpt_get: %d dimensions asked for", ndim);
    if (!same_shape(t, dtype, ndim, shape)) {
        tally__ckpt_tensor want = {.dtype = dtype, .ndim = ndim};
        for (int d = 0; d < ndim; d++) want.shape[d] = shape[d];
        char has[160], wants[160];
        shape_text(t, has, sizeof has);
        shape_text(&want, wants, sizeof wants);
        return tally__seterr(TALLY_E_INVALID,
                             "checkpoint %s: tensor '%s' is %s %s (%zu elements), but the model has %s %s (%zu "
                             "elements): it was written by another model or configuration",
                             c->label, t->name, tally_dtype_name(t->dtype), has, elements(t->ndim, t->shape),
                             tally_dtype_name(dtype), wants, elements(ndim, shape));
    }
    *data = t->data;
    return 0;
}
