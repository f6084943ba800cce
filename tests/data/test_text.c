/* test_text.c - checks byte-level text data: the split, windows against the bytes, the training starts'
 * range, determinism and rank slicing, the validation spread, every refusal (a sparse 3 GiB file among
 * them), and the offsets of a 3 GiB text. */
#include <tally/data.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#define SMALL_N 1000

static char tmpdir[64];

static const char *tpath(const char *name) { return th_path(tmpdir, name); }

/* Every byte value occurs, so a sign-extended or truncated token shows. */
static uint8_t small_byte(size_t i) { return (uint8_t)(i * 37 + i / 256 + 11); }

static const char *write_small(void) {
    static uint8_t b[SMALL_N];
    for (size_t i = 0; i < SMALL_N; i++) b[i] = small_byte(i);
    static char p[512]; /* kept for the whole run: tpath's buffers are reused */
    snprintf(p, sizeof p, "%s", tpath("small.txt"));
    th_write_file(p, b, sizeof b);
    return p;
}

static int names_file(const char *path) { return strstr(tally_last_error(), path) != NULL; }

/* ---- the small file ---- */

static void test_split(const char *path) {
    tally_text t;
    int rc = tally_text_open(path, 0.1, &t);
    TH_CHECK(rc == 0, "open %s with val_frac 0.1: rc %d: %s", path, rc, tally_last_error());
    TH_CHECK(t.n == SMALL_N && t.train_n == 900, "val_frac 0.1: n %zu train_n %zu, want 1000 and 900", t.n, t.train_n);
    TH_CHECK(t.path == path, "t.path is not the pointer given to tally_text_open");
    tally_text_close(&t);
    TH_CHECK(t.bytes == NULL && t.n == 0, "close leaves bytes %p n %zu, want a zeroed struct", (void *)t.bytes, t.n);
    tally_text_close(&t); /* twice is harmless */
    rc = tally_text_open(path, 0, &t);
    TH_CHECK(rc == 0 && t.n == SMALL_N && t.train_n == SMALL_N,
             "val_frac 0: rc %d n %zu train_n %zu, want all training", rc, t.n, t.train_n);
    TH_CHECK(tally_text_check(&t, SMALL_N - 1) == 0, "val_frac 0, T=%d (the whole file): refused: %s", SMALL_N - 1,
             tally_last_error());
    tally_text_close(&t);
    tally_text_close(&t);
}

/* 100 * 0.29 is 28.999999999999996 in doubles: the user still means 29 bytes held out. */
static void test_decimal_frac(void) {
    const char *path = tpath("hundred.txt");
    char b[100];
    memset(b, 'x', sizeof b);
    th_write_file(path, b, sizeof b);
    const double fracs[] = {0.29, 0.57, 0.58, 0.5, 0.01};
    const size_t want[] = {71, 43, 42, 50, 99};
    for (size_t i = 0; i < sizeof fracs / sizeof *fracs; i++) {
        tally_text t;
        int rc = tally_text_open(path, fracs[i], &t);
        TH_CHECK(rc == 0 && t.train_n == want[i], "100 bytes, val_frac %g: rc %d train_n %zu, want %zu", fracs[i], rc,
                 t.train_n, want[i]);
        tally_text_close(&t);
    }
}

static void test_window(const tally_text *t) {
    int32_t tok[64], tgt[64];
    const size_t starts[] = {0, 123, 500, SMALL_N - 65};
    for (size_t s = 0; s < sizeof starts / sizeof *starts; s++) {
        tally_text_window(t, starts[s], 64, tok, tgt);
        int bad = -1;
        for (int i = 0; i < 64 && bad < 0; i++)
            if (tok[i] != small_byte(starts[s] + i) || tgt[i] != small_byte(starts[s] + i + 1)) bad = i;
        TH_CHECK(bad < 0, "window at %zu: position %d has token %d target %d, want %d and %d (the file's bytes)",
                 starts[s], bad, bad < 0 ? 0 : tok[bad], bad < 0 ? 0 : tgt[bad],
                 bad < 0 ? 0 : small_byte(starts[s] + bad), bad < 0 ? 0 : small_byte(starts[s] + bad + 1));
    }
}

static size_t count_out_of_range(const size_t *s, size_t n, size_t hi) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += s[i] > hi;
    return bad;
}

static void test_train_starts(const tally_text *t, int T) {
    enum { W = 64 };
    size_t a[W], b[W], c[W], d[W], hi = t->train_n - (size_t)T - 1;
    tally_text_train_starts(t, 7, 3, T, 0, W, a);
    tally_text_train_starts(t, 7, 3, T, 0, W, b);
    tally_text_train_starts(t, 7, 4, T, 0, W, c);
    tally_text_train_starts(t, 8, 3, T, 0, W, d);
    TH_CHECK(count_out_of_range(a, W, hi) == 0, "T=%d: %zu of %d starts are past %zu (train_n - T - 1)", T,
             count_out_of_range(a, W, hi), W, hi);
    TH_CHECK(memcmp(a, b, sizeof a) == 0, "the same (seed, step) drew different starts on a second call");
    if (hi == 0) return; /* one possible start: every step and seed must draw it */
    TH_CHECK(memcmp(a, c, sizeof a) != 0, "steps 3 and 4 drew the same %d starts", W);
    TH_CHECK(memcmp(a, d, sizeof a) != 0, "seeds 7 and 8 drew the same %d starts", W);
    tally_text_train_starts(t, 7, -3, T, 0, W, c); /* a negative step is a stream of its own */
    TH_CHECK(memcmp(a, c, sizeof a) != 0, "steps 3 and -3 drew the same %d starts", W);
}

/* Rank r of N taking windows r*B .. r*B+B-1 must see what one rank taking all N*B sees. */
static void test_rank_slices(const tally_text *t, int T) {
    enum { ALL = 96 };
    size_t all[ALL], part[ALL];
    tally_text_train_starts(t, 42, 17, T, 0, ALL, all);
    const int splits[][2] = {{1, 96}, {2, 48}, {3, 32}, {4, 24}, {8, 12}, {96, 1}}; /* {N, B} */
    for (size_t s = 0; s < sizeof splits / sizeof *splits; s++) {
        int N = splits[s][0], B = splits[s][1], bad = -1;
        for (int r = 0; r < N && bad < 0; r++) {
            tally_text_train_starts(t, 42, 17, T, (size_t)r * B, (size_t)B, part);
            if (memcmp(part, all + (size_t)r * B, (size_t)B * sizeof *part) != 0) bad = r;
        }
        TH_CHECK(bad < 0, "%d ranks x %d windows: rank %d's windows differ from its slice of one rank's %d", N, B, bad,
                 ALL);
    }
    tally_text_train_starts(t, 42, 17, T, 37, 5, part); /* a slice that starts mid-split */
    TH_CHECK(memcmp(part, all + 37, 5 * sizeof *part) == 0, "windows 37..41 differ from the same slice of 0..%d",
             ALL - 1);
}

/* Starts must be nondecreasing with gaps that differ by at most one, the last window ending at byte n-1. */
static void check_val_spread(const tally_text *t, int T, int windows) {
    size_t first = tally_text_val_start(t, T, 0, windows), last = tally_text_val_start(t, T, windows - 1, windows);
    TH_CHECK(first == t->train_n, "%d val windows: the first starts at %zu, want %zu (the validation part's start)",
             windows, first, t->train_n);
    if (windows > 1)
        TH_CHECK(last + (size_t)T == t->n - 1,
                 "%d val windows of T=%d: the last starts at %zu and ends at %zu, want %zu", windows, T, last,
                 last + (size_t)T, t->n - 1);
    size_t gmin = SIZE_MAX, gmax = 0, prev = first;
    for (int i = 1; i < windows; i++) {
        size_t s = tally_text_val_start(t, T, i, windows), g = s - prev;
        if (s < prev) g = SIZE_MAX; /* out of order */
        gmin = g < gmin ? g : gmin;
        gmax = g > gmax ? g : gmax;
        prev = s;
    }
    if (windows > 1)
        TH_CHECK(gmax != SIZE_MAX && gmax - gmin <= 1, "%d val windows: gaps between starts range over %zu..%zu",
                 windows, gmin, gmax);
}

static void test_val_starts(const tally_text *t) {
    TH_CHECK(tally_text_val_start(t, 9, 3, 10) == 930,
             "val window 3 of 10 (T=9, 100 bytes from 900): start %zu, want 930", tally_text_val_start(t, 9, 3, 10));
    check_val_spread(t, 9, 10);
    check_val_spread(t, 9, 7);
    check_val_spread(t, 99, 5); /* the validation part holds exactly one window: every start is its first byte */
    TH_CHECK(tally_text_val_start(t, 99, 4, 5) == 900, "T=99 on 100 validation bytes: window 4 starts at %zu, want 900",
             tally_text_val_start(t, 99, 4, 5));
    TH_CHECK(tally_text_val_start(t, 9, 0, 1) == 900, "one val window: start %zu, want 900 (the first byte)",
             tally_text_val_start(t, 9, 0, 1));
}

/* ---- many draws ---- */

static void test_many_draws(const char *path) {
    enum { DRAWS = 10000, T = 8 };
    tally_text t;
    if (tally_text_open(path, 0.9, &t) != 0) { /* train_n 100: 92 possible starts */
        TH_CHECK(0, "open %s with val_frac 0.9: %s", path, tally_last_error());
        return;
    }
    size_t *s = malloc(DRAWS * sizeof *s), hi = t.train_n - T - 1, hits[128] = {0};
    tally_text_train_starts(&t, 1234, 99, T, 0, DRAWS, s);
    size_t bad = count_out_of_range(s, DRAWS, hi), seen = 0, most = 0, least = SIZE_MAX;
    TH_CHECK(bad == 0, "%zu of %d starts are past %zu (train_n %zu - T %d - 1)", bad, DRAWS, hi, t.train_n, T);
    for (size_t i = 0; i < DRAWS && !bad; i++) hits[s[i]]++;
    for (size_t v = 0; v <= hi && !bad; v++) {
        seen += hits[v] > 0;
        most = hits[v] > most ? hits[v] : most;
        least = hits[v] < least ? hits[v] : least;
    }
    /* About 109 per start; a fair draw strays past [40, 200] once in far more runs than there are atoms. */
    TH_CHECK(seen == hi + 1, "%d draws hit %zu of the %zu possible starts", DRAWS, seen, hi + 1);
    TH_CHECK(least >= 40 && most <= 200, "%d draws over %zu starts: counts range %zu..%zu, want about %d each", DRAWS,
             hi + 1, least, most, DRAWS / (int)(hi + 1));
    free(s);
    tally_text_close(&t);
}

/* ---- refusals ---- */

static void expect_refused(const char *path, double val_frac, int want, const char *what) {
    tally_text t;
    memset(&t, 0xab, sizeof t);
    int rc = tally_text_open(path, val_frac, &t);
    TH_CHECK(rc == want, "%s: rc %d, want %d (%s)", what, rc, want, tally_last_error());
    TH_CHECK(names_file(path), "%s: the message does not name %s: \"%s\"", what, path, tally_last_error());
    TH_CHECK(t.bytes == NULL && t.n == 0, "%s: *out is not zeroed after the refusal", what);
    if (rc == 0) tally_text_close(&t);
}

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "FAIL test_text: tally_text_open blocked on a FIFO\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(1);
}

static void test_refusals(const char *small) {
    expect_refused(tpath("absent.txt"), 0.1, TALLY_E_SYSTEM, "a missing file");
    const char *empty = tpath("empty.txt");
    th_write_file(empty, "", 0);
    expect_refused(empty, 0.1, TALLY_E_INVALID, "an empty file");
    expect_refused(tmpdir, 0.1, TALLY_E_INVALID, "a directory");
    const char *fifo = tpath("fifo");
    if (mkfifo(fifo, 0600) != 0) {
        TH_CHECK(0, "mkfifo %s: %s", fifo, strerror(errno));
    } else {
        signal(SIGALRM, on_alarm); /* no writer ever comes: a blocking open would hang here */
        alarm(10);
        expect_refused(fifo, 0.1, TALLY_E_INVALID, "a FIFO");
        alarm(0);
        signal(SIGALRM, SIG_DFL);
    }
    expect_refused(small, -0.1, TALLY_E_INVALID, "val_frac -0.1");
    expect_refused(small, 1.0, TALLY_E_INVALID, "val_frac 1.0");
    expect_refused(small, NAN, TALLY_E_INVALID, "val_frac NaN");
    if (geteuid() != 0) { /* root reads a file of mode 000 */
        const char *locked = tpath("locked.txt");
        th_write_file(locked, "abc", 3);
        chmod(locked, 0);
        expect_refused(locked, 0.1, TALLY_E_SYSTEM, "an unreadable file");
    }
}

static void expect_check_refused(const tally_text *t, int T, const char *part, const char *what) {
    int rc = tally_text_check(t, T);
    const char *m = tally_last_error();
    TH_CHECK(rc == TALLY_E_INVALID, "%s (T=%d): rc %d, want TALLY_E_INVALID", what, T, rc);
    TH_CHECK(names_file(t->path) && strstr(m, part) && strstr(m, "1000") && strstr(m, "--context"),
             "%s (T=%d): the message should name %s, its size 1000, the %s part and --context: \"%s\"", what, T,
             t->path, part, m);
}

static void test_check(const char *path) {
    tally_text t;
    if (tally_text_open(path, 0.1, &t) != 0) {
        TH_CHECK(0, "open %s: %s", path, tally_last_error());
        return;
    }
    TH_CHECK(tally_text_check(&t, 99) == 0, "T=99 on 900 + 100 bytes: refused: %s", tally_last_error());
    expect_check_refused(&t, 100, "validation", "only the validation part too short");
    expect_check_refused(&t, 899, "validation", "the training part exactly fits, the validation part is short");
    expect_check_refused(&t, 900, "training", "the training part too short");
    expect_check_refused(&t, 1 << 30, "training", "T far past the file");
    TH_CHECK(tally_text_check(&t, 0) == TALLY_E_INVALID, "T=0 accepted");
    tally_text_close(&t);
}

/* ---- a big sparse file, and the arithmetic of a big text ---- */

#define BIG_N ((off_t)3 << 30)

static void test_big(void) {
    const char *path = tpath("big.txt");
    static const char tail[] = "the end of a very long text.";
    const size_t tl = sizeof tail - 1;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ftruncate(fd, BIG_N) != 0 || pwrite(fd, tail, tl, BIG_N - (off_t)tl) != (ssize_t)tl) {
        TH_CHECK(0, "cannot make the sparse file %s: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return;
    }
    close(fd);
    /* Each rank reads a text whole: past TALLY_TEXT_MAX_BYTES it is refused by its size, before a byte is read. */
    tally_text t;
    int rc = tally_text_open(path, 0.01, &t);
    TH_CHECK(rc == TALLY_E_INVALID &&
                 strstr(tally_last_error(), "big.txt: 3221225472 bytes, more than the 2147483648") && !t.bytes && !t.n,
             "a 3 GiB file: rc %d: %s", rc, tally_last_error());
    if (!rc) tally_text_close(&t);
    unlink(path);
    /* Offsets past 2^31 and 2^32 (a text of 3 GiB, on paper: its bytes are never read here). */
    static const uint8_t unread[1];
    t = (tally_text){
        .bytes = unread, .n = (size_t)BIG_N, .train_n = (size_t)BIG_N - (size_t)BIG_N / 100, .path = "3 GiB"};
    TH_CHECK(tally_text_check(&t, 1024) == 0, "T=1024 refused on 3 GiB: %s", tally_last_error());
    check_val_spread(&t, 1024, 1000);
    check_val_spread(&t, 1024, 3);
    size_t s[256];
    tally_text_train_starts(&t, 5, 1000000, 1024, 1u << 20, 256, s);
    TH_CHECK(count_out_of_range(s, 256, t.train_n - 1025) == 0, "a start past train_n - T - 1 on the big file");
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/tally_text_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 2;
    }
    const char *small = write_small();
    test_split(small);
    test_decimal_frac();
    tally_text t;
    if (tally_text_open(small, 0.1, &t) == 0) {
        test_window(&t);
        test_train_starts(&t, 16);
        test_train_starts(&t, 899); /* one possible start: every draw is 0 */
        test_rank_slices(&t, 16);
        test_val_starts(&t);
        tally_text_close(&t);
    } else {
        TH_CHECK(0, "open %s: %s", small, tally_last_error());
    }
    test_many_draws(small);
    test_refusals(small);
    test_check(small);
    test_big();
    th_rm_dir(tmpdir);
    return th_verdict("test_text");
}
