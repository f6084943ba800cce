/* test_hostile.c - files a careless or hostile user leaves in tally's way, end to end through the CLI:
 * links planted where tally writes, FIFOs where it reads, a full or read-only disk, a gzip bomb, and
 * limits (--threads past the CPUs, ulimit -v): each refused at once, named, with nothing overwritten. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "core/cpus.h"
#include "harness.h"
#include "scratch_dir.h"
#include "tool_runner.h"
#include "ckpt/ckpt.h"

static th_tool R;

static int file_is(const char *path, const char *text) {
    char buf[256] = "";
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return !strcmp(buf, text);
}

/* A short run that saves a checkpoint of step 2 in dir (and more flags, NULL-terminated). */
static void train_ckpt(const char *dir, const char *extra1, const char *extra2, double wall_s) {
    const char *args[] = {"train", "-n",      "2",      "--data", "synthetic:256", "--hidden", "16", "--steps",
                          "2",     "--quiet", "--ckpt", dir,      extra1,          extra2,     NULL};
    th_tool_opts o = {.wall_s = wall_s};
    th_tool_run(args, &o, &R);
}

#define expect(cond, what) th_tool_expect(&R, (cond), (what))

/* ---- 1: never write through a planted link, never truncate what is there ---- */

static void test_planted_links(void) {
    th_put_file(th_at("victim"), "victim\n");
    const char *names[] = {"step-0000000002.tck.tmp", "LATEST.tmp"};
    for (int i = 0; i < 2; i++) {
        char dir[64];
        snprintf(dir, sizeof dir, "links%d", i);
        mkdir(th_at(dir), 0700);
        char link[96];
        snprintf(link, sizeof link, "%s/%s", dir, names[i]);
        TH_CHECK(symlink(th_at("victim"), th_at(link)) == 0, "symlink %s: %s", link, strerror(errno));
        train_ckpt(th_at(dir), NULL, NULL, 60);
        expect(R.rc == 1 && strstr(R.out, names[i]) && strstr(R.out, "symbolic link"), "a link planted at the "
                                                                                       "temporary name is refused");
        TH_CHECK(file_is(th_at("victim"), "victim\n"), "the link's target was written through %s", names[i]);
    }
    /* A regular file at the temporary name, here a second name of the victim: the name goes, the file stays. */
    mkdir(th_at("leftover"), 0700);
    TH_CHECK(link(th_at("victim"), th_at("leftover/step-0000000002.tck.tmp")) == 0, "link: %s", strerror(errno));
    train_ckpt(th_at("leftover"), NULL, NULL, 60);
    expect(R.rc == 0, "a leftover regular file at the temporary name is replaced");
    TH_CHECK(file_is(th_at("victim"), "victim\n"), "the leftover's other name was truncated or written");
    /* --json FILE at this user's own link replaces the file it leads to, whole, and leaves the link; another
     * user's link, a dangling one, a device or a FIFO there: tests/cli/test_hostile_out.c. */
    th_put_file(th_at("mine.json"), "mine\n");
    TH_CHECK(symlink(th_at("mine.json"), th_at("summary.json")) == 0, "symlink: %s", strerror(errno));
    const char *json[] = {"train",   "-n", "1",       "--data", "synthetic:256",
                          "--steps", "1",  "--quiet", "--json", th_at("summary.json"),
                          NULL};
    th_tool_run(json, NULL, &R);
    struct stat st;
    expect(R.rc == 0 && lstat(th_at("summary.json"), &st) == 0 && S_ISLNK(st.st_mode), "--json keeps the user's link");
    TH_CHECK(!file_is(th_at("mine.json"), "mine\n") && !file_is(th_at("mine.json"), ""), "--json did not replace the "
                                                                                         "file the link leads to");
    TH_CHECK(file_is(th_at("victim"), "victim\n"), "--json wrote another file");
}

/* A process watching `path` for `mask` (inotify), as another user sharing a directory could: at the first
 * event it calls act(path, the event's name) and exits 3; it waits at most 60 s. watch_start returns once
 * the watch is in place (its pid, or -1); watch_end kills and reaps it: 1 when it acted. */
static pid_t watch_start(const char *path, uint32_t mask, void (*act)(const char *path, const char *name)) {
    int ready[2];
    if (pipe(ready) != 0) return -1;
    pid_t w = fork();
    if (w == 0) {
        int in = inotify_init1(IN_CLOEXEC);
        if (in < 0 || inotify_add_watch(in, path, mask) < 0 || write(ready[1], "r", 1) != 1) _exit(2);
        char ev[sizeof(struct inotify_event) + NAME_MAX + 1] __attribute__((aligned(8)));
        struct pollfd p = {.fd = in, .events = POLLIN};
        if (poll(&p, 1, 60000) != 1 || read(in, ev, sizeof ev) <= 0) _exit(0);
        const struct inotify_event *e = (const struct inotify_event *)ev;
        act(path, e->len ? e->name : "");
        _exit(3);
    }
    char b = 0;
    struct pollfd p = {.fd = ready[0], .events = POLLIN};
    int ok = w > 0 && poll(&p, 1, 10000) == 1 && read(ready[0], &b, 1) == 1 && b == 'r';
    close(ready[0]);
    close(ready[1]);
    if (!ok && w > 0) kill(w, SIGKILL), waitpid(w, NULL, 0);
    TH_CHECK(ok, "the watcher of %s did not start", path);
    return ok ? w : -1;
}

static int watch_end(pid_t w) {
    int st = 0;
    if (w <= 0) return 0;
    kill(w, SIGKILL);
    waitpid(w, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 3;
}

/* Renames "precious" over the file just made in dir: a second name of another's file put in its place. */
static void swap_in_precious(const char *dir, const char *name) {
    char to[512];
    snprintf(to, sizeof to, "%s/%s", dir, name);
    rename(th_at("precious"), to);
}

/* plan --calibrate (and sim's) hands the ranks' results over in a file no one else can reach: nothing made
 * in TMPDIR, where a file of another's swapped in (a second name of a file of theirs) would be written. */
static void test_calibrate_tmpdir(void) {
    mkdir(th_at("tmpdir"), 0700);
    th_put_file(th_at("precious"), "precious\n");
    pid_t w = watch_start(th_at("tmpdir"), IN_CREATE | IN_MOVED_TO, swap_in_precious);
    char env_tmp[512];
    snprintf(env_tmp, sizeof env_tmp, "TMPDIR=%s", th_at("tmpdir"));
    const char *env[] = {env_tmp, NULL};
    const char *args[] = {"plan", "--params", "1M", "--workers", "2", "--calibrate", NULL};
    th_tool_opts o = {.env = env, .wall_s = 60};
    th_tool_run(args, &o, &R);
    expect(R.rc == 0 && strstr(R.out, "calibrated"), "plan --calibrate");
    TH_CHECK(!watch_end(w), "plan --calibrate made a file in TMPDIR");
    TH_CHECK(file_is(th_at("precious"), "precious\n"), "plan --calibrate wrote into (or removed) a file swapped in");
}

static void change_config(const char *path, const char *name) { th_put_file(path, "hosts = 3\n"); }

/* sim --calibrate --config F reads F once, at the parse, and sets what it read again over what it
 * measured: F rewritten meanwhile (here to other valid settings, as soon as the parse has read it) changes
 * nothing, rather than being taken unchecked by a second read. */
static void test_config_changed(void) {
    th_put_file(th_at("cluster.conf"), "hosts = 2\n");
    pid_t w = watch_start(th_at("cluster.conf"), IN_CLOSE_NOWRITE, change_config); /* once read at the parse */
    const char *args[] = {"sim", "--calibrate", "--config", th_at("cluster.conf"), "--size", "1K", "--json", NULL};
    th_tool_opts o = {.wall_s = 60};
    th_tool_run(args, &o, &R);
    int acted = watch_end(w);
    TH_CHECK(acted && file_is(th_at("cluster.conf"), "hosts = 3\n"), "the config was not rewritten during the run");
    expect(R.rc == 0 && strstr(R.out, "\"hosts\": 2,"), "a config rewritten while sim --calibrate measured is "
                                                        "taken as the parse read it");
}

static void close_stdin(void *arg) { close(0); }

/* Started with stdin closed (a daemon, nohup ... <&-), plan --calibrate hands its ranks the memory file for
 * their results on a descriptor of its own, never on 0, where a rank's launcher puts /dev/null. */
static void test_calibrate_stdin_closed(void) {
    const char *args[] = {"plan", "--params", "1M", "--workers", "2", "--calibrate", NULL};
    th_tool_opts o = {.wall_s = 60, .child = close_stdin};
    th_tool_run(args, &o, &R);
    expect(R.rc == 0 && strstr(R.out, "calibrated"), "plan --calibrate with stdin closed");
}

/* ---- 2: a FIFO (or anything not a regular file) where a file is read: refused, never waited on ---- */

static void test_fifos(void) {
    mkdir(th_at("fifo-latest"), 0700);
    TH_CHECK(mkfifo(th_at("fifo-latest/LATEST"), 0600) == 0, "mkfifo: %s", strerror(errno));
    train_ckpt(th_at("fifo-latest"), "--resume", NULL, 30);
    expect(R.rc == 1 && strstr(R.out, "LATEST: is a FIFO, not a regular file"), "LATEST as a FIFO");

    train_ckpt(th_at("fifo-ckpt"), NULL, NULL, 60); /* a real checkpoint, then its file swapped for a FIFO */
    expect(R.rc == 0, "a checkpoint to swap");
    unlink(th_at("fifo-ckpt/step-0000000002.tck"));
    TH_CHECK(mkfifo(th_at("fifo-ckpt/step-0000000002.tck"), 0600) == 0, "mkfifo: %s", strerror(errno));
    train_ckpt(th_at("fifo-ckpt"), "--resume", NULL, 30);
    expect(R.rc == 1 && strstr(R.out, "step-0000000002.tck: is a FIFO"), "the checkpoint LATEST names as a FIFO");

    mkdir(th_at("fifo-data"), 0700);
    const char *files[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                           "t10k-labels-idx1-ubyte"};
    char p[96];
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "fifo-data/%s", files[i]);
        mkfifo(th_at(p), 0600);
    }
    const char *data[] = {"train", "--data", th_at("fifo-data"), "--steps", "1", "--quiet", NULL};
    th_tool_opts o = {.wall_s = 30};
    th_tool_run(data, &o, &R);
    expect(R.rc == 1 && strstr(R.out, "train-images-idx3-ubyte: is a FIFO"), "a data file as a FIFO");
    mkdir(th_at("dir-data"), 0700);
    mkdir(th_at("dir-data/train-images-idx3-ubyte"), 0700); /* and a directory where a file is read */
    for (int i = 1; i < 4; i++) {
        snprintf(p, sizeof p, "dir-data/%s", files[i]);
        mkfifo(th_at(p), 0600);
    }
    const char *dirdata[] = {"train", "--data", th_at("dir-data"), "--steps", "1", "--quiet", NULL};
    th_tool_run(dirdata, &o, &R);
    expect(R.rc == 1 && strstr(R.out, "train-images-idx3-ubyte: is a directory"), "a data file as a directory");
}

/* ---- 3: a write that fails says which file, why, and what to do ---- */

static int mount_small(const char *dir, const char *opts) {
    mkdir(dir, 0700);
    return mount("tally-test", dir, "tmpfs", 0, opts);
}

static void test_full_and_readonly(void) {
    const char *mnt = th_at("small");
    if (mount_small(mnt, "size=300k") != 0) {
        printf("test_hostile: a full disk and a read-only one not tried: mounting a tmpfs needs root (%s)\n",
               strerror(errno));
        return;
    }
    char dir[360];
    snprintf(dir, sizeof dir, "%s/ck", mnt);
    const char *args[] = {"train",   "-n",     "2", "--data", "synthetic:256", "--steps", "2",
                          "--quiet", "--ckpt", dir, NULL};
    th_tool_opts o = {.wall_s = 60};
    th_tool_run(args, &o, &R); /* the MLP's 2.7 MB of parameters do not fit in 300 KB */
    expect(R.rc == 1 && strstr(R.out, "checkpoint ") && strstr(R.out, "step-0000000002.tck.tmp") &&
               strstr(R.out, "No space left on device") && strstr(R.out, "free space"),
           "a full disk is named, with the file and what to do");
    TH_CHECK(mount("tally-test", mnt, "tmpfs", MS_REMOUNT | MS_RDONLY, "size=300k") == 0, "remount ro: %s",
             strerror(errno));
    snprintf(dir, sizeof dir, "%s/ck2", mnt);
    th_tool_run(args, &o, &R);
    expect(R.rc == 1 && strstr(R.out, "checkpoint directory ") && strstr(R.out, "Read-only file system") &&
               strstr(R.out, "writable directory"),
           "a read-only directory is named, with what to do");
    umount2(mnt, MNT_DETACH);
}

/* ---- 4: a checkpoint whose tensor has another shape (same elements, CRCs right) is refused ---- */

/* Copies the checkpoint in `from` to `to`, the first 2-D tensor's dimensions swapped. */
static int copy_transposed(const char *from, const char *to, char *swapped, size_t cap) {
    tally__ckpt *c = NULL;
    if (tally__ckpt_open_latest(from, &c)) return -1;
    int n = tally__ckpt_count(c), done = 0, rc = 0;
    tally__ckpt_tensor *t = calloc((size_t)n, sizeof *t);
    for (int i = 0; i < n; i++) {
        t[i] = *tally__ckpt_at(c, i);
        if (!done && t[i].ndim == 2 && t[i].shape[0] != t[i].shape[1]) {
            uint64_t d = t[i].shape[0];
            t[i].shape[0] = t[i].shape[1];
            t[i].shape[1] = d;
            snprintf(swapped, cap, "'%s' is f32 [%llu, %llu]", t[i].name, (unsigned long long)t[i].shape[0],
                     (unsigned long long)t[i].shape[1]);
            done = 1;
        }
    }
    tally__ckpt_writer *w = NULL;
    rc = tally__ckpt_write_begin(to, tally__ckpt_step(c), t, n, &w);
    for (int i = 0; i < n && !rc; i++)
        if (t[i].bytes) rc = tally__ckpt_write(w, i, t[i].data, t[i].bytes);
    if (!rc)
        rc = tally__ckpt_write_commit(w, 0);
    else
        tally__ckpt_write_abort(w);
    free(t);
    tally__ckpt_close(c);
    return rc || !done ? -1 : 0;
}

static void test_shape(void) {
    train_ckpt(th_at("shape-from"), NULL, NULL, 60);
    expect(R.rc == 0, "a checkpoint to transpose");
    char swapped[160] = "";
    TH_CHECK(copy_transposed(th_at("shape-from"), th_at("shape-to"), swapped, sizeof swapped) == 0, "rewriting it: %s",
             tally_last_error());
    train_ckpt(th_at("shape-to"), "--resume", NULL, 60);
    expect(R.rc == 1 && strstr(R.out, swapped) && strstr(R.out, "but the model has f32"),
           "a tensor of the same elements in another shape is refused, naming both shapes");
}

/* ---- 8: limits: --threads past the CPUs, an address-space limit too small for BLAS ---- */

static void limit_as(void *arg) __attribute__((unused)); /* not under the sanitizers, below */
static void limit_as(void *arg) {
    struct rlimit r = {.rlim_cur = *(rlim_t *)arg, .rlim_max = *(rlim_t *)arg};
    setrlimit(RLIMIT_AS, &r);
}

static void test_limits(void) {
    char too_many[16];
    snprintf(too_many, sizeof too_many, "%d", tally__cpus_allowed() + 1);
    const char *threads[] = {"train", "-n", "1", "--threads", too_many, "--steps", "1", "--quiet", NULL};
    th_tool_run(threads, NULL, &R);
    expect(R.rc == 2 && strstr(R.out, "(the CPUs this process may use)"), "--threads past the CPUs");
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    printf("test_hostile: ulimit -v not tried: the sanitizers reserve terabytes of address space\n");
#else
    /* Enough for the data and the model, not for what OpenBLAS's threads will take: it used to retry its
     * malloc for ever. Each limit must end in an error or a finished run, never in a wait. */
    static const rlim_t limits[] = {300u << 20, 450u << 20, 520u << 20, 600u << 20};
    for (size_t i = 0; i < sizeof limits / sizeof *limits; i++) {
        if (!(i == 0 || i == 3 ? th_quick() : th_long())) continue; /* quick: the lowest and the highest */
        const char *args[] = {"train", "-n", "1", "--threads", "1", "--steps", "3", "--quiet", NULL};
        th_tool_opts o = {.wall_s = 30, .child = limit_as, .arg = (void *)&limits[i]};
        th_tool_run(args, &o, &R);
        expect(!R.timed_out &&
                   (R.rc == 0 || (R.rc == 1 && (strstr(R.out, "out of memory") || strstr(R.out, "address space")))),
               "a run under ulimit -v ends, or says it is out of memory");
    }
#endif
}

/* ---- 9: a small .gz that declares gigabytes is judged by its header before it is inflated ---- */

static int write_bomb(const char *path, uint32_t n) {
    gzFile g = gzopen(path, "wb1");
    if (!g) return -1;
    unsigned char hdr[16] = {0, 0, 8, 3};
    uint32_t dims[3] = {n, 28, 28};
    for (int i = 0; i < 3; i++)
        for (int b = 0; b < 4; b++) hdr[4 + 4 * i + b] = (unsigned char)(dims[i] >> (24 - 8 * b));
    gzwrite(g, hdr, sizeof hdr);
    static unsigned char zeros[1 << 20];
    for (uint64_t left = (uint64_t)n * 784; left;) {
        unsigned k = left < sizeof zeros ? (unsigned)left : (unsigned)sizeof zeros;
        if (gzwrite(g, zeros, k) != (int)k) break;
        left -= k;
    }
    return gzclose(g) == Z_OK ? 0 : -1;
}

static void test_gzip_bomb(void) {
    mkdir(th_at("bomb"), 0700);
    const uint32_t n = 400000; /* 314 MB of images in a few hundred KB */
    TH_CHECK(write_bomb(th_at("bomb/train-images-idx3-ubyte.gz"), n) == 0, "writing the bomb");
    gzFile g = gzopen(th_at("bomb/train-labels-idx1-ubyte.gz"), "wb");
    unsigned char lhdr[8] = {0, 0, 8, 1, 0, 0, 0x03, 0xe8}; /* 1000 labels */
    static unsigned char labels[1000];
    gzwrite(g, lhdr, sizeof lhdr);
    gzwrite(g, labels, sizeof labels);
    gzclose(g);
    struct stat st;
    stat(th_at("bomb/train-images-idx3-ubyte.gz"), &st);
    const char *args[] = {"train", "-n", "1", "--data", th_at("bomb"), "--steps", "1", "--quiet", NULL};
    th_tool_opts o = {.wall_s = 60};
    th_tool_run(args, &o, &R);
    expect(R.rc == 1 && strstr(R.out, "1000 labels but") && strstr(R.out, "400000 images"),
           "images and labels that disagree are refused from their headers");
    TH_CHECK(R.maxrss_kb < 150 * 1024, "%lld bytes of gzip declaring %u MB: %ld KB resident before the refusal",
             (long long)st.st_size, n * 784u >> 20, R.maxrss_kb);
}

int main(void) {
    if (!th_scratch_make("tally-hostile", 0700)) return 1;
    if (th_quick()) {
        test_planted_links();
        test_calibrate_tmpdir();
        test_calibrate_stdin_closed();
        test_fifos();
        test_shape();
        test_full_and_readonly();
    }
    test_limits();
    if (th_quick()) test_gzip_bomb();
    if (th_long()) test_config_changed(); /* a calibration of its own: test_sim's quick case reads once too */
    th_scratch_remove();
    return th_verdict("test_hostile");
}
