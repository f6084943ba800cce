/* text.c - byte-level text data for a GPT: a file read whole into memory and split into training and
 * validation parts, its windows of T+1 bytes, and the training windows' random starts drawn per (seed,
 * step, window). */
#include <tally/data.h>

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/err.h"
#include "../core/file.h"
#include "../core/rng.h"

#define STREAM_TEXT 0x5445585457494e44ull /* "TEXTWIND" */

/* A fraction typed in decimal (0.29) is a hair below itself in binary, and n * it a hair below the whole
 * number the user meant; a few ulps of slack keeps floor from taking a byte off. */
static size_t val_bytes(size_t n, double val_frac) {
    double v = (double)n * val_frac;
    v = floor(v + v * 4 * DBL_EPSILON);
    return v >= (double)n ? n : (size_t)v;
}

/* Read whole at open: a file that another program truncates or rewrites later cannot reach the run (a
 * mapping of it would fault with SIGBUS past its new end), and one that shrinks while it is read is an
 * error naming it. Each rank holds its own copy, so the size is bounded. */
static int read_file(int fd, const char *path, uint64_t size, tally_text *out) {
    if (size > TALLY_TEXT_MAX_BYTES)
        return tally__seterr(TALLY_E_INVALID,
                             "%s: %llu bytes, more than the %llu a text data set may hold (each rank reads it whole "
                             "into memory): train on a part of it",
                             path, (unsigned long long)size, (unsigned long long)TALLY_TEXT_MAX_BYTES);
    unsigned char *bytes;
    int rc = tally__file_read_all(fd, path, size, &bytes);
    if (rc) return rc;
    out->bytes = bytes;
    out->n = (size_t)size;
    return 0;
}

TALLY_API int tally_text_open(const char *path, double val_frac, tally_text *out) {
    tally__clearerr();
    if (!out) return tally__seterr(TALLY_E_INVALID, "tally_text_open: out is NULL");
    memset(out, 0, sizeof *out);
    if (!path) return tally__seterr(TALLY_E_INVALID, "tally_text_open: path is NULL");
    if (!(val_frac >= 0 && val_frac < 1)) /* written so that NaN fails too */
        return tally__seterr(TALLY_E_INVALID, "%s: --val-frac %g is not in [0, 1): give the fraction held out", path,
                             val_frac);
    int fd;
    uint64_t size;
    int rc = tally__file_open_read(AT_FDCWD, path, path, &fd, &size); /* a FIFO would block the open */
    if (rc) return rc;
    if (size == 0)
        rc = tally__seterr(TALLY_E_INVALID, "%s: the file is empty; a text data set needs bytes to train on", path);
    else
        rc = read_file(fd, path, size, out);
    close(fd);
    if (rc) return rc;
    out->train_n = out->n - val_bytes(out->n, val_frac);
    out->path = path;
    return 0;
}

static int too_short(const tally_text *t, const char *part, size_t have, int T) {
    return tally__seterr(TALLY_E_INVALID,
                         "%s: %zu bytes, of which the %s part holds %zu, fewer than one window of %ld bytes "
                         "(--context %d and the byte after it): use a longer file, a smaller --context, or another "
                         "--val-frac",
                         t->path, t->n, part, have, (long)T + 1, T);
}

TALLY_API int tally_text_check(const tally_text *t, int T) {
    tally__clearerr();
    if (!t || !t->bytes) return tally__seterr(TALLY_E_INVALID, "tally_text_check: the text is not open");
    if (T < 1) return tally__seterr(TALLY_E_INVALID, "%s: --context %d is not a positive window length", t->path, T);
    size_t need = (size_t)T + 1, val = t->n - t->train_n;
    if (t->train_n < need) return too_short(t, "training", t->train_n, T);
    if (val > 0 && val < need) return too_short(t, "validation", val, T);
    return 0;
}

TALLY_API void tally_text_window(const tally_text *t, size_t start, int T, int32_t *tokens, int32_t *targets) {
    const uint8_t *b = t->bytes + start;
    for (int i = 0; i < T; i++) {
        tokens[i] = b[i];
        targets[i] = b[i + 1];
    }
}

/* One stream per window, keyed by (seed, step) and the window's index in the global batch: a window's
 * start never depends on which rank draws it, on how many windows a call asks for, or on earlier steps,
 * and a call costs its own windows only (no skipping over the draws of the windows before `first`). */
static uint64_t step_key(uint64_t seed, long step) {
    tally__rng r;
    tally__rng_seed(&r, seed, STREAM_TEXT);
    tally__rng_seed(&r, tally__rng_next(&r), (uint64_t)(int64_t)step);
    return tally__rng_next(&r);
}

TALLY_API void tally_text_train_starts(const tally_text *t, uint64_t seed, long step, int T, size_t first, size_t count,
                                       size_t *starts) {
    uint64_t key = step_key(seed, step), bound = (uint64_t)(t->train_n - (size_t)T); /* starts 0 .. train_n-T-1 */
    for (size_t k = 0; k < count; k++) {
        tally__rng r;
        tally__rng_seed(&r, key, (uint64_t)(first + k)); /* distinct windows, distinct states: the mix is a bijection */
        starts[k] = (size_t)tally__rng_below(&r, bound);
    }
}

TALLY_API size_t tally_text_val_start(const tally_text *t, int T, int i, int windows) {
    if (windows <= 1) return t->train_n;
    /* span * i would overflow past 2^33 bytes at 2^31 windows: split span into quotient and remainder. */
    size_t span = t->n - t->train_n - (size_t)T - 1, d = (size_t)windows - 1;
    size_t q = span / d, r = span % d;
    return t->train_n + q * (size_t)i + r * (size_t)i / d;
}

TALLY_API void tally_text_close(tally_text *t) {
    if (!t) return;
    free((void *)t->bytes);
    memset(t, 0, sizeof *t);
}
