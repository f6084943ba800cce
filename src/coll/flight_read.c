/* flight_read.c - the flight recorder's reading side (tally flight): every rank's records of a directory
 * loaded, and per communicator the first collective the ranks did not complete alike and who holds it up. */
#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
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

static int fl_bad(const char *dir, const char *name, const char *what) {
    return tally__seterr(TALLY_E_INVALID, "%s/%s is not a flight record: %s", dir, name, what);
}

static int fl_parse_file(FILE *in, const char *dir, const char *name, tally__flight_rank *r) {
    char line[2048];
    memset(r, 0, sizeof *r);
    r->culprit = -1;
    if (!fgets(line, sizeof line, in) || strncmp(line, "tally-flight 1", 14)) return fl_bad(dir, name, "no header");
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
            if (fl_parse_entry(line, &r->e[r->n])) return fl_bad(dir, name, line);
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
    if (!have_entries || r->n != want) return fl_bad(dir, name, "entries missing (a write cut short?)");
    if (!r->label[0] || r->size <= 0 || r->rank < 0 || r->rank >= r->size) return fl_bad(dir, name, "no rank");
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

static int fl_load_one(int dfd, const char *dir, const char *name, tally__flight_set *s) {
    int fd;
    int rc = tally__file_open_read(dfd, name, name, &fd, NULL);
    if (rc) return rc;
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
    rc = fl_parse_file(in, dir, name, &s->r[s->n]);
    fclose(in);
    if (rc) {
        free(s->r[s->n].e);
        return rc;
    }
    s->n++;
    return 0;
}

int tally__flight_load(const char *dir, tally__flight_set *s) {
    memset(s, 0, sizeof *s);
    tally__sig_name_algos(tally__algo_name); /* the records' fingerprints are shown with their names */
    int dfd, rc = tally__file_open_dir(dir, dir, &dfd);
    if (rc) return rc;
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return tally__seterr(TALLY_E_SYSTEM, "cannot list %s", dir);
    }
    struct dirent *de;
    while (!rc && (de = readdir(d)))
        if (fl_is_record(de->d_name)) rc = fl_load_one(dirfd(d), dir, de->d_name, s);
    closedir(d);
    if (rc) {
        tally__flight_set_free(s);
        return rc;
    }
    if (s->n) qsort(s->r, s->n, sizeof *s->r, fl_by_label_rank);
    return 0;
}

void tally__flight_set_free(tally__flight_set *s) {
    for (size_t i = 0; i < s->n; i++) free(s->r[i].e);
    free(s->r);
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
