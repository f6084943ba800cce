/* tally/data.h - training data: IDX files (plain or gzip), the Fashion-MNIST and synthetic data sets
 * in memory, the distributed sampler that gives each rank its own disjoint shard every epoch, and text
 * as byte tokens for a GPT. */
#ifndef TALLY_DATA_H
#define TALLY_DATA_H

#include <stddef.h>
#include <stdint.h>
#include <tally.h>

#ifdef __cplusplus
extern "C" {
#endif

/* An IDX file (the MNIST format): magic 0x0000TTNN (TT the element type, NN the number of dimensions),
 * NN big-endian u32 dimensions, then the elements big-endian, row-major. */
typedef enum {
    TALLY_IDX_U8 = 0x08,
    TALLY_IDX_I8 = 0x09,
    TALLY_IDX_I16 = 0x0B,
    TALLY_IDX_I32 = 0x0C,
    TALLY_IDX_F32 = 0x0D,
    TALLY_IDX_F64 = 0x0E
} tally_idx_type;

#define TALLY_IDX_MAX_DIMS 8

typedef struct tally_idx {
    tally_idx_type type;
    int ndim;
    uint32_t dims[TALLY_IDX_MAX_DIMS];
    size_t count; /* product of dims */
    void *data;   /* count elements in host byte order (malloc'd) */
} tally_idx;

/* Reads `path`; a name ending in ".gz" is inflated with zlib. Rejects, with a message naming the file
 * and what is wrong (tally_last_error()): a missing or unreadable file (TALLY_E_SYSTEM), a bad magic,
 * unknown type, zero or too many dimensions, a size that overflows, data shorter or longer than the
 * header says, a corrupt gzip stream (TALLY_E_INVALID). Never allocates more than the file can hold. */
TALLY_API int tally_idx_read(const char *path, tally_idx *out);
/* The header alone (type, dims, count; data NULL, nothing to free), checked as tally_idx_read checks
 * it, so a caller can hold what a file declares against what it expects (and two files against each
 * other) before reading its data: a small .gz can declare gigabytes. Only regular files are read: a FIFO
 * or a device is refused (TALLY_E_INVALID) without blocking. */
TALLY_API int tally_idx_read_header(const char *path, tally_idx *out);
TALLY_API void tally_idx_free(tally_idx *idx);

/* A data set held in memory: n samples of dim floats, and either class labels or regression targets. */
typedef struct tally_dataset {
    size_t n;                    /* samples */
    int dim;                     /* features per sample (C*H*W for images) */
    int channels, height, width; /* image geometry; 0 when the samples are not images */
    int classes;                 /* number of classes; 0 for regression */
    int tdim;                    /* regression target width; 0 for classification */
    float *x;                    /* [n, dim]; images scaled to [0, 1] (tally_dataset_standardize: mean 0, sd 1) */
    int32_t *y;                  /* [n] labels when classes > 0, else NULL */
    float *t;                    /* [n, tdim] targets when tdim > 0, else NULL */
} tally_dataset;

/* Default location of Debian's dataset-fashion-mnist package. */
#define TALLY_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"

/* Loads train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and
 * t10k-labels-idx1-ubyte from dir (each plain or .gz) and checks they agree (counts, 28x28, labels
 * < 10). TALLY_E_SYSTEM when a file is absent (the message names it), TALLY_E_INVALID when malformed. */
TALLY_API int tally_dataset_load_mnist(const char *dir, tally_dataset *train, tally_dataset *test);

/* A learnable stand-in for Fashion-MNIST generated from seed: 1x28x28 images in [0,1], 10 classes
 * (each a fixed random prototype plus noise), n_train and n_test samples. */
TALLY_API int tally_dataset_synthetic(uint64_t seed, size_t n_train, size_t n_test, tally_dataset *train,
                                      tally_dataset *test);

/* Least squares data, the classic data-parallel example: x ~ N(0,1)^features, y = x.w + b + noise*N(0,1)
 * with w ~ N(0,1)^features and b ~ N(0,1) drawn from seed. true_w (features + 1 floats: w then b) may
 * be NULL. tdim is 1. */
TALLY_API int tally_dataset_linear(uint64_t seed, size_t n, int features, float noise, float *true_w,
                                   tally_dataset *out);

/* Standardizes images by the training set's own statistics, per channel: x = (x - mean_c) / std_c, the
 * mean and the (population) standard deviation over every pixel of channel c of train, applied to train
 * and to test (NULL or empty: none), as torchvision's Normalize does with a data set's mean and std.
 * mean and sd (channels floats each; either may be NULL) receive them. TALLY_E_INVALID, both sets left
 * as they were, when train holds no images (channels 0) or no samples, test's geometry differs, or a
 * channel of train is constant or not finite. */
TALLY_API int tally_dataset_standardize(tally_dataset *train, tally_dataset *test, float *mean, float *sd);

TALLY_API void tally_dataset_free(tally_dataset *d);

/* Distributed sampler. Every epoch has one permutation of 0..n-1 drawn from (seed, epoch), the same on
 * every rank. Rank r takes positions r, r+size, r+2*size, ... of it, floor(n/size) samples, so shards
 * are disjoint and equal; the n % size samples left over are skipped that epoch (with shuffling a
 * different few each epoch; evaluation should not use the sampler, or should score them elsewhere).
 * Batch i of every rank at batch size b (its samples i*b .. i*b+b-1) together are the positions
 * [i*b*size, (i+1)*b*size) of the permutation: the same samples as batch i of one rank at b*size. */
typedef struct tally_sampler {
    size_t n; /* data set size */
    int rank, size;
    uint64_t seed;
    int shuffle;  /* 0: identity order every epoch (evaluation) */
    int epoch;    /* the epoch whose permutation perm holds */
    size_t *perm; /* [n] */
} tally_sampler;

TALLY_API int tally_sampler_init(tally_sampler *s, size_t n, int rank, int size, uint64_t seed, int shuffle);
/* Draws the permutation of `epoch` (deterministic in seed and epoch alone). */
TALLY_API void tally_sampler_set_epoch(tally_sampler *s, int epoch);
/* Samples this rank sees per epoch: floor(n / size). */
TALLY_API size_t tally_sampler_len(const tally_sampler *s);
/* Data set index of this rank's i-th sample this epoch (i < tally_sampler_len). */
TALLY_API size_t tally_sampler_index(const tally_sampler *s, size_t i);
TALLY_API void tally_sampler_free(tally_sampler *s);

/* Text as byte tokens (a GPT's data): a file of at most TALLY_TEXT_MAX_BYTES read whole into memory at
 * open, so what another program does to the file afterwards (truncating it, rewriting it) does not reach
 * the windows. Bytes [0, train_n) are the training part, [train_n, n) the validation part. */
typedef struct tally_text {
    const uint8_t *bytes; /* the file's bytes, as read at open */
    size_t n;             /* bytes in the file */
    size_t train_n;       /* bytes of the training part */
    const char *path;     /* as given to tally_text_open (not copied) */
} tally_text;

#define TALLY_TEXT_VOCAB     256
#define TALLY_TEXT_MAX_BYTES (1ull << 31) /* 2 GiB: enwik9's 10^9 bytes twice over */

/* Reads path whole; the last val_frac of it (0 <= val_frac < 1; rounded down to whole bytes) is held out for
 * validation. Refused with a message naming the file (tally_last_error()): a missing or unreadable file
 * (TALLY_E_SYSTEM), a directory, FIFO or device (TALLY_E_INVALID, without blocking), an empty file
 * (TALLY_E_INVALID), one larger than TALLY_TEXT_MAX_BYTES or one that shrinks while it is read
 * (TALLY_E_INVALID), val_frac outside [0, 1) (TALLY_E_INVALID). On failure *out is zeroed. */
TALLY_API int tally_text_open(const char *path, double val_frac, tally_text *out);
/* Whether windows of T+1 bytes fit: the training part must hold at least T+1 bytes, and the validation
 * part too unless it is empty. TALLY_E_INVALID with the file, its size, the part that is too short and
 * what to do (a longer file, a smaller --context, or another --val-frac); T < 1 is refused too. */
TALLY_API int tally_text_check(const tally_text *t, int T);
/* The window at byte `start`: tokens[i] = bytes[start + i], targets[i] = bytes[start + i + 1], i < T.
 * start + T < n is the caller's to keep (tally_text_train_starts and tally_text_val_start do). */
TALLY_API void tally_text_window(const tally_text *t, size_t start, int T, int32_t *tokens, int32_t *targets);
/* The starts of windows first .. first+count-1 of training step `step`'s global batch: each uniform in
 * [0, train_n - T - 1] and a function of (seed, step, window index) alone (each window has its own
 * random stream), so rank r of N taking windows r*B .. r*B+B-1 draws the same windows as one rank taking
 * all N*B, and a resumed run draws what the uninterrupted one would. Requires tally_text_check(t, T). */
TALLY_API void tally_text_train_starts(const tally_text *t, uint64_t seed, long step, int T, size_t first, size_t count,
                                       size_t *starts);
/* Start of validation window i of `windows`, spread evenly over the validation part (the first at its
 * first byte, the last ending at its last byte; one window: the first). Requires a validation part that
 * holds T+1 bytes and 0 <= i < windows. */
TALLY_API size_t tally_text_val_start(const tally_text *t, int T, int i, int windows);
/* Frees the bytes; NULL-safe, and safe on a zeroed or already closed t. */
TALLY_API void tally_text_close(tally_text *t);

#ifdef __cplusplus
}
#endif
#endif
