/* test_data.c - checks the data layer: IDX round trips and every rejection of a malformed file (plain
 * and gzip), the Fashion-MNIST loader on fake and real files, the sampler's shards, and the generators. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* strcasestr */
#endif
#include <tally/data.h>

#include <ftw.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "harness.h"

static char tmpdir[64];

/* ---- files ---- */

static const char *tpath(const char *name) { return th_path(tmpdir, name); }

static void write_gz(const char *path, const void *data, size_t n) {
    gzFile g = gzopen(path, "wb");
    if (!g || (n && gzwrite(g, data, (unsigned)n) != (int)n) || gzclose(g) != Z_OK) {
        fprintf(stderr, "%s: gzip write failed\n", path);
        exit(2);
    }
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) exit(2);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    rewind(f);
    unsigned char *b = malloc(*n + 1);
    if (!b || fread(b, 1, *n, f) != *n) exit(2);
    fclose(f);
    return b;
}

static int rm_entry(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(p);
}

static void rm_tree(const char *dir) { nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* ---- IDX encoding ---- */

static size_t esize(int type) {
    if (type == TALLY_IDX_I16) return 2;
    if (type == TALLY_IDX_I32 || type == TALLY_IDX_F32) return 4;
    return type == TALLY_IDX_F64 ? 8 : 1;
}

/* An IDX image: header then `data_len` bytes of already big-endian data. */
static unsigned char *idx_encode(int type, int ndim, const uint32_t *dims, const void *data, size_t data_len,
                                 size_t *n) {
    *n = 4 + 4 * (size_t)ndim + data_len;
    unsigned char *b = malloc(*n + 1), *p = b;
    *p++ = 0, *p++ = 0, *p++ = (unsigned char)type, *p++ = (unsigned char)ndim;
    for (int i = 0; i < ndim; i++, p += 4)
        p[0] = dims[i] >> 24, p[1] = dims[i] >> 16 & 255, p[2] = dims[i] >> 8 & 255, p[3] = dims[i] & 255;
    if (data_len) memcpy(p, data, data_len);
    return b;
}

static void write_idx(const char *path, int gz, int type, int ndim, const uint32_t *dims, const void *data,
                      size_t data_len) {
    size_t n;
    unsigned char *b = idx_encode(type, ndim, dims, data, data_len, &n);
    gz ? write_gz(path, b, n) : th_write_file(path, b, n);
    free(b);
}

/* Element i of a test array of `type`, as host bits in the low bytes of a u64. */
static uint64_t test_value(int type, size_t i) {
    uint64_t u = 0;
    switch (type) {
    case TALLY_IDX_U8: return (i * 37 + 11) & 255;
    case TALLY_IDX_I8: return (uint8_t)(int8_t)(i * 37 - 100);
    case TALLY_IDX_I16: return (uint16_t)(int16_t)(i * 1237 - 30000);
    case TALLY_IDX_I32: return (uint32_t)(i * 123456789u ^ 0x80000001u);
    case TALLY_IDX_F32: {
        float f = (float)i * -1.5f + 0.25f;
        uint32_t v;
        memcpy(&v, &f, 4);
        return v;
    }
    default: {
        double d = (double)i * 3.14159e10 - 7;
        memcpy(&u, &d, 8);
        return u;
    }
    }
}

/* Big-endian bytes and the expected host-order array for n elements. */
static void test_arrays(int type, size_t n, unsigned char *be, unsigned char *host) {
    size_t es = esize(type);
    for (size_t i = 0; i < n; i++) {
        uint64_t v = test_value(type, i);
        for (size_t k = 0; k < es; k++) be[i * es + k] = (unsigned char)(v >> (8 * (es - 1 - k)));
        if (es == 1)
            host[i] = (unsigned char)v;
        else if (es == 2) {
            uint16_t h = (uint16_t)v;
            memcpy(host + 2 * i, &h, 2);
        } else if (es == 4) {
            uint32_t h = (uint32_t)v;
            memcpy(host + 4 * i, &h, 4);
        } else
            memcpy(host + 8 * i, &v, 8);
    }
}

/* ---- IDX round trips ---- */

static void roundtrip(int type, int gz) {
    uint32_t dims[3] = {3, 5, 7};
    size_t n = 105, es = esize(type);
    unsigned char *be = malloc(n * es), *host = malloc(n * es);
    test_arrays(type, n, be, host);
    const char *p = tpath(gz ? "rt.idx.gz" : "rt.idx");
    write_idx(p, gz, type, 3, dims, be, n * es);
    tally_idx idx;
    int rc = tally_idx_read(p, &idx);
    TH_CHECK(rc == 0, "round trip type 0x%02x gz=%d: rc %d: %s", type, gz, rc, tally_last_error());
    if (rc == 0) {
        TH_CHECK(idx.type == (tally_idx_type)type && idx.ndim == 3 && idx.dims[0] == 3 && idx.dims[1] == 5 &&
                     idx.dims[2] == 7 && idx.count == n,
                 "round trip type 0x%02x gz=%d: header fields", type, gz);
        TH_CHECK(memcmp(idx.data, host, n * es) == 0, "round trip type 0x%02x gz=%d: data differ", type, gz);
    }
    tally_idx_free(&idx);
    free(be);
    free(host);
}

static void test_idx_roundtrips(void) {
    const int types[] = {TALLY_IDX_U8, TALLY_IDX_I8, TALLY_IDX_I16, TALLY_IDX_I32, TALLY_IDX_F32, TALLY_IDX_F64};
    for (int gz = 0; gz < 2; gz++)
        for (size_t t = 0; t < sizeof types / sizeof *types; t++) roundtrip(types[t], gz);

    /* Eight dimensions, one of them zero: a valid empty array. */
    uint32_t d8[8] = {1, 2, 1, 3, 1, 1, 0, 4};
    write_idx(tpath("empty8.idx"), 0, TALLY_IDX_I32, 8, d8, NULL, 0);
    tally_idx idx;
    int rc = tally_idx_read(tpath("empty8.idx"), &idx);
    TH_CHECK(rc == 0 && idx.ndim == 8 && idx.count == 0 && idx.data, "8 dims, count 0: rc %d %s", rc,
             tally_last_error());
    tally_idx_free(&idx);

    /* gzip allows concatenated members; gunzip reads them as one stream. */
    uint32_t d1 = 300;
    unsigned char v[300];
    for (int i = 0; i < 300; i++) v[i] = (unsigned char)(i * 7);
    size_t n, na, nb;
    unsigned char *whole = idx_encode(TALLY_IDX_U8, 1, &d1, v, 300, &n);
    write_gz(tpath("a.gz"), whole, 100);
    write_gz(tpath("b.gz"), whole + 100, n - 100);
    unsigned char *a = slurp(tpath("a.gz"), &na), *b = slurp(tpath("b.gz"), &nb);
    unsigned char *ab = malloc(na + nb);
    memcpy(ab, a, na);
    memcpy(ab + na, b, nb);
    th_write_file(tpath("multi.idx.gz"), ab, na + nb);
    rc = tally_idx_read(tpath("multi.idx.gz"), &idx);
    TH_CHECK(rc == 0 && idx.count == 300 && memcmp(idx.data, v, 300) == 0, "multi-member gzip: rc %d %s", rc,
             tally_last_error());
    tally_idx_free(&idx);
    free(whole), free(a), free(b), free(ab);
}

/* ---- IDX rejections ---- */

/* Reads `name` (in tmpdir) expecting `code`, a message naming the file and containing `word`. */
static void expect_fail(const char *name, int code, const char *word) {
    tally_idx idx;
    memset(&idx, 0xab, sizeof idx);
    double t0 = th_now();
    int rc = tally_idx_read(tpath(name), &idx);
    double dt = th_now() - t0;
    const char *msg = tally_last_error();
    TH_CHECK(rc == code, "%s: rc %d, want %d (%s)", name, rc, code, msg);
    TH_CHECK(strstr(msg, name) != NULL, "%s: message does not name the file: %s", name, msg);
    TH_CHECK(strcasestr(msg, word) != NULL, "%s: message lacks '%s': %s", name, word, msg);
    TH_CHECK(idx.data == NULL && idx.count == 0, "%s: output not cleared on failure", name);
    TH_CHECK(dt < 0.5, "%s: took %.3f s to fail", name, dt);
    tally_idx_free(&idx);
}

static void write_raw(const char *name, const unsigned char *b, size_t n) { th_write_file(tpath(name), b, n); }

static void test_idx_header_errors(void) {
    expect_fail("missing.idx", TALLY_E_SYSTEM, "no such file");
    expect_fail("missing.idx.gz", TALLY_E_SYSTEM, "no such file");
    write_raw("empty.idx", NULL, 0);
    expect_fail("empty.idx", TALLY_E_INVALID, "empty");
    write_raw("empty.idx.gz", NULL, 0);
    expect_fail("empty.idx.gz", TALLY_E_INVALID, "empty");
    write_gz(tpath("emptydata.idx.gz"), NULL, 0);
    expect_fail("emptydata.idx.gz", TALLY_E_INVALID, "empty");
    mkdir(tpath("adir.idx"), 0700); /* not a regular file: refused as input, and a FIFO without blocking */
    expect_fail("adir.idx", TALLY_E_INVALID, "is a directory, not a regular file");
    mkfifo(tpath("afifo.idx"), 0600);
    expect_fail("afifo.idx", TALLY_E_INVALID, "is a FIFO, not a regular file");
    mkfifo(tpath("afifo.idx.gz"), 0600);
    expect_fail("afifo.idx.gz", TALLY_E_INVALID, "is a FIFO");

    const unsigned char magic1[] = {0x01, 0, 8, 1, 0, 0, 0, 1, 5};
    write_raw("magic1.idx", magic1, sizeof magic1);
    expect_fail("magic1.idx", TALLY_E_INVALID, "magic");
    const unsigned char magic2[] = {0, 0x20, 8, 1, 0, 0, 0, 1, 5};
    write_raw("magic2.idx", magic2, sizeof magic2);
    expect_fail("magic2.idx", TALLY_E_INVALID, "magic");
    write_gz(tpath("magic.idx.gz"), magic1, sizeof magic1);
    expect_fail("magic.idx.gz", TALLY_E_INVALID, "magic");
    const unsigned char type[] = {0, 0, 0x0A, 1, 0, 0, 0, 1, 5};
    write_raw("type.idx", type, sizeof type);
    expect_fail("type.idx", TALLY_E_INVALID, "type");
    const unsigned char nodim[] = {0, 0, 8, 0, 5};
    write_raw("nodim.idx", nodim, sizeof nodim);
    expect_fail("nodim.idx", TALLY_E_INVALID, "dimensions");
    unsigned char many[4 + 9 * 4 + 1] = {0, 0, 8, 9};
    for (int i = 0; i < 9; i++) many[4 + 4 * i + 3] = 1;
    write_raw("manydims.idx", many, sizeof many);
    expect_fail("manydims.idx", TALLY_E_INVALID, "too many dimensions");

    uint32_t big[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
    write_idx(tpath("overflow.idx"), 0, TALLY_IDX_U8, 4, big, "xyz", 3);
    expect_fail("overflow.idx", TALLY_E_INVALID, "overflow");
    uint32_t big2[2] = {0x80000000u, 0x80000000u}; /* 2^62 elements: only the byte size overflows */
    write_idx(tpath("overflow2.idx"), 0, TALLY_IDX_F64, 2, big2, "xyz", 3);
    expect_fail("overflow2.idx", TALLY_E_INVALID, "overflow");

    const unsigned char short1[] = {0, 0, 8};
    write_raw("shorthdr1.idx", short1, sizeof short1);
    expect_fail("shorthdr1.idx", TALLY_E_INVALID, "truncated header");
    const unsigned char short2[] = {0, 0, 8, 2, 0, 0, 0, 3, 0, 0};
    write_raw("shorthdr2.idx", short2, sizeof short2);
    expect_fail("shorthdr2.idx", TALLY_E_INVALID, "truncated header");
    write_gz(tpath("shorthdr.idx.gz"), short2, sizeof short2);
    expect_fail("shorthdr.idx.gz", TALLY_E_INVALID, "truncated header");
}

/* Declared sizes far beyond the file must fail before the buffer is allocated, hence fast. */
static void test_idx_size_errors(void) {
    uint32_t d[2] = {5, 4};
    unsigned char data[21] = "0123456789abcdefghij";
    write_idx(tpath("short.idx"), 0, TALLY_IDX_U8, 2, d, data, 19);
    expect_fail("short.idx", TALLY_E_INVALID, "truncated");
    write_idx(tpath("short.idx.gz"), 1, TALLY_IDX_U8, 2, d, data, 19);
    expect_fail("short.idx.gz", TALLY_E_INVALID, "truncated");
    write_idx(tpath("long.idx"), 0, TALLY_IDX_U8, 2, d, data, 21);
    expect_fail("long.idx", TALLY_E_INVALID, "trailing");
    write_idx(tpath("long.idx.gz"), 1, TALLY_IDX_U8, 2, d, data, 21);
    expect_fail("long.idx.gz", TALLY_E_INVALID, "trailing");
    uint32_t d16[1] = {5};
    write_idx(tpath("odd.idx"), 0, TALLY_IDX_I16, 1, d16, data, 9); /* half an element short */
    expect_fail("odd.idx", TALLY_E_INVALID, "truncated");

    uint32_t huge[2] = {1u << 20, 1u << 20}; /* 2^40 elements: over the cap */
    write_idx(tpath("huge.idx"), 0, TALLY_IDX_U8, 2, huge, data, 20);
    expect_fail("huge.idx", TALLY_E_INVALID, "too large");
    write_idx(tpath("huge.idx.gz"), 1, TALLY_IDX_U8, 2, huge, data, 20);
    expect_fail("huge.idx.gz", TALLY_E_INVALID, "too large");
    uint32_t under[2] = {1u << 15, 1u << 15}; /* exactly the 4 GiB cap, 20 bytes present */
    write_idx(tpath("tiny.idx"), 0, TALLY_IDX_I32, 2, under, data, 20);
    expect_fail("tiny.idx", TALLY_E_INVALID, "truncated");
    write_idx(tpath("tiny.idx.gz"), 1, TALLY_IDX_I32, 2, under, data, 20);
    expect_fail("tiny.idx.gz", TALLY_E_INVALID, "truncated");

    /* Within what the compressed size allows, yet short: the inflated bytes decide. */
    size_t n = 200000;
    unsigned char *noise = malloc(n);
    uint64_t s = 1;
    for (size_t i = 0; i < n; i++) s = s * 6364136223846793005ull + 1442695040888963407ull, noise[i] = s >> 56;
    uint32_t d50m[1] = {50u << 20};
    write_idx(tpath("shortbig.idx.gz"), 1, TALLY_IDX_U8, 1, d50m, noise, n);
    expect_fail("shortbig.idx.gz", TALLY_E_INVALID, "truncated");
    free(noise);
}

static void test_idx_gzip_errors(void) {
    /* A valid gzip header (deflate, no flags) followed by garbage. */
    unsigned char bad[64] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3};
    for (int i = 10; i < 64; i++) bad[i] = (unsigned char)(0xff - i * 3);
    write_raw("garbage.idx.gz", bad, sizeof bad);
    expect_fail("garbage.idx.gz", TALLY_E_INVALID, "corrupt");
    /* A plain IDX file named .gz. */
    const unsigned char plain[] = {0, 0, 8, 1, 0, 0, 0, 1, 5};
    write_raw("notgz.idx.gz", plain, sizeof plain);
    expect_fail("notgz.idx.gz", TALLY_E_INVALID, "corrupt");

    uint32_t d[1] = {4000};
    unsigned char *v = malloc(4000);
    for (int i = 0; i < 4000; i++) v[i] = (unsigned char)(i * i);
    write_idx(tpath("good.idx.gz"), 1, TALLY_IDX_U8, 1, d, v, 4000);
    size_t n;
    unsigned char *gz = slurp(tpath("good.idx.gz"), &n);
    gz[n - 6] ^= 0x5a; /* the CRC-32 in the trailer: only a full check of the stream notices */
    write_raw("badcrc.idx.gz", gz, n);
    expect_fail("badcrc.idx.gz", TALLY_E_INVALID, "corrupt");
    gz[n - 6] ^= 0x5a;
    write_raw("cut.idx.gz", gz, n / 2);
    expect_fail("cut.idx.gz", TALLY_E_INVALID, "truncated");
    write_raw("cuttrailer.idx.gz", gz, n - 3);
    expect_fail("cuttrailer.idx.gz", TALLY_E_INVALID, "truncated");
    unsigned char *junk = malloc(n + 4);
    memcpy(junk, gz, n);
    memcpy(junk + n, "junk", 4);
    write_raw("junk.idx.gz", junk, n + 4);
    expect_fail("junk.idx.gz", TALLY_E_INVALID, "trailing garbage");
    free(junk), free(gz), free(v);
}

/* ---- Fashion-MNIST loader ---- */

typedef struct fake_split {
    uint32_t n_img, n_lab, h, w;
    int bad_label; /* index of a label set to 10, -1 for none */
} fake_split;

static void write_split(const char *dir, const char *split, const fake_split *f, int gz) {
    char p[600];
    uint32_t di[3] = {f->n_img, f->h, f->w};
    size_t npx = (size_t)f->n_img * f->h * f->w;
    unsigned char *px = malloc(npx + 1), *lb = malloc(f->n_lab + 1);
    for (size_t i = 0; i < npx; i++) px[i] = (unsigned char)(i * 31 + 7);
    for (uint32_t i = 0; i < f->n_lab; i++) lb[i] = (unsigned char)(i % 10);
    if (f->bad_label >= 0) lb[f->bad_label] = 10;
    snprintf(p, sizeof p, "%s/%s-images-idx3-ubyte%s", dir, split, gz ? ".gz" : "");
    write_idx(p, gz, TALLY_IDX_U8, 3, di, px, npx);
    snprintf(p, sizeof p, "%s/%s-labels-idx1-ubyte%s", dir, split, gz ? ".gz" : "");
    write_idx(p, gz, TALLY_IDX_U8, 1, &f->n_lab, lb, f->n_lab);
    free(px), free(lb);
}

static const char *make_mnist_dir(const char *name, const fake_split *train, const fake_split *test) {
    const char *d = tpath(name);
    mkdir(d, 0700);
    write_split(d, "train", train, 1);
    write_split(d, "t10k", test, 0);
    return d;
}

static int datasets_cleared(const tally_dataset *a, const tally_dataset *b) {
    return !a->x && !a->y && !a->n && !b->x && !b->y && !b->n;
}

static void expect_mnist_fail(const char *dir, int code, const char *file, const char *word) {
    tally_dataset tr, te;
    int rc = tally_dataset_load_mnist(dir, &tr, &te);
    const char *msg = tally_last_error();
    TH_CHECK(rc == code, "mnist %s: rc %d, want %d (%s)", dir, rc, code, msg);
    TH_CHECK(strstr(msg, file) != NULL, "mnist %s: message does not name %s: %s", dir, file, msg);
    TH_CHECK(strcasestr(msg, word) != NULL, "mnist %s: message lacks '%s': %s", dir, word, msg);
    TH_CHECK(datasets_cleared(&tr, &te), "mnist %s: outputs not cleared on failure", dir);
    tally_dataset_free(&tr);
    tally_dataset_free(&te);
}

static void check_fake_loaded(const tally_dataset *d, size_t n) {
    TH_CHECK(d->n == n && d->dim == 784 && d->channels == 1 && d->height == 28 && d->width == 28 && d->classes == 10 &&
                 d->tdim == 0 && d->t == NULL,
             "fake mnist: geometry of %zu samples", n);
    int ok = 1;
    for (size_t i = 0; i < n * 784; i++) ok &= d->x[i] == (float)(unsigned char)(i * 31 + 7) / 255.0f;
    for (size_t i = 0; i < n; i++) ok &= d->y[i] == (int32_t)(i % 10);
    TH_CHECK(ok, "fake mnist: pixel or label values differ");
}

static void test_mnist_fake(void) {
    fake_split tr = {5, 5, 28, 28, -1}, te = {3, 3, 28, 28, -1};
    const char *d = make_mnist_dir("mnist_ok", &tr, &te);
    tally_dataset a, b;
    int rc = tally_dataset_load_mnist(d, &a, &b);
    TH_CHECK(rc == 0, "fake mnist: rc %d: %s", rc, tally_last_error());
    if (rc == 0) check_fake_loaded(&a, 5), check_fake_loaded(&b, 3);
    tally_dataset_free(&a);
    tally_dataset_free(&b);
    /* A broken plain file beside a good .gz: the .gz is the one read. */
    th_write_file(tpath("mnist_ok/train-images-idx3-ubyte"), "junk", 4);
    rc = tally_dataset_load_mnist(d, &a, &b);
    TH_CHECK(rc == 0 && a.n == 5, "fake mnist: .gz not preferred: rc %d %s", rc, tally_last_error());
    tally_dataset_free(&a);
    tally_dataset_free(&b);

    fake_split mism = {5, 4, 28, 28, -1}, wrong = {5, 5, 27, 28, -1}, badl = {5, 5, 28, 28, 3};
    expect_mnist_fail(make_mnist_dir("mnist_count", &mism, &te), TALLY_E_INVALID, "train-labels-idx1-ubyte.gz",
                      "mismatch");
    expect_mnist_fail(make_mnist_dir("mnist_size", &tr, &wrong), TALLY_E_INVALID, "t10k-images-idx3-ubyte",
                      "image size");
    expect_mnist_fail(make_mnist_dir("mnist_label", &tr, &badl), TALLY_E_INVALID, "t10k-labels-idx1-ubyte",
                      "out of range");
    expect_mnist_fail(tpath("no_such_dir"), TALLY_E_SYSTEM, "train-images-idx3-ubyte", "dataset-fashion-mnist");
    char part[512];
    snprintf(part, sizeof part, "%s", make_mnist_dir("mnist_part", &tr, &te));
    d = part;
    remove(tpath("mnist_part/t10k-labels-idx1-ubyte"));
    expect_mnist_fail(d, TALLY_E_SYSTEM, "t10k-labels-idx1-ubyte", "not found");
    th_write_file(tpath("mnist_part/t10k-labels-idx1-ubyte"), "\0\0\x08", 3);
    expect_mnist_fail(d, TALLY_E_INVALID, "t10k-labels-idx1-ubyte", "truncated header");
    remove(tpath("mnist_part/t10k-labels-idx1-ubyte"));
    /* Labels where images belong. */
    rename(tpath("mnist_part/t10k-images-idx3-ubyte"), tpath("mnist_part/t10k-labels-idx1-ubyte"));
    write_split(d, "t10k", &te, 1);
    remove(tpath("mnist_part/t10k-labels-idx1-ubyte.gz"));
    expect_mnist_fail(d, TALLY_E_INVALID, "t10k-labels-idx1-ubyte", "dimension");
}

static void check_real_split(const tally_dataset *d, size_t n, const char *what) {
    TH_CHECK(d->n == n && d->dim == 784 && d->classes == 10, "%s: %zu samples of dim %d", what, d->n, d->dim);
    size_t hist[10] = {0}, bad = 0;
    float lo = 1, hi = 0;
    for (size_t i = 0; i < d->n; i++) {
        if (d->y[i] < 0 || d->y[i] >= 10)
            bad++;
        else
            hist[d->y[i]]++;
    }
    for (size_t i = 0; i < d->n * 784; i++) lo = fminf(lo, d->x[i]), hi = fmaxf(hi, d->x[i]);
    TH_CHECK(bad == 0 && hist[0] == n / 10 && hist[9] == n / 10, "%s: labels out of range or unbalanced", what);
    TH_CHECK(lo == 0.0f && hi == 1.0f, "%s: pixels span [%g, %g], want [0, 1]", what, lo, hi);
}

static void test_mnist_real(void) {
    struct stat st;
    if (stat(TALLY_FASHION_MNIST_DIR, &st) != 0) {
        printf("note: %s absent, real Fashion-MNIST not checked (install dataset-fashion-mnist)\n",
               TALLY_FASHION_MNIST_DIR);
        return;
    }
    tally_dataset tr, te;
    double t0 = th_now();
    int rc = tally_dataset_load_mnist(TALLY_FASHION_MNIST_DIR, &tr, &te);
    double dt = th_now() - t0;
    TH_CHECK(rc == 0, "Fashion-MNIST: rc %d: %s", rc, tally_last_error());
    if (rc == 0) {
        printf("Fashion-MNIST loaded in %.3f s\n", dt);
        check_real_split(&tr, 60000, "Fashion-MNIST train");
        check_real_split(&te, 10000, "Fashion-MNIST test");
    }
    tally_dataset_free(&tr);
    tally_dataset_free(&te);
}

/* ---- sampler ---- */

static int is_identity(const size_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != i) return 0;
    return 1;
}

/* Disjoint equal shards, one shared permutation, and the batch equivalence with one rank. */
static void check_shards(size_t n, int size, uint64_t seed, int epoch) {
    tally_sampler s[4], one;
    unsigned char *seen = calloc(n + 1, 1);
    size_t covered = 0, dup = 0, range = 0, perm_diff = 0, len_bad = 0;
    tally_sampler_init(&one, n, 0, 1, seed, 1);
    tally_sampler_set_epoch(&one, epoch);
    for (int r = 0; r < size; r++) {
        TH_CHECK(tally_sampler_init(&s[r], n, r, size, seed, 1) == 0, "sampler init: %s", tally_last_error());
        tally_sampler_set_epoch(&s[r], epoch);
        len_bad += tally_sampler_len(&s[r]) != n / (size_t)size;
        perm_diff += memcmp(s[r].perm, one.perm, n * sizeof(size_t)) != 0;
        for (size_t i = 0; i < tally_sampler_len(&s[r]); i++) {
            size_t k = tally_sampler_index(&s[r], i);
            if (k >= n)
                range++;
            else if (seen[k]++)
                dup++;
            else
                covered++;
        }
    }
    TH_CHECK(!len_bad && !dup && !range && covered == n / (size_t)size * (size_t)size && !perm_diff,
             "sampler n=%zu size=%d: len %zu dup %zu range %zu covered %zu perm_diff %zu", n, size, len_bad, dup, range,
             covered, perm_diff);
    /* Batch b on each of `size` ranks covers the same samples as batch b*size on one rank. */
    size_t mism = 0;
    for (size_t b = 1; b <= 8; b *= 2)
        for (size_t i = 0; (i + 1) * b <= tally_sampler_len(&s[0]); i++)
            for (int r = 0; r < size; r++)
                for (size_t j = 0; j < b; j++)
                    mism +=
                        tally_sampler_index(&s[r], i * b + j) != tally_sampler_index(&one, i * b * size + j * size + r);
    TH_CHECK(mism == 0, "sampler n=%zu size=%d: %zu batch positions differ from one rank's", n, size, mism);
    for (int r = 0; r < size; r++) tally_sampler_free(&s[r]);
    tally_sampler_free(&one);
    free(seen);
}

static void test_sampler_epochs(void) {
    tally_sampler a, b, c;
    size_t n = 1000;
    tally_sampler_init(&a, n, 1, 3, 42, 1);
    tally_sampler_init(&b, n, 1, 3, 42, 1);
    tally_sampler_init(&c, n, 1, 3, 43, 1);
    tally_sampler_set_epoch(&a, 5);
    tally_sampler_set_epoch(&b, 5);
    tally_sampler_set_epoch(&c, 5);
    TH_CHECK(memcmp(a.perm, b.perm, n * sizeof(size_t)) == 0 && a.epoch == 5, "same seed and epoch differ");
    TH_CHECK(memcmp(a.perm, c.perm, n * sizeof(size_t)) != 0, "different seeds give the same permutation");
    TH_CHECK(!is_identity(a.perm, n), "shuffled epoch is the identity");
    size_t *keep = malloc(n * sizeof(size_t));
    memcpy(keep, a.perm, n * sizeof(size_t));
    tally_sampler_set_epoch(&b, 6);
    TH_CHECK(memcmp(keep, b.perm, n * sizeof(size_t)) != 0, "epochs 5 and 6 give the same permutation");
    tally_sampler_set_epoch(&b, 5);
    TH_CHECK(memcmp(keep, b.perm, n * sizeof(size_t)) == 0, "epoch 5 not reproduced after epoch 6");
    TH_CHECK(tally_sampler_index(&a, tally_sampler_len(&a)) == SIZE_MAX, "index past the end not refused");
    tally_sampler_free(&a), tally_sampler_free(&b), tally_sampler_free(&c);
    free(keep);

    for (int size = 1; size <= 4; size++)
        for (int r = 0; r < size; r++) {
            tally_sampler_init(&a, 10, r, size, 7, 0);
            tally_sampler_set_epoch(&a, 3);
            int ok = is_identity(a.perm, 10);
            for (size_t i = 0; i < tally_sampler_len(&a); i++) ok &= tally_sampler_index(&a, i) == i * size + r;
            TH_CHECK(ok, "shuffle=0 rank %d/%d is not the identity order", r, size);
            tally_sampler_free(&a);
        }
    TH_CHECK(tally_sampler_init(&a, 10, 2, 2, 0, 1) == TALLY_E_INVALID, "rank == size accepted");
    TH_CHECK(tally_sampler_init(&a, 10, 0, 0, 0, 1) == TALLY_E_INVALID, "size 0 accepted");
    TH_CHECK(tally_sampler_init(&a, 10, -1, 2, 0, 1) == TALLY_E_INVALID, "rank -1 accepted");
    tally_sampler_free(&a);
}

static void test_sampler(void) {
    const size_t ns[] = {0, 1, 2, 7, 10, 13, 997, 6000, 6001, 6003};
    for (size_t k = 0; k < sizeof ns / sizeof *ns; k++)
        for (int size = 1; size <= 4; size++) check_shards(ns[k], size, 1234, (int)k);
    test_sampler_epochs();
}

/* ---- synthetic and linear data ---- */

static double ncm_accuracy(const tally_dataset *tr, const tally_dataset *te) {
    double *mu = calloc(10 * 784, sizeof *mu);
    size_t cnt[10] = {0}, ok = 0;
    for (size_t i = 0; i < tr->n; i++) {
        cnt[tr->y[i]]++;
        for (int j = 0; j < 784; j++) mu[tr->y[i] * 784 + j] += tr->x[i * 784 + j];
    }
    for (int c = 0; c < 10; c++)
        for (int j = 0; j < 784; j++) mu[c * 784 + j] /= cnt[c] ? (double)cnt[c] : 1.0;
    for (size_t i = 0; i < te->n; i++) {
        int best = 0;
        double bd = INFINITY;
        for (int c = 0; c < 10; c++) {
            double d = 0;
            for (int j = 0; j < 784; j++) d += pow(te->x[i * 784 + j] - mu[c * 784 + j], 2);
            if (d < bd) bd = d, best = c;
        }
        ok += best == te->y[i];
    }
    free(mu);
    return te->n ? (double)ok / te->n : 0;
}

static void check_synthetic_values(const tally_dataset *d) {
    size_t bad = 0, hist[10] = {0};
    for (size_t i = 0; i < d->n * 784; i++) bad += !(d->x[i] >= 0.0f && d->x[i] <= 1.0f);
    for (size_t i = 0; i < d->n; i++) {
        if (d->y[i] < 0 || d->y[i] >= 10)
            bad++;
        else
            hist[d->y[i]]++;
    }
    size_t lo = d->n, hi = 0;
    for (int c = 0; c < 10; c++) lo = hist[c] < lo ? hist[c] : lo, hi = hist[c] > hi ? hist[c] : hi;
    TH_CHECK(bad == 0, "synthetic: %zu values or labels out of range", bad);
    TH_CHECK(lo >= d->n / 10 * 6 / 10 && hi <= d->n / 10 * 14 / 10, "synthetic: classes unbalanced (%zu..%zu)", lo, hi);
    TH_CHECK(d->dim == 784 && d->channels == 1 && d->height == 28 && d->width == 28 && d->classes == 10 &&
                 d->tdim == 0 && !d->t,
             "synthetic: geometry");
}

static void test_synthetic(void) {
    tally_dataset a, b, c, d, e, f;
    TH_CHECK(tally_dataset_synthetic(9, 2000, 1000, &a, &b) == 0, "synthetic: %s", tally_last_error());
    TH_CHECK(tally_dataset_synthetic(9, 300, 1000, &c, &d) == 0, "synthetic: %s", tally_last_error());
    TH_CHECK(tally_dataset_synthetic(10, 300, 10, &e, &f) == 0, "synthetic: %s", tally_last_error());
    TH_CHECK(a.n == 2000 && b.n == 1000 && c.n == 300, "synthetic: sizes");
    TH_CHECK(memcmp(a.x, c.x, 300 * 784 * sizeof(float)) == 0 && memcmp(a.y, c.y, 300 * sizeof(int32_t)) == 0,
             "synthetic: same seed, different train samples");
    TH_CHECK(memcmp(b.x, d.x, 1000 * 784 * sizeof(float)) == 0, "synthetic: same seed, different test samples");
    TH_CHECK(memcmp(c.x, e.x, 300 * 784 * sizeof(float)) != 0, "synthetic: seeds 9 and 10 agree");
    check_synthetic_values(&a);
    check_synthetic_values(&b);
    double acc = ncm_accuracy(&a, &b);
    TH_CHECK(acc > 0.5 && acc < 0.99, "synthetic: nearest-class-mean accuracy %.3f, want learnable, not trivial", acc);
    printf("synthetic: nearest-class-mean test accuracy %.3f\n", acc);
    tally_dataset_free(&a), tally_dataset_free(&b), tally_dataset_free(&c);
    tally_dataset_free(&d), tally_dataset_free(&e), tally_dataset_free(&f);
}

/* Solves the (p x p) system a.x = r in place by Gaussian elimination with partial pivoting. */
static void solve(int p, double a[p][p], double *r) {
    for (int k = 0; k < p; k++) {
        int piv = k;
        for (int i = k + 1; i < p; i++)
            if (fabs(a[i][k]) > fabs(a[piv][k])) piv = i;
        for (int j = 0; j < p; j++) {
            double t = a[k][j];
            a[k][j] = a[piv][j], a[piv][j] = t;
        }
        double t = r[k];
        r[k] = r[piv], r[piv] = t;
        for (int i = k + 1; i < p; i++) {
            double m = a[i][k] / a[k][k];
            for (int j = k; j < p; j++) a[i][j] -= m * a[k][j];
            r[i] -= m * r[k];
        }
    }
    for (int k = p - 1; k >= 0; k--) {
        for (int j = k + 1; j < p; j++) r[k] -= a[k][j] * r[j];
        r[k] /= a[k][k];
    }
}

/* Least squares on [x, 1] -> t: the estimate of (w, b). */
static void least_squares(const tally_dataset *d, double *wb) {
    enum { P = 9 };
    double a[P][P] = {{0}}, row[P];
    memset(wb, 0, P * sizeof *wb);
    for (size_t i = 0; i < d->n; i++) {
        for (int j = 0; j < 8; j++) row[j] = d->x[i * 8 + j];
        row[8] = 1;
        for (int j = 0; j < P; j++) {
            wb[j] += row[j] * d->t[i];
            for (int k = 0; k < P; k++) a[j][k] += row[j] * row[k];
        }
    }
    solve(P, a, wb);
}

static void test_linear(void) {
    tally_dataset a, b;
    float w[9], w2[9];
    memset(w, 0, sizeof w);
    TH_CHECK(tally_dataset_linear(5, 4000, 8, 0.1f, w, &a) == 0, "linear: %s", tally_last_error());
    TH_CHECK(tally_dataset_linear(5, 4000, 8, 0.1f, w2, &b) == 0, "linear: %s", tally_last_error());
    TH_CHECK(a.n == 4000 && a.dim == 8 && a.tdim == 1 && a.classes == 0 && !a.y && a.t && !a.height,
             "linear: shape fields");
    TH_CHECK(memcmp(a.x, b.x, 4000 * 8 * sizeof(float)) == 0 && memcmp(a.t, b.t, 4000 * sizeof(float)) == 0 &&
                 memcmp(w, w2, sizeof w) == 0,
             "linear: same seed, different data");
    int filled = 0;
    for (int j = 0; j < 9; j++) filled += w[j] != 0.0f;
    TH_CHECK(filled == 9, "linear: true_w not filled");
    double est[9], err = 0;
    least_squares(&a, est);
    for (int j = 0; j < 9; j++) err = fmax(err, fabs(est[j] - w[j]));
    TH_CHECK(err < 0.02, "linear: least squares misses true_w by %g", err);
    tally_dataset_free(&a);
    tally_dataset_free(&b);
    TH_CHECK(tally_dataset_linear(5, 10, 8, 0.1f, NULL, &a) == 0 && a.n == 10, "linear: true_w NULL refused");
    tally_dataset_free(&a);
    TH_CHECK(tally_dataset_linear(5, 10, 0, 0.1f, NULL, &a) == TALLY_E_INVALID, "linear: 0 features accepted");
    TH_CHECK(tally_dataset_linear(5, 10, 3, -1.0f, NULL, &a) == TALLY_E_INVALID, "linear: negative noise accepted");
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/tally_test_data.XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 2;
    }
    double t0 = th_now();
    test_idx_roundtrips();
    test_idx_header_errors();
    test_idx_size_errors();
    test_idx_gzip_errors();
    test_mnist_fake();
    test_mnist_real();
    test_sampler();
    test_synthetic();
    test_linear();
    rm_tree(tmpdir);
    printf("test_data: %.2f s\n", th_now() - t0);
    return th_verdict("test_data");
}
