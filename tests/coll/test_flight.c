/* test_flight.c - the flight recorder: a rank stopped with SIGSTOP (shm and tcp), a mismatched call, a
 * rank that died and one that aborted on a signal each leave records from which `tally flight` names it;
 * the ring keeps the last K; TALLY_FLIGHT=0 keeps none; the verdict on hand-written records. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <tally.h>
#include <unistd.h>

#include "coll/flight.h"
#include "harness.h"
#include "tool_runner.h"

#define TIMEOUT_S 2.0
#define WARMUP    3 /* allreduces every rank completes before the fault: the next is #4 */

enum { K_STOP, K_MISMATCH, K_EXIT, K_ABORT, K_OFF };

typedef struct {
    int kind, victim;
    char dir[256];
    const char *flight; /* TALLY_FLIGHT for the ranks, or NULL */
    _Atomic int done[TH_MAX_RANKS];
    int code[TH_MAX_RANKS];
    char msg[TH_MAX_RANKS][1024];
} shared_t;

static shared_t *S;

static void flight_env(int rank, void *arg) {
    (void)rank;
    (void)arg;
    setenv("TALLY_FLIGHT_DIR", S->dir, 1);
    if (S->flight) setenv("TALLY_FLIGHT", S->flight, 1);
}

/* WARMUP good allreduces, then the fault the scenario makes at #4, then (for the others) #4 itself. */
static int flight_rank(int rank, int n, void *arg) {
    (void)arg;
    tally_comm *c;
    int rc = tally_comm_init(&c);
    if (rc) {
        snprintf(S->msg[rank], sizeof S->msg[rank], "init: %s", tally_last_error());
        S->code[rank] = rc;
        return 1;
    }
    size_t count = 1000;
    float *buf = calloc(count + 1, sizeof *buf);
    for (int i = 0; i < WARMUP + (S->kind == K_OFF ? 20 : 0) && !rc; i++)
        rc = tally_allreduce(c, buf, buf, count, TALLY_F32, TALLY_SUM);
    if (!rc && rank == S->victim) {
        if (S->kind == K_STOP) raise(SIGSTOP);               /* until the parent sends SIGCONT */
        if (S->kind == K_EXIT || S->kind == K_OFF) _exit(0); /* gone without a goodbye */
        if (S->kind == K_ABORT) {                            /* a fatal signal: its handler writes the records */
            struct rlimit none = {0, 0};
            setrlimit(RLIMIT_CORE, &none);
            abort();
        }
        if (S->kind == K_MISMATCH) count++;
    }
    if (!rc) rc = tally_allreduce(c, buf, buf, count, TALLY_F32, TALLY_SUM);
    /* Resumed, the stopped rank may find every message of #4 there and complete it: #5 fails. */
    if (!rc && rank == S->victim) rc = tally_allreduce(c, buf, buf, count, TALLY_F32, TALLY_SUM);
    S->code[rank] = rc;
    snprintf(S->msg[rank], sizeof S->msg[rank], "%s", rc ? tally_last_error() : "");
    tally_comm_free(c);
    free(buf);
    atomic_store(&S->done[rank], 1);
    return 0;
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* The path of rank `rank`'s world record in S->dir (rank<R>.world.<job>.flight), or where it would be
 * when there is none. */
static const char *record_of(int rank) {
    static char p[4][512];
    static int k;
    char *out = p[k++ % 4], prefix[32];
    int n = snprintf(prefix, sizeof prefix, "rank%d.world.", rank);
    snprintf(out, 512, "%s/%s(none).flight", S->dir, prefix);
    DIR *d = opendir(S->dir);
    for (struct dirent *de; d && (de = readdir(d));) {
        size_t len = strlen(de->d_name);
        if (!strncmp(de->d_name, prefix, (size_t)n) && len > 7 && !strcmp(de->d_name + len - 7, ".flight"))
            snprintf(out, 512, "%s/%s", S->dir, de->d_name);
    }
    if (d) closedir(d);
    return out;
}

/* `tally flight DIR`: its exit status and whether its output holds each of want[] (NULL-ended). */
static void check_tool(const char *what, int want_rc, const char *const *want) {
    const char *args[] = {"flight", S->dir, NULL};
    th_tool_opts o = {.wall_s = 30};
    th_tool *t = malloc(sizeof *t);
    th_tool_run(args, &o, t);
    TH_CHECK(t->rc == want_rc, "%s: tally flight exited %d, want %d:\n%s", what, t->rc, want_rc, t->out);
    for (int i = 0; want && want[i]; i++)
        TH_CHECK(strstr(t->out, want[i]) != NULL, "%s: tally flight does not say \"%s\":\n%s", what, want[i], t->out);
    printf("  %s: tally flight says:\n%s", what, t->out);
    free(t);
}

static void wait_done(int n, int skip, double bound_s) {
    double t0 = th_now();
    for (int r = 0; r < n; r++)
        while (r != skip && !atomic_load(&S->done[r]) && th_now() - t0 < bound_s) usleep(2000);
}

static void start_scenario(const char *what, int kind, int victim, const char *transport, th_job *job, int n,
                           const char *flight) {
    memset(S, 0, sizeof *S);
    S->kind = kind;
    S->victim = victim;
    S->flight = flight;
    snprintf(S->dir, sizeof S->dir, "/tmp/tally-test-flight-%d", (int)getpid());
    th_rm_dir(S->dir);
    th_opts o = {.transport = transport, .algo = "ring", .timeout_s = TIMEOUT_S, .wall_s = 60, .child_env = flight_env};
    if (th_start(job, n, &o, flight_rank, NULL)) TH_CHECK(0, "%s: fork failed", what);
}

/* A rank stopped before allreduce #4: the others time out naming it and leave records whose path their
 * message gives; `tally flight` names it before it resumes (no record of its own) and after (it began
 * #4 late). */
static void stopped(const char *transport) {
    char what[64];
    snprintf(what, sizeof what, "%s, rank 2 stopped", transport);
    th_job job;
    start_scenario(what, K_STOP, 2, transport, &job, 4, NULL);
    wait_done(4, 2, 40);
    for (int r = 0; r < 4; r++) {
        if (r == 2) continue;
        TH_CHECK(S->code[r] == TALLY_E_TIMEOUT, "%s: rank %d got %s: %s", what, r, tally_strerror(S->code[r]),
                 S->msg[r]);
        TH_CHECK(strstr(S->msg[r], record_of(r)) && strstr(S->msg[r], "tally flight"),
                 "%s: rank %d's message does not give its record %s: %s", what, r, record_of(r), S->msg[r]);
        TH_CHECK(file_exists(record_of(r)), "%s: no record from rank %d", what, r);
    }
    TH_CHECK(!file_exists(record_of(2)), "%s: the stopped rank wrote a record", what);
    const char *before[] = {"first divergence: allreduce #4", "holding the job up: rank 2 (it left no record",
                            "no record from rank(s): 2", NULL};
    check_tool(what, 0, before);
    kill(job.pid[2], SIGCONT);
    int bad = th_wait(&job, 60);
    TH_CHECK(bad == 0, "%s: %d rank(s) did not exit 0", what, bad);
    TH_CHECK(file_exists(record_of(2)), "%s: the resumed rank wrote no record: %s", what, S->msg[2]);
    const char *after[] = {"first divergence: allreduce #4", "holding the job up: rank 2 (it began the collective",
                           NULL};
    check_tool(what, 0, after);
    th_rm_dir(S->dir);
}

/* Rank 1 calls allreduce #4 with another count: every rank fails with MISMATCH, and the verdict says
 * the ranks called different collectives and names rank 1. */
static void mismatched(void) {
    const char *what = "shm, rank 1 mismatched";
    th_job job;
    start_scenario(what, K_MISMATCH, 1, "shm", &job, 3, NULL);
    TH_CHECK(th_wait(&job, 60) == 0, "%s: a rank did not exit 0", what);
    for (int r = 0; r < 3; r++) {
        TH_CHECK(S->code[r] == TALLY_E_MISMATCH, "%s: rank %d got %s", what, r, tally_strerror(S->code[r]));
        TH_CHECK(file_exists(record_of(r)), "%s: no record from rank %d", what, r);
    }
    const char *want[] = {"first divergence: allreduce #4", "different collectives",
                          "holding the job up: rank 1, whose call differs", NULL};
    check_tool(what, 0, want);
    th_rm_dir(S->dir);
}

/* A rank gone without a goodbye (PEER_LOST), or killed by a fatal signal (its own handler writes its
 * record, with the signal as the reason). */
static void died(int kind) {
    const char *what = kind == K_EXIT ? "shm, rank 2 exited" : "shm, rank 2 aborted (SIGABRT)";
    th_job job;
    start_scenario(what, kind, 2, "shm", &job, 3, NULL);
    th_wait(&job, 60);
    for (int r = 0; r < 2; r++) {
        TH_CHECK(S->code[r] == TALLY_E_PEER_LOST, "%s: rank %d got %s: %s", what, r, tally_strerror(S->code[r]),
                 S->msg[r]);
        TH_CHECK(file_exists(record_of(r)), "%s: no record from rank %d", what, r);
    }
    const char *want[] = {"holding the job up: rank 2", NULL};
    check_tool(what, 0, want);
    if (kind == K_ABORT) {
        char text[4096] = "";
        FILE *f = fopen(record_of(2), "r");
        size_t got = f ? fread(text, 1, sizeof text - 1, f) : 0;
        text[got] = '\0';
        if (f) fclose(f);
        /* a sanitizer that owns SIGABRT keeps its own handler, and then nothing is written */
        TH_CHECK(!f || strstr(text, "reason signal-6"), "%s: rank 2's record does not give the signal:\n%s", what,
                 text);
        printf("  %s: rank 2 %s its own record\n", what, f ? "wrote" : "(a sanitizer's handler) did not write");
    }
    th_rm_dir(S->dir);
}

/* TALLY_FLIGHT=4 keeps the last 4 (#21 to #24 of 24, the last one failed); TALLY_FLIGHT=0 none. */
static void ring_and_off(void) {
    const char *what = "TALLY_FLIGHT=4";
    th_job job;
    start_scenario(what, K_OFF, 1, "shm", &job, 2, "4");
    th_wait(&job, 60);
    char text[8192] = "";
    FILE *f = fopen(record_of(0), "r");
    size_t got = f ? fread(text, 1, sizeof text - 1, f) : 0;
    text[got] = '\0';
    if (f) fclose(f);
    TH_CHECK(strstr(text, "entries 4\n") && strstr(text, "\ne 21 allreduce") && strstr(text, "\ne 24 allreduce") &&
                 !strstr(text, "\ne 20 "),
             "%s: rank 0's record does not hold #21 to #24 alone:\n%s", what, text);
    th_rm_dir(S->dir);

    what = "TALLY_FLIGHT=0";
    start_scenario(what, K_OFF, 1, "shm", &job, 2, "0");
    th_wait(&job, 60);
    TH_CHECK(S->code[0] == TALLY_E_PEER_LOST && !strstr(S->msg[0], "flight"),
             "%s: rank 0 got %s, its message mentions records: %s", what, tally_strerror(S->code[0]), S->msg[0]);
    TH_CHECK(!file_exists(record_of(0)), "%s: rank 0 wrote a record", what);
    th_rm_dir(S->dir);
}

/* ---- the verdict on records made by hand ------------------------------------------------------ */

static tally__flight_entry ent(uint64_t seq, uint64_t count, int state, int peer, int culprit, uint64_t begin) {
    return (tally__flight_entry){.sig = {.seq = seq, .count = count, .root = -1, .coll = TALLY__ALLREDUCE},
                                 .begin_ns = begin,
                                 .end_ns = begin + 10,
                                 .state = state,
                                 .rc = state == TALLY__FL_FAILED ? TALLY_E_TIMEOUT : 0,
                                 .peer = peer,
                                 .culprit = culprit};
}

static void verdicts(void) {
    enum { D = TALLY__FL_DONE, F = TALLY__FL_FAILED };
    /* 4 ranks, windows of different length; #7 is where rank 3 never arrived: 1 waits for 0, 0 for 2, 2
     * for 3, and nobody's error named anyone. */
    tally__flight_entry e0[] = {ent(5, 8, D, -1, -1, 50), ent(6, 8, D, -1, -1, 60), ent(7, 8, F, 2, -1, 70)};
    tally__flight_entry e1[] = {ent(6, 8, D, -1, -1, 60), ent(7, 8, F, 0, -1, 71)};
    tally__flight_entry e2[] = {ent(4, 8, D, -1, -1, 40), ent(5, 8, D, -1, -1, 50), ent(6, 8, D, -1, -1, 60),
                                ent(7, 8, F, 3, -1, 72)};
    tally__flight_entry e3[] = {ent(6, 8, D, -1, -1, 60)};
    tally__flight_rank r[4] = {{.rank = 0, .size = 4, .e = e0, .n = 3},
                               {.rank = 1, .size = 4, .e = e1, .n = 2},
                               {.rank = 2, .size = 4, .e = e2, .n = 4},
                               {.rank = 3, .size = 4, .e = e3, .n = 1}};
    tally__flight_verdict v;
    tally__flight_analyze(r, 4, &v);
    TH_CHECK(v.diverge_seq == 7 && !v.mismatch && v.holder == 3 && v.holder_recorded && v.holder_late_s < 0,
             "chain: diverge %llu mismatch %d holder %d recorded %d late %g, want #7, 0, rank 3, 1, -1",
             (unsigned long long)v.diverge_seq, v.mismatch, v.holder, v.holder_recorded, v.holder_late_s);
    /* Without rank 3's record the chain ends at it all the same. */
    tally__flight_analyze(r, 3, &v);
    TH_CHECK(v.diverge_seq == 7 && v.holder == 3 && !v.holder_recorded && v.missing == 1 && v.waiting_on_holder == 3,
             "chain, rank 3 silent: diverge %llu holder %d recorded %d missing %d led %d",
             (unsigned long long)v.diverge_seq, v.holder, v.holder_recorded, v.missing, v.waiting_on_holder);
    /* A mismatch at #6: rank 1 alone called it with count 9. */
    e1[0].sig.count = 9;
    tally__flight_analyze(r, 4, &v);
    TH_CHECK(v.diverge_seq == 6 && v.mismatch && v.holder == 1, "mismatch: diverge %llu mismatch %d holder %d",
             (unsigned long long)v.diverge_seq, v.mismatch, v.holder);
    e1[0].sig.count = 8;
    /* Everyone completed everything: no divergence, no holder. */
    tally__flight_rank done[2] = {{.rank = 0, .size = 2, .e = e3, .n = 1}, {.rank = 1, .size = 2, .e = e3, .n = 1}};
    tally__flight_analyze(done, 2, &v);
    TH_CHECK(v.diverge_seq == 0 && v.holder == -1, "all done: diverge %llu holder %d",
             (unsigned long long)v.diverge_seq, v.holder);
    /* The same at the last sequence number there is: the search stops there, not wrapping to #1. */
    tally__flight_entry last[] = {ent(UINT64_MAX, 8, D, -1, -1, 60)};
    done[0].e = done[1].e = last;
    tally__flight_analyze(done, 2, &v);
    TH_CHECK(v.diverge_seq == 0 && v.holder == -1, "all done at #%llu: diverge %llu holder %d",
             (unsigned long long)UINT64_MAX, (unsigned long long)v.diverge_seq, v.holder);
}

/* `tally flight` misused: no directory, two, one that is not there, one without records, a record cut
 * short. Each is refused, naming what was wrong. */
static void tool_misuse(void) {
    th_tool *t = malloc(sizeof *t);
    th_tool_opts o = {.wall_s = 20};
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/tally-test-flight-misuse-%d", (int)getpid());
    th_rm_dir(dir);
    const char *none[] = {"flight", NULL}, *two[] = {"flight", "a", "b", NULL}, *gone[] = {"flight", dir, NULL};
    th_tool_run(none, &o, t);
    TH_CHECK(t->rc == 2 && strstr(t->out, "DIR is missing"), "tally flight without DIR: %d %s", t->rc, t->out);
    th_tool_run(two, &o, t);
    TH_CHECK(t->rc == 2 && strstr(t->out, "takes one directory"), "tally flight a b: %d %s", t->rc, t->out);
    th_tool_run(gone, &o, t);
    TH_CHECK(t->rc == 1 && strstr(t->out, dir), "tally flight on a missing directory: %d %s", t->rc, t->out);
    mkdir(dir, 0700);
    th_tool_run(gone, &o, t);
    TH_CHECK(t->rc == 1 && strstr(t->out, "holds no flight records"), "tally flight on an empty directory: %d %s",
             t->rc, t->out);
    const char cut[] = "tally-flight 1\nlabel world\nrank 0\nsize 2\nentries 3\ne 1 allreduce 8 f32 sum -1 ring "
                       "done 0 -1 -1 1 2\n";
    th_write_file(th_path(dir, "rank0.world.flight"), cut, sizeof cut - 1);
    th_tool_run(gone, &o, t);
    TH_CHECK(t->rc == 1 && strstr(t->out, "rank0.world.flight: not a flight record") &&
                 strstr(t->out, "no flight records it can read"),
             "tally flight on a record cut short: %d %s", t->rc, t->out);
    th_rm_dir(dir);
    free(t);
}

/* Records name every dtype and op, the last ones added too, and read back as the codes they were. */
static void every_name_reads_back(void) {
    char dir[128], text[512];
    snprintf(dir, sizeof dir, "/tmp/tally-test-flight-names-%d", (int)getpid());
    th_rm_dir(dir);
    mkdir(dir, 0700);
    snprintf(text, sizeof text,
             "tally-flight 1\nlabel world\nrank 0\nsize 2\nentries 2\ne 1 allreduce 8 %s %s -1 ring done 0 -1 -1 1 2\n"
             "e 2 allreduce 8 %s %s -1 ring done 0 -1 -1 3 4\n",
             tally_dtype_name(TALLY_DTYPE_COUNT - 1), tally_op_name(TALLY_OP_COUNT - 1), tally_dtype_name(TALLY_I8),
             tally_op_name(TALLY_BAND));
    th_write_file(th_path(dir, "rank0.world.flight"), text, strlen(text));
    tally__flight_set set;
    int rc = tally__flight_load(dir, &set);
    TH_CHECK(!rc && set.n == 1 && set.r[0].n == 2, "a record of the newest dtypes and ops: %s", tally_last_error());
    if (!rc && set.n == 1 && set.r[0].n == 2) {
        const tally__sig *a = &set.r[0].e[0].sig, *b = &set.r[0].e[1].sig;
        TH_CHECK(a->dtype == TALLY_DTYPE_COUNT - 1 && a->op == TALLY_OP_COUNT - 1 && b->dtype == TALLY_I8 &&
                     b->op == TALLY_BAND,
                 "read back as dtype %d op %d, dtype %d op %d", a->dtype, a->op, b->dtype, b->op);
    }
    if (!rc) tally__flight_set_free(&set);
    th_rm_dir(dir);
}

/* ---- each communicator's own directory, job and name --------------------------------------------- */

/* The records in d: how many, and whether each names job `job` (NULL: any). */
static int records_in(const char *d, const char *job, char labels[][48], int max) {
    tally__flight_set set;
    if (tally__flight_load(d, &set)) return -1;
    int n = (int)set.n;
    for (size_t i = 0; i < set.n; i++) {
        if (job && strcmp(set.r[i].job, job)) n = -100;
        if ((int)i < max) snprintf(labels[i], 48, "%s", set.r[i].label);
    }
    if (set.n_skip) n = -200 - (int)set.n_skip; /* a record set aside: a second one of a rank */
    tally__flight_set_free(&set);
    return n;
}

static int world_of(tally_comm **c, const char *d) {
    tally_config cfg = TALLY_CONFIG_INIT;
    cfg.rank = 0;
    cfg.size = 1;
    snprintf(cfg.flight_dir, sizeof cfg.flight_dir, "%s", d);
    return tally_comm_init_config(c, &cfg);
}

/* Two worlds in one process (a test harness, a library that makes its own): a split of the first made
 * after the second writes beside the first, with its job, and two splits of it made around the second
 * world have names of their own. */
static void two_worlds(void) {
    char da[128], db[128], job[TALLY__FLIGHT_JOB] = "", labels[8][48];
    snprintf(da, sizeof da, "/tmp/tally-test-flight-wa-%d", (int)getpid());
    snprintf(db, sizeof db, "/tmp/tally-test-flight-wb-%d", (int)getpid());
    th_rm_dir(da);
    th_rm_dir(db);
    tally_comm *a = NULL, *b = NULL, *a1 = NULL, *a2 = NULL, *a11 = NULL;
    int rc = world_of(&a, da);
    if (!rc) rc = tally_comm_split(a, 0, 0, &a1);
    if (!rc) rc = world_of(&b, db);
    if (!rc) rc = tally_comm_split(a, 0, 0, &a2);
    if (!rc) rc = tally_comm_split(a1, 0, 0, &a11);
    TH_CHECK(rc == 0, "two worlds: %s", tally_last_error());
    tally_comm *abort_them[] = {a, a1, a2, a11};
    for (int i = 3; i >= 0; i--)
        if (abort_them[i]) tally_comm_abort(abort_them[i]); /* each writes its records, and is freed */
    tally__flight_set set;
    if (!tally__flight_load(da, &set)) {
        for (size_t i = 0; i < set.n; i++)
            if (!strcmp(set.r[i].label, "world")) snprintf(job, sizeof job, "%s", set.r[i].job);
        tally__flight_set_free(&set);
    }
    int n = records_in(da, job, labels, 8);
    TH_CHECK(job[0] && n == 4,
             "two worlds: %d records of the first world's job (%s) in its directory, want 4 "
             "(the world and its 3 splits, each its own)",
             n, job);
    for (int i = 0; i < n && n <= 8; i++) printf("  two worlds: a communicator of the first: %s\n", labels[i]);
    TH_CHECK(records_in(db, NULL, labels, 8) <= 0, "two worlds: the second world's directory holds records of the "
                                                   "first's communicators");
    if (b) tally_comm_free(b);
    th_rm_dir(da);
    th_rm_dir(db);
}

/* Ranks that made different numbers of communicators (rank 1 stays out of a split) give the next
 * communicator they make together one name: its records read as one communicator. */
static int labels_rank(int rank, int n, void *arg) {
    (void)n;
    (void)arg;
    tally_comm *w, *some = NULL, *all = NULL;
    if (tally_comm_init(&w)) return 2;
    int rc = tally_comm_split(w, rank == 1 ? -1 : 0, 0, &some);
    if (!rc) rc = tally_comm_split(w, 0, 0, &all);
    if (rc) {
        fprintf(stderr, "rank %d: %s\n", rank, tally_last_error());
        return 3;
    }
    tally_comm_abort(all); /* writes its records, and frees it */
    if (some) tally_comm_free(some);
    tally_comm_free(w);
    return 0;
}

static void split_labels(void) {
    memset(S, 0, sizeof *S);
    snprintf(S->dir, sizeof S->dir, "/tmp/tally-test-flight-labels-%d", (int)getpid());
    th_rm_dir(S->dir);
    th_opts o = {.transport = "shm", .timeout_s = 5, .wall_s = 60, .child_env = flight_env};
    int bad = th_run(2, &o, labels_rank, NULL);
    char labels[8][48];
    int n = records_in(S->dir, NULL, labels, 8);
    TH_CHECK(bad == 0 && n == 2 && !strcmp(labels[0], labels[1]),
             "split labels: %d rank(s) failed, %d records, labels %s and %s: want one communicator's two", bad, n,
             n > 0 ? labels[0] : "-", n > 1 ? labels[1] : "-");
    th_rm_dir(S->dir);
}

/* Splits of splits past the length a label holds stay distinct: two communicators split from two
 * siblings at the same count get two labels and two files, each at most 47 characters. */
static void deep_labels(void) {
    static tally__flight w, a, a1, p1, p2, c1, c2;
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/tally-test-flight-deep-%d", (int)getpid());
    th_rm_dir(dir);
    mkdir(dir, 0700);
    tally__flight_init(&w, 0, 8, 0, 0, NULL, 0, "h", 1, 1, 0, dir);
    tally__flight_init(&a, 0, 8, 0, 0, &w, 10000000, "h", 1, 1, 0, "");
    tally__flight_init(&a1, 0, 8, 0, 0, &a, 20000000, "h", 1, 1, 0, "");
    tally__flight_init(&p1, 0, 4, 0, 0, &a1, 30, "h", 1, 1, 0, "");
    tally__flight_init(&p2, 0, 4, 0, 0, &a1, 40, "h", 1, 1, 0, "");
    tally__flight_init(&c1, 0, 2, 0, 0, &p1, 2, "h", 1, 1, 1, "");
    tally__flight_init(&c2, 0, 2, 0, 0, &p2, 2, "h", 1, 1, 1, "");
    TH_CHECK(strcmp(p1.label, p2.label) && strcmp(c1.label, c2.label) && strcmp(c1.path, c2.path),
             "deep splits share a label: %s and %s, %s and %s", p1.label, p2.label, c1.label, c2.label);
    static tally__flight g1, g2; /* one more level each, past 47 characters: named by a hash, still two */
    tally__flight_init(&g1, 0, 2, 0, 0, &c1, 99999999999ull, "h", 1, 1, 0, "");
    tally__flight_init(&g2, 0, 2, 0, 0, &c2, 99999999999ull, "h", 1, 1, 0, "");
    TH_CHECK(g1.label[0] == 'h' && strcmp(g1.label, g2.label) && strlen(g1.label) < sizeof g1.label - 1,
             "splits past a label's length: %s and %s", g1.label, g2.label);
    tally__flight_dump(&c1, "TIMEOUT", -1, "c1");
    tally__flight_dump(&c2, "TIMEOUT", -1, "c2");
    tally__flight_fini(&c1);
    tally__flight_fini(&c2);
    char labels[4][48];
    int n = records_in(dir, "h-1-00000001", labels, 4);
    TH_CHECK(n == 2 && strcmp(labels[0], labels[1]), "deep splits: %d records, want two communicators' (%s, %s)", n,
             c1.label, c2.label);
    printf("  deep splits: %s and %s\n", c1.label, c2.label);
    th_rm_dir(dir);
}

/* A broken communicator refuses a rooted call whose root is out of range: the record it writes reads
 * back, the refused call's root as none, and names the rank that left. */
static int rooted_rank(int rank, int n, void *arg) {
    (void)n;
    (void)arg;
    tally_comm *c;
    if (tally_comm_init(&c)) return 2;
    float buf[8] = {0}, all[16] = {0};
    int rc = tally_allreduce(c, buf, buf, 8, TALLY_F32, TALLY_SUM);
    if (rank == 1) _exit(0);
    double t0 = th_now();
    for (int k = 0; rc == 0 || rc == TALLY_E_INVALID; k++) {
        if (th_now() - t0 > 30) return 4;
        usleep(10000);
        switch (k % 4) { /* root 7 of 2: refused as INVALID until the peer's loss is seen */
        case 0: rc = tally_broadcast(c, buf, 8, TALLY_F32, 7); break;
        case 1: rc = tally_reduce(c, buf, buf, 8, TALLY_F32, TALLY_SUM, 7); break;
        case 2: rc = tally_gather(c, buf, all, 8, TALLY_F32, 7); break;
        default: rc = tally_scatter(c, all, buf, 8, TALLY_F32, 7); break;
        }
    }
    S->code[0] = rc;
    tally_comm_free(c);
    return 0;
}

static void refused_root(void) {
    memset(S, 0, sizeof *S);
    snprintf(S->dir, sizeof S->dir, "/tmp/tally-test-flight-root-%d", (int)getpid());
    th_rm_dir(S->dir);
    th_opts o = {.transport = "shm", .timeout_s = TIMEOUT_S, .wall_s = 60, .child_env = flight_env};
    th_run(2, &o, rooted_rank, NULL);
    TH_CHECK(S->code[0] == TALLY_E_PEER_LOST, "refused root: rank 0 got %s", tally_strerror(S->code[0]));
    const char *want[] = {"holding the job up: rank 1", "records from 1", NULL};
    check_tool("a rooted call refused with root 7 of 2", 0, want);
    tally__flight_set set; /* the writer wrote no root its reader has to read as none */
    int rc = tally__flight_load(S->dir, &set);
    TH_CHECK(!rc && set.n == 1 && set.r[0].n_flagged == 0,
             "refused root: %zu record(s), %zu entries with a rank out "
             "of range",
             rc ? 0 : set.n, rc || !set.n ? 0 : set.r[0].n_flagged);
    if (!rc) tally__flight_set_free(&set);
    th_rm_dir(S->dir);
}

static void small_memory(void *arg) {
    (void)arg;
    struct rlimit as = {60 << 20, 60 << 20};
    setrlimit(RLIMIT_AS, &as);
}

/* A record too large for the memory there is: the message names the file escaped, as every other. */
static void no_memory_name(void) {
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/tally-test-flight-nomem-%d", (int)getpid());
    th_rm_dir(dir);
    mkdir(dir, 0700);
    const char *p = th_path(dir, "x\x1b]0;pwned\a\x1b[2Jy.flight");
    int fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0600);
    TH_CHECK(fd >= 0 && ftruncate(fd, 16 << 20) == 0, "make %s: %s", p, strerror(errno));
    if (fd >= 0) close(fd);
    const char *args[] = {"flight", dir, NULL};
    th_tool_opts o = {.wall_s = 30, .child = small_memory};
    th_tool *t = malloc(sizeof *t);
    th_tool_run(args, &o, t);
    TH_CHECK(t->rc == 1 && strstr(t->out, "out of memory") && !memchr(t->out, 0x1b, t->len) &&
                 strstr(t->out, "\\x1b]0;pwned"),
             "a record's name on the out-of-memory path: exit %d:\n%s", t->rc, t->out);
    free(t);
    th_rm_dir(dir);
}

int main(void) {
    S = th_shared_alloc(sizeof *S);
    if (th_quick()) {
        verdicts();
        every_name_reads_back();
        tool_misuse();
        stopped("shm"); /* waits out a 2 s TALLY_TIMEOUT */
        mismatched();
        died(K_EXIT);
        died(K_ABORT);
        ring_and_off();
        two_worlds();
        split_labels();
        deep_labels();
        refused_root();
        if (!th_light()) no_memory_name(); /* a sanitizer's shadow memory needs more than the limit */
    }
    if (th_long()) stopped("tcp");
    return th_verdict("test_flight");
}
