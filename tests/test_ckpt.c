/* test_ckpt.c - checkpoint files: CRC32C against known vectors and between its versions, round trips,
 * every byte flip and truncation detected, crafted bad tables, and crash safety under SIGKILL. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "ckpt/ckpt.h"
#include "ckpt/crc32c.h"

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif

static char root[64];

static uint64_t mix(uint64_t z) { /* splitmix64's finaliser */
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void subdir(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", root, name); }

static int has(const char *msg, const char *needle) { return msg && strstr(msg, needle) != NULL; }

static int exists(const char *dir, const char *name) {
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

/* Files in dir whose names end with suffix. */
static int count_suffix(const char *dir, const char *suffix) {
    char cmd[300], out[64];
    snprintf(cmd, sizeof cmd, "ls -1 %s | grep -c '%s$'", dir, suffix);
    th_shell(cmd, 10, out, sizeof out);
    return atoi(out);
}

static unsigned char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*len + 1);
    if (b && fread(b, 1, *len, f) != *len) {
        free(b);
        b = NULL;
    }
    fclose(f);
    return b;
}

static void write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n) perror(path);
    if (f) fclose(f);
}

static int rm_one(const char *p, const struct stat *s, int flag, struct FTW *f) { return remove(p); }
static void rm_tree(const char *p) { nftw(p, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

/* Waits for pid at most limit_s; kills it past that. Returns its status, or -1 if it had to be killed. */
static int reap(pid_t pid, double limit_s) {
    int status = 0;
    for (double t0 = th_now(); waitpid(pid, &status, WNOHANG) == 0; usleep(500)) {
        if (th_now() - t0 > limit_s) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
    }
    return status;
}

/* ---- CRC32C ---- */

static uint32_t crc_bitwise(const unsigned char *p, size_t n) { /* the definition, one bit at a time */
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    }
    return ~c;
}

static void test_crc(void) {
    unsigned char z[32] = {0}, ff[32], inc[32];
    memset(ff, 0xFF, sizeof ff);
    for (int i = 0; i < 32; i++) inc[i] = (unsigned char)i;
    struct {
        const void *p;
        size_t n;
        uint32_t want;
    } v[] = {
        {"123456789", 9, 0xE3069283u}, {z, 32, 0x8A9136AAu}, {ff, 32, 0x62A8AB43u}, {inc, 32, 0x46DD794Eu}, {"", 0, 0}};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        TH_CHECK(tally__crc32c(0, v[i].p, v[i].n) == v[i].want, "crc vector %zu: 0x%08x", i,
                 tally__crc32c(0, v[i].p, v[i].n));
    enum { MAXLEN = 300 };
    unsigned char buf[MAXLEN + 16];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)mix(i);
    int bad = 0;
    for (int mis = 0; mis < 8; mis++) {
        for (size_t n = 0; n <= MAXLEN; n++) {
            const unsigned char *p = buf + mis;
            uint32_t ref = crc_bitwise(p, n), got = tally__crc32c(0, p, n);
            if (got != ref && !bad++) fprintf(stderr, "crc len %zu at +%d: ref %08x got %08x\n", n, mis, ref, got);
            size_t cut = n ? (size_t)mix(n * 8 + (size_t)mis) % (n + 1) : 0; /* continuing over a split */
            if (tally__crc32c(tally__crc32c(0, p, cut), p + cut, n - cut) != ref && !bad++)
                fprintf(stderr, "crc len %zu at +%d split at %zu differs\n", n, mis, cut);
        }
    }
    TH_CHECK(bad == 0, "crc: %d of %d lengths x offsets differ from the bitwise definition", bad, 8 * (MAXLEN + 1));
    size_t big = 3u << 20;
    unsigned char *b = malloc(big);
    for (size_t i = 0; i < big; i++) b[i] = (unsigned char)(i * 131 + (i >> 9));
    uint32_t whole = tally__crc32c(0, b, big);
    TH_CHECK(whole == crc_bitwise(b, big), "crc: 3 MiB differs from the bitwise definition");
    TH_CHECK(tally__crc32c(0, b + 1, big - 1) == crc_bitwise(b + 1, big - 1), "crc: 3 MiB at +1 differs");
    uint32_t parts = 0;
    for (size_t o = 0, k = 1; o < big; o += k, k = k * 7 % 100003 + 1)
        parts = tally__crc32c(parts, b + o, o + k > big ? big - o : k);
    TH_CHECK(parts == whole, "crc: 3 MiB in uneven parts 0x%08x != 0x%08x", parts, whole);
    free(b);
}

/* ---- content that is a function of the step ---- */

enum { NT = 5 };

static void content_desc(tally__ckpt_tensor d[NT], size_t nw, size_t nm) {
    d[0] = (tally__ckpt_tensor){.name = "model.w", .dtype = TALLY_F32, .ndim = 1, .shape = {nw}};
    d[1] = (tally__ckpt_tensor){.name = "optim.m", .dtype = TALLY_F64, .ndim = 2, .shape = {nm / 4, 4}};
    d[2] = (tally__ckpt_tensor){.name = "train.step", .dtype = TALLY_I64, .ndim = 1, .shape = {1}};
    d[3] = (tally__ckpt_tensor){.name = "rng.state", .dtype = TALLY_U8, .ndim = 1, .shape = {33}};
    d[4] = (tally__ckpt_tensor){.name = "codec.residual", .dtype = TALLY_F32, .ndim = 1, .shape = {0}};
}

static size_t desc_bytes(const tally__ckpt_tensor *d) {
    size_t b = tally_dtype_size(d->dtype);
    for (int k = 0; k < d->ndim; k++) b *= d->shape[k];
    return b;
}

/* Bytes [off, off + n) of tensor t at step s. */
static void content_fill(int64_t s, int t, size_t off, unsigned char *out, size_t n) {
    for (size_t i = 0; i < n; i++) {
        size_t k = off + i;
        uint64_t word = t == 2 ? (uint64_t)s : mix((uint64_t)s << 32 ^ (uint64_t)t << 26 ^ (k >> 3));
        out[i] = (unsigned char)(word >> (8 * (k & 7)));
    }
}

/* Writes tensors d with content_fill, in chunks of uneven sizes (some empty). */
static int write_tensors(const char *dir, int64_t step, const tally__ckpt_tensor *d, int n, int keep) {
    tally__ckpt_writer *w;
    int rc = tally__ckpt_write_begin(dir, step, d, n, &w);
    if (rc) return rc;
    static unsigned char chunk[70000];
    uint64_t r = (uint64_t)step * 7 + 3;
    for (int t = 0; t < n && !rc; t++) {
        size_t bytes = desc_bytes(&d[t]);
        for (size_t off = 0; off < bytes && !rc;) {
            r = mix(r);
            size_t c = r % 5 == 0 ? 0 : (size_t)(r >> 20) % sizeof chunk + 1;
            if (c > bytes - off) c = bytes - off;
            content_fill(step, t, off, chunk, c);
            rc = tally__ckpt_write(w, t, chunk, c);
            off += c;
        }
    }
    if (rc) {
        tally__ckpt_write_abort(w);
        return rc;
    }
    return tally__ckpt_write_commit(w, keep);
}

static int write_step(const char *dir, int64_t step, size_t nw, size_t nm, int keep) {
    tally__ckpt_tensor d[NT];
    content_desc(d, nw, nm);
    return write_tensors(dir, step, d, NT, keep);
}

/* Mismatches between c and tensors d written at step s (printed, up to a few). */
static int content_check(const tally__ckpt *c, int64_t s, const tally__ckpt_tensor *d, int n, const char *what) {
    int bad = 0;
    static unsigned char want[1 << 16];
    if (tally__ckpt_step(c) != s || tally__ckpt_count(c) != n) {
        fprintf(stderr, "%s: step %" PRId64 " count %d, want %" PRId64 " and %d\n", what, tally__ckpt_step(c),
                tally__ckpt_count(c), s, n);
        return 1;
    }
    for (int t = 0; t < n; t++) {
        const tally__ckpt_tensor *x = tally__ckpt_find(c, d[t].name);
        size_t bytes = desc_bytes(&d[t]);
        if (!x || x != tally__ckpt_at(c, t) || x->dtype != d[t].dtype || x->ndim != d[t].ndim || x->bytes != bytes ||
            memcmp(x->shape, d[t].shape, sizeof x->shape) || ((uintptr_t)x->data & 63)) {
            if (bad++ < 3) fprintf(stderr, "%s: tensor '%s' missing or described wrongly\n", what, d[t].name);
            continue;
        }
        for (size_t off = 0; off < bytes; off += sizeof want) {
            size_t k = bytes - off < sizeof want ? bytes - off : sizeof want;
            content_fill(s, t, off, want, k);
            if (memcmp(want, (const unsigned char *)x->data + off, k)) {
                if (bad++ < 3) fprintf(stderr, "%s: tensor '%s' differs near byte %zu\n", what, d[t].name, off);
                break;
            }
        }
    }
    return bad;
}

static int step_check(const tally__ckpt *c, int64_t s, size_t nw, size_t nm, const char *what) {
    tally__ckpt_tensor d[NT];
    content_desc(d, nw, nm);
    return content_check(c, s, d, NT, what);
}

/* ---- round trips ---- */

static void test_roundtrip(void) {
    char dir[128];
    subdir(dir, sizeof dir, "rt/nested/dirs");
    size_t big = th_light() ? (1u << 18) : (2u << 20); /* f32 elements: 1 MiB or 8 MiB */
    tally__ckpt_tensor d[] = {
        {.name = "empty", .dtype = TALLY_F32, .ndim = 1, .shape = {0}},
        {.name = "scalar0d", .dtype = TALLY_I64, .ndim = 0},
        {.name = "train.step", .dtype = TALLY_I64, .ndim = 1, .shape = {1}},
        {.name = "one.u8", .dtype = TALLY_U8, .ndim = 1, .shape = {1}},
        {.name = "odd f64", .dtype = TALLY_F64, .ndim = 3, .shape = {3, 5, 7}},
        {.name = "four.d", .dtype = TALLY_F32, .ndim = 4, .shape = {2, 3, 5, 7}},
        {.name = "empty.4d", .dtype = TALLY_U8, .ndim = 4, .shape = {3, 0, 2, 1}},
        {.name = "big.weight", .dtype = TALLY_F32, .ndim = 2, .shape = {big / 64, 64}},
        {.name = "i64.vec", .dtype = TALLY_I64, .ndim = 1, .shape = {17}},
        {.name = "dataset.name", .dtype = TALLY_U8, .ndim = 1, .shape = {13}},
        {.name = "a_name_of_exactly_sixty-three_characters_for_the_limit_test_ok!",
         .dtype = TALLY_F64,
         .ndim = 1,
         .shape = {1}},
        {.name = "last.empty", .dtype = TALLY_F64, .ndim = 2, .shape = {0, 5}},
    };
    int n = (int)(sizeof d / sizeof d[0]);
    TH_CHECK(strlen(d[10].name) == 63, "round trip: the long name is %zu characters", strlen(d[10].name));
    double t0 = th_now();
    int rc = write_tensors(dir, 1234567, d, n, TALLY__CKPT_KEEP_DEFAULT);
    double tw = th_now() - t0;
    TH_CHECK(rc == 0, "round trip: write failed: %s", tally_last_error());
    tally__ckpt *c = NULL;
    t0 = th_now();
    rc = tally__ckpt_open_latest(dir, &c);
    double tr = th_now() - t0;
    TH_CHECK(rc == 0 && c, "round trip: open_latest: %d %s", rc, tally_last_error());
    if (!c) return;
    printf("round trip: %.1f MiB written in %.3f s, opened and verified in %.3f s\n", (double)big * 4 / (1 << 20), tw,
           tr);
    TH_CHECK(content_check(c, 1234567, d, n, "round trip") == 0, "round trip: content differs");
    TH_CHECK(tally__ckpt_find(c, "absent") == NULL && tally__ckpt_find(c, "") == NULL && tally__ckpt_at(c, n) == NULL &&
                 tally__ckpt_at(c, -1) == NULL,
             "round trip: lookups of what is absent");
    const void *p = NULL;
    static const uint64_t s357[3] = {3, 5, 7}, s753[3] = {7, 5, 3}, s105[1] = {105}, s1[1] = {1};
    TH_CHECK(tally__ckpt_get(c, "odd f64", TALLY_F64, 3, s357, &p) == 0 && p == tally__ckpt_at(c, 4)->data,
             "round trip: get odd f64: %s", tally_last_error());
    TH_CHECK(tally__ckpt_get(c, "scalar0d", TALLY_I64, 0, NULL, &p) == 0, "round trip: a 0-d tensor: %s",
             tally_last_error());
    rc = tally__ckpt_get(c, "odd f64", TALLY_F32, 3, s357, &p);
    TH_CHECK(rc == TALLY_E_INVALID && has(tally_last_error(), "'odd f64' is f64 [3, 5, 7] (105 elements), but the "
                                                              "model has f32 [3, 5, 7]"),
             "round trip: get with a wrong dtype: %s", tally_last_error());
    /* The same 105 elements in another shape, or flat, are another tensor. */
    rc = tally__ckpt_get(c, "odd f64", TALLY_F64, 3, s753, &p);
    TH_CHECK(rc == TALLY_E_INVALID && has(tally_last_error(), "f64 [3, 5, 7] (105 elements), but the model has f64 "
                                                              "[7, 5, 3] (105 elements)"),
             "round trip: get with the shape reversed: %s", tally_last_error());
    rc = tally__ckpt_get(c, "odd f64", TALLY_F64, 1, s105, &p);
    TH_CHECK(rc == TALLY_E_INVALID && has(tally_last_error(), "the model has f64 [105]"),
             "round trip: get flat: %s", tally_last_error());
    rc = tally__ckpt_get(c, "fc9.bias", TALLY_F32, 1, s1, &p);
    TH_CHECK(rc == TALLY_E_INVALID && has(tally_last_error(), "no tensor 'fc9.bias'"), "round trip: get absent: %s",
             tally_last_error());
    TH_CHECK(has(tally__ckpt_label(c), "step-0001234567.tck"), "round trip: label %s", tally__ckpt_label(c));
    char path[256];
    snprintf(path, sizeof path, "%s/step-0001234567.tck", dir);
    tally__ckpt *c2 = NULL;
    TH_CHECK(tally__ckpt_open(path, &c2) == 0 && tally__ckpt_head_crc(c2) == tally__ckpt_head_crc(c),
             "round trip: open by path: %s", tally_last_error());
    tally__ckpt_close(c2);
    tally__ckpt_close(c);
    TH_CHECK(count_suffix(dir, ".tmp") == 0, "round trip: .tmp files left");

    /* No tensors at all is a valid (64-byte) checkpoint. */
    subdir(dir, sizeof dir, "rt0");
    TH_CHECK(write_tensors(dir, 0, NULL, 0, 1) == 0, "zero tensors: %s", tally_last_error());
    TH_CHECK(tally__ckpt_open_latest(dir, &c) == 0 && tally__ckpt_count(c) == 0 && tally__ckpt_step(c) == 0,
             "zero tensors: reopen: %s", tally_last_error());
    tally__ckpt_close(c);
}

/* The writer refuses misuse, keeps the first error, and leaves LATEST and the directory as they were. */
static void test_writer_misuse(void) {
    char dir[128];
    subdir(dir, sizeof dir, "misuse");
    TH_CHECK(write_step(dir, 10, 64, 16, 2) == 0, "misuse: first checkpoint: %s", tally_last_error());
    tally__ckpt_tensor d[NT];
    content_desc(d, 64, 16);
    tally__ckpt_writer *w = NULL;
    unsigned char b[4096] = {0};

    int rc = tally__ckpt_write_begin(dir, 10, d, NT, &w);
    TH_CHECK(rc == TALLY_E_INVALID && has(tally_last_error(), "already committed"), "misuse: same step: %s",
             tally_last_error());
    TH_CHECK(tally__ckpt_write_begin(dir, 11, d, NT, &w) == 0, "misuse: begin: %s", tally_last_error());
    tally__ckpt_writer *w2 = NULL;
    rc = tally__ckpt_write_begin(dir, 12, d, NT, &w2);
    TH_CHECK(rc == TALLY_E_INVALID && has(tally_last_error(), "is writing checkpoints"), "misuse: second writer: %s",
             tally_last_error());
    TH_CHECK(tally__ckpt_write(w, 0, b, 100) == 0, "misuse: a chunk");
    rc = tally__ckpt_write(w, 1, b, 8);
    TH_CHECK(rc == TALLY_E_INVALID && has(tally_last_error(), "'model.w' (#0) has 100 of its 256 bytes"),
             "misuse: out of order: %s", tally_last_error());
    rc = tally__ckpt_write(w, 0, b, 8); /* sticky: even a correct call now fails */
    TH_CHECK(rc == TALLY_E_INVALID && has(tally_last_error(), "(#0) has 100 of its 256 bytes"),
             "misuse: the error is not sticky: %d %s", rc, tally_last_error());
    rc = tally__ckpt_write_commit(w, 2);
    TH_CHECK(rc == TALLY_E_INVALID && count_suffix(dir, ".tmp") == 0 && !exists(dir, "step-0000000011.tck"),
             "misuse: failed commit: %d, tmp or file left", rc);

    TH_CHECK(tally__ckpt_write_begin(dir, 11, d, NT, &w) == 0, "misuse: begin again: %s", tally_last_error());
    rc = tally__ckpt_write(w, 0, b, 257);
    TH_CHECK(rc == TALLY_E_INVALID && has(tally_last_error(), "257 more bytes would exceed its 256"),
             "misuse: too many bytes: %s", tally_last_error());
    tally__ckpt_write_abort(w);
    TH_CHECK(tally__ckpt_write_begin(dir, 11, d, NT, &w) == 0 && tally__ckpt_write(w, 0, b, 256) == 0,
             "misuse: begin again");
    rc = tally__ckpt_write_commit(w, 2);
    TH_CHECK(rc == TALLY_E_INVALID && has(tally_last_error(), "'optim.m' (#1) has 0 of its 128 bytes"),
             "misuse: commit of an incomplete file: %s", tally_last_error());
    TH_CHECK(tally__ckpt_write_begin(dir, 11, d, NT, &w) == 0, "misuse: begin again");
    rc = tally__ckpt_write(w, 7, b, 1);
    TH_CHECK(rc == TALLY_E_INVALID && has(tally_last_error(), "index 7"), "misuse: bad index: %s", tally_last_error());
    tally__ckpt_write_abort(w);

    struct {
        tally__ckpt_tensor t;
        const char *want;
    } bad[] = {
        {{.name = "", .dtype = TALLY_F32, .ndim = 1, .shape = {1}}, "is empty"},
        {{.name = "tab\there", .dtype = TALLY_F32, .ndim = 1, .shape = {1}}, "not printable"},
        {{.name = "a_name_of_sixty-four_characters_which_is_one_more_than_the_limit", .dtype = TALLY_F32},
         "more than 63"},
        {{.name = "half", .dtype = TALLY_F16, .ndim = 1, .shape = {1}}, "dtype f16 is not one of"},
        {{.name = "5d", .dtype = TALLY_F32, .ndim = 5}, "ndim 5"},
        {{.name = "huge", .dtype = TALLY_F64, .ndim = 2, .shape = {1ull << 40, 1ull << 30}}, "overflows"},
        {{.name = "model.w", .dtype = TALLY_F32, .ndim = 1, .shape = {1}}, "same name as tensor #0"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tally__ckpt_tensor two[2] = {d[0], bad[i].t};
        rc = tally__ckpt_write_begin(dir, 20, two, 2, &w);
        TH_CHECK(rc == TALLY_E_INVALID && w == NULL && has(tally_last_error(), bad[i].want),
                 "misuse: descriptor %zu accepted or wrong message: %s", i, tally_last_error());
    }
    TH_CHECK(tally__ckpt_write_begin(dir, -1, d, NT, &w) == TALLY_E_INVALID, "misuse: negative step accepted");
    tally__ckpt *c = NULL;
    TH_CHECK(tally__ckpt_open_latest(dir, &c) == 0 && step_check(c, 10, 64, 16, "misuse") == 0,
             "misuse: LATEST no longer names step 10: %s", tally_last_error());
    tally__ckpt_close(c);
    TH_CHECK(count_suffix(dir, ".tmp") == 0 && count_suffix(dir, ".tck") == 1, "misuse: files left behind");
}

/* keep: how many checkpoints the commit leaves (0: all of them). */
static void test_keep(void) {
    char dir[128];
    subdir(dir, sizeof dir, "keep");
    for (int s = 1; s <= 4; s++) write_step(dir, s, 64, 16, 0);
    TH_CHECK(count_suffix(dir, ".tck") == 4, "keep 0: %d files, want all 4", count_suffix(dir, ".tck"));
    write_step(dir, 5, 64, 16, 3);
    TH_CHECK(count_suffix(dir, ".tck") == 3 && exists(dir, "step-0000000003.tck") &&
                 !exists(dir, "step-0000000002.tck"),
             "keep 3: %d files", count_suffix(dir, ".tck"));
    write_step(dir, 6, 64, 16, 1);
    TH_CHECK(count_suffix(dir, ".tck") == 1 && exists(dir, "step-0000000006.tck"), "keep 1: %d files",
             count_suffix(dir, ".tck"));
    /* A step below LATEST's (a run restarted from an older copy) is committed; newer files are then not. */
    write_step(dir, 7, 64, 16, 0);
    write_step(dir, 2, 64, 16, 2);
    tally__ckpt *c = NULL;
    TH_CHECK(tally__ckpt_open_latest(dir, &c) == 0 && tally__ckpt_step(c) == 2, "keep: LATEST after going back");
    tally__ckpt_close(c);
    TH_CHECK(count_suffix(dir, ".tck") == 1 && exists(dir, "step-0000000002.tck"),
             "keep: files of steps after the committed one remain: %d", count_suffix(dir, ".tck"));
}

/* ---- corruption ---- */

/* A small checkpoint (a few KB, one tensor empty) in memory; its path in path. */
static unsigned char *small_image(size_t *len, char *path, size_t cap) {
    static int made;
    char dir[128], tag[32];
    snprintf(tag, sizeof tag, "small%d", made++);
    subdir(dir, sizeof dir, tag);
    tally__ckpt_tensor d[] = {
        {.name = "fc1.weight", .dtype = TALLY_F32, .ndim = 2, .shape = {30, 20}},
        {.name = "fc1.bias", .dtype = TALLY_F32, .ndim = 1, .shape = {30}},
        {.name = "empty", .dtype = TALLY_F64, .ndim = 1, .shape = {0}},
        {.name = "adam.step", .dtype = TALLY_I64, .ndim = 1, .shape = {1}},
        {.name = "note", .dtype = TALLY_U8, .ndim = 1, .shape = {5}},
        {.name = "fc2.weight", .dtype = TALLY_F64, .ndim = 2, .shape = {10, 3}},
    };
    if (write_tensors(dir, 42, d, 6, 2)) {
        fprintf(stderr, "small image: %s\n", tally_last_error());
        return NULL;
    }
    snprintf(path, cap, "%s/step-0000000042.tck", dir);
    return read_all(path, len);
}

/* Which tensor byte k of the image belongs to: its entry (*kind 1), data or padding (2); -1 for none. */
static int owner(const tally__ckpt *c, const unsigned char *base, size_t k, int *kind) {
    int n = tally__ckpt_count(c);
    if (k >= 64 && k < 64 + 128 * (size_t)n) return *kind = 1, (int)((k - 64) / 128);
    for (int i = 0; i < n; i++) {
        const tally__ckpt_tensor *t = tally__ckpt_at(c, i);
        size_t off = (size_t)((const unsigned char *)t->data - base), end = off + ((t->bytes + 63) & ~(size_t)63);
        if (k >= off && k < end) return *kind = 2, i;
    }
    return *kind = 0, -1;
}

static void test_flips(void) {
    char path[256];
    size_t len = 0;
    unsigned char *img = small_image(&len, path, sizeof path);
    TH_CHECK(img != NULL, "flips: no image");
    if (!img) return;
    tally__ckpt *c = NULL;
    TH_CHECK(tally__ckpt_parse(img, len, "X", &c) == 0, "flips: the clean image fails: %s", tally_last_error());
    if (!c) return;
    unsigned char *m = malloc(len + 1);
    int undetected = 0, unnamed = 0, tried = 0, in_tensor = 0;
    const unsigned char flips[] = {0xFF, 0x01, 0x80, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40}; /* each bit, and all */
    size_t nflips = th_light() ? 3 : sizeof flips;
    for (size_t k = 0; k < len; k++) {
        int kind, who = owner(c, img, k, &kind);
        in_tensor += who >= 0;
        for (size_t f = 0; f < nflips; f++) {
            memcpy(m, img, len);
            m[k] ^= flips[f];
            tally__ckpt *bad = NULL;
            int rc = tally__ckpt_parse(m, len, "dir/step-0000000042.tck", &bad);
            const char *msg = tally_last_error();
            tried++;
            if (rc != TALLY_E_CORRUPT || bad || !has(msg, "checkpoint dir/step-0000000042.tck: ")) {
                if (undetected++ < 5) fprintf(stderr, "flip 0x%02x at %zu: rc %d: %s\n", flips[f], k, rc, msg);
                tally__ckpt_close(bad);
                continue;
            }
            char want[128];
            if (kind == 1) snprintf(want, sizeof want, "tensor #%d (name as read '", who);
            if (kind == 2) snprintf(want, sizeof want, "tensor '%s' (#%d)", tally__ckpt_at(c, who)->name, who);
            if (who >= 0 && !has(msg, want) && unnamed++ < 5)
                fprintf(stderr, "flip at %zu: message does not name %s: %s\n", k, want, msg);
        }
    }
    printf("flips: %d single-byte flips (%zu patterns) over %zu bytes (%d in tensors' entries, data or padding)\n",
           tried, nflips, len, in_tensor);
    TH_CHECK(undetected == 0, "flips: %d of %d single-byte flips not detected", undetected, tried);
    TH_CHECK(unnamed == 0, "flips: %d messages do not name the tensor", unnamed);
    TH_CHECK(len > 2000 && len < 8192, "flips: image of %zu bytes is not a few KB", len);

    int kept = 0;
    for (size_t n = 0; n < len; n++) {
        tally__ckpt *bad = NULL;
        if (tally__ckpt_parse(img, n, "cut", &bad) != TALLY_E_CORRUPT || bad) kept++;
        tally__ckpt_close(bad);
    }
    TH_CHECK(kept == 0, "truncation: %d of %zu lengths accepted", kept, len);
    TH_CHECK(tally__ckpt_parse(img, 0, "cut", &(tally__ckpt *){0}) == TALLY_E_CORRUPT &&
                 has(tally_last_error(), "truncated"),
             "truncation to 0: %s", tally_last_error());
    for (int v = 0; v < 2; v++) {
        memcpy(m, img, len);
        m[len] = (unsigned char)v;
        tally__ckpt *bad = NULL;
        int rc = tally__ckpt_parse(m, len + 1, "long", &bad);
        TH_CHECK(rc == TALLY_E_CORRUPT && has(tally_last_error(), "1 trailing bytes"), "appended byte 0x%02x: %s", v,
                 tally_last_error());
        tally__ckpt_close(bad);
    }
    tally__ckpt_close(c);
    free(m);
    free(img);
}

/* ---- crafted tables ---- */

static void put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint64_t get64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* Recomputes every CRC in the header and table (up to count entries as the header says, capped). */
static void reseal(unsigned char *m, size_t len, uint32_t entries) {
    for (uint32_t i = 0; i < entries && 64 + 128 * (size_t)(i + 1) <= len; i++) {
        unsigned char *e = m + 64 + 128 * (size_t)i, idx[4];
        put32(idx, i);
        put32(e + TALLY__CKPT_E_CRC, tally__crc32c(tally__crc32c(0, idx, 4), e, TALLY__CKPT_E_CRC));
    }
    put32(m + TALLY__CKPT_H_CRC, tally__crc32c(0, m, TALLY__CKPT_H_CRC));
}

typedef struct {
    const char *what;
    int entry;    /* -1: a header field */
    int field;    /* offset inside the header or entry */
    int width;    /* 4 or 8; 0: name bytes below */
    uint64_t val; /* the new value; for entry offsets, added to the old one when add is set */
    int add;
    const char *name; /* for width 0 */
    const char *want;
} craft;

static const craft crafts[] = {
    {"huge count", -1, TALLY__CKPT_H_COUNT, 4, 0xFFFFFFFFu, 0, NULL, "tensor count 4294967295 exceeds the limit"},
    {"count at the cap", -1, TALLY__CKPT_H_TABLE_BYTES, 8, 0, 0, NULL,
     "the table of 1048576 entries (134217728 bytes) does not fit in the 3776-byte file"},
    {"table size", -1, TALLY__CKPT_H_TABLE_BYTES, 8, 7 * 128, 0, NULL, "table size 896 is not tensor count 6 x 128"},
    {"version 2", -1, TALLY__CKPT_H_VERSION, 4, 2, 0, NULL, "format version 2"},
    {"entry size", -1, TALLY__CKPT_H_ENTRY_BYTES, 4, 256, 0, NULL, "entries of 256 bytes"},
    {"reserved", -1, TALLY__CKPT_H_RESERVED + 3, 4, 1, 0, NULL, "reserved header byte 51"},
    {"file size", -1, TALLY__CKPT_H_FILE_BYTES, 8, 1u << 30, 0, NULL, "it is truncated"},
    {"step", -1, TALLY__CKPT_H_STEP, 8, 1ull << 63, 0, NULL, "step 9223372036854775808 is out of range"},
    {"shape product", 1, TALLY__CKPT_E_SHAPE, 8, 1ull << 62, 0, NULL, "'fc1.bias' (#1): shape [4611686018427387904]"},
    {"shape x dtype", 0, TALLY__CKPT_E_SHAPE + 8, 8, 1ull << 61, 0, NULL, "'fc1.weight' (#0): shape [30, 23058"},
    {"bytes", 3, TALLY__CKPT_E_BYTES, 8, 16, 0, NULL,
     "'adam.step' (#3): it records 16 data bytes, but i64 [1] needs 8"},
    {"unused dim", 1, TALLY__CKPT_E_SHAPE + 16, 8, 7, 0, NULL, "'fc1.bias' (#1): shape[2] is 7 but ndim is 1"},
    {"ndim", 1, TALLY__CKPT_E_NDIM, 4, 9, 0, NULL, "'fc1.bias' (#1): ndim 9 exceeds 4"},
    {"dtype", 4, TALLY__CKPT_E_DTYPE, 4, TALLY_BF16, 0, NULL, "'note' (#4): dtype code 3 is not"},
    {"unaligned", 1, TALLY__CKPT_E_OFFSET, 8, 8, 1, NULL, "'fc1.bias' (#1): data offset 3272 is not a multiple of 64"},
    {"overlap", 1, TALLY__CKPT_E_OFFSET, 8, (uint64_t)-64, 1, NULL,
     "'fc1.bias' (#1): data offset 3200 overlaps tensor 'fc1.weight' (#0), whose data and padding end at 3264"},
    {"into the table", 0, TALLY__CKPT_E_OFFSET, 8, 64, 0, NULL,
     "'fc1.weight' (#0): data offset 64 overlaps the header"},
    {"gap", 3, TALLY__CKPT_E_OFFSET, 8, 64, 1, NULL, "'adam.step' (#3): data offset 3456 leaves a gap after 3392"},
    {"outside", 5, TALLY__CKPT_E_OFFSET, 8, 1ull << 40, 0, NULL, "'fc2.weight' (#5): its data (offset 1099511627776"},
    {"duplicate", 4, 0, 0, 0, 0, "fc1.bias", "tensor 'fc1.bias' (#4) has the same name as tensor #1"},
    {"control char", 2, 0, 0, 0, 0, "em\x07pty", "tensor #2 (name as read 'em\\x07pty'): its name has byte 0x07"},
    {"high byte", 2, 0, 0, 0, 0, "\xe9t\xe9", "tensor #2 (name as read '\\xe9t\\xe9'): its name has byte 0xe9"},
    {"empty name", 2, 0, 0, 0, 0, "", "tensor #2 (name as read ''): its name is empty"},
    {"no NUL", 2, 0, 0, 0, 0, "x", "its name is not NUL-terminated"},
    {"junk after NUL", 2, 0, 0, 0, 0, "e", "its name has byte 0x21 at position 5, after its end"},
};

static void apply(unsigned char *m, size_t len, const craft *k) {
    unsigned char *at = k->entry < 0 ? m : m + 64 + 128 * (size_t)k->entry;
    if (k->width == 0) {
        memset(at, 0, 64);
        memcpy(at, k->name, strlen(k->name));
        if (!strcmp(k->what, "no NUL")) memset(at, 'x', 64);
        if (!strcmp(k->what, "junk after NUL")) at[5] = '!';
    } else if (k->width == 4) {
        put32(at + k->field, (uint32_t)k->val);
    } else {
        uint64_t v = k->add ? get64(at + k->field) + k->val : k->val;
        if (!strcmp(k->what, "count at the cap")) v = (uint64_t)128 << 20;
        put64(at + k->field, v);
    }
    if (!strcmp(k->what, "count at the cap")) put32(m + TALLY__CKPT_H_COUNT, 1u << 20);
    reseal(m, len, 6);
}

/* Runs every crafted case; returns the number that were accepted or gave another message. */
static int run_crafts(const unsigned char *img, size_t len, int verbose) {
    unsigned char *m = malloc(len);
    int wrong = 0;
    for (size_t i = 0; i < sizeof crafts / sizeof crafts[0]; i++) {
        memcpy(m, img, len);
        apply(m, len, &crafts[i]);
        tally__ckpt *c = NULL;
        int rc = tally__ckpt_parse(m, len, "crafted", &c);
        if (rc != TALLY_E_CORRUPT || c || !has(tally_last_error(), crafts[i].want)) {
            wrong++;
            if (verbose) fprintf(stderr, "crafted '%s': rc %d: %s\n", crafts[i].what, rc, tally_last_error());
        }
        tally__ckpt_close(c);
    }
    free(m);
    return wrong;
}

#ifndef UNDER_ASAN
static long vm_size_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmSize:", 7)) kb = atol(line + 7);
    if (f) fclose(f);
    return kb;
}
#endif

static void test_crafted(void) {
    char path[256];
    size_t len = 0;
    unsigned char *img = small_image(&len, path, sizeof path);
    if (!img) return;
    TH_CHECK(run_crafts(img, len, 1) == 0, "crafted: cases rejected wrongly (above)");
    unsigned char h[64];
    memcpy(h, img, 64);
    memcpy(h, "TALLYCK2", 8);
    TH_CHECK(tally__ckpt_parse(h, 64, "m", &(tally__ckpt *){0}) == TALLY_E_CORRUPT &&
                 has(tally_last_error(), "not a tally checkpoint"),
             "crafted: bad magic: %s", tally_last_error());
    TH_CHECK(tally__ckpt_parse(NULL, 10, "m", &(tally__ckpt *){0}) == TALLY_E_INVALID, "crafted: NULL buffer");
#ifdef UNDER_ASAN
    printf("crafted: allocation bound not checked under AddressSanitizer (it reserves address space)\n");
#else
    /* The same cases again in a child whose address space may grow by 16 MiB only: a parser that sized
     * anything by the claimed count (up to 2^32 entries) before checking it against the file would die. */
    pid_t pid = fork();
    if (pid == 0) {
        long kb = vm_size_kb();
        struct rlimit r = {.rlim_cur = (rlim_t)(kb + 16 * 1024) * 1024, .rlim_max = (rlim_t)(kb + 16 * 1024) * 1024};
        if (kb < 0 || setrlimit(RLIMIT_AS, &r)) _exit(3);
        void *volatile probe = malloc(64u << 20); /* the bound must bite, or this proves nothing */
        if (probe) _exit(5);
        _exit(run_crafts(img, len, 0) ? 4 : 0);
    }
    int st = reap(pid, 30);
    TH_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "crafted: under a 16 MiB allocation bound: status 0x%x", st);
#endif
    free(img);
}

/* ---- LATEST and the directory ---- */

static void test_latest(void) {
    char dir[128], path[256];
    tally__ckpt *c = (tally__ckpt *)1;
    subdir(dir, sizeof dir, "none/missing");
    int rc = tally__ckpt_open_latest(dir, &c);
    TH_CHECK(rc == TALLY__CKPT_NONE && c == NULL && has(tally_last_error(), "directory does not exist"),
             "missing dir: %d %s", rc, tally_last_error());
    subdir(dir, sizeof dir, "none");
    mkdir(dir, 0755);
    rc = tally__ckpt_open_latest(dir, &c);
    TH_CHECK(rc == TALLY__CKPT_NONE && c == NULL && has(tally_last_error(), "LATEST does not exist"),
             "missing LATEST: %d %s", rc, tally_last_error());
    subdir(path, sizeof path, "none/plain");
    write_file(path, "x", 1);
    rc = tally__ckpt_open_latest(path, &c);
    TH_CHECK(rc == TALLY_E_SYSTEM && has(tally_last_error(), "plain"), "a file as DIR: %d %s", rc, tally_last_error());

    subdir(dir, sizeof dir, "latest");
    TH_CHECK(write_step(dir, 5, 256, 64, 2) == 0 && write_step(dir, 6, 256, 64, 2) == 0, "latest: writes: %s",
             tally_last_error());
    size_t n = 0;
    snprintf(path, sizeof path, "%s/LATEST", dir);
    unsigned char *man = read_all(path, &n), *m = malloc(n + 1);
    int wrong = 0;
    for (size_t k = 0; k < n; k++) { /* every byte of the manifest matters */
        memcpy(m, man, n);
        m[k] ^= (unsigned char)(k % 3 == 0 ? 0x01 : k % 3 == 1 ? 0x20 : 0xFF);
        write_file(path, m, n);
        rc = tally__ckpt_open_latest(dir, &c);
        if ((rc != TALLY_E_CORRUPT || c || !has(tally_last_error(), "LATEST")) && wrong++ < 3)
            fprintf(stderr, "LATEST flip at %zu: %d %s\n", k, rc, tally_last_error());
        tally__ckpt_close(c);
    }
    TH_CHECK(wrong == 0, "LATEST: %d of %zu byte flips not reported as a corrupt manifest", wrong, n);
    write_file(path, man, n - 1);
    rc = tally__ckpt_open_latest(dir, &c);
    TH_CHECK(rc == TALLY_E_CORRUPT && has(tally_last_error(), "truncated"), "LATEST cut: %s", tally_last_error());
    char longer[600];
    memset(longer, 'x', sizeof longer);
    memcpy(longer, man, n);
    write_file(path, longer, sizeof longer);
    rc = tally__ckpt_open_latest(dir, &c);
    TH_CHECK(rc == TALLY_E_CORRUPT && has(tally_last_error(), "longer than 512 bytes"), "LATEST long: %s",
             tally_last_error());
    write_file(path, man, n);
    TH_CHECK(tally__ckpt_open_latest(dir, &c) == 0 && step_check(c, 6, 256, 64, "latest") == 0, "latest: restored");
    tally__ckpt_close(c);

    /* The file it names: corrupt, replaced by another of the same step, missing. */
    char file[256], other[128], keep[256];
    snprintf(file, sizeof file, "%s/step-0000000006.tck", dir);
    snprintf(keep, sizeof keep, "%s/saved", dir);
    size_t fl = 0;
    unsigned char *img = read_all(file, &fl);
    rename(file, keep);
    img[fl - 300] ^= 0x10; /* inside optim.m's data */
    write_file(file, img, fl);
    rc = tally__ckpt_open_latest(dir, &c);
    TH_CHECK(rc == TALLY_E_CORRUPT && has(tally_last_error(), "step-0000000006.tck: tensor 'optim.m' (#1): data "
                                                               "CRC32C mismatch"),
             "corrupt file: %s", tally_last_error());
    tally__ckpt_tensor d[NT];
    content_desc(d, 256, 64);
    d[3].name = "rng.other"; /* same sizes and step, another table: entries that are valid, but others */
    subdir(other, sizeof other, "latest-other");
    TH_CHECK(write_tensors(other, 6, d, NT, 2) == 0, "other: %s", tally_last_error());
    snprintf(path, sizeof path, "%s/step-0000000006.tck", other);
    rename(path, file);
    rc = tally__ckpt_open_latest(dir, &c);
    TH_CHECK(rc == TALLY_E_CORRUPT && has(tally_last_error(), "but LATEST says step 6 with"), "replaced file: %d %s",
             rc, tally_last_error());
    unlink(file);
    rc = tally__ckpt_open_latest(dir, &c);
    TH_CHECK(rc == TALLY_E_CORRUPT && has(tally_last_error(), "step-0000000006.tck: LATEST names this file but it "
                                                               "does not exist"),
             "missing file: %s", tally_last_error());
    write_file(file, img, fl - 64);
    rc = tally__ckpt_open_latest(dir, &c);
    TH_CHECK(rc == TALLY_E_CORRUPT && has(tally_last_error(), "bytes but LATEST says"), "short file: %s",
             tally_last_error());
    rename(keep, file);
    TH_CHECK(tally__ckpt_open_latest(dir, &c) == 0, "latest: the original again: %s", tally_last_error());
    tally__ckpt_close(c);
    free(img);
    free(man);
    free(m);
}

/* ---- crash safety ---- */

static int kill_stage = -1;
static void kill_at(int stage) {
    if (stage == kill_stage) raise(SIGKILL);
}

/* A child that resumes from LATEST and writes one checkpoint after another until it is killed. */
static void writer_loop(const char *dir, size_t nw, size_t nm) {
    tally__ckpt *c = NULL;
    int64_t step = 1;
    int rc = tally__ckpt_open_latest(dir, &c);
    if (rc == 0) step = tally__ckpt_step(c) + 1;
    tally__ckpt_close(c);
    if (rc < 0) {
        fprintf(stderr, "writer child: %s\n", tally_last_error());
        _exit(3);
    }
    for (;; step++)
        if (write_step(dir, step, nw, nm, 2)) {
            fprintf(stderr, "writer child, step %" PRId64 ": %s\n", step, tally_last_error());
            _exit(4);
        }
}

static void test_kills(void) {
    int light = th_light();
    const char *ks = getenv("TALLY_CKPT_KILLS"), *ss = getenv("TALLY_CKPT_SEED");
    int kills = ks ? atoi(ks) : light ? 8 : 20;
    uint64_t seed = ss ? strtoull(ss, NULL, 0) : (uint64_t)time(NULL) ^ (uint64_t)getpid() << 16;
    size_t nw = light ? 1u << 17 : 1u << 19, nm = light ? 1u << 15 : 1u << 17; /* 0.75 or 3 MiB a checkpoint */
    char dir[128];
    subdir(dir, sizeof dir, "kills-time");
    double t0 = th_now();
    write_step(dir, 1, nw, nm, 2);
    tally__ckpt *c = NULL;
    tally__ckpt_open_latest(dir, &c);
    tally__ckpt_close(c);
    double cycle = th_now() - t0, span = 3 * cycle + 0.002;
    printf("kills: %d SIGKILLs, seed %" PRIu64 " (TALLY_CKPT_SEED to repeat), a checkpoint of %.2f MiB takes %.1f ms; "
           "kills within %.1f ms of the start\n",
           kills, seed, (double)(nw * 4 + nm * 8) / (1 << 20), cycle * 1e3, span * 1e3);

    subdir(dir, sizeof dir, "kills");
    mkdir(dir, 0755);
    char p[256]; /* stale files of an earlier crash: ignored by readers, removed by the next commit */
    snprintf(p, sizeof p, "%s/step-0000000077.tck.tmp", dir);
    write_file(p, "partial", 7);
    snprintf(p, sizeof p, "%s/LATEST.tmp", dir);
    write_file(p, "partial", 7);
    snprintf(p, sizeof p, "%s/step-9999999999.tck", dir); /* renamed, never committed */
    write_file(p, "uncommitted", 11);
    int64_t last = 0;
    int none = 0, loaded = 0, stale = 0, failed = 0;
    for (int k = 0; k < kills; k++) {
        uint64_t r = mix(seed + (uint64_t)k);
        double delay = span * (double)(r >> 11) * 0x1p-53;
        pid_t pid = fork();
        if (pid == 0) {
            writer_loop(dir, nw, nm);
            _exit(5);
        }
        usleep((useconds_t)(delay * 1e6));
        kill(pid, SIGKILL);
        int st = reap(pid, 20);
        if (!(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) && failed++ < 3)
            fprintf(stderr, "kill %d: the writer ended by itself (status 0x%x)\n", k, st);
        stale += count_suffix(dir, ".tmp") > 0;
        int rc = tally__ckpt_open_latest(dir, &c);
        if (rc == TALLY__CKPT_NONE) {
            none++;
            TH_CHECK(last == 0, "kill %d (after %.1f ms): LATEST vanished after step %" PRId64 " was committed", k,
                     delay * 1e3, last);
            continue;
        }
        TH_CHECK(rc == 0, "kill %d (after %.1f ms): open_latest: %s", k, delay * 1e3, tally_last_error());
        if (rc) continue;
        loaded++;
        int64_t s = tally__ckpt_step(c);
        TH_CHECK(s >= last, "kill %d: LATEST went back from step %" PRId64 " to %" PRId64, k, last, s);
        TH_CHECK(step_check(c, s, nw, nm, "kill") == 0, "kill %d: step %" PRId64 " holds the wrong content", k, s);
        last = s;
        tally__ckpt_close(c);
    }
    TH_CHECK(failed == 0, "kills: %d writers failed before they were killed", failed);
    pid_t pid = fork();
    if (pid == 0) _exit(write_step(dir, last + 1, nw, nm, 2) ? 6 : 0);
    int st = reap(pid, 60);
    TH_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "kills: the last writer failed: 0x%x", st);
    TH_CHECK(tally__ckpt_open_latest(dir, &c) == 0 && step_check(c, last + 1, nw, nm, "final") == 0,
             "kills: the final checkpoint: %s", tally_last_error());
    tally__ckpt_close(c);
    TH_CHECK(count_suffix(dir, ".tmp") == 0, "kills: .tmp files remain after a clean commit");
    TH_CHECK(count_suffix(dir, ".tck") <= 2 && !exists(dir, "step-9999999999.tck"),
             "kills: %d checkpoint files remain (keep 2), or the uncommitted one", count_suffix(dir, ".tck"));
    printf("kills: %d loaded (newest step %" PRId64 "), %d before the first commit, %d left .tmp files\n", loaded, last,
           none, stale);
}

/* A writer killed as it reaches each stage: LATEST names the old or the new checkpoint, whole. */
static void test_stages(void) {
    static const char *names[] = {"begun",        "data written",     "header written",   "file synced", "file renamed",
                                  "file durable", "manifest written", "manifest renamed", "committed",   "removed one"};
    size_t nw = 4096, nm = 1024;
    for (int s = 0; s < TALLY__CKPT_STAGES; s++) {
        char dir[128], tag[32];
        snprintf(tag, sizeof tag, "stage%d", s);
        subdir(dir, sizeof dir, tag);
        pid_t pid = fork();
        if (pid == 0) {
            if (write_step(dir, 1, nw, nm, 2) || write_step(dir, 2, nw, nm, 2)) _exit(3);
            kill_stage = s;
            tally__ckpt_stage_hook = kill_at;
            write_step(dir, 3, nw, nm, 2);
            _exit(4); /* the stage was never reached */
        }
        int st = reap(pid, 30);
        TH_CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "stage %s: the writer was not killed there (0x%x)",
                 names[s], st);
        int64_t want = s >= TALLY__CKPT_AT_MANIFEST_RENAMED ? 3 : 2;
        tally__ckpt *c = NULL;
        int rc = tally__ckpt_open_latest(dir, &c);
        TH_CHECK(rc == 0 && step_check(c, want, nw, nm, names[s]) == 0, "stage %s: LATEST: %s", names[s],
                 rc ? tally_last_error() : "wrong step or content");
        tally__ckpt_close(c);
        int renamed = s >= TALLY__CKPT_AT_FILE_RENAMED;
        TH_CHECK(exists(dir, "step-0000000003.tck.tmp") == !renamed && exists(dir, "step-0000000003.tck") == renamed,
                 "stage %s: step 3's files are not as expected", names[s]);
        TH_CHECK(exists(dir, "LATEST.tmp") == (s == TALLY__CKPT_AT_MANIFEST_WRITTEN), "stage %s: LATEST.tmp", names[s]);
        TH_CHECK(write_step(dir, 4, nw, nm, 2) == 0, "stage %s: the next writer: %s", names[s], tally_last_error());
        TH_CHECK(tally__ckpt_open_latest(dir, &c) == 0 && step_check(c, 4, nw, nm, names[s]) == 0,
                 "stage %s: after the next commit", names[s]);
        tally__ckpt_close(c);
        TH_CHECK(count_suffix(dir, ".tmp") == 0 && count_suffix(dir, ".tck") == 2 &&
                     exists(dir, renamed ? "step-0000000003.tck" : "step-0000000002.tck"),
                 "stage %s: the next commit left %d .tmp and %d .tck files", names[s], count_suffix(dir, ".tmp"),
                 count_suffix(dir, ".tck"));
    }
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/tally_test_ckpt.XXXXXX");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 2;
    }
    double t0 = th_now(), t;
    int fds = th_count_fds();
#define PHASE(f) (t = th_now(), f(), printf("  %s: %.2f s\n", #f, th_now() - t))
    PHASE(test_crc);
    PHASE(test_roundtrip);
    PHASE(test_writer_misuse);
    PHASE(test_keep);
    PHASE(test_flips);
    PHASE(test_crafted);
    PHASE(test_latest);
    PHASE(test_stages);
    PHASE(test_kills);
    TH_CHECK(th_count_fds() == fds, "%d file descriptors open at the end, %d at the start", th_count_fds(), fds);
    rm_tree(root);
    printf("test_ckpt: %.2f s\n", th_now() - t0);
    return th_verdict("test_ckpt");
}
