/* cmd_flight.c - `tally flight DIR`: merges the flight records the ranks of a failed job wrote and says
 * where they diverged, which rank holds the job up, and what each rank was doing. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <tally.h>

#include "../src/coll/flight.h"
#include "../src/core/sig.h"
#include "cmd.h"

static void flight_usage(FILE *out) {
    fprintf(out, "usage: tally flight DIR\n"
                 "Reads the flight records the ranks of a job wrote to DIR when a collective timed out, lost a\n"
                 "peer, mismatched or was aborted, or a rank took a fatal signal (each rank keeps its last\n"
                 "TALLY_FLIGHT collectives, default 256; TALLY_FLIGHT=0 keeps none; TALLY_FLIGHT_DIR chooses\n"
                 "DIR, by default /tmp/tally-flight-<host>-<pid of rank 0>, named in the error message).\n"
                 "For each communicator it prints the first collective the ranks did not complete alike, the\n"
                 "rank that holds the job up and how that was found, and each rank's last collective.\n"
                 "Only the records of one job are read (the one with records of the most ranks): a file of\n"
                 "another job, a second record of a rank, a link, a file that is not a well-formed record, or\n"
                 "a file of a user who is neither you nor DIR's owner is ignored, and named with the reason.\n"
                 "Exit status: 0 with a verdict, 1 when the records name no rank (or DIR holds none).\n");
}

static void flight_sig(const tally__flight_entry *e, char *out, size_t n) { tally__sig_format(&e->sig, out, n); }

/* s as it is where printable, else \xNN: a file name in DIR is anyone's choice, and a newline or an
 * escape sequence in it must not forge a line of the report or drive the terminal. */
static void fprint_escaped(FILE *out, const char *s) {
    for (const unsigned char *c = (const unsigned char *)s; *c; c++)
        if (*c >= 0x20 && *c < 0x7f && *c != '\\')
            putc(*c, out);
        else
            fprintf(out, "\\x%02x", *c);
}

static void print_escaped(const char *s) { fprint_escaped(stdout, s); }

/* "rank 2: allreduce #4 (...) failed after 2.00 s (TIMEOUT), waiting for rank 3; blamed rank 2" */
static void flight_rank_line(const tally__flight_rank *r, uint64_t seq) {
    const tally__flight_entry *e = seq ? tally__flight_find(r, seq) : NULL, *last = r->n ? &r->e[r->n - 1] : NULL;
    printf("  rank %d", r->rank);
    if (r->world_rank != r->rank) printf(" (world rank %d)", r->world_rank);
    printf(" [");
    print_escaped(r->host); /* what a record says is text from a file: escaped as the names are */
    printf(" pid %d]: ", r->pid);
    if (!e) e = last;
    if (!e) {
        printf("no collective recorded (");
        print_escaped(r->reason);
        printf(")\n");
        return;
    }
    char what[200];
    flight_sig(e, what, sizeof what);
    uint64_t until = e->end_ns ? e->end_ns : r->dumped_ns; /* the realtime clock may have stepped back */
    double took = until > e->begin_ns ? (double)(until - e->begin_ns) * 1e-9 : 0.0;
    if (e->state == TALLY__FL_RUNNING)
        printf("in %s for %.3f s", what, took);
    else
        printf("%s %s after %.3f s", what, tally__flight_state_name(e->state), took);
    if (e->state == TALLY__FL_FAILED) printf(" (%s)", tally_strerror(e->rc));
    if (e->peer >= 0) printf(", waiting for rank %d", e->peer);
    if (e->culprit >= 0) printf("; the error named rank %d", e->culprit);
    if (seq && e->sig.seq != seq) printf(" (it never began #%" PRIu64 ")", seq);
    printf("\n");
}

/* unread: *.flight files not looked at, so a rank without a record read may have left one. */
static void flight_holder(const tally__flight_verdict *v, size_t unread) {
    if (v->holder < 0) {
        printf("  holding the job up: the records do not tell%s\n",
               v->mismatch ? " (more than one rank called something else)" : "");
        return;
    }
    if (v->mismatch) {
        printf("  holding the job up: rank %d, whose call differs from every other rank's\n", v->holder);
        return;
    }
    printf("  holding the job up: rank %d", v->holder);
    if (!v->holder_recorded && unread)
        printf(" (no record of it was read, and %zu *.flight file(s) were not looked at", unread);
    else if (!v->holder_recorded)
        printf(" (it left no record: stopped, hung outside tally, or killed");
    else if (v->holder_late_s < 0)
        printf(" (it never began the collective the others wait in");
    else
        printf(" (it began the collective %.3f s after the first rank", v->holder_late_s);
    if (v->waiting_on_holder) printf("; %d rank(s) waited for it", v->waiting_on_holder);
    printf(")\n");
}

static int flight_report(const tally__flight_rank *r, size_t n, size_t unread) {
    tally__flight_verdict v;
    tally__flight_analyze(r, n, &v);
    printf("communicator ");
    print_escaped(r[0].label);
    printf(": %d ranks, records from %zu (", v.size, n);
    print_escaped(r[0].transport);
    printf(")\n");
    if (v.missing > 0) {
        printf("  no record %s rank(s):", unread ? "read from" : "from");
        size_t i = 0; /* r is in rank order, each rank once */
        for (int k = 0; k < v.size; k++) {
            while (i < n && r[i].rank < k) i++;
            if (i == n || r[i].rank != k) printf(" %d", k);
        }
        printf("\n");
    }
    const tally__flight_entry *at = NULL;
    for (size_t i = 0; i < n && v.diverge_seq && !at; i++) at = tally__flight_find(&r[i], v.diverge_seq);
    if (at) {
        char what[200];
        flight_sig(at, what, sizeof what);
        printf("  first divergence: %s%s\n", what, v.mismatch ? ": the ranks called different collectives" : "");
    } else {
        printf("  first divergence: none in the records (every rank completed every collective they hold)\n");
    }
    flight_holder(&v, unread);
    for (size_t i = 0; i < n; i++) flight_rank_line(&r[i], v.diverge_seq);
    return v.holder >= 0 ? 0 : 1;
}

/* What the verdict below does not see: records cut to their newest entries for room, and entries whose
 * ranks were out of range (read as none). */
static void flight_notes(const char *dir, const tally__flight_set *s) {
    size_t cut = 0;
    for (size_t i = 0; i < s->n; i++) {
        cut += s->r[i].n_old > 0;
        if (!s->r[i].n_flagged) continue;
        printf("note: ");
        print_escaped(dir);
        putchar('/');
        print_escaped(s->r[i].file);
        printf(": %zu entr%s a rank outside the communicator's %d, read as none\n", s->r[i].n_flagged,
               s->r[i].n_flagged == 1 ? "y names" : "ies name", s->r[i].size);
    }
    if (cut)
        printf("note: %zu record(s) hold more entries than each may keep (%zu: tally flight keeps %d of a directory, "
               "shared by its *.flight files): their newest are read, the older not judged\n",
               cut, s->share, TALLY__FLIGHT_KEPT);
}

int tally_cmd_flight(int argc, char **argv) {
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        flight_usage(stdout);
        return 0;
    }
    if (argc != 2 || argv[1][0] == '-' || !argv[1][0]) {
        fprintf(stderr, "tally flight: %s\n", argc < 2 ? "DIR is missing" : "takes one directory");
        flight_usage(stderr);
        return 2;
    }
    tally__flight_set s;
    if (tally__flight_load(argv[1], &s)) {
        fputs("tally flight: ", stderr); /* the message may name a file of DIR, anyone's choice */
        fprint_escaped(stderr, tally_last_error());
        fputc('\n', stderr);
        return 1;
    }
    /* Files set aside first: the verdict below is of the other records alone. */
    if (s.dir_uid != (unsigned)geteuid()) {
        printf("note: ");
        print_escaped(argv[1]);
        printf(" belongs to uid %u, not you (uid %u): its records are what that user's processes wrote\n", s.dir_uid,
               (unsigned)geteuid());
    }
    for (size_t i = 0; i < s.n_skip; i++) {
        printf("ignored ");
        print_escaped(argv[1]);
        putchar('/');
        print_escaped(s.skip[i].file);
        printf(": ");
        print_escaped(s.skip[i].why);
        putchar('\n');
    }
    if (s.n_unread) {
        printf("ignored %zu more *.flight file(s) in ", s.n_unread);
        print_escaped(argv[1]);
        printf(": tally flight looks at no more than %d\n", TALLY__FLIGHT_FILES);
    }
    flight_notes(argv[1], &s);
    if (s.n == 0) {
        fflush(stdout);
        if (s.n_skip)
            fprintf(stderr,
                    "tally flight: %s holds no flight records it can read: each *.flight file there was "
                    "ignored (above)\n",
                    argv[1]);
        else
            fprintf(stderr, "tally flight: %s holds no flight records (*.flight)\n", argv[1]);
        tally__flight_set_free(&s);
        return 1;
    }
    if (s.job[0]) {
        printf("job ");
        print_escaped(s.job);
        printf(": %zu record(s)\n", s.n);
    }
    int rc = 1;
    for (size_t i = 0; i < s.n;) {
        size_t j = i;
        while (j < s.n && !strcmp(s.r[j].label, s.r[i].label)) j++;
        if (flight_report(&s.r[i], j - i, s.n_unread) == 0) rc = 0;
        i = j;
    }
    tally__flight_set_free(&s);
    return rc;
}
