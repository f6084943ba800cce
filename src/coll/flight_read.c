/* flight_read.c - the flight recorder's reading side (tally flight): every rank's records of a directory
 * loaded, and per communicator the first collective the ranks did not complete alike and who holds it up. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <tally.h>

#include "../boot/boot.h"
#include "../core/file.h"
#include "../core/parse.h"
#include "coll.h"
#include "flight.h"

/* ---- parsing ----------------------------------------------------------------------------------- */

/* A record is untrusted input: anyone who may write in the directory may have put it there. Every line
 * is bounded, every number is parsed whole and in range, every name is one the writer writes, and what
 * the reader allocates is bounded by TALLY__FLIGHT_MAX, never by what a file claims. */

static int fl_name(const char *s, int lo, int hi, const char *(*name)(int)) {
    for (int k = lo; k <= hi; k++)
        if (!strcmp(s, name(k))) return k;
    return -1;
}
static const char *fl_dtype(int k) { return tally_dtype_name((tally_dtype)k); }
static const char *fl_op(int k) { return tally_op_name((tally_op)k); }
static const char *fl_coll(int k) { return tally__coll_name(k); }

typedef struct fl_parse {
    char *p, *end; /* the text not yet read */
    int line;      /* the number of the line last read */
    int line_max;  /* a line's bound, its end included: the version's */
    int version;   /* the header's */
    unsigned seen; /* header keys read (1 << FK_*) */
    int head;      /* header lines read */
    uint64_t want; /* entries the record says it holds */
    int flagged;   /* the entry being read named a rank out of range */
    size_t room;   /* entries the caller keeps of this record: its newest */
    tally__flight_rank *r;
    char *why;
    size_t wn;
} fl_parse;

/* A record set aside: why names the line ("line 4: rank='-1' is out of range: ..."). */
static int fl_bad(fl_parse *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fl_bad(fl_parse *x, const char *fmt, ...) {
    int k = snprintf(x->why, x->wn, "not a flight record: line %d: ", x->line);
    va_list ap;
    va_start(ap, fmt);
    if (k > 0 && (size_t)k < x->wn) vsnprintf(x->why + k, x->wn - (size_t)k, fmt, ap);
    va_end(ap);
    return TALLY_E_INVALID;
}

/* The strict parser's message (tally_last_error: "rank='x' is not a whole number: ...") as the reason. */
static int fl_bad_value(fl_parse *x) { return fl_bad(x, "%s", tally_last_error()); }

static int fl_int(fl_parse *x, const char *name, const char *v, long long lo, long long hi, long long *out) {
    return tally__parse_int(name, v, lo, hi, out) ? fl_bad_value(x) : 0;
}

static int fl_u64(fl_parse *x, const char *name, const char *v, uint64_t *out) {
    return tally__parse_u64(name, v, out) ? fl_bad_value(x) : 0;
}

/* The next line, its end made a NUL, or NULL at the end of the text (*rc 0) or at a line that breaks a
 * bound (*rc TALLY_E_INVALID, with why). */
static char *fl_line(fl_parse *x, int *rc) {
    *rc = 0;
    if (x->p == x->end) return NULL;
    x->line++;
    size_t left = (size_t)(x->end - x->p);
    size_t max = (size_t)x->line_max;
    char *nl = memchr(x->p, '\n', left < max ? left : max);
    if (!nl) {
        *rc = left < max ? fl_bad(x, "it has no end: the record was cut short (a write interrupted?)")
                         : fl_bad(x, "it is longer than %zu bytes, which no line of a format version %d record is",
                                  max - 1, x->version ? x->version : 1);
        return NULL;
    }
    if (memchr(x->p, '\0', (size_t)(nl - x->p))) {
        *rc = fl_bad(x, "it holds a NUL byte, which no record's line does");
        return NULL;
    }
    char *line = x->p;
    *nl = '\0';
    x->p = nl + 1;
    return line;
}

/* Lines in the text not yet read, a last one without its end included. */
static uint64_t fl_lines_left(const fl_parse *x) {
    uint64_t n = 0;
    const char *q = x->p;
    for (const char *nl; q < x->end && (nl = memchr(q, '\n', (size_t)(x->end - q))); q = nl + 1) n++;
    return n + (q < x->end);
}

/* "tally-flight <version>": the versions this reader knows (TALLY__FLIGHT_FORMAT and older). */
static int fl_parse_version(fl_parse *x, const char *line) {
    static const char magic[] = "tally-flight ";
    if (strncmp(line, magic, sizeof magic - 1))
        return fl_bad(x, "it is not \"tally-flight <version>\", the first line of every record");
    long long v;
    if (tally__parse_int("version", line + sizeof magic - 1, 1, INT32_MAX, &v)) return fl_bad_value(x);
    if (v > TALLY__FLIGHT_FORMAT)
        return fl_bad(x,
                      "format version %lld, newer than this tally reads (1 to %d): read it with the tally that "
                      "wrote it",
                      v, TALLY__FLIGHT_FORMAT);
    x->version = (int)v;
    x->line_max = v == 1 ? TALLY__FLIGHT_LINE_V1 : TALLY__FLIGHT_LINE;
    return 0;
}

/* A rank of an entry (root, peer, culprit): a whole number of 32 bits; outside -1..size-1 it is read as
 * -1, none, and counted: an older writer recorded a refused call's root unchecked, and one such field
 * is no reason to lose the record (no rank it names is used). */
static int fl_rank(fl_parse *x, const char *name, const char *v, int32_t *out) {
    long long k;
    if (fl_int(x, name, v, INT32_MIN, INT32_MAX, &k)) return TALLY_E_INVALID;
    *out = k >= -1 && k < x->r->size ? (int32_t)k : -1;
    x->flagged |= *out != k;
    return 0;
}

/* One entry: e seq coll count dtype op root algo state rc peer culprit begin_ns end_ns, each field
 * parsed whole and in range (ranks as fl_rank reads them). */
static int fl_parse_entry(fl_parse *x, char *line, tally__flight_entry *e) {
    char *f[14];
    int nf = 0;
    for (char *q = line + 2; nf < 14; nf++) {
        f[nf] = q;
        q = strchr(q, ' ');
        if (!q) {
            nf++;
            break;
        }
        *q++ = '\0';
    }
    if (nf > 13) return fl_bad(x, "an entry of more than 13 fields, where an entry has 13");
    if (nf < 13) return fl_bad(x, "an entry of %d fields, where an entry has 13", nf);
    for (int i = 0; i < 13; i++)
        if (!f[i][0]) return fl_bad(x, "an entry with an empty field (field %d)", i + 1);
    uint64_t seq, count, b, end;
    long long rc;
    int32_t root, peer, culprit;
    int c, d, o, a, st;
    x->flagged = 0;
    int bad = fl_u64(x, "seq", f[0], &seq) || fl_u64(x, "count", f[2], &count) || fl_rank(x, "root", f[5], &root) ||
              fl_int(x, "rc", f[8], INT32_MIN, 0, &rc) || fl_rank(x, "peer", f[9], &peer) ||
              fl_rank(x, "culprit", f[10], &culprit) || fl_u64(x, "begin_ns", f[11], &b) ||
              fl_u64(x, "end_ns", f[12], &end);
    if (bad) return TALLY_E_INVALID;
    x->r->n_flagged += x->flagged;
    if (seq == 0) return fl_bad(x, "seq 0: a communicator's collectives are numbered from 1");
    if ((c = fl_name(f[1], 0, TALLY__COLL_COUNT - 1, fl_coll)) < 0) return fl_bad(x, "'%.32s' is no collective", f[1]);
    if ((d = fl_name(f[3], 0, TALLY_DTYPE_COUNT - 1, fl_dtype)) < 0) return fl_bad(x, "'%.32s' is no dtype", f[3]);
    if ((o = fl_name(f[4], 0, TALLY_OP_COUNT - 1, fl_op)) < 0) return fl_bad(x, "'%.32s' is no op", f[4]);
    if ((a = tally__algo_parse(f[6])) < 0) return fl_bad(x, "'%.32s' is no algorithm", f[6]);
    if ((st = fl_name(f[7], TALLY__FL_RUNNING, TALLY__FL_FAILED, tally__flight_state_name)) < 0)
        return fl_bad(x, "'%.32s' is no state (running, done or failed)", f[7]);
    *e = (tally__flight_entry){.sig = {.seq = seq,
                                       .count = count,
                                       .root = root,
                                       .coll = (uint8_t)c,
                                       .dtype = (uint8_t)d,
                                       .op = (uint8_t)o,
                                       .algo = (uint8_t)a},
                               .begin_ns = b,
                               .end_ns = end,
                               .state = st,
                               .rc = (int32_t)rc,
                               .peer = peer,
                               .culprit = culprit};
    return 0;
}

enum {
    FK_JOB,
    FK_LABEL,
    FK_HOST,
    FK_TRANSPORT,
    FK_REASON,
    FK_MESSAGE,
    FK_RANK,
    FK_WORLD_RANK,
    FK_SIZE,
    FK_PID,
    FK_CULPRIT,
    FK_DUMPED,
    FK_ENTRIES,
    FK_COUNT
};
static const char *const fl_keys[FK_COUNT] = {"job",     "label",     "host",       "transport", "reason",
                                              "message", "rank",      "world_rank", "size",      "pid",
                                              "culprit", "dumped_ns", "entries"};

/* A text value: not empty, and whole in its field (a message alone may be cut to fit: it is only shown). */
static int fl_text(fl_parse *x, int k, const char *v, char *to, size_t cap) {
    if (!v[0]) return fl_bad(x, "its %s is empty", fl_keys[k]);
    if (k != FK_MESSAGE && strlen(v) >= cap)
        return fl_bad(x, "its %s is longer than %zu characters, which no writer's is", fl_keys[k], cap - 1);
    snprintf(to, cap, "%s", v);
    return 0;
}

/* "entries N": at most TALLY__FLIGHT_MAX (a ring's largest), after the size the entries' ranks are
 * checked against, no more than the lines that follow; the array is then allocated once (at most
 * TALLY__FLIGHT_MAX entries, cut to the caller's room once sorted). */
static int fl_parse_entries(fl_parse *x, const char *v) {
    long long n;
    if (!(x->seen & (1u << FK_SIZE)))
        return fl_bad(x, "no size line before \"entries N\": every record has one, and the entries' ranks are "
                         "checked against it");
    if (fl_int(x, "entries", v, 0, TALLY__FLIGHT_MAX, &n)) return TALLY_E_INVALID;
    uint64_t left = fl_lines_left(x);
    if ((uint64_t)n > left)
        return fl_bad(x, "entries %lld, but %llu line(s) follow: the record was cut short (a write interrupted?)", n,
                      (unsigned long long)left);
    x->want = (uint64_t)n;
    if (n && !(x->r->e = malloc((size_t)n * sizeof *x->r->e)))
        return tally__seterr(TALLY_E_NOMEM, "out of memory for %lld entries of %s", n, x->r->file);
    return 0;
}

/* A header line "key value". A key no writer repeats is refused the second time; an unknown key is
 * skipped (a newer writer's, of the same format version). */
static int fl_parse_key(fl_parse *x, char *line) {
    tally__flight_rank *r = x->r;
    char *sp = strchr(line, ' ');
    if (!sp) return fl_bad(x, "'%.40s' is neither \"key value\" nor an entry", line);
    *sp = '\0';
    const char *v = sp + 1;
    int k = 0;
    while (k < FK_COUNT && strcmp(line, fl_keys[k])) k++;
    if (k == FK_COUNT) return 0;
    if (x->seen & (1u << k)) return fl_bad(x, "a second %s line", fl_keys[k]);
    x->seen |= 1u << k;
    long long i = 0;
    int bad = 0;
    switch (k) {
    case FK_JOB: return fl_text(x, k, v, r->job, sizeof r->job);
    case FK_LABEL: return fl_text(x, k, v, r->label, sizeof r->label);
    case FK_HOST: return fl_text(x, k, v, r->host, sizeof r->host);
    case FK_TRANSPORT: return fl_text(x, k, v, r->transport, sizeof r->transport);
    case FK_REASON: return fl_text(x, k, v, r->reason, sizeof r->reason);
    case FK_MESSAGE: return fl_text(x, k, v, r->msg, sizeof r->msg);
    case FK_DUMPED: return fl_u64(x, "dumped_ns", v, &r->dumped_ns);
    case FK_ENTRIES: return fl_parse_entries(x, v);
    case FK_RANK: bad = fl_int(x, "rank", v, 0, TALLY__BOOT_MAX_SIZE - 1, &i), r->rank = (int)i; break;
    case FK_WORLD_RANK:
        bad = fl_int(x, "world_rank", v, 0, TALLY__BOOT_MAX_SIZE - 1, &i), r->world_rank = (int)i;
        break;
    case FK_SIZE: bad = fl_int(x, "size", v, 1, TALLY__BOOT_MAX_SIZE, &i), r->size = (int)i; break;
    case FK_PID: bad = fl_int(x, "pid", v, 1, INT32_MAX, &i), r->pid = (int)i; break;
    case FK_CULPRIT: bad = fl_int(x, "culprit", v, -1, TALLY__BOOT_MAX_SIZE - 1, &i), r->culprit = (int)i; break;
    }
    return bad ? TALLY_E_INVALID : 0;
}

/* One line after the first: an entry (after "entries", no more than it said) or a header line. */
static int fl_parse_line(fl_parse *x, char *line) {
    if (line[0] == 'e' && line[1] == ' ') {
        if (!(x->seen & (1u << FK_ENTRIES))) return fl_bad(x, "an entry before the line \"entries N\"");
        if (x->r->n == x->want)
            return fl_bad(x, "more entry lines than \"entries %llu\" says", (unsigned long long)x->want);
        if (strlen(line) >= TALLY__FLIGHT_ENTRY_LINE)
            return fl_bad(x, "an entry longer than %d bytes, which no entry is", TALLY__FLIGHT_ENTRY_LINE - 1);
        return fl_parse_entry(x, line, &x->r->e[x->r->n++]) ? TALLY_E_INVALID : 0;
    }
    if (++x->head > TALLY__FLIGHT_HEAD) return fl_bad(x, "more than %d header lines", TALLY__FLIGHT_HEAD);
    return fl_parse_key(x, line);
}

/* Of r's entries (in sequence order) the newest `room`: the failure is at the end of every record. */
static void fl_keep_newest(tally__flight_rank *r, size_t room) {
    if (r->n <= room) return;
    r->n_old = r->n - room;
    memmove(r->e, r->e + r->n_old, room * sizeof *r->e);
    r->n = room;
    tally__flight_entry *less = realloc(r->e, (room ? room : 1) * sizeof *r->e);
    if (less) r->e = less; /* else the larger block stays: only memory */
}

static int fl_by_seq(const void *a, const void *b) {
    uint64_t x = ((const tally__flight_entry *)a)->sig.seq, y = ((const tally__flight_entry *)b)->sig.seq;
    return x < y ? -1 : x > y;
}

/* What the whole record must hold: its label, rank below its size, every entry it said, each
 * collective once. */
static int fl_parse_check(fl_parse *x) {
    tally__flight_rank *r = x->r;
    x->line++; /* past the last line: "line N" is where the missing thing was due */
    if (!(x->seen & (1u << FK_ENTRIES)) || r->n != x->want)
        return x->seen & (1u << FK_ENTRIES)
                   ? fl_bad(x, "\"entries %llu\", but %zu entry line(s): the record was cut short",
                            (unsigned long long)x->want, r->n)
                   : fl_bad(x, "no line \"entries N\" (a write cut short?)");
    if (!(x->seen & (1u << FK_LABEL))) return fl_bad(x, "no label line");
    if (x->version >= 2 && !(x->seen & (1u << FK_JOB)))
        return fl_bad(x, "no job line, which every record of format version 2 has");
    if (!(x->seen & (1u << FK_RANK))) return fl_bad(x, "no rank line, which every record has");
    if (r->rank >= r->size) return fl_bad(x, "rank %d is not below its size %d", r->rank, r->size);
    if (!(x->seen & (1u << FK_WORLD_RANK))) r->world_rank = r->rank; /* records before splits */
    if (r->n) qsort(r->e, r->n, sizeof *r->e, fl_by_seq);            /* none: e is NULL, which qsort may not take */
    for (size_t i = 1; i < r->n; i++)
        if (r->e[i].sig.seq == r->e[i - 1].sig.seq)
            return fl_bad(x, "two entries of collective #%llu", (unsigned long long)r->e[i].sig.seq);
    fl_keep_newest(r, x->room);
    return 0;
}

/* Parses text (size bytes, NUL after them) into r; TALLY_E_INVALID with why when it is not a record,
 * TALLY_E_NOMEM. room: the entries of it r keeps, its newest. */
static int fl_parse_file(char *text, size_t size, const char *name, size_t room, tally__flight_rank *r, char *why,
                         size_t wn) {
    memset(r, 0, sizeof *r);
    r->culprit = -1;
    snprintf(r->file, sizeof r->file, "%s", name);
    fl_parse x = {
        .p = text, .end = text + size, .line_max = TALLY__FLIGHT_LINE, .room = room, .r = r, .why = why, .wn = wn};
    int rc;
    char *line = fl_line(&x, &rc);
    if (!line && !rc) {
        snprintf(why, wn, "not a flight record: the file is empty");
        return TALLY_E_INVALID;
    }
    if (!line) return rc;
    if ((rc = fl_parse_version(&x, line))) return rc;
    while ((line = fl_line(&x, &rc)))
        if ((rc = fl_parse_line(&x, line))) return rc;
    return rc ? rc : fl_parse_check(&x);
}

static int fl_by_label_rank(const void *a, const void *b) {
    const tally__flight_rank *x = a, *y = b;
    int c = strcmp(x->label, y->label);
    if (c) return strcmp(x->label, "world") ? (strcmp(y->label, "world") ? c : 1) : -1; /* the world first */
    return x->rank - y->rank;
}

static int fl_is_record(const char *name) {
    size_t n = strlen(name);
    return n > 7 && !strcmp(name + n - 7, ".flight");
}

static int fl_skip(tally__flight_set *s, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fl_skip(tally__flight_set *s, const char *name, const char *fmt, ...) {
    tally__flight_skip *grown = realloc(s->skip, (s->n_skip + 1) * sizeof *s->skip);
    if (!grown) return tally__seterr(TALLY_E_NOMEM, "out of memory");
    s->skip = grown;
    tally__flight_skip *k = &s->skip[s->n_skip++];
    snprintf(k->file, sizeof k->file, "%s", name);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->why, sizeof k->why, fmt, ap);
    va_end(ap);
    return 0;
}

/* The file set aside with the library's message about it, less the "<name>: " it starts with. */
static int fl_skip_err(tally__flight_set *s, const char *name) {
    const char *msg = tally_last_error(); /* "<name>: is a symbolic link; ..." */
    size_t k = strlen(name);
    return fl_skip(s, name, "%s", !strncmp(msg, name, k) && !strncmp(msg + k, ": ", 2) ? msg + k + 2 : msg);
}

/* The file open at fd, read whole (it is at most TALLY__FLIGHT_FILE_MAX bytes), parsed into s->r, or
 * set aside with why; an error only for want of memory. */
static int fl_read_one(int fd, const struct stat *st, const char *name, tally__flight_set *s) {
    if ((uint64_t)st->st_size > TALLY__FLIGHT_FILE_MAX) {
        close(fd);
        return fl_skip(s, name,
                       "is %llu bytes, larger than any flight record can be (%llu bytes: %d entries): not read",
                       (unsigned long long)st->st_size, (unsigned long long)TALLY__FLIGHT_FILE_MAX, TALLY__FLIGHT_MAX);
    }
    unsigned char *text;
    int rc = tally__file_read_all(fd, name, (uint64_t)st->st_size, &text);
    close(fd);
    if (rc == TALLY_E_NOMEM) return rc;
    if (rc) return fl_skip_err(s, name);
    tally__flight_rank *grown = realloc(s->r, (s->n + 1) * sizeof *s->r);
    if (!grown) {
        free(text);
        return tally__seterr(TALLY_E_NOMEM, "out of memory");
    }
    s->r = grown;
    char why[512];
    rc = fl_parse_file((char *)text, (size_t)st->st_size, name, s->share, &s->r[s->n], why, sizeof why);
    free(text);
    if (rc) {
        free(s->r[s->n].e);
        return rc == TALLY_E_INVALID ? fl_skip(s, name, "%s", why) : rc;
    }
    s->n_entries += s->r[s->n].n;
    s->n++;
    return 0;
}

/* Reads one file into s->r, or sets it aside with why; an error only for want of memory. */
static int fl_load_one(int dfd, const char *name, uid_t dir_uid, tally__flight_set *s) {
    int fd;
    struct stat st;
    if (tally__file_open_read_nofollow(dfd, name, name, &fd, &st)) return fl_skip_err(s, name);
    uid_t me = geteuid();
    if (st.st_uid != me && st.st_uid != dir_uid) {
        close(fd);
        return fl_skip(s, name,
                       "belongs to uid %u, neither this user (uid %u) nor the directory's owner (uid %u): the job's "
                       "ranks did not write it",
                       (unsigned)st.st_uid, (unsigned)me, (unsigned)dir_uid);
    }
    return fl_read_one(fd, &st, name, s);
}

/* What speaks for a job: the ranks it has records of (distinct world ranks: one rank's records under
 * several names or of several communicators count once), whether rank 0's world record is among them,
 * and its newest. */
typedef struct fl_vote {
    size_t ranks;
    int root;
    uint64_t newest;
} fl_vote;

static int fl_by_job_rank(const void *a, const void *b) {
    const tally__flight_rank *x = a, *y = b;
    int c = strcmp(x->job, y->job);
    return c ? c : (x->world_rank > y->world_rank) - (x->world_rank < y->world_rank);
}

/* The run of s->r (sorted by job, then world rank) from i that is one job: its end, and its vote. */
static size_t fl_job_run(const tally__flight_set *s, size_t i, fl_vote *v) {
    *v = (fl_vote){0};
    size_t j = i;
    for (; j < s->n && !strcmp(s->r[j].job, s->r[i].job); j++) {
        const tally__flight_rank *r = &s->r[j];
        v->ranks += j == i || r->world_rank != s->r[j - 1].world_rank;
        v->root |= r->rank == 0 && !strcmp(r->label, "world");
        if (r->dumped_ns > v->newest) v->newest = r->dumped_ns;
    }
    return j;
}

static int fl_vote_beats(const fl_vote *a, const fl_vote *b) {
    if (a->ranks != b->ranks) return a->ranks > b->ranks;
    if (a->root != b->root) return a->root > b->root;
    return a->newest > b->newest;
}

/* The job whose records come from the most ranks (ties: the one with rank 0's world record, then the
 * newest); s->r is left sorted by job. */
static void fl_pick_job(tally__flight_set *s, fl_vote *best) {
    qsort(s->r, s->n, sizeof *s->r, fl_by_job_rank);
    for (size_t i = 0, j; i < s->n; i = j) {
        fl_vote v;
        j = fl_job_run(s, i, &v);
        if (i == 0 || fl_vote_beats(&v, best)) {
            *best = v;
            snprintf(s->job, sizeof s->job, "%s", s->r[i].job);
        }
    }
}

/* Drops the records drop[] marks (freeing their entries), the others kept in order. */
static void fl_compact(tally__flight_set *s, const unsigned char *drop) {
    size_t kept = 0;
    for (size_t i = 0; i < s->n; i++)
        if (drop[i])
            free(s->r[i].e);
        else
            s->r[kept++] = s->r[i];
    s->n = kept;
}

/* Sets aside the records of every job but the one picked. */
static int fl_other_jobs(tally__flight_set *s, const fl_vote *best, unsigned char *drop) {
    char ours[TALLY__FLIGHT_JOB + 16];
    snprintf(ours, sizeof ours, "%s", s->job[0] ? s->job : "none named");
    for (size_t i = 0, j; i < s->n; i = j) {
        fl_vote v;
        j = fl_job_run(s, i, &v);
        if (!strcmp(s->r[i].job, s->job)) continue;
        char theirs[TALLY__FLIGHT_JOB + 32];
        snprintf(theirs, sizeof theirs, "%s", s->r[i].job[0] ? s->r[i].job : "none named: an older tally's");
        for (size_t k = i; k < j; k++) {
            drop[k] = 1;
            int rc = fl_skip(s, s->r[k].file,
                             "of another job (%s, with records of %zu rank(s)), not of job %s, the one read (records "
                             "of %zu rank(s))",
                             theirs, v.ranks, ours, best->ranks);
            if (rc) return rc;
        }
    }
    return 0;
}

/* 2 when r's file is the name the writer gives it (tally__flight_file_name), 1 when it is the name an
 * older writer gave it (rank<world rank>.<label>.flight, no job), else 0. */
static int fl_named_for(const tally__flight_rank *r) {
    char want[256];
    tally__flight_file_name(want, sizeof want, r->world_rank, r->label, r->job);
    if (r->job[0] && !strcmp(r->file, want)) return 2;
    snprintf(want, sizeof want, "rank%d.%s.flight", r->world_rank, r->label);
    return !strcmp(r->file, want);
}

/* By communicator (the world first) and rank; of one rank's records, the one named for it first, then
 * by name. */
static int fl_by_label_rank_name(const void *a, const void *b) {
    const tally__flight_rank *x = a, *y = b;
    int c = fl_by_label_rank(a, b);
    if (c) return c;
    int nx = fl_named_for(x), ny = fl_named_for(y);
    return nx != ny ? ny - nx : strcmp(x->file, y->file);
}

/* Sets aside a second record of a communicator's rank (s->r sorted by fl_by_label_rank_name). */
static int fl_repeats(tally__flight_set *s, unsigned char *drop) {
    for (size_t i = 1, first = 0; i < s->n; i++) {
        const tally__flight_rank *a = &s->r[first], *b = &s->r[i];
        if (a->rank != b->rank || strcmp(a->label, b->label)) {
            first = i;
            continue;
        }
        drop[i] = 1;
        int rc = fl_skip(s, b->file, "a second record of rank %d of communicator %s (%s is the one read)", b->rank,
                         b->label, a->file);
        if (rc) return rc;
    }
    return 0;
}

/* Keeps the records of the job picked, one per communicator's rank, by communicator and rank; sets
 * aside the others, naming why. */
static int fl_keep_job(tally__flight_set *s) {
    if (!s->n) return 0;
    unsigned char *drop = calloc(s->n, 1);
    if (!drop) return tally__seterr(TALLY_E_NOMEM, "out of memory");
    fl_vote best = {0};
    fl_pick_job(s, &best);
    int rc = fl_other_jobs(s, &best, drop);
    if (!rc) {
        fl_compact(s, drop);
        memset(drop, 0, s->n);
        qsort(s->r, s->n, sizeof *s->r, fl_by_label_rank_name);
        rc = fl_repeats(s, drop);
    }
    if (!rc) fl_compact(s, drop);
    free(drop);
    return rc;
}

static int fl_by_file(const void *a, const void *b) {
    return strcmp(((const tally__flight_skip *)a)->file, ((const tally__flight_skip *)b)->file);
}

/* The *.flight names in d, at most TALLY__FLIGHT_FILES (the rest counted in s->n_unread): listed before
 * any is read, so that the room for entries is shared alike by all of them. */
static int fl_list(DIR *d, tally__flight_set *s, char ***names, size_t *n) {
    size_t cap = 0;
    for (struct dirent *de; (de = readdir(d));) {
        if (!fl_is_record(de->d_name)) continue;
        if (*n == TALLY__FLIGHT_FILES) {
            s->n_unread++; /* counted, not listed: a directory of a million names costs no memory */
            continue;
        }
        if (*n == cap) {
            cap = cap ? 2 * cap : 64;
            char **grown = realloc(*names, cap * sizeof *grown);
            if (!grown) return tally__seterr(TALLY_E_NOMEM, "out of memory listing flight records");
            *names = grown;
        }
        if (!((*names)[*n] = strdup(de->d_name)))
            return tally__seterr(TALLY_E_NOMEM, "out of memory listing flight records");
        (*n)++;
    }
    return 0;
}

int tally__flight_load(const char *dir, tally__flight_set *s) {
    memset(s, 0, sizeof *s);
    tally__sig_name_algos(tally__algo_name); /* the records' fingerprints are shown with their names */
    int dfd, rc = tally__file_open_dir(dir, dir, &dfd);
    if (rc) return rc;
    struct stat dst;
    if (fstat(dfd, &dst) != 0) {
        rc = tally__seterr(TALLY_E_SYSTEM, "%s: cannot stat the directory: %s", dir, strerror(errno));
        close(dfd);
        return rc;
    }
    s->dir_uid = (unsigned)dst.st_uid;
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return tally__seterr(TALLY_E_SYSTEM, "cannot list %s", dir);
    }
    char **names = NULL;
    size_t n = 0;
    rc = fl_list(d, s, &names, &n);
    s->share = n ? TALLY__FLIGHT_KEPT / n : 0;
    for (size_t i = 0; i < n && !rc; i++) rc = fl_load_one(dirfd(d), names[i], dst.st_uid, s);
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    closedir(d);
    if (!rc) rc = fl_keep_job(s);
    if (rc) {
        tally__flight_set_free(s);
        return rc;
    }
    if (s->n_skip) qsort(s->skip, s->n_skip, sizeof *s->skip, fl_by_file);
    return 0;
}

void tally__flight_set_free(tally__flight_set *s) {
    for (size_t i = 0; i < s->n; i++) free(s->r[i].e);
    free(s->r);
    free(s->skip);
    memset(s, 0, sizeof *s);
}

/* ---- the verdict ------------------------------------------------------------------------------ */

const tally__flight_entry *tally__flight_find(const tally__flight_rank *r, uint64_t seq) {
    size_t lo = 0, hi = r->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (r->e[mid].sig.seq < seq)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < r->n && r->e[lo].sig.seq == seq ? &r->e[lo] : NULL;
}

/* Rank `rank`'s record, by bisection: the chain walk asks this at every hop of every rank's wait. */
static const tally__flight_rank *fl_of_rank(const tally__flight_rank *r, size_t n, int rank) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (r[mid].rank < rank)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && r[lo].rank == rank ? &r[lo] : NULL;
}

/* 1 when the ranks' records at seq show it was not completed alike (or a rank never began it). */
static int fl_diverges(const tally__flight_rank *r, size_t n, uint64_t seq, int *mismatch) {
    const tally__flight_entry *first = NULL;
    int out = 0;
    for (size_t i = 0; i < n; i++) {
        const tally__flight_entry *e = tally__flight_find(&r[i], seq);
        if (!e || e->state != TALLY__FL_DONE) out = 1;
        if (e && first && !tally__sig_equal(&e->sig, &first->sig)) *mismatch = out = 1;
        if (e && !first) first = e;
    }
    return out;
}

/* Where rank `from`'s wait leads at seq: along each rank's awaited peer until a rank that waits on
 * nobody, left no record, never began seq, or closes a loop. */
static int fl_wait_end(const tally__flight_rank *r, size_t n, uint64_t seq, int from, int size) {
    int cur = from;
    for (int hops = 0; hops <= size; hops++) {
        const tally__flight_rank *rr = fl_of_rank(r, n, cur);
        const tally__flight_entry *e = rr ? tally__flight_find(rr, seq) : NULL;
        if (!e || e->peer < 0 || e->peer >= size || e->peer == cur) return cur;
        cur = e->peer;
    }
    return cur; /* a loop: its last link */
}

/* The one rank whose fingerprint at seq differs from every other rank's, or -1. */
static int fl_odd_one(const tally__flight_rank *r, size_t n, uint64_t seq) {
    int odd = -1;
    for (size_t i = 0; i < n; i++) {
        const tally__flight_entry *e = tally__flight_find(&r[i], seq);
        if (!e) continue;
        int alike = 0;
        for (size_t j = 0; j < n; j++) {
            const tally__flight_entry *f = j == i ? NULL : tally__flight_find(&r[j], seq);
            alike += f && tally__sig_equal(&e->sig, &f->sig);
        }
        if (alike == 0 && n > 2) {
            if (odd >= 0) return -1;
            odd = r[i].rank;
        }
    }
    return odd;
}

static void fl_votes(const tally__flight_rank *r, size_t n, uint64_t seq, int size, double *votes, int *led) {
    for (size_t i = 0; i < n; i++) {
        const tally__flight_entry *e = tally__flight_find(&r[i], seq);
        if (!e) {
            votes[r[i].rank] += size; /* it never reached the collective the others wait in */
            continue;
        }
        int end = fl_wait_end(r, n, seq, r[i].rank, size);
        if (end != r[i].rank) {
            votes[end] += 1;
            led[end]++;
        }
        if (e->culprit >= 0 && e->culprit < size && e->culprit != r[i].rank) votes[e->culprit] += 1;
    }
}

static void fl_pick_holder(const tally__flight_rank *r, size_t n, uint64_t seq, tally__flight_verdict *v) {
    double *votes = calloc((size_t)v->size, sizeof *votes);
    int *led = calloc((size_t)v->size, sizeof *led);
    if (!votes || !led) {
        free(votes);
        free(led);
        return;
    }
    fl_votes(r, n, seq, v->size, votes, led);
    int best = -1;
    for (int k = 0; k < v->size; k++)
        if (votes[k] > 0 && (best < 0 || votes[k] > votes[best])) best = k;
    v->holder = best;
    if (best >= 0) {
        const tally__flight_rank *hr = fl_of_rank(r, n, best);
        v->holder_recorded = hr != NULL;
        v->waiting_on_holder = led[best];
        const tally__flight_entry *he = hr ? tally__flight_find(hr, seq) : NULL;
        uint64_t first = UINT64_MAX;
        for (size_t i = 0; i < n; i++) {
            const tally__flight_entry *e = tally__flight_find(&r[i], seq);
            if (e && e->begin_ns < first) first = e->begin_ns;
        }
        v->holder_late_s = he ? (double)(he->begin_ns - first) * 1e-9 : -1;
    }
    free(votes);
    free(led);
}

void tally__flight_analyze(const tally__flight_rank *r, size_t n, tally__flight_verdict *v) {
    memset(v, 0, sizeof *v);
    v->holder = -1;
    v->holder_late_s = -1;
    for (size_t i = 0; i < n; i++)
        if (r[i].size > v->size) v->size = r[i].size;
    v->missing = v->size - (int)n;
    uint64_t lo = 0, hi = 0;
    for (size_t i = 0; i < n; i++) {
        if (!r[i].n) continue;
        if (r[i].e[0].sig.seq > lo) lo = r[i].e[0].sig.seq; /* the windows all ranks still hold */
        if (r[i].e[r[i].n - 1].sig.seq > hi) hi = r[i].e[r[i].n - 1].sig.seq;
    }
    for (uint64_t s = lo ? lo : 1; s <= hi && !v->diverge_seq; s++) {
        if (fl_diverges(r, n, s, &v->mismatch)) v->diverge_seq = s;
        if (s == UINT64_MAX) break; /* a record may hold the last number there is: s++ would wrap to 0 */
    }
    if (!v->diverge_seq) return;
    if (v->mismatch) {
        v->holder = fl_odd_one(r, n, v->diverge_seq);
        v->holder_recorded = v->holder >= 0;
        return;
    }
    fl_pick_holder(r, n, v->diverge_seq, v);
}
