/* test_ckpt_dir.c - the checkpoint directory: LATEST and what it points to, each stage of a save, and
 * crash safety: writers killed with SIGKILL at random points always leave a loadable newest checkpoint. */
#include <dirent.h>
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
#include "ckpt/ckpt_seam.h"
#include "ckpt/crc32c.h"
#include "ckpt_fixture.h"
#include "harness.h"

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
    th_write_file(path, "x", 1);
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
        th_write_file(path, m, n);
        rc = tally__ckpt_open_latest(dir, &c);
        if ((rc != TALLY_E_CORRUPT || c || !has(tally_last_error(), "LATEST")) && wrong++ < 3)
            fprintf(stderr, "LATEST flip at %zu: %d %s\n", k, rc, tally_last_error());
        tally__ckpt_close(c);
    }
    TH_CHECK(wrong == 0, "LATEST: %d of %zu byte flips not reported as a corrupt manifest", wrong, n);
    th_write_file(path, man, n - 1);
    rc = tally__ckpt_open_latest(dir, &c);
    TH_CHECK(rc == TALLY_E_CORRUPT && has(tally_last_error(), "truncated"), "LATEST cut: %s", tally_last_error());
    char longer[600];
    memset(longer, 'x', sizeof longer);
    memcpy(longer, man, n);
    th_write_file(path, longer, sizeof longer);
    rc = tally__ckpt_open_latest(dir, &c);
    TH_CHECK(rc == TALLY_E_CORRUPT && has(tally_last_error(), "longer than 512 bytes"), "LATEST long: %s",
             tally_last_error());
    th_write_file(path, man, n);
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
    th_write_file(file, img, fl);
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
    th_write_file(file, img, fl - 64);
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
    th_write_file(p, "partial", 7);
    snprintf(p, sizeof p, "%s/LATEST.tmp", dir);
    th_write_file(p, "partial", 7);
    snprintf(p, sizeof p, "%s/step-9999999999.tck", dir); /* renamed, never committed */
    th_write_file(p, "uncommitted", 11);
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
            tally__ckpt_seam_kill_at(s);
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

/* ---- a file truncated while it is loaded: the image is the loader's own ---- */

/* Truncates every file in dir but LATEST to 0 bytes: the number truncated. */
static int truncate_files(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (strcmp(e->d_name, "LATEST") && stat(path, &st) == 0 && S_ISREG(st.st_mode) && truncate(path, 0) == 0) n++;
    }
    if (d) closedir(d);
    return n;
}

static void test_truncated_under_reader(void) {
    char dir[128];
    subdir(dir, sizeof dir, "truncated");
    TH_CHECK(write_step(dir, 3, 1 << 16, 1 << 12, 2) == 0, "truncated: write: %s", tally_last_error());
    tally__ckpt *c = NULL;
    int rc = tally__ckpt_open_latest(dir, &c);
    TH_CHECK(rc == 0 && c, "truncated: open: %d %s", rc, tally_last_error());
    if (!c) return;
    TH_CHECK(truncate_files(dir) >= 1, "truncated: no checkpoint file to truncate in %s", dir);
    /* A mapped image raised SIGBUS here, at the first page past the new end. */
    TH_CHECK(step_check(c, 3, 1 << 16, 1 << 12, "truncated under the reader") == 0,
             "a checkpoint truncated after it was loaded changed what the loader holds");
    tally__ckpt_close(c);
}

int main(void) {
    if (ck_root_make("test_ckpt_dir")) return 2;
    double t0 = th_now(), t;
    int fds = th_count_fds();
#define PHASE(f) (t = th_now(), f(), printf("  %s: %.2f s\n", #f, th_now() - t))
    PHASE(test_latest);
    PHASE(test_truncated_under_reader);
    PHASE(test_stages);
    PHASE(test_kills);
    TH_CHECK(th_count_fds() == fds, "%d file descriptors open at the end, %d at the start", th_count_fds(), fds);
    ck_root_remove();
    printf("test_ckpt_dir: %.2f s\n", th_now() - t0);
    return th_verdict("test_ckpt_dir");
}
