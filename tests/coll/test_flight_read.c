/* test_flight_read.c - `tally flight`'s reader against records anyone could have written: every field
 * out of range, overflowing, with junk after it or repeated, lines and files past their bounds, a NUL,
 * too many entries, and a directory of more files than it reads; each is set aside, named with why. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <tally.h>
#include <unistd.h>

#include "boot/boot.h"
#include "coll/coll.h"
#include "coll/flight.h"
#include "core/sig.h"
#include "harness.h"

#define X40 "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"

static char dir[256];

/* A record every check takes: one entry, rank 0 of 2, of job h-1-00000001. */
static const char good[] = "tally-flight 1\n"
                           "job h-1-00000001\n"
                           "label world\n"
                           "rank 0\n"
                           "world_rank 0\n"
                           "size 2\n"
                           "host h\n"
                           "pid 1\n"
                           "transport shm\n"
                           "reason TIMEOUT\n"
                           "culprit -1\n"
                           "dumped_ns 5\n"
                           "message m\n"
                           "entries 1\n"
                           "e 1 allreduce 8 f32 sum -1 ring done 0 -1 -1 1 2\n";

static void fresh_dir(void) {
    th_rm_dir(dir);
    mkdir(dir, 0700);
}

/* text, with its first `find` replaced by `put`. */
static void edit(const char *text, const char *find, const char *put, char *out, size_t n) {
    const char *at = strstr(text, find);
    if (!at) {
        snprintf(out, n, "%s", text);
        TH_CHECK(0, "the probe's \"%s\" is not in the record", find);
        return;
    }
    snprintf(out, n, "%.*s%s%s", (int)(at - text), text, put, at + strlen(find));
}

static void edited(const char *find, const char *put, char *out, size_t n) { edit(good, find, put, out, n); }

/* Loads dir, which holds the file `name`: it must be set aside, its reason holding each of want[]. */
static void set_aside(const char *what, const char *name, const char *const *want) {
    tally__flight_set s;
    int rc = tally__flight_load(dir, &s);
    TH_CHECK(rc == 0, "%s: the load failed: %s", what, tally_last_error());
    if (rc) return;
    const tally__flight_skip *k = NULL;
    for (size_t i = 0; i < s.n_skip; i++)
        if (!strcmp(s.skip[i].file, name)) k = &s.skip[i];
    TH_CHECK(s.n == 0 && k, "%s: the record was read (%zu read, %zu set aside)", what, s.n, s.n_skip);
    for (int i = 0; k && want[i]; i++)
        TH_CHECK(strstr(k->why, want[i]) != NULL, "%s: the reason does not say \"%s\": %s", what, want[i], k->why);
    if (k) printf("  %s: %s\n", what, k->why);
    tally__flight_set_free(&s);
}

static void good_reads(void) {
    fresh_dir();
    th_write_file(th_path(dir, "rank0.world.flight"), good, strlen(good));
    tally__flight_set s;
    int rc = tally__flight_load(dir, &s);
    TH_CHECK(rc == 0 && s.n == 1 && s.n_skip == 0 && s.r[0].n == 1 && s.r[0].size == 2,
             "the good record does not read: rc %d, %zu read, %zu set aside: %s", rc, s.n, s.n_skip,
             s.n_skip ? s.skip[0].why : tally_last_error());
    if (!rc) tally__flight_set_free(&s);
}

/* Each field with a value no writer makes: set aside, naming the line and the field. */
static void bad_fields(void) {
    static const struct {
        const char *find, *put, *line, *word;
    } probe[] = {
        {"rank 0\n", "rank 99999999999999999999\n", "line 4", "rank"},
        {"rank 0\n", "rank 0x\n", "line 4", "rank"},
        {"rank 0\n", "rank  0\n", "line 4", "rank"},
        {"rank 0\n", "rank -1\n", "line 4", "rank"},
        {"world_rank 0\n", "world_rank -1\n", "line 5", "world_rank"},
        {"size 2\n", "size 2000000000\n", "line 6", "size"},
        {"size 2\n", "size 0\n", "line 6", "size"},
        {"pid 1\n", "pid -5\n", "line 8", "pid"},
        {"culprit -1\n", "culprit -7\n", "line 11", "culprit"},
        {"dumped_ns 5\n", "dumped_ns -1\n", "line 12", "dumped_ns"},
        {"dumped_ns 5\n", "dumped_ns 18446744073709551616\n", "line 12", "dumped_ns"},
        {"entries 1\n", "entries -1\n", "line 14", "entries"},
        {"entries 1\n", "entries 65537\n", "line 14", "entries"},
        {"entries 1\n", "entries 4294967297\n", "line 14", "entries"},
        {"rank 0\n", "rank 0\nrank 1\n", "line 5", "rank"},
        {"host h\n", "hosth\n", "line 7", "hosth"},
        {"label world\n", "label \n", "line 3", "label"},
        {"job h-1-00000001\n", "job h-1-00000001" X40 X40 X40 "\n", "line 2", "job"},
        {" 1 2\n", " 1 2 junk\n", "line 15", "entry"},
        {"e 1 ", "e -1 ", "line 15", "seq"},
        {"e 1 ", "e 0 ", "line 15", "seq"},
        {"e 1 ", "e 1x ", "line 15", "seq"},
        {"allreduce 8 ", "allreduce 99999999999999999999999 ", "line 15", "count"},
        {"sum -1 ring", "sum 2147483648 ring", "line 15", "root"},
        {"done 0 -1 -1", "done 5 -1 -1", "line 15", "rc"},
        {"done 0 -1 -1", "done 0 -2147483649 -1", "line 15", "peer"},
        {"done 0 -1 -1", "done 0 -1 99999999999", "line 15", "culprit"},
        {" 1 2\n", " 1 -2\n", "line 15", "end"},
        {"e 1 allreduce", "e 1  allreduce", "line 15", "entry"},
        {"allreduce 8 f32", "allreduce 8 f33", "line 15", "f33"},
        {"entries 1\ne", "entries 1\ne 1 allreduce 8 f32 sum -1 ring done 0 -1 -1 1 2\ne", "line 16", "entries 1"},
        {"entries 1\n", "", "line 14", "entries"},
        {"rank 0\n", "", "line 15", "no rank line"},
        {"size 2\n", "", "line 13", "no size line"},
        {"rank 0\n", "rank 2\n", "line 16", "rank 2 is not below its size 2"},
        {"message m\n", "message m\ne 1 allreduce 8 f32 sum -1 ring done 0 -1 -1 1 2\n", "line 14", "entries"},
    };
    for (size_t i = 0; i < sizeof probe / sizeof *probe; i++) {
        char text[4096], what[160];
        edited(probe[i].find, probe[i].put, text, sizeof text);
        snprintf(what, sizeof what, "'%.*s' for '%.*s'", (int)strcspn(probe[i].put, "\n"), probe[i].put,
                 (int)strcspn(probe[i].find, "\n"), probe[i].find);
        fresh_dir();
        th_write_file(th_path(dir, "rank0.world.flight"), text, strlen(text));
        const char *want[] = {probe[i].line, probe[i].word, NULL};
        set_aside(what, "rank0.world.flight", want);
    }
}

/* A line past the bound (the writer's lines are shorter), a NUL, a last line without its end, a file
 * larger than any record: set aside, saying so, and the large one is not read at all. */
static void bad_shape(void) {
    char text[8192];
    fresh_dir();
    char longmsg[TALLY__FLIGHT_LINE + 64];
    memset(longmsg, 'x', sizeof longmsg - 1);
    longmsg[sizeof longmsg - 1] = '\0';
    char put[sizeof longmsg + 16];
    snprintf(put, sizeof put, "message %s\n", longmsg);
    edited("message m\n", put, text, sizeof text);
    th_write_file(th_path(dir, "rank0.world.flight"), text, strlen(text));
    const char *too_long[] = {"line 13", "longer than", NULL};
    set_aside("a line too long", "rank0.world.flight", too_long);

    fresh_dir();
    size_t n = strlen(good);
    memcpy(text, good, n);
    text[strstr(good, "host h") - good + 5] = '\0';
    th_write_file(th_path(dir, "rank0.world.flight"), text, n);
    const char *nul[] = {"line 7", "NUL", NULL};
    set_aside("a NUL byte", "rank0.world.flight", nul);

    fresh_dir();
    th_write_file(th_path(dir, "rank0.world.flight"), good, n - 1);
    const char *cut[] = {"line 15", "cut short", NULL};
    set_aside("no end to the last line", "rank0.world.flight", cut);

    /* A sparse file past the bound: its size alone sets it aside. */
    fresh_dir();
    const char *big = th_path(dir, "rank0.world.flight");
    th_write_file(big, good, n);
    int fd = open(big, O_WRONLY);
    TH_CHECK(fd >= 0 && ftruncate(fd, (off_t)TALLY__FLIGHT_FILE_MAX + 1) == 0, "ftruncate: %s", strerror(errno));
    if (fd >= 0) close(fd);
    const char *huge[] = {"bytes", "larger than", NULL};
    set_aside("a file larger than a record can be", "rank0.world.flight", huge);

    /* No header, and a header of some other program. */
    fresh_dir();
    th_write_file(th_path(dir, "rank0.world.flight"), "junk\n", 5);
    const char *junk[] = {"line 1", NULL};
    set_aside("no header", "rank0.world.flight", junk);
}

/* The longest of names(k) for k in lo..hi, and its k. */
static int longest(int lo, int hi, const char *(*names)(int)) {
    int best = lo;
    for (int k = lo; k <= hi; k++)
        if (strlen(names(k)) > strlen(names(best))) best = k;
    return best;
}
static const char *coll_name(int k) { return tally__coll_name(k); }
static const char *dtype_name(int k) { return tally_dtype_name((tally_dtype)k); }
static const char *op_name(int k) { return tally_op_name((tally_op)k); }
static const char *algo_name(int k) { return tally__algo_name(k == tally__algo_count() + 1 ? TALLY__ALGO_HIER : k); }

/* What the writer writes, at the largest of every field (the longest label a split's split may have,
 * host, job, collective, dtype, op, algorithm and reason, every number at its largest) and with a
 * message longer than a line may be, reads back: the writer keeps within the bounds the reader holds
 * it to. */
static void writer_within_bounds(void) {
    fresh_dir();
    tally__flight w, a, f;
    char host[64];
    memset(host, 'h', sizeof host - 1);
    host[sizeof host - 1] = '\0';
    int top = TALLY__BOOT_MAX_SIZE - 1;
    tally__flight_init(&w, top, top + 1, top, 0, NULL, 0, host, 2147483647, 0xffffffffu, 0, dir);
    tally__flight_init(&a, top, top + 1, top, top, &w, UINT64_MAX, host, 2147483647, 0xffffffffu, 0, dir);
    /* "comm18446744073709551615-4095.999999999999-4095": 47 characters, the most a label holds */
    tally__flight_init(&f, top, top + 1, top, top, &a, 999999999999ull, host, 2147483647, 0xffffffffu, 3, dir);
    TH_CHECK(strlen(f.label) == sizeof f.label - 1, "the label %s is not the longest a label may be (%zu)", f.label,
             sizeof f.label - 1);
    tally__flight_set_transport(&f, "shm+tcp");
    int algo = longest(0, tally__algo_count() + 1, algo_name);
    for (int i = 0; i < 3; i++) {
        tally__sig sig = {.seq = UINT64_MAX - 2 + (uint64_t)i,
                          .count = UINT64_MAX,
                          .root = top,
                          .coll = (uint8_t)longest(0, TALLY__COLL_COUNT - 1, coll_name),
                          .dtype = (uint8_t)longest(0, TALLY_DTYPE_COUNT - 1, dtype_name),
                          .op = (uint8_t)longest(0, TALLY_OP_COUNT - 1, op_name),
                          .algo = (uint8_t)(algo == tally__algo_count() + 1 ? TALLY__ALGO_HIER : algo)};
        tally__flight_begin(&f, &sig);
        atomic_store(&f.awaited, top);
        tally__flight_end(&f, -2147483647 - 1, top);
        f.ring[i].begin_ns = f.ring[i].end_ns = UINT64_MAX;
    }
    char msg[3000];
    memset(msg, 'm', sizeof msg - 1);
    msg[sizeof msg - 1] = '\0';
    TH_CHECK(tally__flight_dump(&f, "PEER_LOST", top, msg) == 0, "the dump failed: %s", strerror(errno));
    tally__flight_fini(&f);
    tally__flight_set s;
    int rc = tally__flight_load(dir, &s);
    TH_CHECK(rc == 0 && s.n == 1 && s.r[0].n == 3 && s.r[0].e[2].sig.seq == UINT64_MAX &&
                 s.r[0].e[2].begin_ns == UINT64_MAX && !strcmp(s.r[0].label, f.label),
             "the writer's largest record does not read back: %zu read: %s", rc ? 0 : s.n,
             rc         ? tally_last_error()
             : s.n_skip ? s.skip[0].why
                        : "-");
    if (!rc) tally__flight_set_free(&s);
}

/* An entry naming a rank outside the record's size (a refused call's root, as an older writer wrote
 * it) is read with that rank as none and counted, not the whole record set aside. */
static void ranks_out_of_range(void) {
    static const struct {
        const char *find, *put;
    } probe[] = {{"sum -1 ring", "sum 7 ring"}, {"done 0 -1 -1", "done 0 7 -1"}, {"done 0 -1 -1", "done 0 -2 5"}};
    for (size_t i = 0; i < sizeof probe / sizeof *probe; i++) {
        char text[4096];
        edited(probe[i].find, probe[i].put, text, sizeof text);
        fresh_dir();
        th_write_file(th_path(dir, "rank0.world.flight"), text, strlen(text));
        tally__flight_set s;
        int rc = tally__flight_load(dir, &s);
        const tally__flight_entry *e = !rc && s.n == 1 && s.r[0].n == 1 ? &s.r[0].e[0] : NULL;
        TH_CHECK(e && e->sig.root == -1 && e->peer == -1 && e->culprit == -1 && s.r[0].n_flagged == 1,
                 "'%s': %zu read, root %d peer %d culprit %d, %zu flagged: %s", probe[i].put, rc ? 0 : s.n,
                 e ? e->sig.root : 0, e ? e->peer : 0, e ? e->culprit : 0, e ? s.r[0].n_flagged : 0,
                 rc         ? tally_last_error()
                 : s.n_skip ? s.skip[0].why
                            : "-");
        if (!rc) tally__flight_set_free(&s);
    }
}

/* A record of `n` entries (rank `rank` of 2, job `job`), seqs 1..n done but the last `last` (a state). */
static void put_big(const char *name, const char *job, int rank, int n, const char *last) {
    size_t cap = 1024 + (size_t)n * 64, k = 0;
    char *text = malloc(cap);
    k += (size_t)snprintf(text + k, cap - k,
                          "tally-flight 2\njob %s\nlabel world\nrank %d\nworld_rank %d\nsize 2\nhost h\npid 1\n"
                          "dumped_ns 5\nentries %d\n",
                          job, rank, rank, n);
    for (int i = 1; i <= n; i++)
        k += (size_t)snprintf(text + k, cap - k, "e %d allreduce 8 f32 sum -1 ring %s 0 -1 -1 1 2\n", i,
                              i == n ? last : "done");
    th_write_file(th_path(dir, name), text, k);
    free(text);
}

/* Records at the deepest ring, more than the reader keeps whole (64 copies of another job's and the two
 * of the job read): none is set aside for want of room, each keeps its newest entries (the same share
 * each), and the verdict is the records' (rank 1 never began #65536). */
static void room_shared(void) {
    fresh_dir();
    put_big("other.flight", "h-2-00000002", 1, TALLY__FLIGHT_MAX, "done");
    for (int i = 0; i < 64; i++) {
        char name[32];
        snprintf(name, sizeof name, "copy%02d.flight", i);
        TH_CHECK(link(th_path(dir, "other.flight"), th_path(dir, name)) == 0, "link: %s", strerror(errno));
    }
    unlink(th_path(dir, "other.flight"));
    put_big("rank0.world.h-1-00000001.flight", "h-1-00000001", 0, TALLY__FLIGHT_MAX, "running");
    put_big("rank1.world.h-1-00000001.flight", "h-1-00000001", 1, TALLY__FLIGHT_MAX - 1, "done");
    tally__flight_set s;
    int rc = tally__flight_load(dir, &s);
    TH_CHECK(rc == 0, "66 deep records: %s", tally_last_error());
    if (rc) return;
    size_t other = 0, share = TALLY__FLIGHT_KEPT / 66;
    for (size_t i = 0; i < s.n_skip; i++) other += strstr(s.skip[i].why, "of another job") != NULL;
    TH_CHECK(s.n == 2 && other == 64 && s.n_skip == 64,
             "66 deep records: %zu read, %zu set aside (%zu of another "
             "job), want 2 and 64: %s",
             s.n, s.n_skip, other, s.n_skip ? s.skip[s.n_skip - 1].why : "-");
    for (size_t i = 0; i < s.n && s.n == 2; i++)
        TH_CHECK(s.r[i].n == share && s.r[i].e[s.r[i].n - 1].sig.seq == (uint64_t)TALLY__FLIGHT_MAX - i &&
                     s.r[i].n + s.r[i].n_old == (size_t)TALLY__FLIGHT_MAX - i,
                 "rank %zu keeps %zu entries (%zu older dropped), its newest #%llu; want its newest %zu", i, s.r[i].n,
                 s.r[i].n_old, (unsigned long long)s.r[i].e[s.r[i].n - 1].sig.seq, share);
    if (s.n == 2) {
        tally__flight_verdict v;
        tally__flight_analyze(s.r, 2, &v);
        TH_CHECK(v.diverge_seq == TALLY__FLIGHT_MAX && v.holder == 1 && v.holder_recorded && !v.missing,
                 "66 deep records: diverge #%llu holder %d recorded %d missing %d, want #%d, 1, 1, 0",
                 (unsigned long long)v.diverge_seq, v.holder, v.holder_recorded, v.missing, TALLY__FLIGHT_MAX);
    }
    tally__flight_set_free(&s);
}

/* A record of job `job`'s rank `rank` (world rank `world`) of `size` in communicator `label`, dumped at
 * `t`, written as `name`. */
static void put_record(const char *name, const char *job, const char *label, int rank, int world, int size,
                       unsigned t) {
    char text[1024];
    snprintf(text, sizeof text,
             "tally-flight 1\njob %s\nlabel %s\nrank %d\nworld_rank %d\nsize %d\nhost h\npid 1\ndumped_ns %u\n"
             "entries 1\ne 1 allreduce 8 f32 sum -1 ring done 0 -1 -1 1 2\n",
             job, label, rank, world, size, t);
    th_write_file(th_path(dir, name), text, strlen(text));
}

/* The job read, and whether `name` was set aside with a reason holding `why`. */
static void job_read(const char *what, const char *want_job, const char *name, const char *why) {
    tally__flight_set s;
    int rc = tally__flight_load(dir, &s);
    TH_CHECK(rc == 0 && !strcmp(s.job, want_job), "%s: job %s read, want %s", what, rc ? "(none)" : s.job, want_job);
    if (rc) return;
    const tally__flight_skip *k = NULL;
    for (size_t i = 0; i < s.n_skip; i++)
        if (!strcmp(s.skip[i].file, name)) k = &s.skip[i];
    TH_CHECK(k && strstr(k->why, why), "%s: %s is not set aside saying \"%s\": %s", what, name, why,
             k ? k->why : "(read)");
    if (k) printf("  %s: %s: %s\n", what, name, k->why);
    tally__flight_set_free(&s);
}

/* The job read is the one whose records come from the most ranks, not the most files: a job that left
 * one rank's record under many names (or in many communicators) does not outvote two ranks. Ties: rank
 * 0's world record, then the newest. */
static void job_by_ranks(void) {
    fresh_dir();
    put_record("rank0.world.flight", "h-1-0000000a", "world", 0, 0, 3, 10);
    put_record("rank1.world.flight", "h-1-0000000a", "world", 1, 1, 3, 10);
    put_record("rank2.world.flight", "h-1-0000000b", "world", 2, 2, 3, 20);
    put_record("copy1.flight", "h-1-0000000b", "world", 2, 2, 3, 20);
    put_record("copy2.flight", "h-1-0000000b", "world", 2, 2, 3, 20);
    put_record("rank2.comm4-2.flight", "h-1-0000000b", "comm4-2", 0, 2, 1, 20);
    job_read("one rank under four names against two ranks", "h-1-0000000a", "copy1.flight", "of another job");

    fresh_dir(); /* a tie, 2 ranks each: the job with rank 0's world record, though older */
    put_record("rank0.world.flight", "h-1-0000000a", "world", 0, 0, 4, 10);
    put_record("rank3.world.flight", "h-1-0000000a", "world", 3, 3, 4, 10);
    put_record("rank1.world.flight", "h-1-0000000b", "world", 1, 1, 4, 20);
    put_record("rank2.world.flight", "h-1-0000000b", "world", 2, 2, 4, 20);
    put_record("x.flight", "h-1-0000000b", "world", 2, 2, 4, 20);
    job_read("a tie, rank 0's world record", "h-1-0000000a", "rank1.world.flight", "of another job");

    fresh_dir(); /* a tie, neither has rank 0: the newest */
    put_record("rank1.world.flight", "h-1-0000000a", "world", 1, 1, 4, 10);
    put_record("rank3.world.flight", "h-1-0000000a", "world", 3, 3, 4, 10);
    put_record("rank2.world.flight", "h-1-0000000b", "world", 2, 2, 4, 20);
    put_record("rank0.comm1-2.flight", "h-1-0000000b", "comm1-2", 0, 2, 2, 20);
    put_record("rank1.comm1-2.flight", "h-1-0000000b", "comm1-2", 1, 0, 2, 20);
    job_read("a tie, the newest", "h-1-0000000b", "rank1.world.flight", "of another job");
}

/* Two jobs dumping the same rank of the same communicator into one shared directory (TALLY_FLIGHT_DIR
 * as /tmp): each keeps its own record, named for its job, and the reader takes either job's alone. */
static void shared_dir(void) {
    fresh_dir();
    chmod(dir, 01777);
    tally__flight f;
    for (uint32_t draw = 1; draw <= 2; draw++)
        for (int rank = 0; rank < (int)draw + 1; rank++) {
            tally__flight_init(&f, rank, 3, rank, 0, NULL, 0, "h", 77, draw, 4, dir);
            tally__sig sig = {.seq = 1, .count = 8, .root = -1, .coll = TALLY__ALLREDUCE};
            tally__flight_begin(&f, &sig);
            tally__flight_end(&f, TALLY_E_TIMEOUT, -1);
            TH_CHECK(tally__flight_dump(&f, "TIMEOUT", -1, "a test") == 0, "shared dir: a dump failed");
            char want[64];
            snprintf(want, sizeof want, "/rank%d.world.h-77-%08x.flight", rank, (unsigned)draw);
            TH_CHECK(strstr(f.path, want) != NULL, "shared dir: the record is %s, not named for its job (%s)", f.path,
                     want);
            tally__flight_fini(&f);
        }
    tally__flight_set s;
    int rc = tally__flight_load(dir, &s);
    TH_CHECK(rc == 0 && s.n == 3 && !strcmp(s.job, "h-77-00000002") && s.n_skip == 2,
             "shared dir: %zu records of job %s read, %zu set aside; want the 3 of job h-77-00000002 and the 2 of "
             "the other set aside",
             s.n, rc ? "-" : s.job, s.n_skip);
    if (!rc) tally__flight_set_free(&s);
    /* A job's record and an older copy of it under the old name (rank<R>.<label>.flight): one is read. */
    fresh_dir();
    put_record("rank0.world.h-1-0000000a.flight", "h-1-0000000a", "world", 0, 0, 2, 10);
    put_record("rank0.world.flight", "h-1-0000000a", "world", 0, 0, 2, 10);
    put_record("zz.flight", "h-1-0000000a", "world", 0, 0, 2, 10);
    job_read("a rank's record under two names it may have", "h-1-0000000a", "zz.flight", "a second record of rank 0");
}

/* The record format is versioned: the writer writes version 2 (a job line in every record); version 1
 * (before job lines, or with one) still reads; a version this reader does not know is set aside naming
 * it, never read as if it were one it knows; a version 2 record without its job line is not one. */
static void versions(void) {
    char text[4096];
    fresh_dir();
    tally__flight f;
    tally__flight_init(&f, 0, 2, 0, 0, NULL, 0, "h", 9, 3, 4, dir);
    TH_CHECK(tally__flight_dump(&f, "TIMEOUT", -1, "m") == 0, "versions: the dump failed");
    FILE *in = fopen(f.path, "r");
    size_t got = in ? fread(text, 1, sizeof text - 1, in) : 0;
    text[got] = '\0';
    if (in) fclose(in);
    tally__flight_fini(&f);
    TH_CHECK(!strncmp(text, "tally-flight 2\njob h-9-00000003\n", 31), "versions: the writer wrote:\n%s", text);

    fresh_dir();
    edited("tally-flight 1\n", "tally-flight 2\n", text, sizeof text);
    th_write_file(th_path(dir, "rank0.world.h-1-00000001.flight"), text, strlen(text));
    char older[4096]; /* version 1 without a job line: an older tally's, of an older job */
    edited("job h-1-00000001\n", "", older, sizeof older);
    edit(older, "dumped_ns 5\n", "dumped_ns 4\n", text, sizeof text);
    th_write_file(th_path(dir, "rank0.world.flight"), text, strlen(text));
    tally__flight_set s;
    int rc = tally__flight_load(dir, &s);
    TH_CHECK(rc == 0 && s.n == 1 && s.n_skip == 1 && !strcmp(s.job, "h-1-00000001") &&
                 strstr(s.skip[0].why, "of another job"),
             "versions: a version 2 record beside a version 1 one: %zu read, %zu set aside (%s)", s.n, s.n_skip,
             s.n_skip ? s.skip[0].why : "-");
    if (!rc) tally__flight_set_free(&s);

    /* Alone, the version 1 record without a job line reads; so does one whose message line is as long as
     * a writer before the line bound made it ("message " and the 1023 characters of an error), cut. */
    fresh_dir();
    th_write_file(th_path(dir, "rank0.world.flight"), older, strlen(older));
    rc = tally__flight_load(dir, &s);
    TH_CHECK(rc == 0 && s.n == 1 && s.n_skip == 0 && !s.r[0].job[0],
             "versions: a version 1 record without a job line, alone: %zu read (%s)", rc ? 0 : s.n,
             rc         ? tally_last_error()
             : s.n_skip ? s.skip[0].why
                        : "-");
    if (!rc) tally__flight_set_free(&s);
    char put[1100] = "message ";
    memset(put + 8, 'x', 1023);
    snprintf(put + 8 + 1023, sizeof put - 8 - 1023, "\n");
    edited("message m\n", put, text, sizeof text);
    fresh_dir();
    th_write_file(th_path(dir, "rank0.world.flight"), text, strlen(text));
    rc = tally__flight_load(dir, &s);
    TH_CHECK(rc == 0 && s.n == 1 && strlen(s.r[0].msg) == sizeof s.r[0].msg - 1,
             "versions: a version 1 record with a message of 1023 characters: %zu read (%s)", rc ? 0 : s.n,
             rc         ? tally_last_error()
             : s.n_skip ? s.skip[0].why
                        : "-");
    if (!rc) tally__flight_set_free(&s);
    edit(text, "tally-flight 1\n", "tally-flight 2\n", older, sizeof older);
    fresh_dir();
    th_write_file(th_path(dir, "rank0.world.flight"), older, strlen(older));
    const char *v2_long[] = {"line 13", "longer than", NULL};
    set_aside("versions: a version 2 record with a message line past the bound", "rank0.world.flight", v2_long);

    static const struct {
        const char *find, *put, *want;
    } probe[] = {
        {"tally-flight 1\n", "tally-flight 3\n", "format version 3"},
        {"tally-flight 1\n", "tally-flight 12\n", "format version 12"},
        {"tally-flight 1\n", "tally-flight 1.5\n", "version"},
        {"tally-flight 1\n", "tally-flight 0\n", "version"},
        {"tally-flight 1\n", "tally-flight\n", "tally-flight <version>"},
        {"tally-flight 1\njob h-1-00000001\n", "tally-flight 2\n", "no job line"},
    };
    for (size_t i = 0; i < sizeof probe / sizeof *probe; i++) {
        fresh_dir();
        edited(probe[i].find, probe[i].put, text, sizeof text);
        th_write_file(th_path(dir, "rank0.world.flight"), text, strlen(text));
        const char *want[] = {"line ", probe[i].want, NULL};
        char what[64];
        snprintf(what, sizeof what, "version: %.*s", (int)strcspn(probe[i].put, "\n"), probe[i].put);
        set_aside(what, "rank0.world.flight", want);
    }
}

/* More *.flight names than the reader looks at: the rest are counted, not read or listed. */
static void many_files(void) {
    fresh_dir();
    char name[64];
    for (int i = 0; i < TALLY__FLIGHT_FILES + 3; i++) {
        snprintf(name, sizeof name, "f%d.flight", i);
        int fd = open(th_path(dir, name), O_WRONLY | O_CREAT | O_EXCL, 0600);
        if (fd < 0) {
            TH_CHECK(0, "create %s: %s", name, strerror(errno));
            return;
        }
        close(fd);
    }
    tally__flight_set s;
    int rc = tally__flight_load(dir, &s);
    TH_CHECK(rc == 0 && s.n == 0 && s.n_skip == TALLY__FLIGHT_FILES && s.n_unread == 3 &&
                 strstr(s.skip[0].why, "the file is empty"),
             "%d empty files: rc %d, %zu read, %zu set aside, %zu not looked at, want 0, %d, 3: %s",
             TALLY__FLIGHT_FILES + 3, rc, s.n, s.n_skip, s.n_unread, TALLY__FLIGHT_FILES,
             s.n_skip ? s.skip[0].why : tally_last_error());
    if (!rc) tally__flight_set_free(&s);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/tally-test-flight-read-%d", (int)getpid());
    if (th_quick()) {
        good_reads();
        bad_fields();
        bad_shape();
        writer_within_bounds();
        ranks_out_of_range();
        if (!th_light()) many_files(); /* 16387 files: minutes of system time under the sanitizers */
        job_by_ranks();
        shared_dir();
        versions();
    }
    if (th_long() && !th_light()) room_shared(); /* 66 records of 65536 entries: 200 MB parsed */
    th_rm_dir(dir);
    return th_verdict("test_flight_read");
}
