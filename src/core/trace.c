/* trace.c - the timeline's recording side: a ring of spans that any thread appends to with one atomic
 * add, thread tracks, and the spans as Chrome trace-event JSON (which Perfetto and chrome://tracing open). */
#include "trace.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tally.h>

#include "err.h"

#define TRACE_ARGS    4
#define TRACE_NAME    40
#define TRACE_THREADS 64

typedef struct trace_ev {
    uint64_t t0, t1;
    const char *cat;
    int32_t tid, nargs;
    tally__trace_arg arg[TRACE_ARGS];
    char name[TRACE_NAME];
} trace_ev;

int tally__trace_on;
static trace_ev *ring;
static size_t cap;
static _Atomic uint64_t head; /* spans appended since the start */
static _Atomic int nthreads;
static char thread_names[TRACE_THREADS][32];
static _Thread_local int my_tid = -1;

int tally__trace_start(size_t events) {
    if (ring) return 0; /* a second world in this process adds to the first's timeline */
    ring = calloc(events, sizeof *ring);
    if (!ring)
        return tally__seterr(TALLY_E_NOMEM, "no memory for the timeline's %zu spans (TALLY_TRACE_EVENTS)", events);
    cap = events;
    atomic_store(&head, 0);
    tally__trace_on = 1;
    return 0;
}

void tally__trace_stop(void) {
    tally__trace_on = 0;
    free(ring);
    ring = NULL;
    cap = 0;
}

static int trace_tid(void) {
    if (my_tid < 0) {
        my_tid = atomic_fetch_add(&nthreads, 1);
        if (my_tid < TRACE_THREADS && !thread_names[my_tid][0])
            snprintf(thread_names[my_tid], sizeof thread_names[my_tid], "thread %d", my_tid);
    }
    return my_tid;
}

void tally__trace_thread(const char *name) {
    if (!tally__trace_on) return;
    int t = trace_tid();
    if (t < TRACE_THREADS) snprintf(thread_names[t], sizeof thread_names[t], "%s", name);
}

void tally__trace_span(const char *cat, const char *name, uint64_t t0, uint64_t t1, const tally__trace_arg *args,
                       int nargs) {
    if (!tally__trace_on || !ring) return;
    uint64_t i = atomic_fetch_add_explicit(&head, 1, memory_order_relaxed);
    trace_ev *e = &ring[i % cap];
    e->t0 = t0;
    e->t1 = t1 > t0 ? t1 : t0;
    e->cat = cat;
    e->tid = trace_tid();
    e->nargs = nargs < TRACE_ARGS ? nargs : TRACE_ARGS;
    for (int k = 0; k < e->nargs; k++) e->arg[k] = args[k];
    snprintf(e->name, sizeof e->name, "%s", name);
}

uint64_t tally__trace_dropped(void) {
    uint64_t n = atomic_load(&head);
    return n > cap ? n - cap : 0;
}

/* ---- JSON ------------------------------------------------------------------------------------- */

typedef struct jbuf {
    char *p;
    size_t n, cap;
    int bad;
} jbuf;

static void jb_printf(jbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void jb_printf(jbuf *b, const char *fmt, ...) {
    for (int pass = 0; pass < 2 && !b->bad; pass++) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->bad = 1;
            return;
        }
        if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t want = b->cap ? b->cap : 1 << 16;
        while (want <= b->n + (size_t)k) want *= 2;
        char *q = realloc(b->p, want);
        if (!q) {
            b->bad = 1;
            return;
        }
        b->p = q;
        b->cap = want;
    }
}

/* s as a JSON string's contents: quotes, backslashes and control bytes escaped. */
static void jb_str(jbuf *b, const char *s) {
    char out[2 * TRACE_NAME + 64];
    size_t n = 0;
    for (; *s && n < sizeof out - 8; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') out[n++] = '\\';
        if (c < 0x20)
            n += (size_t)snprintf(out + n, sizeof out - n, "\\u%04x", c);
        else
            out[n++] = (char)c;
    }
    out[n] = '\0';
    jb_printf(b, "\"%s\"", out);
}

static void jb_span(jbuf *b, const trace_ev *e, int rank, int64_t offset_ns, uint64_t origin_ns) {
    double ts = ((double)(int64_t)(e->t0 - origin_ns) - (double)offset_ns) * 1e-3;
    jb_printf(b, "{\"ph\":\"X\",\"cat\":\"%s\",\"name\":", e->cat ? e->cat : "tally");
    jb_str(b, e->name);
    jb_printf(b, ",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f", rank, e->tid, ts, (double)(e->t1 - e->t0) * 1e-3);
    if (e->nargs) {
        jb_printf(b, ",\"args\":{");
        for (int k = 0; k < e->nargs; k++) {
            jb_printf(b, "%s\"%s\":", k ? "," : "", e->arg[k].key);
            if (e->arg[k].str)
                jb_str(b, e->arg[k].str);
            else
                jb_printf(b, "%" PRId64, e->arg[k].num);
        }
        jb_printf(b, "}");
    }
    jb_printf(b, "},\n");
}

int tally__trace_json(int rank, const char *label, int64_t offset_ns, uint64_t origin_ns, char **out, size_t *len) {
    jbuf b = {0};
    jb_printf(&b, "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"args\":{\"name\":", rank);
    jb_str(&b, label);
    jb_printf(&b, "}},\n{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%d,\"args\":{\"sort_index\":%d}},\n",
              rank, rank);
    int nt = atomic_load(&nthreads);
    for (int t = 0; t < nt && t < TRACE_THREADS; t++) {
        jb_printf(&b, "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":", rank, t);
        jb_str(&b, thread_names[t]);
        jb_printf(&b, "}},\n");
    }
    uint64_t n = ring ? atomic_load(&head) : 0, first = n > cap ? n - cap : 0;
    for (uint64_t i = first; i < n; i++) jb_span(&b, &ring[i % cap], rank, offset_ns, origin_ns);
    if (b.bad || !b.p) {
        free(b.p);
        return tally__seterr(TALLY_E_NOMEM, "rank %d: no memory to write the timeline", rank);
    }
    *out = b.p;
    *len = b.n - 2; /* the last ",\n": the writer joins the ranks' lists */
    return 0;
}
