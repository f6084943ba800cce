/* test_ckpt_corrupt.c - damaged checkpoint files: every byte flip and truncation of a small image detected,
 * and crafted tables (bad offsets, sizes, names, counts) refused with a message, within bounded memory. */
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

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif

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

int main(void) {
    if (ck_root_make("test_ckpt_corrupt")) return 2;
    double t0 = th_now(), t;
    int fds = th_count_fds();
#define PHASE(f) (t = th_now(), f(), printf("  %s: %.2f s\n", #f, th_now() - t))
    PHASE(test_flips);
    PHASE(test_crafted);
    TH_CHECK(th_count_fds() == fds, "%d file descriptors open at the end, %d at the start", th_count_fds(), fds);
    ck_root_remove();
    printf("test_ckpt_corrupt: %.2f s\n", th_now() - t0);
    return th_verdict("test_ckpt_corrupt");
}
