/* fuzz_idx.c - fuzz target for the IDX reader (tally_idx_read), plain and gzip: each input becomes a
 * temporary file, named .gz or not, optionally gzipped first so the parser behind zlib is reached. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <tally/data.h>

#include "fuzz.h"

static char fz_path[2][512]; /* [0] plain, [1] .gz */
static char fz_fifo[600], fz_dir[512];
static int fz_fd[2] = {-1, -1};
static volatile uint64_t fz_sink;

static void fz_unlink(void) {
    for (int i = 0; i < 2; i++)
        if (fz_path[i][0]) unlink(fz_path[i]);
    if (fz_fifo[0]) unlink(fz_fifo);
    if (fz_dir[0]) rmdir(fz_dir);
}

/* A FIFO no one writes and a directory, where a file is read: each must be refused at once. */
static void fz_not_files(const char *dir) {
    snprintf(fz_dir, sizeof fz_dir, "%s/tally-fuzz-idx-dir-XXXXXX", dir);
    if (!mkdtemp(fz_dir)) {
        perror("fuzz_idx: cannot make its directory");
        abort();
    }
    snprintf(fz_fifo, sizeof fz_fifo, "%s/fifo", fz_dir);
    if (mkfifo(fz_fifo, 0600) != 0) {
        perror("fuzz_idx: cannot make its FIFO");
        abort();
    }
}

/* In TMPDIR, else in memory (/dev/shm) where there is one: a file per input on a disk would make the
 * disk, not the parser, set the pace. */
static void fz_files(void) {
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(fz_path[0], sizeof fz_path[0], "%s/tally-fuzz-idx-XXXXXX", dir);
    snprintf(fz_path[1], sizeof fz_path[1], "%s/tally-fuzz-idx-XXXXXX.gz", dir);
    fz_fd[0] = mkstemp(fz_path[0]);
    fz_fd[1] = mkstemps(fz_path[1], 3);
    if (fz_fd[0] < 0 || fz_fd[1] < 0) {
        perror("fuzz_idx: cannot create its temporary files");
        abort();
    }
    fz_not_files(dir);
    atexit(fz_unlink);
}

static void fz_write(int which, const void *p, size_t n) {
    if (ftruncate(fz_fd[which], 0) || (n && pwrite(fz_fd[which], p, n, 0) != (ssize_t)n)) {
        perror("fuzz_idx: cannot write its temporary file");
        abort();
    }
}

/* The rest of the input as one gzip member, at the level the input picks. */
static unsigned char *fz_gzip(const uint8_t *p, size_t n, int level, size_t *out_len) {
    z_stream zs = {0};
    if (deflateInit2(&zs, level, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) abort();
    size_t cap = deflateBound(&zs, (uLong)n);
    unsigned char *out = malloc(cap);
    if (!out) abort();
    zs.next_in = (unsigned char *)p;
    zs.avail_in = (uInt)n;
    zs.next_out = out;
    zs.avail_out = (uInt)cap;
    if (deflate(&zs, Z_FINISH) != Z_STREAM_END) abort();
    *out_len = cap - zs.avail_out;
    deflateEnd(&zs);
    return out;
}

static size_t fz_elem_size(tally_idx_type t) {
    switch (t) {
    case TALLY_IDX_U8:
    case TALLY_IDX_I8: return 1;
    case TALLY_IDX_I16: return 2;
    case TALLY_IDX_I32:
    case TALLY_IDX_F32: return 4;
    case TALLY_IDX_F64: return 8;
    }
    return 0; /* an accepted file of another type fails the check below */
}

/* What a caller may rely on: a result that matches its header and can be read in full, or a
 * rejection whose message names the file. */
static void fz_check(int rc, const tally_idx *idx, const char *path) {
    if (rc) {
        if (rc > 0 || !strstr(tally_last_error(), path)) {
            fprintf(stderr, "fuzz_idx: rejected with %d and a message not naming the file: %s\n", rc,
                    tally_last_error());
            abort();
        }
        return;
    }
    size_t count = 1, es = fz_elem_size(idx->type);
    for (int i = 0; i < idx->ndim; i++) count *= idx->dims[i];
    if (!es || idx->ndim < 1 || idx->ndim > TALLY_IDX_MAX_DIMS || count != idx->count || !idx->data) {
        fprintf(stderr, "fuzz_idx: accepted an inconsistent result (ndim %d, count %zu)\n", idx->ndim, idx->count);
        abort();
    }
    const unsigned char *b = idx->data;
    for (size_t i = 0; i < count * es; i++) fz_sink += b[i]; /* every byte promised is there */
}

/* Not a regular file: refused with TALLY_E_INVALID naming it (and, by returning at all, not waited on). */
static void fz_refused(const char *path, const char *kind) {
    tally_idx idx;
    int rc = tally_idx_read(path, &idx);
    if (rc != TALLY_E_INVALID || !strstr(tally_last_error(), path) || !strstr(tally_last_error(), kind)) {
        fprintf(stderr, "fuzz_idx: %s read with %d: %s\n", kind, rc, tally_last_error());
        abort();
    }
}

/* The header alone agrees with the whole read: same verdict, same header when both accept. */
static void fz_header(const uint8_t *p, size_t n) {
    fz_write(0, p, n);
    tally_idx h, idx;
    int hrc = tally_idx_read_header(fz_path[0], &h), rc = tally_idx_read(fz_path[0], &idx);
    if (hrc == 0 && h.data) abort();
    if ((rc == 0 && hrc != 0) || (rc == 0 && (h.type != idx.type || h.ndim != idx.ndim || h.count != idx.count))) {
        fprintf(stderr, "fuzz_idx: the header (%d) disagrees with the whole read (%d)\n", hrc, rc);
        abort();
    }
    tally_idx_free(&idx);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, fz_files);
    if (size < 1) return 0;
    int mode = data[0] % FZ_IDX_MODES, gz = mode != FZ_IDX_PLAIN;
    if (mode == FZ_IDX_FIFO) return fz_refused(fz_fifo, "a FIFO"), 0;
    if (mode == FZ_IDX_DIR) return fz_refused(fz_dir, "a directory"), 0;
    if (mode == FZ_IDX_HEADER) return fz_header(data + 1, size - 1), 0;
    if (mode == FZ_IDX_GZ_WRAP) {
        if (size < 2) return 0;
        size_t n;
        unsigned char *z = fz_gzip(data + 2, size - 2, data[1] % 10, &n);
        fz_write(1, z, n);
        free(z);
    } else {
        fz_write(gz, data + 1, size - 1);
    }
    tally_idx idx;
    int rc = tally_idx_read(fz_path[gz], &idx);
    fz_check(rc, &idx, fz_path[gz]);
    tally_idx_free(&idx);
    return 0;
}
