/* idx.c - the IDX reader (plain or gzip): every header field and size is checked against what the
 * file can actually hold before anything is allocated, so hostile files fail fast and cleanly. */
#include <tally/data.h>

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include "../core/err.h"
#include "../core/file.h"

/* Far above any real data set (Fashion-MNIST is 47 MB) yet small enough that a hostile header cannot
 * make us reserve absurd amounts of memory. */
#define IDX_MAX_BYTES (4ull << 30)
/* zlib's FAQ: deflate never compresses better than 1032:1, so a gzip file of S bytes inflates to at
 * most about 1032*S bytes; the slack covers headers of tiny files. */
#define GZ_MAX_RATIO 1032ull
#define GZ_SLACK     4096ull
#define GZ_CHUNK     (1u << 16)
/* Where the size on disk does not bound the data (gzip, pipes), the buffer grows with what arrives. */
#define GZ_FIRST_ALLOC ((size_t)1 << 20)

typedef struct idx_src {
    const char *path;
    FILE *f;
    uint64_t fsize; /* a regular file's size: nothing else is read */
    int gz;
    int zlive;      /* inflateInit2 succeeded */
    int member_end; /* inflate reached the end of a gzip member */
    int eof;        /* nothing more to read */
    z_stream zs;
    unsigned char *in;
} idx_src;

static size_t elem_size(int type) {
    switch (type) {
    case TALLY_IDX_U8:
    case TALLY_IDX_I8: return 1;
    case TALLY_IDX_I16: return 2;
    case TALLY_IDX_I32:
    case TALLY_IDX_F32: return 4;
    case TALLY_IDX_F64: return 8;
    default: return 0;
    }
}

static int ends_with_gz(const char *path) {
    size_t n = strlen(path);
    return n >= 3 && strcmp(path + n - 3, ".gz") == 0;
}

static int src_open_gz(idx_src *s) {
    s->in = malloc(GZ_CHUNK);
    if (!s->in) return tally__seterr(TALLY_E_NOMEM, "%s: out of memory for the gzip input buffer", s->path);
    /* 16 + MAX_WBITS: gzip framing only, so a .gz that is not gzip is reported, not read raw. */
    int zr = inflateInit2(&s->zs, 16 + MAX_WBITS);
    if (zr != Z_OK)
        return tally__seterr(zr == Z_MEM_ERROR ? TALLY_E_NOMEM : TALLY_E_SYSTEM, "%s: zlib cannot start: %s", s->path,
                             zError(zr));
    s->zlive = 1;
    return 0;
}

static int src_open(idx_src *s, const char *path) {
    memset(s, 0, sizeof *s);
    s->path = path;
    s->gz = ends_with_gz(path);
    int fd, rc = tally__file_open_read(AT_FDCWD, path, path, &fd, &s->fsize); /* a FIFO would block for ever */
    if (rc) return rc;
    if (!(s->f = fdopen(fd, "rb"))) {
        rc = tally__seterr(TALLY_E_NOMEM, "%s: out of memory", path);
        close(fd);
        return rc;
    }
    if (s->fsize == 0)
        return tally__seterr(TALLY_E_INVALID, "%s: empty file (0 bytes), not an IDX file; replace it", path);
    return s->gz ? src_open_gz(s) : 0;
}

static void src_close(idx_src *s) {
    if (s->zlive) inflateEnd(&s->zs);
    free(s->in);
    if (s->f) fclose(s->f);
    memset(s, 0, sizeof *s);
}

static int read_error(idx_src *s) {
    return tally__seterr(TALLY_E_SYSTEM, "%s: read error: %s", s->path, strerror(errno ? errno : EIO));
}

static int plain_read(idx_src *s, void *buf, size_t n, size_t *got) {
    errno = 0;
    *got = fread(buf, 1, n, s->f);
    if (*got < n && ferror(s->f)) return read_error(s);
    return 0;
}

/* Refills zlib's input; returns 1 with data, 0 at the end of the file, or an error. */
static int gz_fill(idx_src *s) {
    errno = 0;
    size_t n = fread(s->in, 1, GZ_CHUNK, s->f);
    if (n == 0) return ferror(s->f) ? read_error(s) : 0;
    s->zs.next_in = s->in;
    s->zs.avail_in = (uInt)n;
    return 1;
}

static int gz_corrupt(idx_src *s, int zr) {
    if (zr == Z_MEM_ERROR) return tally__seterr(TALLY_E_NOMEM, "%s: zlib ran out of memory", s->path);
    return tally__seterr(TALLY_E_INVALID, "%s: corrupt gzip stream (zlib: %s); the file is damaged, fetch it again",
                         s->path, s->zs.msg ? s->zs.msg : zError(zr));
}

/* One inflate step; input ending inside a member means the file was cut short. */
static int gz_step(idx_src *s) {
    if (s->zs.avail_in == 0) {
        int rc = gz_fill(s);
        if (rc < 0) return rc;
        if (rc == 0) {
            if (s->member_end) {
                s->eof = 1;
                return 0;
            }
            return tally__seterr(TALLY_E_INVALID,
                                 "%s: truncated gzip stream (the file ends inside it); the file is incomplete, "
                                 "fetch it again",
                                 s->path);
        }
    }
    if (s->member_end) { /* more bytes after a member: gzip allows concatenated members, nothing else */
        if (s->zs.next_in[0] != 0x1f)
            return tally__seterr(TALLY_E_INVALID,
                                 "%s: trailing garbage after the end of the gzip stream; the file is damaged", s->path);
        inflateReset(&s->zs);
        s->member_end = 0;
    }
    int zr = inflate(&s->zs, Z_NO_FLUSH);
    if (zr == Z_STREAM_END)
        s->member_end = 1;
    else if (zr != Z_OK && !(zr == Z_BUF_ERROR && s->zs.avail_in == 0))
        return gz_corrupt(s, zr);
    return 0;
}

static int gz_read(idx_src *s, void *buf, size_t n, size_t *got) {
    unsigned char *p = buf;
    *got = 0;
    while (*got < n && !s->eof) {
        size_t want = n - *got;
        if (want > (size_t)1 << 30) want = (size_t)1 << 30; /* avail_out is a uInt */
        s->zs.next_out = p + *got;
        s->zs.avail_out = (uInt)want;
        int rc = gz_step(s);
        *got += want - s->zs.avail_out;
        if (rc < 0) return rc;
    }
    return 0;
}

/* Reads up to n bytes; *got < n only at the end of the (inflated) data. */
static int src_read(idx_src *s, void *buf, size_t n, size_t *got) {
    return s->gz ? gz_read(s, buf, n, got) : plain_read(s, buf, n, got);
}

static int bad(idx_src *s, const char *what) { return tally__seterr(TALLY_E_INVALID, "%s: %s", s->path, what); }

static int read_magic(idx_src *s, tally_idx *out) {
    unsigned char m[4];
    size_t got;
    int rc = src_read(s, m, 4, &got);
    if (rc) return rc;
    if (got == 0) return bad(s, "empty (no IDX header); replace the file");
    if (got < 4) return bad(s, "truncated header (shorter than the 4-byte magic); the file is incomplete");
    if (m[0] || m[1])
        return tally__seterr(TALLY_E_INVALID,
                             "%s: bad magic %02x %02x %02x %02x: an IDX file starts with two zero bytes; "
                             "is this an IDX file (a .gz must be named .gz)?",
                             s->path, m[0], m[1], m[2], m[3]);
    if (!elem_size(m[2]))
        return tally__seterr(TALLY_E_INVALID, "%s: unknown element type 0x%02x (IDX knows 08, 09, 0b, 0c, 0d, 0e)",
                             s->path, m[2]);
    if (m[3] == 0) return bad(s, "zero dimensions declared (an IDX file needs at least one)");
    if (m[3] > TALLY_IDX_MAX_DIMS)
        return tally__seterr(TALLY_E_INVALID, "%s: too many dimensions (%d; this reader takes at most %d)", s->path,
                             m[3], TALLY_IDX_MAX_DIMS);
    out->type = (tally_idx_type)m[2];
    out->ndim = m[3];
    return 0;
}

static int read_dims(idx_src *s, tally_idx *out) {
    unsigned char d[4 * TALLY_IDX_MAX_DIMS];
    size_t want = 4 * (size_t)out->ndim, got;
    int rc = src_read(s, d, want, &got);
    if (rc) return rc;
    if (got < want)
        return tally__seterr(TALLY_E_INVALID,
                             "%s: truncated header: %d dimensions declared but only %zu of their %zu bytes present",
                             s->path, out->ndim, got, want);
    for (int i = 0; i < out->ndim; i++) {
        const unsigned char *b = d + 4 * i;
        out->dims[i] = (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
    }
    return 0;
}

/* Data bytes the header declares, refused when they overflow or pass the cap. */
static int data_bytes(idx_src *s, const tally_idx *out, uint64_t *bytes) {
    uint64_t count = 1;
    for (int i = 0; i < out->ndim; i++)
        if (__builtin_mul_overflow(count, (uint64_t)out->dims[i], &count))
            return bad(s, "dimension sizes overflow when multiplied; the header is corrupt");
    if (__builtin_mul_overflow(count, (uint64_t)elem_size(out->type), bytes))
        return bad(s, "data size overflows (dimensions times element size); the header is corrupt");
    if (*bytes > IDX_MAX_BYTES || *bytes > SIZE_MAX)
        return tally__seterr(TALLY_E_INVALID,
                             "%s: header declares %llu bytes of data, too large (this reader takes at most 4 GiB); "
                             "the header is corrupt",
                             s->path, (unsigned long long)*bytes);
    return 0;
}

/* Compares the declared size with what the file on disk can hold, before allocating it. */
static int check_fits(idx_src *s, uint64_t hdr, uint64_t bytes) {
    unsigned long long have = s->fsize, need = hdr + bytes;
    if (s->gz) {
        unsigned long long most = have * GZ_MAX_RATIO + GZ_SLACK;
        if (need > most)
            return tally__seterr(TALLY_E_INVALID,
                                 "%s: truncated: the header declares %llu data bytes but a gzip file of %llu "
                                 "bytes inflates to at most %llu",
                                 s->path, (unsigned long long)bytes, have, most);
        return 0;
    }
    if (have < need)
        return tally__seterr(TALLY_E_INVALID,
                             "%s: truncated data: the header declares %llu bytes but only %llu follow it; "
                             "the file is incomplete",
                             s->path, (unsigned long long)bytes, have - hdr);
    if (have > need)
        return tally__seterr(TALLY_E_INVALID,
                             "%s: trailing data: %llu extra byte(s) after the %llu the header declares", s->path,
                             have - need, (unsigned long long)bytes);
    return 0;
}

static size_t next_cap(size_t cap, size_t bytes, const idx_src *s) {
    if (!s->gz) return bytes; /* the size on disk was checked already */
    size_t n = cap ? (cap > bytes / 2 ? bytes : cap * 2) : GZ_FIRST_ALLOC;
    return n < bytes ? n : bytes;
}

static int truncated_data(idx_src *s, size_t have, size_t bytes) {
    return tally__seterr(TALLY_E_INVALID,
                         "%s: truncated data: the header declares %zu bytes but only %zu are present; "
                         "the file is incomplete",
                         s->path, bytes, have);
}

/* Reads exactly `bytes` (growing the buffer with what actually arrives), then insists on the end. */
static int read_body(idx_src *s, size_t bytes, void **data) {
    unsigned char *buf = NULL;
    size_t have = 0, cap = 0, got;
    int rc = 0;
    while (have < bytes) {
        size_t ncap = next_cap(cap, bytes, s);
        unsigned char *nb = realloc(buf, ncap);
        if (!nb) {
            rc = tally__seterr(TALLY_E_NOMEM, "%s: out of memory for %zu bytes of data", s->path, ncap);
            goto fail;
        }
        buf = nb;
        cap = ncap;
        if ((rc = src_read(s, buf + have, cap - have, &got))) goto fail;
        have += got;
        if (have < cap) {
            rc = truncated_data(s, have, bytes);
            goto fail;
        }
    }
    unsigned char extra;
    if ((rc = src_read(s, &extra, 1, &got))) goto fail; /* for gzip this also checks the CRC */
    if (got) {
        rc =
            tally__seterr(TALLY_E_INVALID, "%s: trailing data after the %zu bytes the header declares", s->path, bytes);
        goto fail;
    }
    *data = buf ? buf : malloc(1); /* zero elements still get a pointer the caller may free */
    if (*data) return 0;
    rc = tally__seterr(TALLY_E_NOMEM, "%s: out of memory", s->path);
fail:
    free(buf);
    return rc;
}

static void to_host_order(tally_idx *idx) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    (void)idx;
#else
    size_t es = elem_size(idx->type), n = idx->count;
    if (es == 2) {
        uint16_t *p = idx->data;
        for (size_t i = 0; i < n; i++) p[i] = __builtin_bswap16(p[i]);
    } else if (es == 4) {
        uint32_t *p = idx->data;
        for (size_t i = 0; i < n; i++) p[i] = __builtin_bswap32(p[i]);
    } else if (es == 8) {
        uint64_t *p = idx->data;
        for (size_t i = 0; i < n; i++) p[i] = __builtin_bswap64(p[i]);
    }
#endif
}

static int read_header(idx_src *s, tally_idx *out, uint64_t *bytes) {
    int rc;
    if ((rc = read_magic(s, out)) || (rc = read_dims(s, out)) || (rc = data_bytes(s, out, bytes))) return rc;
    if ((rc = check_fits(s, 4 + 4 * (uint64_t)out->ndim, *bytes))) return rc;
    out->count = (size_t)(*bytes / elem_size(out->type));
    return 0;
}

static int read_idx(idx_src *s, tally_idx *out) {
    int rc;
    uint64_t bytes = 0;
    if ((rc = read_header(s, out, &bytes))) return rc;
    if ((rc = read_body(s, (size_t)bytes, &out->data))) return rc;
    to_host_order(out);
    return 0;
}

TALLY_API int tally_idx_read(const char *path, tally_idx *out) {
    tally__clearerr();
    if (!out) return tally__seterr(TALLY_E_INVALID, "tally_idx_read: out is NULL");
    memset(out, 0, sizeof *out);
    if (!path) return tally__seterr(TALLY_E_INVALID, "tally_idx_read: path is NULL");
    idx_src s;
    int rc = src_open(&s, path);
    if (!rc) rc = read_idx(&s, out);
    src_close(&s);
    if (rc) tally_idx_free(out);
    return rc;
}

TALLY_API int tally_idx_read_header(const char *path, tally_idx *out) {
    tally__clearerr();
    if (!out) return tally__seterr(TALLY_E_INVALID, "tally_idx_read_header: out is NULL");
    memset(out, 0, sizeof *out);
    if (!path) return tally__seterr(TALLY_E_INVALID, "tally_idx_read_header: path is NULL");
    idx_src s;
    uint64_t bytes;
    int rc = src_open(&s, path);
    if (!rc) rc = read_header(&s, out, &bytes);
    src_close(&s);
    return rc;
}

TALLY_API void tally_idx_free(tally_idx *idx) {
    if (!idx) return;
    free(idx->data);
    memset(idx, 0, sizeof *idx);
}
