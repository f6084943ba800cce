/* p2p.c - the public point-to-point calls (tally_send, _recv, _isend, _irecv): their arguments checked, then
 * handed to the communicator's post office (src/p2p), whose completion ends a request made outside the queue. */
#include <stdio.h>
#include <tally.h>

#include "../core/err.h"
#include "../core/numeric/dtype.h"
#include "../p2p/p2p.h"
#include "async.h"
#include "coll.h"

static int p2p_check(const tally_comm *c, const char *fn, const void *buf, size_t count, tally_dtype t, int peer,
                     int is_recv, int tag) {
    if (!c) return tally__seterr(TALLY_E_INVALID, "%s: communicator is NULL", fn);
    int foreign = tally__comm_foreign(c, fn);
    if (foreign) return foreign;
    int rank = tally_comm_rank(c), size = tally_comm_size(c);
    if (!tally__dtype_valid((int)t) || !tally_dtype_size(t)) /* a size 0: a dtype this build cannot move */
        return tally__seterr(TALLY_E_INVALID, "%s on rank %d: invalid dtype %d", fn, rank, (int)t);
    if (count > ((size_t)1 << 50) / tally_dtype_size(t))
        return tally__seterr(TALLY_E_INVALID, "%s on rank %d: count %zu is too large", fn, rank, count);
    if (count > 0 && !buf)
        return tally__seterr(TALLY_E_INVALID, "%s on rank %d: buf is NULL with count %zu", fn, rank, count);
    if ((peer < 0 || peer >= size) && !(is_recv && peer == TALLY_ANY_SOURCE))
        return tally__seterr(TALLY_E_INVALID, "%s on rank %d: %s %d is out of range [0, %d)%s", fn, rank,
                             is_recv ? "src" : "dst", peer, size, is_recv ? " (or TALLY_ANY_SOURCE)" : "");
    if (tag < 0)
        return tally__seterr(TALLY_E_INVALID, "%s on rank %d: tag %d is out of range [0, TALLY_TAG_MAX]", fn, rank,
                             tag);
    return 0;
}

static void p2p_done(void *arg, int rc, const char *msg, int source) { tally__request_complete(arg, rc, msg, source); }

static int p2p_drive(void *po, _Atomic int *done) { return tally__po_drive(po, done); }

/* A request for the post office to end; none when the post is refused. */
static int p2p_post(tally_comm *c, int is_recv, const void *buf, size_t count, tally_dtype t, int peer, int tag,
                    tally_request **req) {
    tally_request *r;
    int rc = tally__request_external(&r);
    if (rc) return rc;
    tally__po *po = tally__comm_po(c);
    if (is_recv) tally__request_progress(r, p2p_drive, po); /* its waiter reads the message itself */
    rc = is_recv ? tally__po_recv(po, (void *)buf, count, t, peer, tag, p2p_done, r)
                 : tally__po_send(po, buf, count, t, peer, tag, p2p_done, r);
    if (rc) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", tally_last_error());
        tally__request_complete(r, rc, msg, -1); /* never posted: ended here, and gone */
        tally_request_free(r);
        return tally__seterr(rc, "%s", msg);
    }
    *req = r;
    return 0;
}

/* Non-blocking: a refused post (bad arguments, a failed or freed communicator) is returned at once. */
static int p2p_start(tally_comm *c, const char *fn, int is_recv, const void *buf, size_t count, tally_dtype t, int peer,
                     int tag, tally_request **req) {
    tally__clearerr();
    if (!req) return tally__seterr(TALLY_E_INVALID, "%s: req is NULL", fn);
    *req = NULL;
    int rc = p2p_check(c, fn, buf, count, t, peer, is_recv, tag);
    if (rc) return rc;
    tally__comm_hold(c);
    return tally__comm_release(c, p2p_post(c, is_recv, buf, count, t, peer, tag, req));
}

/* Blocking: post and wait, the communicator held meanwhile (an abort on another thread ends the wait). */
static int p2p_run(tally_comm *c, const char *fn, int is_recv, const void *buf, size_t count, tally_dtype t, int peer,
                   int tag, int *from) {
    tally__clearerr();
    if (from) *from = -1;
    int rc = p2p_check(c, fn, buf, count, t, peer, is_recv, tag);
    if (rc) return rc;
    tally__comm_hold(c);
    tally_request *r = NULL;
    rc = p2p_post(c, is_recv, buf, count, t, peer, tag, &r);
    if (!rc) {
        rc = tally_wait(r);
        if (!rc && from) *from = tally_request_source(r);
        tally_request_free(r);
    }
    return tally__comm_release(c, rc);
}

TALLY_API int tally_isend(tally_comm *c, const void *buf, size_t count, tally_dtype t, int dst, int tag,
                          tally_request **req) {
    return p2p_start(c, "tally_isend", 0, buf, count, t, dst, tag, req);
}

TALLY_API int tally_irecv(tally_comm *c, void *buf, size_t count, tally_dtype t, int src, int tag,
                          tally_request **req) {
    return p2p_start(c, "tally_irecv", 1, buf, count, t, src, tag, req);
}

TALLY_API int tally_send(tally_comm *c, const void *buf, size_t count, tally_dtype t, int dst, int tag) {
    return p2p_run(c, "tally_send", 0, buf, count, t, dst, tag, NULL);
}

TALLY_API int tally_recv(tally_comm *c, void *buf, size_t count, tally_dtype t, int src, int tag, int *from) {
    return p2p_run(c, "tally_recv", 1, buf, count, t, src, tag, from);
}
