/* po_match.c - matching in the post office: posted receives against arriving messages by (source or any,
 * tag) in the order each was posted or arrived, the unexpected messages kept meanwhile, and the ends of
 * requests (their callbacks run once the post office's lock is released). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/clock.h"
#include "po_int.h"

/* An unexpected message's staging starts at most this big and doubles as its payload arrives, so a
 * header's length costs memory only once its bytes come. */
#define PO_STAGE_FIRST ((size_t)4 << 20)

/* ---- the ends of requests ---- */

void tally__po_finish(tally__po *po, tally__po_op *op, int rc, int source, const char *fmt, ...) {
    op->rc = rc;
    op->source = rc ? -1 : source;
    op->why[0] = '\0';
    if (rc && fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(op->why, sizeof op->why, fmt, ap);
        va_end(ap);
        if (po->fault->world) tally__err_name_world(op->why, sizeof op->why, po->fault->world, po->fault->world_n);
    }
    op->next = NULL;
    if (po->done_tail)
        po->done_tail->next = op;
    else
        po->done = op;
    po->done_tail = op;
}

_Thread_local int tally__po_driver_here;

tally__po_op *tally__po_take_done(tally__po *po) {
    tally__po_op *list = po->done;
    po->done = po->done_tail = NULL;
    return list;
}

void tally__po_run_done(tally__po *po, tally__po_op *list) {
    if (!list) return;
    while (list) {
        tally__po_op *op = list;
        list = op->next;
        op->done(op->arg, op->rc, op->why, op->source);
        free(op);
    }
    tally__po_poke_driver(po);
}

/* "rank 1: tally_recv from any rank with tag 3": how a request's messages begin. */
static const char *po_words(const tally__po *po, const tally__po_op *op, char *buf, size_t n) {
    if (!op->is_recv)
        snprintf(buf, n, "rank %d: tally_send to rank %d with tag %d", po->rank, op->peer, op->tag);
    else if (op->peer == TALLY_ANY_SOURCE)
        snprintf(buf, n, "rank %d: tally_recv from any rank with tag %d", po->rank, op->tag);
    else
        snprintf(buf, n, "rank %d: tally_recv from rank %d with tag %d", po->rank, op->peer, op->tag);
    return buf;
}

/* Ends op with rc and the reason, in the words of its kind. */
void tally__po_fail(tally__po *po, tally__po_op *op, int rc, const char *why) {
    char w[128];
    tally__po_finish(po, op, rc, -1, "%s: %s", po_words(po, op, w, sizeof w), why);
}

/* ---- messages ---- */

static void po_msg_free(tally__po_msg *m) {
    free(m->data);
    free(m);
}

static int po_matches(int want_src, int want_tag, int src, int tag) {
    return (want_src == TALLY_ANY_SOURCE || want_src == src) && want_tag == tag;
}

static void po_unlink_posted(tally__po *po, tally__po_op *op) {
    tally__po_op *prev = NULL;
    for (tally__po_op *p = po->posted; p; prev = p, p = p->next) {
        if (p != op) continue;
        if (prev)
            prev->next = p->next;
        else
            po->posted = p->next;
        if (po->posted_tail == p) po->posted_tail = prev;
        return;
    }
}

static void po_unlink_unx(tally__po *po, tally__po_msg *m) {
    tally__po_msg *prev = NULL;
    for (tally__po_msg *p = po->unx; p; prev = p, p = p->next) {
        if (p != m) continue;
        if (prev)
            prev->next = p->next;
        else
            po->unx = p->next;
        if (po->unx_tail == p) po->unx_tail = prev;
        return;
    }
}

/* A receive whose count or dtype is not the message's fails (the message goes with it). 1 when so. */
static int po_mismatch(tally__po *po, tally__po_op *op, int src, size_t count, tally_dtype t) {
    if (count == op->count && t == op->dtype) return 0;
    char w[128], why[384];
    snprintf(why, sizeof why,
             "it takes %zu x %s, but rank %d sent %zu x %s with that tag: a send and its receive must have the same "
             "count and dtype",
             op->count, tally_dtype_name(op->dtype), src, count, tally_dtype_name(t));
    tally__po_finish(po, op, TALLY_E_MISMATCH, -1, "%s: %s", po_words(po, op, w, sizeof w), why);
    return 1;
}

/* The first waiting receive a message from src with tag goes to, or NULL. */
static tally__po_op *po_find_posted(const tally__po *po, int src, int tag) {
    for (tally__po_op *op = po->posted; op; op = op->next)
        if (!op->msg && po_matches(op->peer, op->tag, src, tag)) return op;
    return NULL;
}

/* op (not queued) takes m (out of the queue): what arrived is copied, the rest comes straight in. Returns
 * m when it is still at its sender (the caller reads it), else NULL. */
static tally__po_msg *po_take(tally__po *po, tally__po_op *op, tally__po_msg *m) {
    if (po_mismatch(po, op, m->src, m->count, m->dtype)) {
        if (m->unread) { /* read as nothing, so its sender hears */
            m->discard = 1;
            return m;
        }
        if (m->complete) {
            po_msg_free(m);
        } else {
            m->discard = 1;
            free(m->data);
            m->data = NULL;
        }
        return NULL;
    }
    if (m->got) memcpy(op->rbuf, m->data, m->got);
    if (m->complete) {
        tally__po_finish(po, op, 0, m->src, NULL);
        po_msg_free(m);
        return NULL;
    }
    free(m->data);
    m->data = NULL;
    m->cap = 0;
    m->to = op;
    op->msg = m;
    if (po->posted_tail)
        po->posted_tail->next = op;
    else
        po->posted = op;
    po->posted_tail = op;
    return m->unread ? m : NULL;
}

tally__po_msg *tally__po_post_recv(tally__po *po, tally__po_op *op) {
    tally__po_msg *m = po->unx;
    while (m && !po_matches(op->peer, op->tag, m->src, m->tag)) m = m->next;
    if (m) {
        po_unlink_unx(po, m);
        return po_take(po, op, m);
    }
    if (op->peer != TALLY_ANY_SOURCE && po->lost[op->peer]) {
        char why[512];
        if (po->lost[op->peer] == TALLY_E_PEER_LOST)
            snprintf(why, sizeof why,
                     "rank %d closed its point-to-point connection (it exited, or freed or aborted the communicator) "
                     "and no message of it with that tag is left",
                     op->peer);
        else
            snprintf(why, sizeof why, "rank %d's point-to-point connection was closed after an error: %s", op->peer,
                     po->lost_why[op->peer] ? po->lost_why[op->peer] : tally_strerror(po->lost[op->peer]));
        tally__po_fail(po, op, po->lost[op->peer], why);
        return NULL;
    }
    op->next = NULL;
    if (po->posted_tail)
        po->posted_tail->next = op;
    else
        po->posted = op;
    po->posted_tail = op;
    if (op->deadline < po->poll_until) tally__po_wake(po);
    return NULL;
}

void tally__po_self_send(tally__po *po, tally__po_op *op) {
    tally__po_op *r = po_find_posted(po, po->rank, op->tag);
    if (r) {
        po_unlink_posted(po, r);
        if (!po_mismatch(po, r, po->rank, op->count, op->dtype)) {
            if (op->bytes) memcpy(r->rbuf, op->sbuf, op->bytes);
            tally__po_finish(po, r, 0, po->rank, NULL);
        }
        tally__po_finish(po, op, 0, -1, NULL);
        return;
    }
    tally__po_msg *m = calloc(1, sizeof *m);
    unsigned char *data = op->bytes ? malloc(op->bytes) : NULL;
    if (!m || (op->bytes && !data)) {
        free(m);
        free(data);
        tally__po_fail(po, op, TALLY_E_NOMEM, "no memory to keep the message until its receive");
        return;
    }
    *m = (tally__po_msg){.src = po->rank,
                         .tag = op->tag,
                         .dtype = op->dtype,
                         .count = op->count,
                         .bytes = op->bytes,
                         .got = op->bytes,
                         .data = data,
                         .cap = op->bytes,
                         .complete = 1};
    if (op->bytes) memcpy(data, op->sbuf, op->bytes);
    if (po->unx_tail)
        po->unx_tail->next = m;
    else
        po->unx = m;
    po->unx_tail = m;
    tally__po_finish(po, op, 0, -1, NULL);
}

tally__po_msg *tally__po_arrive(tally__po *po, tally__po_in *in) {
    const tally__po_hdr *h = &in->hdr;
    tally__po_msg *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    *m = (tally__po_msg){.src = in->rank,
                         .tag = h->tag,
                         .dtype = (tally_dtype)h->dtype,
                         .count = (size_t)h->count,
                         .bytes = (size_t)h->bytes,
                         .addr = h->addr,
                         .id = h->id,
                         .cma = (h->flags & TALLY__PO_CMA) != 0};
    tally__po_op *op = po_find_posted(po, m->src, m->tag);
    if (op && m->count == op->count && m->dtype == op->dtype) {
        m->to = op; /* it stays posted, so a fault or its timeout still finds it */
        op->msg = m;
    } else if (op) {
        po_unlink_posted(po, op);
        po_mismatch(po, op, m->src, m->count, m->dtype);
        m->discard = 1;
    } else {
        if (po->unx_tail)
            po->unx_tail->next = m;
        else
            po->unx = m;
        po->unx_tail = m;
    }
    return m;
}

unsigned char *tally__po_msg_dst(tally__po_msg *m, size_t *room, unsigned char *scratch, size_t scratch_len) {
    size_t left = m->bytes - m->got;
    if (m->discard) {
        *room = left < scratch_len ? left : scratch_len;
        return scratch;
    }
    if (m->to) {
        *room = left;
        return m->to->rbuf + m->got;
    }
    if (m->got == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : PO_STAGE_FIRST;
        if (cap > m->bytes || cap < m->cap) cap = m->bytes;
        unsigned char *d = realloc(m->data, cap);
        if (!d) return NULL;
        m->data = d;
        m->cap = cap;
    }
    *room = m->cap - m->got;
    return m->data + m->got;
}

int tally__po_msg_grew(tally__po *po, tally__po_msg *m, size_t n) {
    m->got += n;
    if (m->got < m->bytes) return 0;
    if (m->to) {
        tally__po_op *op = m->to;
        po_unlink_posted(po, op);
        op->msg = NULL;
        tally__po_finish(po, op, 0, m->src, NULL);
        po_msg_free(m);
    } else if (m->discard) {
        po_msg_free(m);
    } else {
        m->complete = 1;
    }
    return 1;
}

void tally__po_msg_lost(tally__po *po, tally__po_msg *m, int rc, const char *why) {
    if (m->to) {
        tally__po_op *op = m->to;
        po_unlink_posted(po, op);
        op->msg = NULL;
        tally__po_fail(po, op, rc, why);
    } else if (!m->discard) {
        po_unlink_unx(po, m);
    }
    po_msg_free(m);
}

void tally__po_fail_from(tally__po *po, int rank, int rc, const char *why) {
    tally__po_op *op = po->posted, *next;
    for (; op; op = next) {
        next = op->next;
        if (op->peer != rank || op->msg) continue;
        po_unlink_posted(po, op);
        tally__po_fail(po, op, rc, why);
    }
}

/* A receive that ends before its message did: the rest of the message is read and dropped. */
static void po_let_go(tally__po_op *op) {
    if (!op->msg) return;
    op->msg->to = NULL;
    op->msg->discard = 1;
    op->msg = NULL;
}

void tally__po_fail_recvs(tally__po *po, int rc, const char *why) {
    while (po->posted) {
        tally__po_op *op = po->posted;
        po_unlink_posted(po, op);
        po_let_go(op);
        tally__po_fail(po, op, rc, why);
    }
}

static void po_expired(tally__po *po, tally__po_op *op) {
    char why[384];
    if (op->msg)
        snprintf(why, sizeof why,
                 "waited %g s (TALLY_TIMEOUT) for its message: rank %d began sending it (%zu bytes) but only %zu "
                 "arrived: it is hung or much slower",
                 po->timeout_s, op->msg->src, op->msg->bytes, op->msg->got);
    else if (op->peer == TALLY_ANY_SOURCE)
        snprintf(why, sizeof why, "waited %g s (TALLY_TIMEOUT) and no rank sent a message with that tag",
                 po->timeout_s);
    else
        snprintf(why, sizeof why,
                 "waited %g s (TALLY_TIMEOUT) and rank %d sent no message with that tag: it has not called "
                 "tally_send yet, or is hung",
                 po->timeout_s, op->peer);
    po_unlink_posted(po, op);
    po_let_go(op);
    tally__po_fail(po, op, TALLY_E_TIMEOUT, why);
}

void tally__po_expire(tally__po *po, uint64_t now, uint64_t *next) {
    tally__po_op *op = po->posted, *after;
    for (; op; op = after) {
        after = op->next;
        if (op->deadline <= now)
            po_expired(po, op);
        else if (op->deadline < *next)
            *next = op->deadline;
    }
}

void tally__po_free_msgs(tally__po *po) {
    while (po->unx) {
        tally__po_msg *m = po->unx;
        po->unx = m->next;
        po_msg_free(m);
    }
    po->unx_tail = NULL;
}

void tally__po_forget_from(tally__po *po, tally__po_in *in) {
    tally__po_msg *m = po->unx, *next;
    for (; m; m = next) {
        next = m->next;
        if (!m->unread || m->from != in) continue;
        po_unlink_unx(po, m);
        po_msg_free(m);
    }
}
