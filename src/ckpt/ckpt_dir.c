/* ckpt_dir.c - the checkpoint directory: file names, the LATEST manifest (its text, reading, atomic
 * replacement), pruning old and stale files, creating and fsyncing the directory. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/err.h"
#include "../core/file.h"
#include "../core/log.h"
#include "ckpt_int.h"
#include "crc32c.h"

void tally__ckpt_file_name(char *out, size_t cap, int64_t step, int tmp) {
    snprintf(out, cap, "step-%010" PRId64 ".tck%s", step, tmp ? ".tmp" : "");
}

int tally__ckpt_file_parse(const char *name, int tmp, int64_t *step) {
    if (strncmp(name, "step-", 5)) return 0;
    const char *p = name + 5, *digits = p;
    uint64_t v = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > ((uint64_t)INT64_MAX - (uint64_t)(*p - '0')) / 10) return 0;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    if (p - digits < 10) return 0; /* the writer pads to ten digits; anything else is not ours */
    if (strcmp(p, tmp ? ".tck.tmp" : ".tck")) return 0;
    char canon[CKPT_FILE_NAME_MAX];
    tally__ckpt_file_name(canon, sizeof canon, (int64_t)v, tmp);
    if (strcmp(canon, name)) return 0; /* e.g. more leading zeros than the writer would put */
    *step = (int64_t)v;
    return 1;
}

int tally__ckpt_fsync(int fd, const char *dir, const char *name) {
    while (fsync(fd) != 0)
        if (errno != EINTR)
            return tally__seterr(TALLY_E_SYSTEM, "checkpoint %s/%s: fsync failed: %s; the data may not be on disk%s",
                                 dir, name, strerror(errno), tally__errno_hint(errno));
    return 0;
}

int tally__ckpt_dir_sync(int dirfd, const char *dir) {
    while (fsync(dirfd) != 0)
        if (errno != EINTR)
            return tally__seterr(TALLY_E_SYSTEM, "checkpoint directory %s: fsync failed: %s", dir, strerror(errno));
    return 0;
}

int tally__ckpt_mkdirs(const char *dir) {
    size_t n = strlen(dir);
    char *p = malloc(n + 1);
    if (!p) return tally__seterr(TALLY_E_NOMEM, "checkpoint directory %s: out of memory", dir);
    memcpy(p, dir, n + 1);
    int rc = 0;
    for (size_t i = 1; i <= n && !rc; i++) {
        if (p[i] != '/' && p[i] != '\0') continue;
        char c = p[i];
        p[i] = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            rc = tally__seterr(TALLY_E_SYSTEM, "checkpoint directory %s: cannot create %s: %s%s", dir, p,
                               strerror(errno), tally__errno_hint(errno));
        p[i] = c;
    }
    free(p);
    return rc;
}

/* ---- LATEST ---- */

static size_t manifest_body(const ckpt_manifest *m, char *out, size_t cap) {
    int n = snprintf(out, cap,
                     "tally checkpoint manifest 1\nfile %s\nbytes %" PRIu64 "\nstep %" PRId64
                     "\nhead-crc32c 0x%08" PRIx32 "\n",
                     m->file, m->bytes, m->step, m->head_crc);
    return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}

size_t tally__ckpt_manifest_format(const ckpt_manifest *m, char *out, size_t cap) {
    size_t n = manifest_body(m, out, cap);
    int k = snprintf(out + n, cap - n, "crc32c 0x%08" PRIx32 "\n", tally__crc32c(0, out, n));
    return k < 0 ? n : n + (size_t)k < cap ? n + (size_t)k : cap - 1;
}

#define MANIFEST_FIX "restore it, or remove it to start without a checkpoint"

/* text holds len bytes (NUL-terminated): the CRC line first, so a flipped byte reads as corruption. */
int tally__ckpt_manifest_parse(const char *text, size_t len, const char *dir, ckpt_manifest *m) {
    if (len == 0 || text[len - 1] != '\n' || strlen(text) != len)
        return tally__seterr(TALLY_E_CORRUPT,
                             "checkpoint %s/LATEST: the manifest is empty, truncated or not text; " MANIFEST_FIX, dir);
    size_t last = len - 1;
    while (last > 0 && text[last - 1] != '\n') last--;
    unsigned stored = 0;
    char line[32];
    if (len - last != 18 || sscanf(text + last, "crc32c 0x%8x", &stored) != 1 ||
        (snprintf(line, sizeof line, "crc32c 0x%08x\n", stored), memcmp(line, text + last, 18)))
        return tally__seterr(TALLY_E_CORRUPT,
                             "checkpoint %s/LATEST: its last line is not 'crc32c 0x<8 hex "
                             "digits>': the manifest is corrupt or truncated; " MANIFEST_FIX,
                             dir);
    uint32_t computed = tally__crc32c(0, text, last);
    if (computed != stored)
        return tally__seterr(TALLY_E_CORRUPT,
                             "checkpoint %s/LATEST: manifest CRC32C mismatch (stored 0x%08x, "
                             "computed 0x%08" PRIx32 "): the manifest is corrupt; " MANIFEST_FIX,
                             dir, stored, computed);
    char file[CKPT_FILE_NAME_MAX + 1] = "";
    unsigned long long bytes = 0;
    long long step = -1;
    unsigned head = 0;
    if (sscanf(text, "tally checkpoint manifest 1\nfile %48s\nbytes %llu\nstep %lld\nhead-crc32c 0x%8x", file, &bytes,
               &step, &head) != 4 ||
        strlen(file) >= CKPT_FILE_NAME_MAX)
        return tally__seterr(TALLY_E_CORRUPT,
                             "checkpoint %s/LATEST: not a version-1 manifest (format line, file, "
                             "bytes, step, head-crc32c): written by another tally, or corrupt",
                             dir);
    memcpy(m->file, file, strlen(file) + 1); /* shorter than the field, checked above */
    m->bytes = bytes;
    m->step = step;
    m->head_crc = head;
    char canon[CKPT_MANIFEST_MAX];
    int64_t file_step = -1;
    if (manifest_body(m, canon, sizeof canon) != last || memcmp(canon, text, last))
        return tally__seterr(TALLY_E_CORRUPT,
                             "checkpoint %s/LATEST: the manifest is not in the form tally writes "
                             "(extra spaces, signs or zeros?): " MANIFEST_FIX,
                             dir);
    if (!tally__ckpt_file_parse(m->file, 0, &file_step) || file_step != m->step || m->bytes < TALLY__CKPT_HEADER_BYTES)
        return tally__seterr(TALLY_E_CORRUPT,
                             "checkpoint %s/LATEST: it names '%s' for step %" PRId64 " with %" PRIu64
                             " bytes, which do not agree: the manifest is corrupt; " MANIFEST_FIX,
                             dir, m->file, m->step, m->bytes);
    return 0;
}

int tally__ckpt_manifest_read(int dirfd, const char *dir, ckpt_manifest *m) {
    char label[4200];
    snprintf(label, sizeof label, "checkpoint %s/LATEST", dir);
    int fd, rc = tally__file_open_read(dirfd, CKPT_LATEST, label, &fd, NULL);
    if (rc == TALLY_E_SYSTEM && errno == ENOENT)
        return tally__seterr(TALLY__CKPT_NONE, "no checkpoint in %s: %s/LATEST does not exist", dir, dir);
    if (rc) return rc;
    char text[CKPT_MANIFEST_MAX + 2]; /* one byte more than a manifest may have, and the NUL */
    size_t len = 0;
    while (len < sizeof text - 1) {
        ssize_t k = read(fd, text + len, sizeof text - 1 - len);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            int e = errno;
            close(fd);
            return tally__seterr(TALLY_E_SYSTEM, "checkpoint %s/LATEST: cannot read it: %s", dir, strerror(e));
        }
        if (k == 0) break;
        len += (size_t)k;
    }
    close(fd);
    if (len > CKPT_MANIFEST_MAX)
        return tally__seterr(TALLY_E_CORRUPT,
                             "checkpoint %s/LATEST: longer than %d bytes, so not a manifest: it is "
                             "corrupt; " MANIFEST_FIX,
                             dir, CKPT_MANIFEST_MAX);
    text[len] = '\0';
    return tally__ckpt_manifest_parse(text, len, dir, m);
}

static int write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

int tally__ckpt_manifest_commit(int dirfd, const char *dir, const ckpt_manifest *m, int *renamed) {
    *renamed = 0;
    char text[CKPT_MANIFEST_MAX];
    size_t len = tally__ckpt_manifest_format(m, text, sizeof text);
    char label[4200];
    snprintf(label, sizeof label, "checkpoint %s/%s", dir, CKPT_LATEST_TMP);
    int fd, rc = tally__file_create(dirfd, CKPT_LATEST_TMP, label, &fd);
    if (rc) return rc;
    if (write_all(fd, text, len))
        rc = tally__seterr(TALLY_E_SYSTEM, "%s: write failed: %s%s", label, strerror(errno), tally__errno_hint(errno));
    if (!rc) rc = tally__ckpt_fsync(fd, dir, CKPT_LATEST_TMP);
    if (close(fd) != 0 && !rc)
        rc = tally__seterr(TALLY_E_SYSTEM, "%s: close failed: %s%s", label, strerror(errno), tally__errno_hint(errno));
    if (!rc) tally__ckpt_seam_stage(TALLY__CKPT_AT_MANIFEST_WRITTEN);
    if (!rc && renameat(dirfd, CKPT_LATEST_TMP, dirfd, CKPT_LATEST) != 0)
        rc = tally__seterr(TALLY_E_SYSTEM, "checkpoint %s: renaming %s to LATEST failed: %s%s", dir, CKPT_LATEST_TMP,
                           strerror(errno), tally__errno_hint(errno));
    if (rc) {
        unlinkat(dirfd, CKPT_LATEST_TMP, 0);
        return rc;
    }
    *renamed = 1;
    tally__ckpt_seam_stage(TALLY__CKPT_AT_MANIFEST_RENAMED);
    rc = tally__ckpt_dir_sync(dirfd, dir);
    if (!rc) tally__ckpt_seam_stage(TALLY__CKPT_AT_COMMITTED);
    return rc;
}

/* ---- pruning ---- */

typedef struct {
    int64_t step;
    char name[CKPT_FILE_NAME_MAX];
} ckpt_found;

static int found_newest_first(const void *a, const void *b) {
    int64_t x = ((const ckpt_found *)a)->step, y = ((const ckpt_found *)b)->step;
    return x < y ? 1 : x > y ? -1 : 0;
}

static void prune_remove(int dirfd, const char *dir, const char *name, const char *why) {
    if (unlinkat(dirfd, name, 0) != 0 && errno != ENOENT)
        tally__log_warn("checkpoint %s/%s: cannot remove this %s: %s; remove it by hand", dir, name, why,
                        strerror(errno));
    tally__ckpt_seam_stage(TALLY__CKPT_AT_REMOVED_ONE);
}

/* The directory's checkpoint files (tmp: the .tmp ones, and LATEST.tmp as step -1), in *out. */
static int prune_list(int dirfd, int tmp, ckpt_found **out, size_t *n) {
    *out = NULL;
    *n = 0;
    int fd = dup(dirfd);
    DIR *d = fd < 0 ? NULL : fdopendir(fd);
    if (!d) {
        if (fd >= 0) close(fd);
        return -1;
    }
    rewinddir(d); /* the duplicate shares the offset of the original */
    size_t cap = 0;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d)) != NULL) {
        int64_t step = -1;
        if (!(tmp && !strcmp(e->d_name, CKPT_LATEST_TMP)) && !tally__ckpt_file_parse(e->d_name, tmp, &step)) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            ckpt_found *g = realloc(*out, cap * sizeof *g);
            if (!g) {
                rc = -1;
                break;
            }
            *out = g;
        }
        size_t len = strlen(e->d_name); /* a name that parsed is shorter than the field */
        if (len >= sizeof(*out)->name) continue;
        (*out)[*n].step = step;
        memcpy((*out)[(*n)++].name, e->d_name, len + 1);
    }
    closedir(d);
    return rc;
}

void tally__ckpt_prune(int dirfd, const char *dir, int64_t committed, int keep) {
    ckpt_found *f;
    size_t n;
    if (prune_list(dirfd, 1, &f, &n) != 0) {
        tally__log_warn("checkpoint %s: cannot list the directory to remove stale .tmp files: %s", dir,
                        strerror(errno));
    } else {
        for (size_t i = 0; i < n; i++) prune_remove(dirfd, dir, f[i].name, "stale temporary file");
    }
    free(f);
    if (prune_list(dirfd, 0, &f, &n) != 0) {
        tally__log_warn("checkpoint %s: cannot list the directory to remove old checkpoints: %s", dir, strerror(errno));
        free(f);
        return;
    }
    qsort(f, n, sizeof *f, found_newest_first);
    int kept = 1; /* the committed one */
    for (size_t i = 0; i < n; i++) {
        if (f[i].step == committed) continue;
        if (f[i].step > committed)
            prune_remove(dirfd, dir, f[i].name, "checkpoint, never committed");
        else if (keep > 0 && kept >= keep)
            prune_remove(dirfd, dir, f[i].name, "old checkpoint");
        else
            kept++;
    }
    free(f);
}
