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

#include "../core/file.h"
#include "coll.h"
#include "flight.h"

/* ---- parsing ---------------------------------------------------------------------------------- */

static int fl_name(const char *s, int lo, int hi, const char *(*name)(int)) {
    for (int k = lo; k <= hi; k++)
        if (!strcmp(s, name(k))) return k;
    return -1;
}
static const char *fl_dtype(int k) { return tally_dtype_name((tally_dtype)k); }
static const char *fl_op(int k) { return tally_op_name((tally_op)k); }

static int fl_parse_entry(const char *line, tally__flight_entry *e) {
    char coll[32], dtype[16], op[16], algo[16], state[16];
    uint64_t seq, count, b, end;
    int root, rc, peer, culprit;
    if (sscanf(line, "e %" SCNu64 " %31s %" SCNu64 " %15s %15s %d %15s %15s %d %d %d %" SCNu64 " %" SCNu64, &seq, coll,
               &count, dtype, op, &root, algo, state, &rc, &peer, &culprit, &b, &end) != 13)
        return -1;
    int c = fl_name(coll, 0, TALLY__COLL_COUNT - 1, tally__coll_name),
        d = fl_name(dtype, 0, TALLY_DTYPE_COUNT - 1, fl_dtype), o = fl_name(op, 0, TALLY_OP_COUNT - 1, fl_op),
        a = tally__algo_parse(algo), st = fl_name(state, TALLY__FL_RUNNING, TALLY__FL_FAILED, tally__flight_state_name);
    if (c < 0 || d < 0 || o < 0 || a < 0 || st < 0) return -1;
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
                               .rc = rc,
                               .peer = peer,
                               .culprit = culprit};
    return 0;
}

/* A header line "key value": fills the field it names; unknown keys are skipped (newer writers). */
static void fl_parse_key(tally__flight_rank *r, const char *k, const char *v) {
    if (!strcmp(k, "job")) snprintf(r->job, sizeof r->job, "%s", v);
    if (!strcmp(k, "label")) snprintf(r->label, sizeof r->label, "%s", v);
    if (!strcmp(k, "host")) snprintf(r->host, sizeof r->host, "%s", v);
    if (!strcmp(k, "transport")) snprintf(r->transport, sizeof r->transport, "%s", v);
    if (!strcmp(k, "reason")) snprintf(r->reason, sizeof r->reason, "%s", v);
    if (!strcmp(k, "message")) snprintf(r->msg, sizeof r->msg, "%s", v);
    if (!strcmp(k, "rank")) r->rank = atoi(v);
    if (!strcmp(k, "world_rank")) r->world_rank = atoi(v);
    if (!strcmp(k, "size")) r->size = atoi(v);
    if (!strcmp(k, "pid")) r->pid = atoi(v);
    if (!strcmp(k, "culprit")) r->culprit = atoi(v);
    if (!strcmp(k, "dumped_ns")) r->dumped_ns = strtoull(v, NULL, 10);
}

static int fl_by_seq(const void *a, const void *b) {
    uint64_t x = ((const tally__flight_entry *)a)->sig.seq, y = ((const tally__flight_entry *)b)->sig.seq;
    return x < y ? -1 : x > y;
}

/* A record that does not parse: the reason goes to the caller's list of files set aside. */
static int fl_bad(char *why, size_t n, const char *what) {
    snprintf(why, n, "not a flight record: %.200s", what);
    return TALLY_E_INVALID;
}

static int fl_parse_file(FILE *in, const char *name, tally__flight_rank *r, char *why, size_t wn) {
    char line[2048];
    memset(r, 0, sizeof *r);
    r->culprit = -1;
    snprintf(r->file, sizeof r->file, "%s", name);
    if (!fgets(line, sizeof line, in) || strncmp(line, "tally-flight 1", 14)) return fl_bad(why, wn, "no header");
    size_t want = 0, cap = 0;
    int have_entries = 0;
    while (fgets(line, sizeof line, in)) {
        line[strcspn(line, "\n")] = '\0';
        if (line[0] == 'e' && line[1] == ' ') {
            if (r->n == cap) {
                cap = cap ? 2 * cap : 64;
                tally__flight_entry *e = realloc(r->e, cap * sizeof *e);
                if (!e) return tally__seterr(TALLY_E_NOMEM, "out of memory reading %s", name);
                r->e = e;
            }
            if (fl_parse_entry(line, &r->e[r->n])) return fl_bad(why, wn, line);
            r->n++;
            continue;
        }
        char *sp = strchr(line, ' ');
        if (!sp) continue;
        *sp = '\0';
        if (!strcmp(line, "entries")) {
            want = strtoull(sp + 1, NULL, 10);
            have_entries = 1;
        }
        fl_parse_key(r, line, sp + 1);
    }
    if (!have_entries || r->n != want) return fl_bad(why, wn, "entries missing (a write cut short?)");
    if (!r->label[0] || r->size <= 0 || r->rank < 0 || r->rank >= r->size) return fl_bad(why, wn, "no rank");
    if (r->n) qsort(r->e, r->n, sizeof *r->e, fl_by_seq); /* none: e is NULL, which qsort may not take */
    return 0;
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

/* Reads one file into s->r, or sets it aside with why; an error only for want of memory. */
static int fl_load_one(int dfd, const char *dir, const char *name, uid_t dir_uid, tally__flight_set *s) {
    int fd;
    struct stat st;
    if (tally__file_open_read_nofollow(dfd, name, name, &fd, &st)) {
        const char *msg = tally_last_error(); /* "<name>: is a symbolic link; ..." */
        size_t k = strlen(name);
        return fl_skip(s, name, "%s", !strncmp(msg, name, k) && !strncmp(msg + k, ": ", 2) ? msg + k + 2 : msg);
    }
    uid_t me = geteuid();
    if (st.st_uid != me && st.st_uid != dir_uid) {
        close(fd);
        return fl_skip(s, name,
                       "belongs to uid %u, neither this user (uid %u) nor the directory's owner (uid %u): the job's "
                       "ranks did not write it",
                       (unsigned)st.st_uid, (unsigned)me, (unsigned)dir_uid);
    }
    FILE *in = fdopen(fd, "r");
    if (!in) {
        close(fd);
        return tally__seterr(TALLY_E_NOMEM, "cannot read %s/%s", dir, name);
    }
    tally__flight_rank *grown = realloc(s->r, (s->n + 1) * sizeof *s->r);
    if (!grown) {
        fclose(in);
        return tally__seterr(TALLY_E_NOMEM, "out of memory");
    }
    s->r = grown;
    char why[256];
    int rc = fl_parse_file(in, name, &s->r[s->n], why, sizeof why);
    fclose(in);
    if (rc) {
        free(s->r[s->n].e);
        return rc == TALLY_E_INVALID ? fl_skip(s, name, "%s", why) : rc;
    }
    s->n++;
    return 0;
}

/* Records of job j, those of it with rank 0's world record, and the newest of them. */
static void fl_job_votes(const tally__flight_set *s, const char *j, size_t *count, int *has_root, uint64_t *newest) {
    *count = 0;
    *has_root = 0;
    *newest = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (strcmp(s->r[i].job, j)) continue;
        ++*count;
        *has_root |= s->r[i].rank == 0 && !strcmp(s->r[i].label, "world");
        if (s->r[i].dumped_ns > *newest) *newest = s->r[i].dumped_ns;
    }
}

/* The job most records are of (ties: the one with rank 0's world record, then the newest). */
static void fl_pick_job(tally__flight_set *s) {
    size_t best_n = 0;
    int best_root = 0;
    uint64_t best_t = 0;
    for (size_t i = 0; i < s->n; i++) {
        size_t n;
        int root;
        uint64_t t;
        fl_job_votes(s, s->r[i].job, &n, &root, &t);
        if (n > best_n || (n == best_n && (root > best_root || (root == best_root && t > best_t)))) {
            best_n = n, best_root = root, best_t = t;
            snprintf(s->job, sizeof s->job, "%s", s->r[i].job);
        }
    }
}

static void fl_drop(tally__flight_set *s, size_t i) {
    free(s->r[i].e);
    s->r[i] = s->r[--s->n];
}

/* 1 when r's file is the one the writer names for it: rank<world rank>.<label>.flight. */
static int fl_named_for(const tally__flight_rank *r) {
    char want[128];
    snprintf(want, sizeof want, "rank%d.%s.flight", r->world_rank, r->label);
    return !strcmp(r->file, want);
}

/* Keeps the records of the job picked; sets aside the others and the second record of a rank. */
static int fl_keep_job(tally__flight_set *s) {
    fl_pick_job(s);
    size_t total = s->n, mine;
    int root;
    uint64_t t;
    fl_job_votes(s, s->job, &mine, &root, &t);
    for (size_t i = s->n; i-- > 0;) {
        const tally__flight_rank *r = &s->r[i];
        if (!strcmp(r->job, s->job)) continue;
        char theirs[TALLY__FLIGHT_JOB + 16], ours[TALLY__FLIGHT_JOB + 16];
        snprintf(theirs, sizeof theirs, "%s", r->job[0] ? r->job : "none named: an older tally's");
        snprintf(ours, sizeof ours, "%s", s->job[0] ? s->job : "none named");
        int rc = fl_skip(s, r->file, "of another job (%s), not of job %s, which %zu of the %zu files read are of",
                         theirs, ours, mine, total);
        if (rc) return rc;
        fl_drop(s, i);
    }
    for (size_t i = 0; i < s->n; i++)
        for (size_t j = i + 1; j < s->n; j++) {
            tally__flight_rank *a = &s->r[i], *b = &s->r[j];
            if (a->rank != b->rank || strcmp(a->label, b->label)) continue;
            /* the one named for its rank stays; else the first by name */
            int na = fl_named_for(a), nb = fl_named_for(b);
            if (nb > na || (nb == na && strcmp(b->file, a->file) < 0)) {
                tally__flight_rank x = *a;
                *a = *b;
                *b = x;
            }
            int rc = fl_skip(s, b->file, "a second record of rank %d of communicator %s (%s is the one read)", b->rank,
                             b->label, a->file);
            if (rc) return rc;
            fl_drop(s, j--);
        }
    return 0;
}

static int fl_by_file(const void *a, const void *b) {
    return strcmp(((const tally__flight_skip *)a)->file, ((const tally__flight_skip *)b)->file);
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
    struct dirent *de;
    while (!rc && (de = readdir(d)))
        if (fl_is_record(de->d_name)) rc = fl_load_one(dirfd(d), dir, de->d_name, dst.st_uid, s);
    closedir(d);
    if (!rc) rc = fl_keep_job(s);
    if (rc) {
        tally__flight_set_free(s);
        return rc;
    }
    if (s->n) qsort(s->r, s->n, sizeof *s->r, fl_by_label_rank);
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
    for (uint64_t s = lo ? lo : 1; s <= hi && !v->diverge_seq; s++)
        if (fl_diverges(r, n, s, &v->mismatch)) v->diverge_seq = s;
    if (!v->diverge_seq) return;
    if (v->mismatch) {
        v->holder = fl_odd_one(r, n, v->diverge_seq);
        v->holder_recorded = v->holder >= 0;
        return;
    }
    fl_pick_holder(r, n, v->diverge_seq, v);
}
