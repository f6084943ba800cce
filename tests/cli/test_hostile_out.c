/* test_hostile_out.c - what a user names as an output (--json, --plot, --trace, --svg, sim --save) or as sim's
 * --config, end to end through the CLI: devices, FIFOs, /dev/stdout, links, directories, /proc; none replaced. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <tally.h>
#include <unistd.h>

#include "harness.h"
#include "scratch_dir.h"
#include "tool_runner.h"
#include "core/file.h"
#include "sim/sim.h"

static th_tool R;

/* The file's first bytes (up to cap - 1), "" when it cannot be read. */
static const char *read_head(const char *path) {
    static char buf[4096];
    buf[0] = '\0';
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) return buf;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    buf[n > 0 ? n : 0] = '\0';
    close(fd);
    return buf;
}

#define expect(cond, what) th_tool_expect(&R, (cond), (what))

static void run(const char *const *args, double wall_s) {
    th_tool_opts o = {.wall_s = wall_s};
    th_tool_run(args, &o, &R);
}

/* Each command's output flag at `path`: the argument vectors of the cheapest run of each. */
enum { OUT_JSON, OUT_PLOT, OUT_TRACE, BENCH_SVG, BENCH_TRACE, PLAN_SVG, SIM_SVG, SIM_SAVE, NOUTS };
static const char *const out_names[NOUTS] = {"train --json",  "train --plot", "train --trace", "bench --svg",
                                             "bench --trace", "plan --svg",   "sim --svg",     "sim --save"};

/* Where every command has shown it writes through the one writer (devices, FIFOs, others' links), the
 * other rules are tried on a few: the train run, the trace, and the two cheapest. */
static const int some_outs[] = {OUT_JSON, BENCH_TRACE, PLAN_SVG, SIM_SAVE};
#define NSOME ((int)(sizeof some_outs / sizeof *some_outs))

/* A check's description: the output's name, then what of it. */
static const char *named(int out, const char *what) {
    static char buf[160];
    snprintf(buf, sizeof buf, "%s %s", out_names[out], what);
    return buf;
}

static void run_out(int which, const char *path) {
    const char *train[] = {"train",   "-n",     "1",  "--data", "synthetic:256", "--steps", "1",
                           "--quiet", "--json", path, NULL};
    const char *bench[] = {"bench",   "allreduce", "-n",       "2", "-b",    "1K", "-e", "1K",
                           "--iters", "2",         "--warmup", "1", "--svg", path, NULL};
    const char *plan[] = {"plan", "--params", "1M", "--workers", "4", "--svg", path, NULL};
    const char *sim[] = {"sim", "--size", "1K", "--svg", path, NULL};
    switch (which) {
    case OUT_JSON: break;
    case OUT_PLOT: train[8] = "--plot"; break;
    case OUT_TRACE: train[8] = "--trace"; break;
    case BENCH_SVG: break;
    case BENCH_TRACE: bench[12] = "--trace"; break;
    case SIM_SAVE: sim[3] = "--save"; break;
    default: break;
    }
    const char *const *args = which <= OUT_TRACE     ? train
                              : which <= BENCH_TRACE ? bench
                              : which == PLAN_SVG    ? plan
                                                     : sim;
    run(args, 60);
}

static int is_char_dev(const char *path, unsigned maj, unsigned min) {
    struct stat st;
    return lstat(path, &st) == 0 && S_ISCHR(st.st_mode) && major(st.st_rdev) == maj && minor(st.st_rdev) == min;
}

static int is_fifo(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0 && S_ISFIFO(st.st_mode);
}

static int is_link_to(const char *path, const char *to) {
    char t[320];
    ssize_t n = readlink(path, t, sizeof t - 1);
    if (n < 0) return 0;
    t[n] = '\0';
    return !strcmp(t, to);
}

/* ---- 1: a null and a full device (our own nodes: /dev/null itself is never risked) ---- */

static void test_devices(void) {
    if (mknod(th_at("null"), S_IFCHR | 0666, makedev(1, 3)) != 0 ||
        mknod(th_at("full"), S_IFCHR | 0666, makedev(1, 7))) {
        printf("test_hostile_out: device nodes not tried: mknod needs root (%s)\n", strerror(errno));
        return;
    }
    for (int i = 0; i < NOUTS; i++) {
        run_out(i, th_at("null"));
        expect(R.rc == 0 && !R.timed_out, named(i, "to a null device is written in place"));
        TH_CHECK(is_char_dev(th_at("null"), 1, 3), "%s replaced the null device", out_names[i]);
        run_out(i, th_at("full"));
        expect(R.rc != 0 && !R.timed_out && strstr(R.out, "No space left on device") && strstr(R.out, th_at("full")),
               named(i, "to a full device fails with ENOSPC's text"));
        TH_CHECK(is_char_dev(th_at("full"), 1, 7), "%s replaced the full device", out_names[i]);
    }
}

/* ---- 2: a FIFO: refused at once with no reader, written in place with one ---- */

static void test_fifo(void) {
    TH_CHECK(mkfifo(th_at("fifo"), 0600) == 0, "mkfifo: %s", strerror(errno));
    for (int i = 0; i < NOUTS; i++) {
        run_out(i, th_at("fifo"));
        expect(R.rc != 0 && !R.timed_out && R.secs < 20 && strstr(R.out, "FIFO no one is reading"),
               named(i, "to a FIFO no one reads is refused at once"));
        TH_CHECK(is_fifo(th_at("fifo")), "%s replaced the FIFO", out_names[i]);
    }
    /* A reader (ours, opened without waiting for a writer): what tally writes arrives through the FIFO. */
    int rfd = open(th_at("fifo"), O_RDONLY | O_NONBLOCK);
    TH_CHECK(rfd >= 0, "open the FIFO to read: %s", strerror(errno));
    const int small[] = {SIM_SAVE, OUT_JSON}; /* outputs within the pipe's 64 KiB, so nothing waits for us */
    for (int k = 0; k < 2 && rfd >= 0; k++) {
        run_out(small[k], th_at("fifo"));
        char buf[8192];
        ssize_t n = read(rfd, buf, sizeof buf - 1);
        buf[n > 0 ? n : 0] = '\0';
        char what[96];
        snprintf(what, sizeof what, "%s to a FIFO with a reader", out_names[small[k]]);
        expect(R.rc == 0, what);
        TH_CHECK(strstr(buf, small[k] == SIM_SAVE ? "# tally sim's cluster\nhosts = " : "\"model\": \"mlp\""),
                 "%s: the reader got %zd bytes: %.200s", what, n, buf);
        TH_CHECK(is_fifo(th_at("fifo")), "%s replaced the FIFO", what);
    }
    if (rfd >= 0) close(rfd);
}

/* ---- 3: /dev/stdout and the descriptors' names: the descriptor itself, never reopened ---- */

static void stdout_to(void *arg) {
    int fd = open((const char *)arg, O_WRONLY | O_APPEND);
    if (fd >= 0) dup2(fd, 1);
}

static void test_stdout(void) {
    const char *names[] = {"/dev/stdout", "/proc/self/fd/1", "/dev/fd/1", "/dev//fd/1", "/proc/self/task/../fd/1"};
    for (int i = 0; i < 5; i++) {
        const char *args[] = {"sim", "--size", "1K", "--save", names[i], NULL};
        run(args, 30);
        char what[96];
        snprintf(what, sizeof what, "sim --save %s arrives on stdout", names[i]);
        expect(R.rc == 0 && strstr(R.out, "# tally sim's cluster\nhosts = 1\n"), what);
    }
    /* `--json /dev/stdout >> f`: after what f held, not over it, and f stays a regular file */
    th_put_file(th_at("stdout.txt"), "kept\n");
    const char *args[] = {"sim", "--size", "1K", "--save", "/dev/stdout", NULL};
    th_tool_opts o = {.wall_s = 30, .child = stdout_to, .arg = (void *)th_at("stdout.txt")};
    th_tool_run(args, &o, &R);
    const char *got = read_head(th_at("stdout.txt"));
    expect(R.rc == 0 && !strncmp(got, "kept\n", 5) && strstr(got, "# tally sim's cluster\nhosts = 1\n"),
           "--save /dev/stdout with stdout a file appends to it");
    const char *err[] = {"sim", "--size", "1K", "--save", "/dev/stderr", NULL};
    run(err, 30);
    expect(R.rc == 0 && strstr(R.out, "# tally sim's cluster"), "--save /dev/stderr");
    const char *closed[] = {"sim", "--size", "1K", "--save", "/dev/fd/9", NULL};
    run(closed, 30);
    expect(R.rc == 1 && strstr(R.out, "/dev/fd/9") && strstr(R.out, "descriptor 9, which is not open"),
           "a descriptor not open is refused, named");
}

/* ---- 4: links: never replaced, followed only when they and the file they lead to are this user's ---- */

static void test_links(void) {
    /* another user's link (in a shared directory, say) to this user's file: refused, the file untouched */
    th_put_file(th_at("mine"), "mine\n");
    TH_CHECK(symlink(th_at("mine"), th_at("their-link")) == 0, "symlink: %s", strerror(errno));
    /* as root (bypassing every permission check, so ownership is all that stops it), uid 65534 is the other */
    int other = geteuid() == 0 && lchown(th_at("their-link"), 65534, 65534) == 0;
    if (!other) printf("test_hostile_out: links of another user not tried: giving a file away needs root\n");
    for (int i = 0; other && i < NOUTS; i++) {
        run_out(i, th_at("their-link"));
        expect(R.rc != 0 && strstr(R.out, "belongs to uid 65534") && strstr(R.out, th_at("mine")),
               named(i, "through another user's link is refused"));
        TH_CHECK(!strcmp(read_head(th_at("mine")), "mine\n"), "%s wrote through another user's link", out_names[i]);
        TH_CHECK(is_link_to(th_at("their-link"), th_at("mine")), "%s replaced another user's link", out_names[i]);
    }
    /* another user's link as a directory on the way: refused, nothing made where it leads */
    TH_CHECK(mkdir(th_at("real-dir"), 0755) == 0, "mkdir: %s", strerror(errno));
    TH_CHECK(symlink(th_at("real-dir"), th_at("their-dir")) == 0, "symlink: %s", strerror(errno));
    if (other && lchown(th_at("their-dir"), 65534, 65534) == 0) {
        const char *args[] = {"sim", "--size", "1K", "--save", th_at("their-dir/out.json"), NULL};
        run(args, 30);
        expect(R.rc == 1 && strstr(R.out, "is a symbolic link of uid 65534's"),
               "another user's link on the way to an output is refused");
        TH_CHECK(access(th_at("real-dir/out.json"), F_OK) != 0, "an output was made through another user's link");
        /* ... also reached through a link of this user's, whose target the walk follows name by name */
        TH_CHECK(symlink(th_at("their-dir"), th_at("my-dir")) == 0, "symlink: %s", strerror(errno));
        const char *nested[] = {"sim", "--size", "1K", "--save", th_at("my-dir/out.json"), NULL};
        run(nested, 30);
        expect(R.rc == 1 && strstr(R.out, "is a symbolic link of uid 65534's"),
               "another user's link reached through this user's link is refused");
        TH_CHECK(access(th_at("real-dir/out.json"), F_OK) != 0, "an output was made through a link in a link");
    }
    /* ... and on the way to a device, which is written in place */
    TH_CHECK(symlink(th_at("."), th_at("their-devs")) == 0, "symlink: %s", strerror(errno));
    if (other && is_char_dev(th_at("full"), 1, 7) && lchown(th_at("their-devs"), 65534, 65534) == 0) {
        const char *args[] = {"sim", "--size", "1K", "--save", th_at("their-devs/full"), NULL};
        run(args, 30);
        expect(R.rc == 1 && strstr(R.out, "is a symbolic link of uid 65534's"),
               "another user's link on the way to a device is refused");
    }
    /* this user's link to another user's file: refused, the file untouched */
    th_put_file(th_at("theirs"), "theirs\n");
    TH_CHECK(symlink(th_at("theirs"), th_at("to-theirs")) == 0, "symlink: %s", strerror(errno));
    if (other && chown(th_at("theirs"), 65534, 65534) == 0) {
        const char *args[] = {"sim", "--size", "1K", "--save", th_at("to-theirs"), NULL};
        run(args, 30);
        expect(R.rc == 1 && strstr(R.out, "a file of uid 65534's"), "a link to another user's file is refused");
        TH_CHECK(!strcmp(read_head(th_at("theirs")), "theirs\n"), "another user's file was replaced through a link");
        TH_CHECK(is_link_to(th_at("to-theirs"), th_at("theirs")), "the link was replaced");
    }
    /* this user's link to this user's file: the file is replaced whole, the link stays */
    TH_CHECK(symlink("mine", th_at("my-link")) == 0, "symlink: %s", strerror(errno));
    for (int k = 0; k < NSOME; k++) {
        int i = some_outs[k];
        th_put_file(th_at("mine"), "mine\n");
        run_out(i, th_at("my-link"));
        expect(R.rc == 0 && strcmp(read_head(th_at("mine")), "mine\n") && is_link_to(th_at("my-link"), "mine"),
               named(i, "through this user's link replaces its file"));
    }
    /* a dangling link: refused, nothing created through it */
    TH_CHECK(symlink(th_at("nothing"), th_at("dangling")) == 0, "symlink: %s", strerror(errno));
    for (int k = 0; k < NSOME; k++) {
        int i = some_outs[k];
        run_out(i, th_at("dangling"));
        expect(R.rc != 0 && strstr(R.out, "which does not exist"), named(i, "through a dangling link is refused"));
        TH_CHECK(access(th_at("nothing"), F_OK) != 0, "%s created a file through a dangling link", out_names[i]);
    }
    /* a loop of links */
    symlink("loop-b", th_at("loop-a"));
    symlink("loop-a", th_at("loop-b"));
    const char *loop[] = {"sim", "--size", "1K", "--save", th_at("loop-a"), NULL};
    run(loop, 30);
    expect(R.rc == 1 && strstr(R.out, "symbolic links in a row"), "a loop of links is refused");
}

/* ---- 5: a directory, /proc, a missing directory: refused with the real reason ---- */

static void test_refused(void) {
    mkdir(th_at("dir"), 0700);
    for (int k = 0; k < NSOME; k++) {
        int i = some_outs[k];
        run_out(i, th_at("dir"));
        expect(R.rc != 0 && strstr(R.out, "is a directory"), named(i, "to a directory is refused"));
    }
    const char *proc[] = {"sim", "--size", "1K", "--svg", "/proc/version", NULL};
    run(proc, 30);
    expect(R.rc == 1 && strstr(R.out, "/proc/version") && strstr(R.out, "procfs") &&
               !strstr(R.out, "a directory on the path does not exist"),
           "--svg /proc/version names the real reason");
    const char *missing[] = {"sim", "--size", "1K", "--save", th_at("no-dir/t"), NULL};
    run(missing, 30);
    expect(R.rc == 1 && strstr(R.out, "no-dir") && strstr(R.out, "No such file or directory"),
           "sim --save into a missing directory says why");
    const char *save_dir[] = {"sim", "--size", "1K", "--save", th_at("dir"), NULL};
    run(save_dir, 30);
    expect(R.rc == 1 && strstr(R.out, "--save") && strstr(R.out, "is a directory"),
           "sim --save to a directory says why");
    /* a regular file and a new name: replaced whole, as ever */
    th_put_file(th_at("plain"), "old\n");
    const char *plain[] = {"sim", "--size", "1K", "--save", th_at("plain"), NULL};
    run(plain, 30);
    expect(R.rc == 0 && !strncmp(read_head(th_at("plain")), "# tally sim's cluster", 21), "sim --save over a file");
}

/* ---- 6: sim --config: a regular text file only, its errors said once ---- */

static void test_config(void) {
    const char *cases[][2] = {
        {"fifo", "is a FIFO, not a regular file"},
        {"/dev/zero", "is a character device, not a regular file"},
        {"dir", "is a directory, not a regular file"},
    };
    if (access(th_at("fifo"), F_OK) != 0) mkfifo(th_at("fifo"), 0600);
    mkdir(th_at("dir"), 0700);
    for (int i = 0; i < 3; i++) {
        const char *path = cases[i][0][0] == '/' ? cases[i][0] : th_at(cases[i][0]);
        const char *args[] = {"sim", "--config", path, "--size", "1K", NULL};
        run(args, 30);
        char what[96];
        snprintf(what, sizeof what, "--config %s is refused at once", cases[i][0]);
        expect(R.rc == 2 && R.secs < 10 && strstr(R.out, path) && strstr(R.out, cases[i][1]), what);
    }
    /* NUL bytes and control characters: refused, the line named */
    static const char nul[] = "hosts = 2\n\0ranks-per-host = 2\n";
    FILE *f = fopen(th_at("nul.conf"), "w");
    if (f) fwrite(nul, 1, sizeof nul - 1, f), fclose(f);
    const char *nul_args[] = {"sim", "--config", th_at("nul.conf"), "--size", "1K", NULL};
    run(nul_args, 30);
    expect(R.rc == 2 && strstr(R.out, "nul.conf line 2: byte 1 is a NUL"), "a NUL byte in a config is refused");
    th_put_file(th_at("ctl.conf"), "hosts = 2\x1b[0m\n");
    const char *ctl_args[] = {"sim", "--config", th_at("ctl.conf"), "--size", "1K", NULL};
    run(ctl_args, 30);
    expect(R.rc == 2 && strstr(R.out, "ctl.conf line 1: byte 10 is a control character (0x1b)"),
           "a control character in a config is refused");
    /* a value a setting refuses: the message once, not formatted from itself */
    const char *bad[][2] = {{"hosts = 1e9\n", "--hosts '1e9' is not a whole number"},
                            {"hosts = 2\nshm-latency = nan\n", "--shm-latency 'nan'"},
                            {"hosts = 2\nshm-latency = -5us\n", "--shm-latency '-5us'"}};
    for (int i = 0; i < 3; i++) {
        th_put_file(th_at("dup.conf"), bad[i][0]);
        const char *args[] = {"sim", "--config", th_at("dup.conf"), "--size", "1K", NULL};
        run(args, 30);
        char want[160];
        snprintf(want, sizeof want, "dup.conf line %d: %s", i ? 2 : 1, bad[i][1]);
        const char *first = strstr(R.out, "dup.conf line");
        expect(R.rc == 2 && strstr(R.out, want) && first && !strstr(first + 1, "dup.conf line"),
               "a refused value is named once, with its line");
    }
}

/* The reader itself: the open's own error, and a file read whole within what its size said at the open
 * (one that says less than it holds, a kernel file or one growing as it is read, is refused, not read on). */
static void test_config_read(void) {
    tally__sim_cluster c;
    tally__sim_cluster_default(&c);
    int rc = tally__sim_cluster_read(&c, th_at("no-such.conf"));
    TH_CHECK(rc == TALLY_E_SYSTEM && strstr(tally_last_error(), "No such file or directory"),
             "a missing config: rc %d, want the open's TALLY_E_SYSTEM: %s", rc, tally_last_error());
    rc = tally__sim_cluster_read(&c, "/proc/self/status"); /* size 0 at the open, a page of text to read */
    TH_CHECK(rc == TALLY_E_INVALID && strstr(tally_last_error(), "more than the 0 bytes"),
             "a file holding more than its size: rc %d: %s", rc, tally_last_error());
    static char line[(1 << 20) + 64]; /* one line past the bound: refused by its size before any of it is read */
    memset(line, 'x', sizeof line - 1);
    th_put_file(th_at("huge.conf"), line);
    rc = tally__sim_cluster_read(&c, th_at("huge.conf"));
    TH_CHECK(rc == TALLY_E_INVALID && strstr(tally_last_error(), "more than 1048576 bytes"), "a 1 MiB line: rc %d: %s",
             rc, tally_last_error());
    th_put_file(th_at("ok.conf"), "hosts = 3\n# a comment\nranks-per-host = 2 # two a host\r\n\nnic = 10Gbps");
    rc = tally__sim_cluster_read(&c, th_at("ok.conf"));
    TH_CHECK(rc == 0 && c.hosts == 3 && c.per_host == 2, "a config with CR LF and no last newline: rc %d: %s", rc,
             tally_last_error());
}

/* ---- 7: the writer itself: the errno of a write that failed early, a zeroed writer dropped ---- */

/* A pipe whose reader left: EPIPE for the commit to report, never a SIGPIPE that kills the process. */
static void test_reader_gone(void) {
    int p[2];
    TH_CHECK(pipe(p) == 0, "pipe: %s", strerror(errno));
    close(p[0]);
    char name[32];
    snprintf(name, sizeof name, "/dev/fd/%d", p[1]);
    tally__file_out o;
    TH_CHECK(tally__file_out_open(&o, name) == 0, "open a pipe by its descriptor: %s", tally_last_error());
    if (o.f) {
        fputs("{}\n", o.f);
        TH_CHECK(tally__file_out_commit(&o) != 0 && strstr(tally_last_error(), "reader has gone"),
                 "a pipe whose reader left: %s", tally_last_error());
    }
    sigset_t pending;
    sigpending(&pending);
    TH_CHECK(!sigismember(&pending, SIGPIPE), "a SIGPIPE was left pending");
    close(p[1]);
}

/* Writes "{}\n" to path; 0, or the commit's (or the open's) code with tally_last_error() saying why. */
static int write_to(const char *path) {
    tally__file_out o;
    int rc = tally__file_out_open(&o, path);
    if (rc) return rc;
    fputs("{}\n", o.f);
    return tally__file_out_commit(&o);
}

/* A message about a descriptor says what it is in words, never its link's text ("pipe:[1234]"). */
static int in_words(const char *kind) {
    const char *e = tally_last_error();
    return strstr(e, kind) && !strstr(e, ":[");
}

/* Descriptors however they are named: this process's own (/dev//fd/N, /proc/PID/fd/N) are written as
 * /dev/fd/N is; another process's pipe, socket or deleted file is refused, said in words. */
static void test_descriptors(void) {
    int p[2], sv[2];
    TH_CHECK(pipe(p) == 0 && socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "pipe: %s", strerror(errno));
    char name[64];
    const char *own[] = {"/dev//fd/%d", "/proc/%d/fd/%d", "/proc/self/task/%d/fd/%d"};
    for (int i = 0; i < 3; i++) {
        if (i == 0)
            snprintf(name, sizeof name, own[i], p[1]);
        else
            snprintf(name, sizeof name, own[i], i == 1 ? (int)getpid() : (int)gettid(), p[1]);
        int rc = write_to(name);
        char got[8] = {0};
        ssize_t k = rc ? 0 : read(p[0], got, sizeof got - 1);
        TH_CHECK(rc == 0 && k == 3 && !strcmp(got, "{}\n"), "%s, this process's pipe: rc %d, read %zd: %s", name, rc, k,
                 tally_last_error());
    }
    snprintf(name, sizeof name, "/dev/fd/%d", p[0]);
    TH_CHECK(write_to(name) != 0 && in_words("a pipe") && strstr(tally_last_error(), "reading only"),
             "the read end of a pipe: %s", tally_last_error());
    close(sv[1]);
    snprintf(name, sizeof name, "/dev/fd/%d", sv[0]);
    TH_CHECK(write_to(name) != 0 && in_words("descriptor ") && in_words("a socket"), "a socket whose peer left: %s",
             tally_last_error());
    int del = open(th_at("deleted"), O_WRONLY | O_CREAT | O_EXCL, 0600);
    unlink(th_at("deleted"));
    pid_t kid = fork(); /* holds the same descriptors, as another process of this user's */
    if (kid == 0) {
        pause();
        _exit(0);
    }
    const int theirs[] = {p[1], sv[0], del};
    const char *kinds[] = {"a pipe", "a socket", "a deleted file"};
    for (int i = 0; i < 3 && kid > 0; i++) {
        snprintf(name, sizeof name, "/proc/%d/fd/%d", (int)kid, theirs[i]);
        int rc = write_to(name);
        char want[64];
        snprintf(want, sizeof want, "descriptor %d of process %d", theirs[i], (int)kid);
        TH_CHECK(rc != 0 && in_words(kinds[i]) && strstr(tally_last_error(), want), "another process's %s: rc %d: %s",
                 kinds[i] + 2, rc, tally_last_error());
    }
    if (kid > 0) {
        kill(kid, SIGKILL);
        waitpid(kid, NULL, 0);
    }
    close(del);
    close(sv[0]);
    close(p[0]);
    close(p[1]);
}

/* Replacing a file: another writer's temporary file of the old naming (".NAME.tmp.<pid>", a pid that
 * repeats across containers sharing the directory) is left alone; the replaced file keeps its mode; a
 * new one has 0666 less the umask; nothing of ours is left behind. */
static void test_replace(void) {
    char theirs[64];
    snprintf(theirs, sizeof theirs, ".kept.json.tmp.%d", (int)getpid());
    th_put_file(th_at(theirs), "another writer's\n");
    th_put_file(th_at("kept.json"), "old\n");
    TH_CHECK(chmod(th_at("kept.json"), 0600) == 0, "chmod: %s", strerror(errno));
    tally__file_out o;
    TH_CHECK(tally__file_out_open(&o, th_at("kept.json")) == 0, "open: %s", tally_last_error());
    if (o.f) {
        fputs("{}\n", o.f);
        TH_CHECK(tally__file_out_commit(&o) == 0, "commit: %s", tally_last_error());
    }
    struct stat st;
    TH_CHECK(!strcmp(read_head(th_at(theirs)), "another writer's\n"), "another writer's temporary file was touched");
    TH_CHECK(!strcmp(read_head(th_at("kept.json")), "{}\n"), "the file was not replaced");
    TH_CHECK(stat(th_at("kept.json"), &st) == 0 && (st.st_mode & 07777) == 0600, "a replaced 0600 file came back as %o",
             (unsigned)(st.st_mode & 07777));
    mode_t old = umask(022);
    TH_CHECK(tally__file_out_open(&o, th_at("fresh.json")) == 0, "open a new name: %s", tally_last_error());
    if (o.f) TH_CHECK(tally__file_out_commit(&o) == 0, "commit a new name: %s", tally_last_error());
    umask(old);
    TH_CHECK(stat(th_at("fresh.json"), &st) == 0 && (st.st_mode & 07777) == 0644,
             "a new output under umask 022 has mode %o, not 644", (unsigned)(st.st_mode & 07777));
    DIR *d = opendir(th_at("."));
    for (struct dirent *e; d && (e = readdir(d));)
        TH_CHECK(!strncmp(e->d_name, theirs, strlen(theirs)) || !strstr(e->d_name, ".tmp."),
                 "a temporary file was left behind: %s", e->d_name);
    if (d) closedir(d);
}

/* A temporary file swapped for a link while it was written (its directory writable by others): the
 * replaced file's mode goes on our file through its descriptor, never through the name onto the link's
 * target, and a name that is no longer ours is neither renamed nor removed. */
static void test_swapped_temp(void) {
    th_put_file(th_at("secret"), "secret\n");
    TH_CHECK(chmod(th_at("secret"), 0600) == 0, "chmod: %s", strerror(errno));
    th_put_file(th_at("swapped.json"), "old\n");
    tally__file_out o;
    TH_CHECK(tally__file_out_open(&o, th_at("swapped.json")) == 0, "open: %s", tally_last_error());
    if (!o.f) return;
    fputs("{}\n", o.f);
    char tmp[512], moved[600];
    snprintf(tmp, sizeof tmp, "%s", th_at(o.tmp));
    snprintf(moved, sizeof moved, "%s.moved", tmp);
    TH_CHECK(rename(tmp, moved) == 0 && symlink(th_at("secret"), tmp) == 0, "swap: %s", strerror(errno));
    th_put_file(th_at("swapped.json"), "planted\n");
    TH_CHECK(chmod(th_at("swapped.json"), 06777) == 0, "chmod: %s", strerror(errno));
    TH_CHECK(tally__file_out_commit(&o) != 0 && strstr(tally_last_error(), "moved or replaced"),
             "a swapped temporary file is not renamed: %s", tally_last_error());
    struct stat st;
    TH_CHECK(stat(th_at("secret"), &st) == 0 && (st.st_mode & 07777) == 0600, "the link's target got mode %o",
             (unsigned)(st.st_mode & 07777));
    TH_CHECK(!strcmp(read_head(th_at("secret")), "secret\n"), "the link's target was written");
    TH_CHECK(is_link_to(tmp, th_at("secret")), "the swapped-in link was removed or renamed");
    TH_CHECK(lstat(th_at("swapped.json"), &st) == 0 && S_ISREG(st.st_mode), "the output became a link");
    TH_CHECK(stat(moved, &st) == 0 && !(st.st_mode & 07000), "set-id bits were carried over: %o",
             (unsigned)(st.st_mode & 07777));
    unlink(tmp);
    unlink(moved);
}

static void test_writer(void) {
    test_swapped_temp();
    test_reader_gone();
    test_descriptors();
    test_replace();
    if (!is_char_dev(th_at("full"), 1, 7)) return; /* made by test_devices, as root */
    tally__file_out o;
    TH_CHECK(tally__file_out_open(&o, th_at("full")) == 0, "open the full device: %s", tally_last_error());
    if (o.f) {
        static char big[256 << 10]; /* past stdio's buffer: the first write fails long before the commit */
        memset(big, 'x', sizeof big);
        fwrite(big, 1, sizeof big, o.f);
        errno = 0;
        TH_CHECK(tally__file_out_commit(&o) != 0 && strstr(tally_last_error(), "No space left on device"),
                 "an early write error keeps its errno: %s", tally_last_error());
    }
    int had0 = fcntl(0, F_GETFD) >= 0;
    tally__file_out z = {0}; /* never opened: dropping it must not close descriptor 0 */
    tally__file_out_abort(&z);
    TH_CHECK(!had0 || fcntl(0, F_GETFD) >= 0, "abort of a zeroed writer closed descriptor 0");
    TH_CHECK(tally__file_out_open(&o, "") != 0 && strstr(tally_last_error(), "empty"), "an empty name");
}

int main(void) {
    if (!th_scratch_make("tally-hostile-out", 0755)) return 1; /* uid 65534's files in it, as in a shared directory */
    if (th_quick()) {
        test_devices();
        test_fifo();
        test_stdout();
        test_links();
        test_refused();
        test_config();
        test_config_read();
        test_writer();
    }
    th_scratch_remove();
    return th_verdict("test_hostile_out");
}
