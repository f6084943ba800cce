/* ckpt_int.h - what the checkpoint writer and loader share: little-endian fields, tensor name rules, the
 * name index, file names in DIR, the LATEST manifest, pruning and directory fsync. */
#ifndef TALLY_CKPT_CKPT_INT_H
#define TALLY_CKPT_CKPT_INT_H

#include <stddef.h>
#include <stdint.h>

#include "../core/bytes.h"
#include "ckpt.h"
#include "ckpt_seam.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checkpoint tensor data is stored as the host's bytes, which must be little-endian"
#endif

#define CKPT_LATEST        "LATEST"
#define CKPT_LATEST_TMP    "LATEST.tmp"
#define CKPT_MANIFEST_MAX  512 /* bytes; a real manifest is under 200 */
#define CKPT_FILE_NAME_MAX 48  /* "step-" + up to 19 digits + ".tck.tmp" + NUL */

static inline uint64_t ckpt_align(uint64_t x) {
    return (x + TALLY__CKPT_ALIGN - 1) & ~(uint64_t)(TALLY__CKPT_ALIGN - 1);
}

/* The CRC LATEST records for a file's header and count table entries (see ckpt.h). */
uint32_t tally__ckpt_head_crc_of(const unsigned char *head, uint32_t count);
/* Size of a tensor's element for the dtypes a checkpoint holds; 0 for any other code. */
size_t tally__ckpt_dtype_size(uint32_t dtype);
/* Elements of a shape times the element size into *bytes; 0, or -1 on overflow or a bad ndim. */
int tally__ckpt_shape_bytes(uint32_t dtype, uint32_t ndim, const uint64_t *shape, uint64_t *bytes);
/* The name field's defect as a phrase ("is empty", "has byte 0x07 at 2", ...), or NULL when it is valid. */
const char *tally__ckpt_name_defect(const unsigned char field[64], char *why, size_t cap);
/* field (up to its first NUL, at most 64 bytes) with bytes outside 0x20..0x7E and the quote written as
 * \xNN, for messages about a name that may be corrupt. */
void tally__ckpt_name_quote(const unsigned char *field, size_t max, char *out, size_t cap);

/* An open-addressing index of the names of n tensors (slots hold index + 1). Build returns -1 on
 * allocation failure, else the index of the first name equal to an earlier one (*dup_of set to that
 * one), else n. */
typedef struct ckpt_index {
    uint32_t *slot;
    uint32_t mask;
} ckpt_index;
int tally__ckpt_index_build(ckpt_index *x, const tally__ckpt_tensor *t, int n, int *dup_of);
int tally__ckpt_index_find(const ckpt_index *x, const tally__ckpt_tensor *t, const char *name); /* -1 */
void tally__ckpt_index_free(ckpt_index *x);

/* "step-0000000100.tck" (tmp: with ".tmp"). */
void tally__ckpt_file_name(char *out, size_t cap, int64_t step, int tmp);
/* 1 when name is exactly a checkpoint file name (tmp: with ".tmp"), with *step set; else 0. */
int tally__ckpt_file_parse(const char *name, int tmp, int64_t *step);

typedef struct ckpt_manifest {
    char file[CKPT_FILE_NAME_MAX];
    uint64_t bytes;
    int64_t step;
    uint32_t head_crc;
} ckpt_manifest;

/* The manifest's text for m into out (cap >= CKPT_MANIFEST_MAX); returns its length. */
size_t tally__ckpt_manifest_format(const ckpt_manifest *m, char *out, size_t cap);
/* Reads and checks dir/LATEST through dirfd: 0, TALLY__CKPT_NONE when it does not exist, or an error
 * (TALLY_E_CORRUPT for a corrupt manifest) with its message set. */
int tally__ckpt_manifest_read(int dirfd, const char *dir, ckpt_manifest *m);
/* The manifest's text (len bytes, NUL after them) as read from dir/LATEST: 0 with m filled, or
 * TALLY_E_CORRUPT naming what is wrong. What tally__ckpt_manifest_read does after reading. */
int tally__ckpt_manifest_parse(const char *text, size_t len, const char *dir, ckpt_manifest *m);
/* Writes LATEST for m: LATEST.tmp, fsync, rename, fsync the directory, passing the test seam's stages.
 * *renamed says whether the rename (the commit) happened, which an error after it does not undo. */
int tally__ckpt_manifest_commit(int dirfd, const char *dir, const ckpt_manifest *m, int *renamed);

/* Removes stale .tmp files, checkpoint files other than `committed` with a higher step (never
 * committed), and all but the newest `keep` (counting `committed`; keep <= 0: none). Logs what it could
 * not remove. */
void tally__ckpt_prune(int dirfd, const char *dir, int64_t committed, int keep);

int tally__ckpt_dir_sync(int dirfd, const char *dir);
/* Creates dir and its missing parents (mode 0755). */
int tally__ckpt_mkdirs(const char *dir);
/* fsync, retrying EINTR; the message names what and where. */
int tally__ckpt_fsync(int fd, const char *dir, const char *name);

#endif
