/* ckpt_write.c - the checkpoint writer: lays out the table, streams each tensor's chunks (CRC on the fly)
 * into step-N.tck.tmp, then writes header and table last and commits through LATEST. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/err.h"
#include "../core/file.h"
#include "../core/log.h"
#include "ckpt_int.h"
#include "crc32c.h"

#define STREAM_BUF (4u << 20) /* small chunks are gathered into writes of this size */

typedef struct {
    char name[64]; /* NUL-padded, as in the file */
    uint64_t off, done;
    uint32_t crc;
} wstate;

struct tally__ckpt_writer {
    char *dir;
    int dirfd, fd;
    int64_t step;
    char file[CKPT_FILE_NAME_MAX], tmp[CKPT_FILE_NAME_MAX];
    int count, cur; /* cur: the first tensor not yet complete */
    tally__ckpt_tensor *t;
    wstate *s;
    ckpt_index index;
    uint64_t data_start, file_bytes;
    unsigned char *buf;
    size_t buf_cap, buf_len;
    uint64_t buf_off; /* file offset of buf[0] */
    int err;          /* sticky: the first error, its message in errmsg */
    char errmsg[1024];
};

/* "checkpoint DIR/FILE.tmp: " + text; the writer keeps the error and its message. */
__attribute__((format(printf, 3, 4))) static int wfail(tally__ckpt_writer *w, int code, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(w->errmsg, sizeof w->errmsg, "checkpoint %s/%s: %s", w->dir, w->tmp, msg);
    w->err = code;
    return tally__seterr(code, "%s", w->errmsg);
}

/* A failure already described by tally_last_error(), made sticky. */
static int wkeep(tally__ckpt_writer *w, int code) {
    snprintf(w->errmsg, sizeof w->errmsg, "%s", tally_last_error());
    w->err = code;
    return code;
}

static int pwrite_all(int fd, const unsigned char *p, size_t n, uint64_t off) {
    while (n) {
        ssize_t k = pwrite(fd, p, n, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return -1;
        if (k == 0) return errno = EIO, -1;
        p += k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
    return 0;
}

static int write_at(tally__ckpt_writer *w, const unsigned char *p, size_t n, uint64_t off) {
    if (pwrite_all(w->fd, p, n, off) == 0) return 0;
    int e = errno;
    return wfail(w, TALLY_E_SYSTEM, "writing %zu bytes at offset %" PRIu64 " failed: %s%s", n, off, strerror(e),
                 tally__errno_hint(e));
}

/* ---- layout ---- */

static int describe_one(tally__ckpt_writer *w, int i, const tally__ckpt_tensor *in, uint64_t *pos) {
    wstate *s = &w->s[i];
    char why[128];
    if (!in->name) return wfail(w, TALLY_E_INVALID, "tensor #%d has no name", i);
    size_t n = strlen(in->name);
    if (n > TALLY__CKPT_NAME_MAX)
        return wfail(w, TALLY_E_INVALID, "tensor #%d: name '%.40s...' has %zu characters, more than %d", i, in->name, n,
                     TALLY__CKPT_NAME_MAX);
    memcpy(s->name, in->name, n); /* the rest stays zero */
    if (tally__ckpt_name_defect((const unsigned char *)s->name, why, sizeof why))
        return wfail(w, TALLY_E_INVALID, "tensor #%d: its name %s (names are printable ASCII)", i, why);
    if (!tally__ckpt_dtype_size((uint32_t)in->dtype))
        return wfail(w, TALLY_E_INVALID, "tensor '%s' (#%d): dtype %s is not one of f32, f64, i64, u8", s->name, i,
                     tally_dtype_name(in->dtype));
    if (in->ndim < 0 || in->ndim > TALLY__CKPT_MAX_DIMS)
        return wfail(w, TALLY_E_INVALID, "tensor '%s' (#%d): ndim %d is not in 0..%d", s->name, i, in->ndim,
                     TALLY__CKPT_MAX_DIMS);
    tally__ckpt_tensor *t = &w->t[i];
    *t = (tally__ckpt_tensor){.name = s->name, .dtype = in->dtype, .ndim = in->ndim};
    memcpy(t->shape, in->shape, (size_t)in->ndim * sizeof t->shape[0]); /* dimensions past ndim stay 0 */
    uint64_t bytes;
    if (tally__ckpt_shape_bytes((uint32_t)t->dtype, (uint32_t)t->ndim, t->shape, &bytes) || bytes > SIZE_MAX ||
        bytes > (uint64_t)INT64_MAX - TALLY__CKPT_ALIGN || *pos > (uint64_t)INT64_MAX - TALLY__CKPT_ALIGN - bytes)
        return wfail(w, TALLY_E_INVALID, "tensor '%s' (#%d): its size overflows (shape too large)", s->name, i);
    t->bytes = (size_t)bytes;
    s->off = *pos;
    *pos += ckpt_align(bytes);
    return 0;
}

static int describe(tally__ckpt_writer *w, const tally__ckpt_tensor *in, int count) {
    w->t = calloc(count ? (size_t)count : 1, sizeof *w->t);
    w->s = calloc(count ? (size_t)count : 1, sizeof *w->s);
    if (!w->t || !w->s) return wfail(w, TALLY_E_NOMEM, "out of memory for a table of %d tensors", count);
    w->count = count;
    w->data_start = TALLY__CKPT_HEADER_BYTES + (uint64_t)count * TALLY__CKPT_ENTRY_BYTES;
    uint64_t pos = w->data_start;
    for (int i = 0; i < count; i++) {
        int rc = describe_one(w, i, &in[i], &pos);
        if (rc) return rc;
    }
    w->file_bytes = pos;
    int dup_of = -1, dup = tally__ckpt_index_build(&w->index, w->t, count, &dup_of);
    if (dup < 0) return wfail(w, TALLY_E_NOMEM, "out of memory for the name index of %d tensors", count);
    if (dup < count)
        return wfail(w, TALLY_E_INVALID, "tensor '%s' (#%d) has the same name as tensor #%d: names must be unique",
                     w->t[dup].name, dup, dup_of);
    return 0;
}

/* ---- the directory and the temporary file ---- */

/* Files are created without following links whoever can write the directory, but another user who can
 * write it can still delete or replace them: say so once. */
static void warn_shared_dir(const tally__ckpt_writer *w) {
    struct stat st;
    if (fstat(w->dirfd, &st) != 0 || !(st.st_mode & (S_IWGRP | S_IWOTH))) return;
    tally__log_notice("checkpoint directory %s is writable by %s (mode %04o): others there can delete or replace "
                      "its checkpoints; use a directory only you can write",
                      w->dir, st.st_mode & S_IWOTH ? "every user" : "its group", (unsigned)(st.st_mode & 07777));
}

static int open_dir(tally__ckpt_writer *w) {
    if (tally__ckpt_mkdirs(w->dir)) return wkeep(w, TALLY_E_SYSTEM);
    char label[4200];
    snprintf(label, sizeof label, "checkpoint directory %s", w->dir);
    if (tally__file_open_dir(w->dir, label, &w->dirfd)) return wkeep(w, TALLY_E_SYSTEM);
    warn_shared_dir(w);
    if (flock(w->dirfd, LOCK_EX | LOCK_NB) != 0) {
        if (errno == EWOULDBLOCK)
            return wfail(w, TALLY_E_INVALID,
                         "another process is writing checkpoints to %s: give each job its own checkpoint directory",
                         w->dir);
        /* Some file systems (NFS) refuse locks on directories: writing still works, unguarded. */
        tally__log_debug(1, "checkpoint %s: no lock on the directory (%s)", w->dir, strerror(errno));
    }
    ckpt_manifest m;
    int rc = tally__ckpt_manifest_read(w->dirfd, w->dir, &m);
    tally__clearerr(); /* a missing or corrupt LATEST is replaced at the commit */
    if (rc == 0 && m.step == w->step)
        return wfail(w, TALLY_E_INVALID,
                     "step %" PRId64 " is already committed (LATEST names %s): a step is "
                     "written once, so that LATEST always names the file it was checked against",
                     w->step, m.file);
    snprintf(label, sizeof label, "checkpoint %s/%s", w->dir, w->tmp);
    rc = tally__file_create(w->dirfd, w->tmp, label, &w->fd);
    return rc ? wkeep(w, rc) : 0;
}

static void writer_free(tally__ckpt_writer *w, int unlink_tmp) {
    if (w->fd >= 0) close(w->fd);
    if (unlink_tmp && w->fd >= 0) unlinkat(w->dirfd, w->tmp, 0);
    if (w->dirfd >= 0) close(w->dirfd); /* releases the lock */
    tally__ckpt_index_free(&w->index);
    free(w->buf);
    free(w->t);
    free(w->s);
    free(w->dir);
    free(w);
}

/* Skips tensors that are complete (those of 0 bytes from the start). */
static void advance(tally__ckpt_writer *w) {
    while (w->cur < w->count && w->s[w->cur].done == w->t[w->cur].bytes) w->cur++;
}

int tally__ckpt_write_begin(const char *dir, int64_t step, const tally__ckpt_tensor *tensors, int count,
                            tally__ckpt_writer **out) {
    if (!out) return tally__seterr(TALLY_E_INVALID, "tally__ckpt_write_begin: out is NULL");
    *out = NULL;
    if (!dir || !*dir) return tally__seterr(TALLY_E_INVALID, "tally__ckpt_write_begin: no checkpoint directory");
    if (step < 0) return tally__seterr(TALLY_E_INVALID, "checkpoint %s: step %" PRId64 " is negative", dir, step);
    if (count < 0 || (unsigned)count > TALLY__CKPT_MAX_TENSORS || (count && !tensors))
        return tally__seterr(TALLY_E_INVALID, "checkpoint %s: %d tensors (at most %u, with descriptors)", dir, count,
                             TALLY__CKPT_MAX_TENSORS);
    tally__ckpt_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->dir = strdup(dir))) {
        free(w);
        return tally__seterr(TALLY_E_NOMEM, "checkpoint %s: out of memory for the writer", dir);
    }
    w->dirfd = w->fd = -1;
    w->step = step;
    tally__ckpt_file_name(w->file, sizeof w->file, step, 0);
    tally__ckpt_file_name(w->tmp, sizeof w->tmp, step, 1);
    int rc = describe(w, tensors, count);
    if (!rc) {
        uint64_t data = w->file_bytes - w->data_start;
        w->buf_cap = data < STREAM_BUF ? (size_t)data : STREAM_BUF;
        w->buf = malloc(w->buf_cap ? w->buf_cap : 1);
        if (!w->buf) rc = wfail(w, TALLY_E_NOMEM, "out of memory for a %zu-byte write buffer", w->buf_cap);
    }
    if (!rc) rc = open_dir(w);
    if (rc) {
        writer_free(w, 1);
        return rc;
    }
    w->buf_off = w->data_start;
    advance(w);
    *out = w;
    tally__ckpt_seam_stage(TALLY__CKPT_AT_BEGUN);
    return 0;
}

/* ---- data ---- */

static int flush(tally__ckpt_writer *w) {
    int rc = w->buf_len ? write_at(w, w->buf, w->buf_len, w->buf_off) : 0;
    w->buf_off += w->buf_len;
    w->buf_len = 0;
    return rc;
}

/* Appends to the stream: the file is written front to back from data_start. */
static int put(tally__ckpt_writer *w, const void *p, size_t n) {
    if (w->buf_len + n > w->buf_cap) {
        int rc = flush(w);
        if (rc) return rc;
    }
    if (n >= w->buf_cap) { /* large chunks go straight to the file */
        int rc = write_at(w, p, n, w->buf_off);
        w->buf_off += n;
        return rc;
    }
    memcpy(w->buf + w->buf_len, p, n);
    w->buf_len += n;
    return 0;
}

int tally__ckpt_write(tally__ckpt_writer *w, int index, const void *data, size_t len) {
    if (!w) return tally__seterr(TALLY_E_INVALID, "tally__ckpt_write: no writer");
    if (w->err) return tally__seterr(w->err, "%s", w->errmsg);
    if (index < 0 || index >= w->count)
        return wfail(w, TALLY_E_INVALID, "tensor index %d is not in [0, %d)", index, w->count);
    wstate *s = &w->s[index];
    uint64_t bytes = w->t[index].bytes;
    if (len && !data) return wfail(w, TALLY_E_INVALID, "tensor '%s' (#%d): data is NULL", s->name, index);
    if (index < w->cur && len)
        return wfail(w, TALLY_E_INVALID,
                     "tensor '%s' (#%d): all its %" PRIu64 " bytes were written already; %zu more are too many",
                     s->name, index, bytes, len);
    if (index > w->cur)
        return wfail(w, TALLY_E_INVALID,
                     "tensor '%s' (#%d) has %" PRIu64 " of its %" PRIu64 " bytes: tensors are "
                     "written in table order, so it must be complete before tensor '%s' (#%d)",
                     w->s[w->cur].name, w->cur, w->s[w->cur].done, w->t[w->cur].bytes, s->name, index);
    if (len > bytes - s->done)
        return wfail(w, TALLY_E_INVALID,
                     "tensor '%s' (#%d): %zu more bytes would exceed its %" PRIu64 " (it has %" PRIu64 ")", s->name,
                     index, len, bytes, s->done);
    if (!len) return 0;
    s->crc = tally__crc32c(s->crc, data, len);
    s->done += len;
    int rc = put(w, data, len);
    if (!rc && s->done == bytes) {
        static const unsigned char zeros[TALLY__CKPT_ALIGN];
        rc = put(w, zeros, (size_t)(ckpt_align(bytes) - bytes));
        advance(w);
    }
    return rc;
}

/* ---- commit ---- */

static void encode_entry(const tally__ckpt_writer *w, int i, unsigned char *e) {
    const tally__ckpt_tensor *t = &w->t[i];
    memcpy(e + TALLY__CKPT_E_NAME, w->s[i].name, 64);
    tally__put_le32(e + TALLY__CKPT_E_DTYPE, (uint32_t)t->dtype);
    tally__put_le32(e + TALLY__CKPT_E_NDIM, (uint32_t)t->ndim);
    for (int d = 0; d < TALLY__CKPT_MAX_DIMS; d++) tally__put_le64(e + TALLY__CKPT_E_SHAPE + 8 * d, t->shape[d]);
    tally__put_le64(e + TALLY__CKPT_E_OFFSET, w->s[i].off);
    tally__put_le64(e + TALLY__CKPT_E_BYTES, t->bytes);
    tally__put_le32(e + TALLY__CKPT_E_DATA_CRC, w->s[i].crc);
    unsigned char idx[4];
    tally__put_le32(idx, (uint32_t)i);
    tally__put_le32(e + TALLY__CKPT_E_CRC, tally__crc32c(tally__crc32c(0, idx, 4), e, TALLY__CKPT_E_CRC));
}

/* Header and table, written last at offset 0: a file cut short before this point has no valid header. */
static int write_head(tally__ckpt_writer *w, uint32_t *head_crc) {
    unsigned char *h = calloc(1, (size_t)w->data_start);
    if (!h) return wfail(w, TALLY_E_NOMEM, "out of memory for the %" PRIu64 "-byte table", w->data_start);
    memcpy(h + TALLY__CKPT_H_MAGIC, TALLY__CKPT_MAGIC, 8);
    tally__put_le32(h + TALLY__CKPT_H_VERSION, TALLY__CKPT_VERSION);
    tally__put_le32(h + TALLY__CKPT_H_HEADER_BYTES, TALLY__CKPT_HEADER_BYTES);
    tally__put_le32(h + TALLY__CKPT_H_ENTRY_BYTES, TALLY__CKPT_ENTRY_BYTES);
    tally__put_le32(h + TALLY__CKPT_H_COUNT, (uint32_t)w->count);
    tally__put_le64(h + TALLY__CKPT_H_TABLE_BYTES, (uint64_t)w->count * TALLY__CKPT_ENTRY_BYTES);
    tally__put_le64(h + TALLY__CKPT_H_FILE_BYTES, w->file_bytes);
    tally__put_le64(h + TALLY__CKPT_H_STEP, (uint64_t)w->step);
    tally__put_le32(h + TALLY__CKPT_H_CRC, tally__crc32c(0, h, TALLY__CKPT_H_CRC));
    for (int i = 0; i < w->count; i++)
        encode_entry(w, i, h + TALLY__CKPT_HEADER_BYTES + (size_t)i * TALLY__CKPT_ENTRY_BYTES);
    *head_crc = tally__ckpt_head_crc_of(h, (uint32_t)w->count);
    int rc = write_at(w, h, (size_t)w->data_start, 0);
    free(h);
    return rc;
}

/* Data, header, fsync, rename: the complete file under its final name, not yet committed. */
static int finish_file(tally__ckpt_writer *w, uint32_t *head_crc) {
    if (w->cur < w->count)
        return wfail(w, TALLY_E_INVALID,
                     "tensor '%s' (#%d) has %" PRIu64 " of its %zu bytes: every tensor must be "
                     "written in full before the commit",
                     w->s[w->cur].name, w->cur, w->s[w->cur].done, w->t[w->cur].bytes);
    int rc = flush(w);
    if (rc) return rc;
    tally__ckpt_seam_stage(TALLY__CKPT_AT_DATA_WRITTEN);
    if ((rc = write_head(w, head_crc))) return rc;
    tally__ckpt_seam_stage(TALLY__CKPT_AT_HEADER_WRITTEN);
    if (tally__ckpt_fsync(w->fd, w->dir, w->tmp)) return wkeep(w, TALLY_E_SYSTEM);
    tally__ckpt_seam_stage(TALLY__CKPT_AT_FILE_SYNCED);
    return 0;
}

int tally__ckpt_write_commit(tally__ckpt_writer *w, int keep) {
    if (!w) return tally__seterr(TALLY_E_INVALID, "tally__ckpt_write_commit: no writer");
    uint32_t head_crc = 0;
    int rc = w->err ? tally__seterr(w->err, "%s", w->errmsg) : finish_file(w, &head_crc);
    if (rc) {
        writer_free(w, 1);
        return rc;
    }
    int e = close(w->fd) != 0 ? errno : 0;
    w->fd = -1;
    if (e || renameat(w->dirfd, w->tmp, w->dirfd, w->file) != 0) {
        e = e ? e : errno;
        rc = wfail(w, TALLY_E_SYSTEM, "%s failed: %s%s", w->fd < 0 && e ? "close or rename" : "renaming it",
                   strerror(e), tally__errno_hint(e));
        unlinkat(w->dirfd, w->tmp, 0);
        writer_free(w, 0);
        return rc;
    }
    tally__ckpt_seam_stage(TALLY__CKPT_AT_FILE_RENAMED);
    rc = tally__ckpt_dir_sync(w->dirfd, w->dir);
    if (!rc) tally__ckpt_seam_stage(TALLY__CKPT_AT_FILE_DURABLE);
    ckpt_manifest m = {.bytes = w->file_bytes, .step = w->step, .head_crc = head_crc};
    snprintf(m.file, sizeof m.file, "%s", w->file);
    int renamed = 0;
    if (!rc) rc = tally__ckpt_manifest_commit(w->dirfd, w->dir, &m, &renamed);
    if (rc && !renamed) unlinkat(w->dirfd, w->file, 0); /* never committed: LATEST names the previous one */
    if (!rc) tally__ckpt_prune(w->dirfd, w->dir, w->step, keep);
    writer_free(w, 0);
    return rc;
}

void tally__ckpt_write_abort(tally__ckpt_writer *w) {
    if (w) writer_free(w, 1);
}
