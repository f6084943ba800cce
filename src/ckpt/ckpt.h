/* ckpt.h - tally's checkpoint files: the format (below), a streaming writer with an atomic commit
 * protocol, and a loader that reads a file whole and verifies every byte before anything is used. */
#ifndef TALLY_CKPT_CKPT_H
#define TALLY_CKPT_CKPT_H

#include <stddef.h>
#include <stdint.h>
#include <tally.h>

/* Where a run's checkpoints go and how often (`tally train --ckpt DIR --ckpt-every K --ckpt-keep N
 * --resume`). Two kept by default: a reader that read LATEST just before a commit still finds its file. */
#define TALLY__CKPT_KEEP_DEFAULT 2
typedef struct tally__ckpt_cfg {
    const char *dir; /* checkpoints go (and resume reads them) there; NULL: none */
    long every;      /* > 0: save after every this many steps; the end of training always saves */
    int keep;        /* checkpoints kept in dir; 0 means TALLY__CKPT_KEEP_DEFAULT */
    int resume;      /* start from the newest checkpoint in dir, when there is one */
} tally__ckpt_cfg;

/* ---- Format, version 1 (all integers little-endian) ----
 *
 * A checkpoint is one canonical, unsharded list of named tensors, whatever the world size or ZeRO
 * stage that wrote it. A scalar is a tensor of shape [1] (or ndim 0); a string is a u8 tensor.
 *
 * Fixed header, 64 bytes:
 *    0  magic "TALLYCK1"       8 bytes
 *    8  version                u32 = 1
 *   12  header bytes           u32 = 64
 *   16  entry bytes            u32 = 128
 *   20  tensor count           u32, at most TALLY__CKPT_MAX_TENSORS
 *   24  table bytes            u64 = count * 128
 *   32  file bytes             u64 = the exact size of the file
 *   40  step                   u64, at most INT64_MAX: the training step the state belongs to
 *   48  reserved               12 bytes, zero
 *   60  header CRC32C          u32, of bytes 0..59
 *
 * Tensor table at offset 64: count entries of 128 bytes, in data order:
 *    0  name                   64 bytes: 1..63 printable ASCII characters (0x20..0x7E), then NULs
 *   64  dtype                  u32, a tally_dtype code: TALLY_F32, TALLY_F64, TALLY_I64 or TALLY_U8
 *   68  ndim                   u32, 0..4 (0: a scalar, one element)
 *   72  shape[4]               u64 each; the entries past ndim are zero
 *  104  data offset            u64
 *  112  data bytes             u64 = product(shape[0..ndim)) * dtype size
 *  120  data CRC32C            u32, of the data bytes (not the padding)
 *  124  entry CRC32C           u32, of the entry's index (u32) followed by its bytes 0..123, so an
 *                              entry is valid only in its own place
 *
 * Data from offset 64 + table bytes (a multiple of 64): tensor i's bytes at its data offset, each
 * followed by zero bytes up to the next multiple of 64, where tensor i+1 starts. The file ends where the
 * last tensor's padding ends (at 64 + table bytes when there are no tensors): no gaps, no trailing bytes.
 * Tensor data is the host's representation, which tally requires to be little-endian.
 *
 * A directory of checkpoints (DIR) holds step-NNNNNNNNNN.tck files (the step, zero-padded to ten
 * digits) and LATEST, the manifest, six lines of text, each ending in '\n':
 *    tally checkpoint manifest 1
 *    file step-0000000100.tck
 *    bytes <the file's size>
 *    step <the step, as in the file's header>
 *    head-crc32c 0x<8 hex digits: CRC32C of the file's header and table, CRC fields left out>
 *    crc32c 0x<8 hex digits: CRC32C of the manifest's text before this line>
 *
 * The head CRC runs over header bytes 0..59, then bytes 0..123 of each entry: over bytes that end in
 * their own CRC, a CRC comes out the same whatever they hold, and would not tell two files apart.
 *
 * Commit protocol: the file is written as step-....tck.tmp (data, then header and table at offset 0),
 * fsynced, renamed to its final name and the directory fsynced; then LATEST is written the same way
 * (LATEST.tmp, fsync, rename, fsync the directory). The rename of LATEST is the commit. Only then are
 * stale .tmp files, uncommitted checkpoint files and all but the newest `keep` checkpoints removed, so a
 * crash at any instant leaves LATEST naming a complete, valid file. One process writes to a DIR at a
 * time (an flock on DIR makes a second one fail); any number may read. */

#define TALLY__CKPT_VERSION      1u
#define TALLY__CKPT_MAGIC        "TALLYCK1"
#define TALLY__CKPT_HEADER_BYTES 64u
#define TALLY__CKPT_ENTRY_BYTES  128u
#define TALLY__CKPT_ALIGN        64u
#define TALLY__CKPT_MAX_TENSORS  (1u << 20)
#define TALLY__CKPT_NAME_MAX     63 /* characters, not counting the NUL */
#define TALLY__CKPT_MAX_DIMS     4
#define TALLY__CKPT_KEEP_DEFAULT 2

/* Byte offsets of the fields, for tools and tests that craft files. */
enum {
    TALLY__CKPT_H_MAGIC = 0,
    TALLY__CKPT_H_VERSION = 8,
    TALLY__CKPT_H_HEADER_BYTES = 12,
    TALLY__CKPT_H_ENTRY_BYTES = 16,
    TALLY__CKPT_H_COUNT = 20,
    TALLY__CKPT_H_TABLE_BYTES = 24,
    TALLY__CKPT_H_FILE_BYTES = 32,
    TALLY__CKPT_H_STEP = 40,
    TALLY__CKPT_H_RESERVED = 48,
    TALLY__CKPT_H_CRC = 60,
    TALLY__CKPT_E_NAME = 0,
    TALLY__CKPT_E_DTYPE = 64,
    TALLY__CKPT_E_NDIM = 68,
    TALLY__CKPT_E_SHAPE = 72,
    TALLY__CKPT_E_OFFSET = 104,
    TALLY__CKPT_E_BYTES = 112,
    TALLY__CKPT_E_DATA_CRC = 120,
    TALLY__CKPT_E_CRC = 124,
};

/* One tensor. Read side: every field is filled, name and data point into the image, and data is 64-byte
 * aligned when the image is (a file read by tally__ckpt_open is). Write side (tally__ckpt_write_begin):
 * name, dtype, ndim and shape are read; data and bytes are ignored. */
typedef struct tally__ckpt_tensor {
    const char *name;
    tally_dtype dtype;
    int ndim;
    uint64_t shape[TALLY__CKPT_MAX_DIMS];
    const void *data;
    size_t bytes;
} tally__ckpt_tensor;

/* ---- Reading ---- */

typedef struct tally__ckpt tally__ckpt; /* a verified checkpoint image (opaque) */

/* Parses and verifies an image in memory: every check above. label names it in messages.
 * On success *out refers to buf (not copied): buf must outlive it.
 * Errors: TALLY_E_CORRUPT for a malformed or corrupt image, with a message naming label and, where one
 * is involved, the tensor ("checkpoint L: tensor 'fc1.weight' (#3): data CRC32C mismatch ..."; a
 * corrupt table entry as "tensor #3 (name as read 'fc1.weight')"); TALLY_E_INVALID for NULL arguments;
 * TALLY_E_NOMEM. Memory allocated is proportional to the table, which must fit in len first. */
int tally__ckpt_parse(const void *buf, size_t len, const char *label, tally__ckpt **out);
void tally__ckpt_close(tally__ckpt *c); /* also frees the image read from a file; NULL is fine */

/* Reads the file at path whole (memory of its size, freed by tally__ckpt_close) and verifies it as
 * tally__ckpt_parse does. TALLY_E_SYSTEM when it cannot be opened or read; a file that shrinks while it
 * is read is TALLY_E_INVALID naming it. What happens to the file afterwards cannot reach the image. */
int tally__ckpt_open(const char *path, tally__ckpt **out);

/* Returned by tally__ckpt_open_latest (a positive value, not an error) when DIR or DIR/LATEST does not
 * exist: nothing was ever committed there. *out is NULL and tally_last_error() says which was missing,
 * so --resume can start fresh or refuse, as its caller chooses. */
#define TALLY__CKPT_NONE 1

/* Reads DIR/LATEST, checks it, reads the file it names and verifies all of it, and that its size, step and
 * header CRC are the manifest's. 0 with *out set, TALLY__CKPT_NONE, or a negative error: a corrupt
 * manifest or a missing or corrupt file is TALLY_E_CORRUPT (never skipped for an older checkpoint), a
 * failing system call TALLY_E_SYSTEM. */
int tally__ckpt_open_latest(const char *dir, tally__ckpt **out);

int tally__ckpt_count(const tally__ckpt *c);
const tally__ckpt_tensor *tally__ckpt_at(const tally__ckpt *c, int i);              /* NULL when i is out of range */
const tally__ckpt_tensor *tally__ckpt_find(const tally__ckpt *c, const char *name); /* NULL if absent */
int64_t tally__ckpt_step(const tally__ckpt *c);
const char *tally__ckpt_label(const tally__ckpt *c); /* the path or label, for the caller's messages */
uint32_t tally__ckpt_head_crc(const tally__ckpt *c); /* the head CRC, as LATEST records it */

/* The tensor `name` when it has this dtype and exactly this shape (ndim dimensions; ndim 0 is a scalar):
 * *data points at its elements. Otherwise TALLY_E_INVALID with a message giving the dtype and shape the
 * file holds and those expected: the same elements in another shape (a [784, 512] for a [512, 784]) are
 * another tensor, not a transposed copy to load. */
int tally__ckpt_get(const tally__ckpt *c, const char *name, tally_dtype dtype, int ndim, const uint64_t *shape,
                    const void **data);

/* ---- Writing (one process per DIR; rank 0 in a job) ---- */

typedef struct tally__ckpt_writer tally__ckpt_writer;

/* Starts DIR/step-NNNNNNNNNN.tck.tmp for these tensors (names unique; DIR is created if missing). The
 * descriptors are copied. TALLY_E_INVALID for bad descriptors, for the step LATEST already names, or when
 * another writer holds DIR; TALLY_E_SYSTEM when DIR cannot be created or written. The commit removes
 * checkpoint files of later steps, so a trainer starting a fresh run (not --resume) in a DIR that holds
 * checkpoints should refuse, or ask, rather than write there. */
int tally__ckpt_write_begin(const char *dir, int64_t step, const tally__ckpt_tensor *tensors, int count,
                            tally__ckpt_writer **out);
/* Appends len bytes of tensor `index`'s data. Tensors come in table order, each one's chunks in order
 * (ZeRO stage 3 may hand a tensor over layer by layer); tensors of 0 bytes need no call. After an error
 * every later call returns that error at once and writes nothing, so a caller inside a loop of
 * collectives can keep going and report the error at commit. */
int tally__ckpt_write(tally__ckpt_writer *w, int index, const void *data, size_t len);
/* Finishes the file (flush, header and table, fsync, rename) and commits it through LATEST. Then removes
 * stale .tmp files, checkpoint files of later steps (renamed but never committed before a crash) and
 * all but the newest `keep` of the others, this one included (keep <= 0: keeps them all). With keep >= 2
 * a reader that read LATEST just before this commit still finds its file; one that read it is never affected.
 * Always frees w. On an error before the commit its files are removed and LATEST names the previous
 * checkpoint. A failure to remove an old file after the commit is logged, not returned. */
int tally__ckpt_write_commit(tally__ckpt_writer *w, int keep);
/* Abandons the checkpoint: removes the .tmp file, frees w (NULL is fine). LATEST is untouched. */
void tally__ckpt_write_abort(tally__ckpt_writer *w);

#endif
