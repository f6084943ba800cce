/* test_ckpt_format.c - the checkpoint file format: CRC32C against known vectors and the bitwise definition,
 * round trips of every dtype and size, a writer used wrongly, and how many files a directory keeps. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "ckpt/crc32c.h"
#include "ckpt_fixture.h"
#include "harness.h"

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
    TH_CHECK(rc == TALLY_E_INVALID && has(tally_last_error(), "the model has f64 [105]"), "round trip: get flat: %s",
             tally_last_error());
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

int main(void) {
    if (ck_root_make("test_ckpt_format")) return 2;
    double t0 = th_now(), t;
    int fds = th_count_fds();
#define PHASE(f) (t = th_now(), f(), printf("  %s: %.2f s\n", #f, th_now() - t))
    PHASE(test_crc);
    PHASE(test_roundtrip);
    PHASE(test_writer_misuse);
    PHASE(test_keep);
    TH_CHECK(th_count_fds() == fds, "%d file descriptors open at the end, %d at the start", th_count_fds(), fds);
    ck_root_remove();
    printf("test_ckpt_format: %.2f s\n", th_now() - t0);
    return th_verdict("test_ckpt_format");
}
