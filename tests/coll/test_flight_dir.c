/* test_flight_dir.c - the flight recorder's directory against another local user: the default name
 * ($TMPDIR/tally-flight-<host>-<pid of rank 0>) planted first as a link, as a 0777 directory or as one of
 * another uid is not used and nothing is written through it; a link at a record's name inside is
 * replaced, not followed; TALLY_FLIGHT_DIR's rules (a directory of this user's, or a sticky one; a link
 * only of this user's or root's); and `tally flight` reads one job's records, naming each file it
 * ignored (another job's, another user's, a link, a second record of a rank) with the verdict unchanged.
 * The tests run as root, who passes every permission check: ownership is made with chown to 65534 and
 * checked as such (without root those cases are skipped). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <tally.h>
#include <unistd.h>

#include "coll/flight.h"
#include "harness.h"
#include "tool_runner.h"

#define OTHER   65534 /* nobody: another local user */
#define JOB_PID 4242

static char base[256]; /* $TMPDIR for the writer: the default directory is base/tally-flight-h-4242 */
static char def_dir[320];
static int root;

static void reset(void) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", base, base);
    char out[256];
    th_shell(cmd, 20, out, sizeof out);
}

static int is_regular(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int exists(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

static void read_text(const char *path, char *out, size_t n) {
    out[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f) return;
    size_t got = fread(out, 1, n - 1, f);
    out[got] = '\0';
    fclose(f);
}

/* Files in dir (. and .. aside). */
static int count_files(const char *dir) {
    char cmd[400], out[64];
    snprintf(cmd, sizeof cmd, "ls -A '%s' | wc -l", dir);
    if (th_shell(cmd, 20, out, sizeof out) != 0) return -1;
    return atoi(out);
}

/* A communicator's recorder of rank `rank` of `size` (job JOB_PID with draw `draw`), in dir ("": the
 * default), with collectives #1..#last done and, unless it is 0, #fail failed waiting for `peer`; then the
 * dump. Returns the dump's result, with f kept for its why. */
static int record(tally__flight *f, int rank, int size, const char *dir, uint32_t draw, int last, int fail, int peer) {
    tally__flight_init(f, rank, size, rank, 0, NULL, 0, "h", JOB_PID, draw, 16, dir);
    tally__flight_set_transport(f, "shm");
    for (int s = 1; s <= last; s++) {
        tally__sig sig = {.seq = (uint64_t)s, .count = 8, .root = -1, .coll = TALLY__ALLREDUCE};
        tally__flight_begin(f, &sig);
        tally__flight_end(f, 0, -1);
    }
    if (fail) {
        tally__sig sig = {.seq = (uint64_t)fail, .count = 8, .root = -1, .coll = TALLY__ALLREDUCE};
        tally__flight_begin(f, &sig);
        atomic_store(&f->awaited, peer);
        tally__flight_end(f, TALLY_E_TIMEOUT, -1);
    }
    int rc = tally__flight_dump(f, "TIMEOUT", -1, "a test");
    tally__flight_fini(f);
    return rc;
}

/* The name rank `rank`'s world record of job h-4242-<draw> is written under. */
static const char *rec(int rank, uint32_t draw) {
    static char name[4][96];
    static int k;
    char *out = name[k++ & 3];
    snprintf(out, 96, "rank%d.world.h-%d-%08x.flight", rank, JOB_PID, (unsigned)draw);
    return out;
}

static void why_of(const tally__flight *f, char *out, size_t n) { tally__flight_why(f, out, n); }

/* A directory another user owns with files of theirs: it must come out of a refused dump unchanged. */
static void victim_dir(const char *dir, int owner) {
    mkdir(dir, 0777);
    chmod(dir, 0777);
    th_write_file(th_path(dir, rec(0, 1)), "precious\n", 9);
    if (owner >= 0) {
        if (chown(dir, (uid_t)owner, (gid_t)owner) || chown(th_path(dir, rec(0, 1)), (uid_t)owner, (gid_t)owner))
            TH_CHECK(0, "chown %s: %s", dir, strerror(errno));
    }
}

static void victim_unchanged(const char *what, const char *dir) {
    char text[64];
    read_text(th_path(dir, rec(0, 1)), text, sizeof text);
    TH_CHECK(!strcmp(text, "precious\n"), "%s: the file in %s was replaced: \"%s\"", what, dir, text);
    TH_CHECK(count_files(dir) == 1, "%s: %d files in %s, want its one file (nothing written there)", what,
             count_files(dir), dir);
}

/* ---- the default directory -------------------------------------------------------------------- */

/* Missing: made 0700, ours, and the record is in it. */
static void fresh(void) {
    reset();
    tally__flight f;
    int rc = record(&f, 0, 2, "", 7, 3, 0, -1);
    struct stat st;
    TH_CHECK(rc == 0 && stat(def_dir, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 07777) == 0700 &&
                 st.st_uid == geteuid(),
             "fresh: rc %d, %s mode %o uid %u, want a 0700 directory of ours", rc, def_dir,
             (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid);
    char text[4096];
    read_text(th_path(def_dir, rec(0, 7)), text, sizeof text);
    TH_CHECK(strstr(text, "tally-flight 2\njob h-4242-00000007\n") != NULL, "fresh: the record has no job line:\n%s",
             text);
    /* Again into the one made: an earlier dump of this user's left it, and it is taken. */
    rc = record(&f, 1, 2, "", 7, 3, 0, -1);
    TH_CHECK(rc == 0 && is_regular(th_path(def_dir, rec(1, 7))), "fresh: a second rank's dump: rc %d", rc);
}

/* (a) A link at the default name, to a directory of another user's (and one to ours, made by the
 * attacker): refused, nothing written through it. */
static void planted_link(void) {
    char victim[320], why[1024];
    snprintf(victim, sizeof victim, "%s/victim", base);
    for (int owner_case = 0; owner_case < 2; owner_case++) {
        reset();
        victim_dir(victim, owner_case && root ? OTHER : -1);
        if (symlink(victim, def_dir)) TH_CHECK(0, "symlink: %s", strerror(errno));
        if (root && lchown(def_dir, OTHER, OTHER)) TH_CHECK(0, "lchown: %s", strerror(errno));
        tally__flight f;
        int rc = record(&f, 0, 2, "", 1, 3, 0, -1);
        why_of(&f, why, sizeof why);
        TH_CHECK(rc == -1 && f.why == TALLY__FL_WHY_LINK && strstr(why, def_dir) && strstr(why, "symbolic link"),
                 "planted link: rc %d why %d: %s", rc, f.why, why);
        victim_unchanged("planted link", victim);
        printf("  a link at %s: %s\n", def_dir, why);
    }
}

/* (b) A 0777 directory at the default name (ours: made by someone with the same uid, or by root for
 * another), and a 0700 one of another uid: refused, nothing written in them. */
static void planted_dirs(void) {
    char why[1024];
    reset();
    victim_dir(def_dir, -1); /* 0777, ours */
    tally__flight f;
    int rc = record(&f, 0, 2, "", 1, 3, 0, -1);
    why_of(&f, why, sizeof why);
    TH_CHECK(rc == -1 && f.why == TALLY__FL_WHY_MODE && strstr(why, "0777"), "0777 dir: rc %d why %d: %s", rc, f.why,
             why);
    victim_unchanged("0777 dir", def_dir);
    printf("  a 0777 directory: %s\n", why);
    if (!root) {
        printf("  (not root: another user's directory is not made)\n");
        return;
    }
    for (int mode = 0; mode < 2; mode++) {
        reset();
        victim_dir(def_dir, OTHER);
        chmod(def_dir, mode ? 0700 : 01777);
        rc = record(&f, 0, 2, "", 1, 3, 0, -1);
        why_of(&f, why, sizeof why);
        TH_CHECK(rc == -1 && f.why == TALLY__FL_WHY_OWNER && strstr(why, "uid 65534"),
                 "another uid's dir (mode %o): rc %d why %d: %s", mode ? 0700 : 01777, rc, f.why, why);
        victim_unchanged("another uid's dir", def_dir);
        if (mode) printf("  another user's directory: %s\n", why);
    }
}

/* (d) A link at a record's name (and at its temporary name) in a genuine directory: the record replaces
 * the link, the file it points to is untouched. */
static void link_at_record(void) {
    reset();
    char victim[320];
    snprintf(victim, sizeof victim, "%s/victim", base);
    victim_dir(victim, root ? OTHER : -1);
    mkdir(def_dir, 0700);
    char tmp[128];
    snprintf(tmp, sizeof tmp, "%s.tmp", rec(0, 1));
    const char *target = th_path(victim, rec(0, 1));
    if (symlink(target, th_path(def_dir, rec(0, 1))) || symlink(target, th_path(def_dir, tmp)))
        TH_CHECK(0, "symlink: %s", strerror(errno));
    tally__flight f;
    int rc = record(&f, 0, 2, "", 1, 3, 0, -1);
    TH_CHECK(rc == 0, "link at the record's name: the dump failed (%d)", rc);
    victim_unchanged("link at the record's name", victim);
    char text[4096];
    read_text(th_path(def_dir, rec(0, 1)), text, sizeof text);
    TH_CHECK(is_regular(th_path(def_dir, rec(0, 1))) && strstr(text, "tally-flight 2\n") &&
                 !exists(th_path(def_dir, tmp)),
             "link at the record's name: the record is not a file of its own in its place");
}

/* ---- TALLY_FLIGHT_DIR --------------------------------------------------------------------------- */

static void chosen_dir(void) {
    char dir[320], link[320], why[1024];
    tally__flight f;
    int rc;
    reset();
    /* Missing, parents too: made. */
    snprintf(dir, sizeof dir, "%s/a/b/records/", base);
    rc = record(&f, 0, 2, dir, 1, 3, 0, -1);
    TH_CHECK(rc == 0 && is_regular(th_path(dir, rec(0, 1))), "a chosen directory with parents to make: %d", rc);
    /* A link of this user's to a directory of theirs: followed. */
    snprintf(link, sizeof link, "%s/mine", base);
    if (symlink(dir, link)) TH_CHECK(0, "symlink: %s", strerror(errno));
    rc = record(&f, 1, 2, link, 1, 3, 0, -1);
    TH_CHECK(rc == 0 && is_regular(th_path(dir, rec(1, 1))), "a chosen link of ours: %d", rc);
    /* A directory of this user's that group or others may write in: refused (they could remove or replace
     * the records), unless it is sticky. */
    chmod(dir, 0770);
    rc = record(&f, 0, 2, dir, 1, 3, 0, -1);
    why_of(&f, why, sizeof why);
    TH_CHECK(rc == -1 && f.why == TALLY__FL_WHY_MODE && strstr(why, "0770") && strstr(why, "go-w"),
             "a chosen 0770 directory of ours: rc %d: %s", rc, why);
    chmod(dir, 01777);
    rc = record(&f, 0, 2, dir, 1, 3, 0, -1);
    TH_CHECK(rc == 0, "a chosen sticky 01777 directory of ours: %d", rc);
    struct stat rst;
    TH_CHECK(stat(th_path(dir, rec(0, 1)), &rst) == 0 && (rst.st_mode & 07777) == 0600,
             "a record's mode is %o, not 600", (unsigned)(rst.st_mode & 07777));
    chmod(dir, 0700);
    if (!root) return;
    /* Another user's link, to a directory of ours: not followed. */
    if (lchown(link, OTHER, OTHER)) TH_CHECK(0, "lchown: %s", strerror(errno));
    rc = record(&f, 0, 2, link, 1, 3, 0, -1);
    why_of(&f, why, sizeof why);
    TH_CHECK(rc == -1 && f.why == TALLY__FL_WHY_LINK, "another user's link as TALLY_FLIGHT_DIR: rc %d: %s", rc, why);
    /* Another user's directory, open to all but not sticky: refused; sticky (as /tmp): used. */
    char victim[320];
    snprintf(victim, sizeof victim, "%s/theirs", base);
    victim_dir(victim, OTHER);
    rc = record(&f, 0, 2, victim, 1, 3, 0, -1);
    why_of(&f, why, sizeof why);
    TH_CHECK(rc == -1 && f.why == TALLY__FL_WHY_OWNER && strstr(why, "not sticky"),
             "another user's 0777 directory as TALLY_FLIGHT_DIR: rc %d: %s", rc, why);
    victim_unchanged("another user's 0777 directory as TALLY_FLIGHT_DIR", victim);
    /* Sticky but another user's (not root's): its owner could still replace the records: refused. */
    chmod(victim, 01777);
    rc = record(&f, 1, 2, victim, 1, 3, 0, -1);
    why_of(&f, why, sizeof why);
    TH_CHECK(rc == -1 && f.why == TALLY__FL_WHY_OWNER && strstr(why, "though sticky"),
             "another user's sticky directory: rc %d: %s", rc, why);
    TH_CHECK(!is_regular(th_path(victim, rec(1, 1))), "a record was written to another user's directory");
    /* Root's sticky directory (as /tmp): used. */
    if (chown(victim, 0, 0)) TH_CHECK(0, "chown: %s", strerror(errno));
    rc = record(&f, 1, 2, victim, 1, 3, 0, -1);
    TH_CHECK(rc == 0 && is_regular(th_path(victim, rec(1, 1))), "root's sticky directory: %d", rc);
}

/* ---- a whole job: rank 0's default directory planted as a link before it starts ------------------- */

typedef struct {
    char msg[2048];
    int code;
} job_shared;
static job_shared *J;

static void job_env(int rank, void *arg) {
    (void)rank;
    (void)arg;
    unsetenv("TALLY_FLIGHT_DIR");
    setenv("TMPDIR", base, 1);
}

static int job_rank(int rank, int n, void *arg) {
    (void)n;
    (void)arg;
    if (rank == 0) { /* the directory this job will use, as another user would guess it */
        char host[64] = "", dir[400];
        const char *named = getenv("TALLY_HOST");
        if (named && named[0])
            snprintf(host, sizeof host, "%s", named);
        else
            gethostname(host, sizeof host - 1);
        snprintf(dir, sizeof dir, "%s/tally-flight-%s-%d", base, host, (int)getpid());
        if (symlink(th_path(base, "victim"), dir) || (root && lchown(dir, OTHER, OTHER))) return 3;
    }
    tally_comm *c;
    if (tally_comm_init(&c)) return 2;
    float x[4] = {0};
    int rc = tally_allreduce(c, x, x, 4, TALLY_F32, TALLY_SUM);
    if (rank == 1) _exit(0); /* gone without a goodbye: rank 0's next call fails and dumps */
    if (!rc) rc = tally_allreduce(c, x, x, 4, TALLY_F32, TALLY_SUM);
    J->code = rc;
    snprintf(J->msg, sizeof J->msg, "%s", tally_last_error());
    tally_comm_free(c);
    return 0;
}

static void whole_job(void) {
    reset();
    char victim[320];
    snprintf(victim, sizeof victim, "%s/victim", base);
    victim_dir(victim, root ? OTHER : -1);
    J = th_shared_alloc(sizeof *J);
    th_opts o = {.transport = "shm", .timeout_s = 5, .wall_s = 60, .child_env = job_env};
    int bad = th_run(2, &o, job_rank, NULL);
    TH_CHECK(bad == 0, "a job with its directory planted: %d rank(s) failed", bad);
    TH_CHECK(J->code == TALLY_E_PEER_LOST && strstr(J->msg, "flight records were not written") &&
                 strstr(J->msg, "symbolic link") && strstr(J->msg, base),
             "a job with its directory planted: rank 0 got %s, its message does not say the link was refused: %s",
             tally_strerror(J->code), J->msg);
    victim_unchanged("a job with its directory planted", victim);
    printf("  a job whose directory was planted: %s\n", J->msg);
    th_shared_free(J, sizeof *J);
}

/* ---- (c) tally flight reads one job ----------------------------------------------------------------- */

/* `tally flight dir`: its exit status and output. */
static int tool(const char *dir, th_tool *t) {
    const char *args[] = {"flight", dir, NULL};
    th_tool_opts o = {.wall_s = 30};
    th_tool_run(args, &o, t);
    return t->rc;
}

/* The report from the job line on: what the verdict is, beside the ignored files. */
static const char *report(const th_tool *t) {
    if (!strncmp(t->out, "job ", 4)) return t->out;
    const char *j = strstr(t->out, "\njob ");
    return j ? j + 1 : t->out;
}

static void reader(void) {
    reset();
    char dir[320];
    snprintf(dir, sizeof dir, "%s/records", base);
    /* The job: 3 ranks, rank 2 never began #4; ranks 0 and 1 time out there waiting for it. */
    tally__flight f;
    int rc = record(&f, 0, 3, dir, 0xabc, 3, 4, 2) | record(&f, 1, 3, dir, 0xabc, 3, 4, 2) |
             record(&f, 2, 3, dir, 0xabc, 3, 0, -1);
    TH_CHECK(rc == 0, "reader: the job's records could not be written");
    th_tool *before = malloc(sizeof *before), *after = malloc(sizeof *after);
    tool(dir, before);
    TH_CHECK(before->rc == 0 && strstr(before->out, "holding the job up: rank 2") &&
                 strstr(before->out, "job h-4242-00000abc: 3 record(s)") && !strstr(before->out, "ignored"),
             "reader: the genuine records alone:\n%s", before->out);
    /* Another job of the same host and pid (an earlier one: the pid was reused), whose rank 3 of 4 blames
     * rank 0; rank 1's record again under another name; another user's copy of rank 2's record with the
     * job's own line; a link to a record elsewhere. */
    rc = record(&f, 3, 4, dir, 0x999, 3, 4, 0);
    char text[4096], other[320];
    read_text(th_path(dir, rec(1, 0xabc)), text, sizeof text);
    th_write_file(th_path(dir, "copy-of-rank1.world.flight"), text, strlen(text));
    snprintf(other, sizeof other, "%s/elsewhere", base);
    rc |= record(&f, 0, 3, other, 0xabc, 2, 3, 1);
    if (symlink(th_path(other, rec(0, 0xabc)), th_path(dir, "rank7.world.flight")))
        TH_CHECK(0, "symlink: %s", strerror(errno));
    if (root) {
        read_text(th_path(dir, rec(2, 0xabc)), text, sizeof text);
        th_write_file(th_path(dir, "rank5.world.flight"), text, strlen(text));
        if (chown(th_path(dir, "rank5.world.flight"), OTHER, OTHER)) TH_CHECK(0, "chown: %s", strerror(errno));
    }
    /* A name that would forge a line of the report and move the terminal's cursor. */
    th_write_file(th_path(dir, "x\nholding the job up: rank 0\x1b[2A.flight"), "junk\n", 5);
    TH_CHECK(rc == 0, "reader: the other records could not be written");
    tool(dir, after);
    TH_CHECK(strstr(after->out, "x\\x0aholding the job up: rank 0\\x1b[2A.flight") && !strchr(after->out, 0x1b),
             "reader: a file name with a newline and an escape is printed raw:\n%s", after->out);
    char theirs[160];
    snprintf(theirs, sizeof theirs, "/%s: of another job (h-4242-00000999, with records of 1 rank(s))", rec(3, 0x999));
    const char *want[] = {"ignored ",
                          theirs,
                          "/copy-of-rank1.world.flight: a second record of rank 1 of communicator world",
                          "/rank7.world.flight: is a symbolic link",
                          root ? "/rank5.world.flight: belongs to uid 65534" : "ignored",
                          NULL};
    for (int i = 0; want[i]; i++)
        TH_CHECK(strstr(after->out, want[i]) != NULL, "reader: tally flight does not say \"%s\":\n%s", want[i],
                 after->out);
    TH_CHECK(after->rc == before->rc && !strcmp(report(after), report(before)),
             "reader: the verdict changed with the others' files:\n--- before\n%s--- after\n%s", before->out,
             after->out);
    printf("  tally flight with planted records says:\n%s", after->out);
    /* Records of more ranks of the other job: that is the job read, and the first is ignored. Its records
     * of ranks 0 and 1 are beside the first job's, not over them. */
    record(&f, 0, 4, dir, 0x999, 3, 4, 0);
    record(&f, 1, 4, dir, 0x999, 3, 4, 0);
    record(&f, 2, 4, dir, 0x999, 3, 4, 0);
    tool(dir, after);
    snprintf(theirs, sizeof theirs, "/%s: of another job (h-4242-00000abc, with records of 3 rank(s))", rec(2, 0xabc));
    TH_CHECK(strstr(after->out, "job h-4242-00000999: 4 record(s)") && strstr(after->out, theirs) &&
                 is_regular(th_path(dir, rec(0, 0xabc))),
             "reader: the job of the most ranks is not the one read:\n%s", after->out);
    /* Another user's directory: read, with a note that its records are that user's word. */
    if (root) {
        if (chown(dir, OTHER, OTHER)) TH_CHECK(0, "chown: %s", strerror(errno));
        tool(dir, after);
        TH_CHECK(strstr(after->out, "belongs to uid 65534, not you"),
                 "reader: another user's directory read without a note:\n%s", after->out);
    }
    free(before);
    free(after);
}

int main(void) {
    root = geteuid() == 0;
    snprintf(base, sizeof base, "/tmp/tally-test-flight-dir-%d", (int)getpid());
    snprintf(def_dir, sizeof def_dir, "%s/tally-flight-h-%d", base, JOB_PID);
    setenv("TMPDIR", base, 1);
    if (th_quick()) {
        fresh();
        planted_link();
        planted_dirs();
        link_at_record();
        chosen_dir();
        reader();
        whole_job();
    }
    char cmd[400], out[64];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
    th_shell(cmd, 20, out, sizeof out);
    return th_verdict("test_flight_dir");
}
