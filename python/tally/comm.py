"""comm.py - tally.Comm: the communicator over NumPy arrays (the collectives, point-to-point messages,
abort, memory peers read in place), every check and error in Python's terms. What the library still uses
stays alive: a pending Request keeps its arrays, an array from mem_alloc its memory (past the
communicator too); a blocking call waits in slices so Ctrl-C reaches Python; a communicator belongs to
the process that made it (a forked child gets tally.InvalidArgument, its finalizers just drop it)."""
import ctypes
import numbers
import os
import threading
import weakref

import numpy as np

from . import config, errors
from ._lib import lib, c_comm_p, c_req_p

# tally_dtype and tally_op, in include/tally.h's order.
DTYPES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3, "int32": 4, "int64": 5, "uint8": 6, "int8": 7,
          "int16": 8, "bool": 9}
OPS = {"sum": 0, "avg": 1, "prod": 2, "min": 3, "max": 4, "band": 5, "bor": 6, "bxor": 7}
ANY_SOURCE = -1  # TALLY_ANY_SOURCE: recv from whichever rank sends first
# The codes by NumPy dtype (native byte order): one dict look-up per array, where dtype.name takes 1.5 us.
_CODES = {np.dtype(name): code for name, code in DTYPES.items() if name != "bfloat16"}
# A blocking call waits in the library at most this long at a time, then lets Python run its signal
# handlers (Ctrl-C's KeyboardInterrupt): a signal is noticed within it.
SLICE_S = 0.1
# The most mem_alloc takes at once, as the library's calls take at most 2**50 bytes.
MEM_MAX_BYTES = 1 << 50

# Bumped in the child of every os.fork(): a communicator made before belongs to the parent.
_fork_gen = 0


def _forked():
    global _fork_gen
    _fork_gen += 1


os.register_at_fork(after_in_child=_forked)


def _raise(rc):
    if rc:
        raise errors.from_code(rc, lib.tally_last_error().decode(errors="replace"))
    return rc


def _int(v, what):
    """v as an int: a rank, a root, a tag, a count, a dimension. A float (0.9), a bool or a str is refused
    (TypeError naming the argument) rather than rounded."""
    if type(v) is int:
        return v
    if isinstance(v, numbers.Integral) and not isinstance(v, bool):
        return int(v)
    raise TypeError(f"tally: {what} must be an int, not {type(v).__name__} {v!r}")


def _ptr(a):
    return a.__array_interface__["data"][0]  # a third cheaper than a.ctypes.data


def _dtype_code(a, what):
    code = _CODES.get(a.dtype)
    if code is not None:
        return code
    # bfloat16 has no NumPy dtype of its own: an array whose dtype is named so (ml_dtypes') is taken as one.
    if a.dtype.name == "bfloat16":
        return DTYPES["bfloat16"]
    order = " in the other byte order" if a.dtype.name in DTYPES else ""
    raise ValueError(f"tally: {what} has dtype {a.dtype.name}{order} ({a.dtype.str}); tally takes "
                     + ", ".join(DTYPES) + " (native byte order; bfloat16 where the array's dtype is named so)")


def _check_array(a, what, writable=False):
    if not isinstance(a, np.ndarray):
        raise ValueError(f"tally: {what} must be a NumPy array, not {type(a).__name__}")
    if not a.flags.c_contiguous:
        raise ValueError(f"tally: {what} must be C-contiguous (np.ascontiguousarray makes a copy that is)")
    if writable and not a.flags.writeable:
        raise ValueError(f"tally: {what} is read-only, and the result is written into it")
    return _dtype_code(a, what)


def _op_code(op):
    code = OPS.get(op) if type(op) is str else None
    if code is None:
        code = OPS.get(str(op).lower())
    if code is None:
        raise ValueError(f"tally: op {op!r} is not one of " + ", ".join(OPS))
    return code


def _same_kind(a, out, what):
    if out.dtype != a.dtype:
        raise ValueError(f"tally: {what} has dtype {out.dtype.name}, the input {a.dtype.name}")


class _State:
    """The library's communicator as the Comm, its Requests and its mem_alloc arrays share it: the handle
    (None once freed or aborted, and why), the process it belongs to, the requests dropped while pending
    (kept with their arrays until done), and a lock that orders free and abort with a buffer's release."""

    def __init__(self, handle):
        self.h = handle
        self.gen = _fork_gen
        self.gone = None
        self.orphans = []  # (request handle, what it keeps alive)
        # Never held across the library's free or abort: those wait for the communication thread, which
        # may run Python (a log callback) that drops an array, whose finalizer takes this lock.
        self.lock = threading.RLock()  # reentrant: a finalizer may run inside a call on the same thread
        self.closing = False  # the free or abort runs: releases and orphans wait for its end (deferred)
        self.deferred = []  # mem_alloc pointers whose last view went while closing

    def foreign(self):
        return self.gen != _fork_gen

    def orphan(self, h, arrays):
        """Keeps a dropped pending request (and its arrays) until it is done; freed at once when the
        communicator went meanwhile (its free or abort completed every request it had)."""
        if self.foreign():  # the parent's request: its lock may have been held at the fork
            return
        with self.lock:
            if self.h or self.closing:
                self.orphans.append((h, arrays))
                return
        lib.tally_request_free(h)

    def reap(self):
        """Frees the orphaned requests that are done, and lets their arrays go."""
        if self.foreign():
            return
        done = ctypes.c_int(0)
        with self.lock:
            keep = []
            for h, arrays in self.orphans:
                lib.tally_test(h, ctypes.byref(done))
                if done.value:
                    lib.tally_request_free(h)
                else:
                    keep.append((h, arrays))
            self.orphans = keep

    def close(self, abort, why):
        """Frees (or aborts) the communicator; its pending requests are done once this returns (the
        library completes or fails them), so the orphans go too. In a forked child: only dropped, without
        the lock (another thread of the parent may have held it at the fork: it stays held here)."""
        if self.foreign():
            if self.h:
                self.h, self.orphans = None, []
                self.gone = "made in another process (before a fork): this one must make its own"
            return
        with self.lock:
            h, self.h = self.h, None
            if not h:
                return
            self.gone, self.closing = why, True
        (lib.tally_comm_abort if abort else lib.tally_comm_free)(h)
        with self.lock:
            self.closing = False
            orphans, self.orphans = self.orphans, []
            deferred, self.deferred = self.deferred, []
        for h, _ in orphans:  # done: the free completed them, the abort failed them
            lib.tally_request_free(h)
        for ptr in deferred:  # kept past the communicator (tally_mem_keep): released by themselves now
            lib.tally_mem_release(ptr)

    def interrupted(self, req, what, exc):
        """A signal handler raised (Ctrl-C) while req was in flight: unless it is done, the communicator
        is aborted (the request fails at once, the peers are told), so nothing writes into arrays the
        exception may free; the exception then goes on. Nothing when done, closed, or not ours."""
        done = ctypes.c_int(0)
        if self.foreign() or not self.h:
            return
        lib.tally_test(req, ctypes.byref(done))
        if not done.value:
            self.close(True, f"aborted: {type(exc).__name__} interrupted its {what}")


def _await(st, req, what):
    """Waits for req in slices of SLICE_S, Python's signal handlers running between them; returns its
    result code (with tally_last_error set). A handler that raises aborts the communicator first (unless
    req is done by then), then its exception goes on."""
    done = ctypes.c_int(0)
    ref = ctypes.byref(done)
    try:
        rc = lib.tally_wait_for(req, SLICE_S, ref)
        while not done.value and not rc:  # rc without done: refused (a forked child's)
            rc = lib.tally_wait_for(req, SLICE_S, ref)
        return rc
    except BaseException as e:
        st.interrupted(req, what, e)
        raise


def _settle(st, r, waited, keep):
    """After a blocking call: its request freed once waited for (the common path: no extra call); else
    (an exception before or during the wait) freed only when done, or kept with its arrays until it is."""
    if not r:
        return
    done = ctypes.c_int(1 if waited else 0)
    if not waited:
        lib.tally_test(r, ctypes.byref(done))
    if done.value:
        lib.tally_request_free(r)
    else:
        st.orphan(r, keep)


class Request:
    """A non-blocking call in flight: wait() returns its result array (or raises tally's error); a receive's
    source is the rank its message came from, once done. Until it is done it keeps every array the call
    uses alive, even dropped unwaited (it then completes in the background, its arrays with it)."""

    def __init__(self, st, handle, result, keep, what):
        self._st, self._h, self._result, self._keep, self._what = st, handle, result, keep, what
        self.source = None
        self._finished, self._error = False, None  # set once done: wait() then returns or raises the same

    def test(self):
        """True once done (raising its error if it failed)."""
        if not self._h:
            return True
        done = ctypes.c_int(0)
        rc = lib.tally_test(self._h, ctypes.byref(done))
        if rc or done.value:
            self._finish(rc)
        return bool(done.value)

    def wait(self):
        if not self._h:
            if self._error is not None:
                raise self._error
            if self._finished:
                return self._result  # a test() that said done, or an earlier wait()
            raise errors.InvalidArgument("tally: this request was never posted", -1)
        try:
            rc = _await(self._st, self._h, self._what)
        except BaseException as e:
            if not isinstance(e, errors.Error):
                self._st.interrupted(self._h, self._what, e)  # raised as _await began: idempotent
            raise
        self._finish(rc)
        return self._result

    def _finish(self, rc):
        """Done: its source, its error raised, the library's request freed and the arrays let go."""
        h, self._h = self._h, None
        self._finished = True
        try:
            _raise(rc)
        except errors.Error as e:
            self._error = e
            raise
        finally:
            src = lib.tally_request_source(h)
            self.source = src if src >= 0 else None
            lib.tally_request_free(h)
            self._keep = None

    def __del__(self):
        h, self._h = getattr(self, "_h", None), None
        if not h or self._st.foreign():
            return  # nothing, or the parent's (after a fork): dropped
        done = ctypes.c_int(0)
        lib.tally_test(h, ctypes.byref(done))
        if done.value:
            lib.tally_request_free(h)
        else:  # still running: it and its arrays are kept until it is done (the communicator's free waits)
            self._st.orphan(h, self._keep)
        self._keep = None


def _release_mem(st, ptr):
    """The last view of a mem_alloc array is gone: its memory goes back, to the communicator while it
    lives, else (kept past it: tally_mem_keep) by itself. In a forked child: the parent's, left alone."""
    if st.foreign():
        return
    with st.lock:
        if st.h:
            lib.tally_mem_free(st.h, ptr)
            return
        if st.closing:  # the communicator hands its kept buffers over as its free ends: released after
            st.deferred.append(ptr)
            return
    lib.tally_mem_release(ptr)


class Comm:
    """A tally communicator. Comm() takes rank, size and the rendezvous from the environment (tally run,
    torchrun, mpirun, srun, or TALLY_RANK / TALLY_WORLD_SIZE / TALLY_ADDR); what is given here is used
    instead: rank, size, addr ("host:port" where rank 0 listens; or address=), token, and any other field
    of tally_config by name (timeout=30, transport="tcp", algo="ring", log_level=1, ...: docs/config.md),
    with log=callable(level, line) to take tally's log lines. The environment is only read, never set.
    Collective over all ranks. It belongs to this process: in a child of os.fork() every call raises
    tally.InvalidArgument (make a new Comm there), and free() or the finalizer only drop it."""

    def __init__(self, rank=None, size=None, addr=None, token=None, log=None, **fields):
        self._st = None
        if addr is not None and fields.get("address") is not None:
            raise ValueError("tally: give addr or address, not both")
        if addr is not None:
            fields["address"] = addr
        cfg = config.make(log=log, rank=rank, size=size, token=token, **fields)
        handle = c_comm_p()
        _raise(lib.tally_comm_init_config(ctypes.byref(handle), ctypes.byref(cfg)))
        self._st = _State(handle.value)
        self.rank = lib.tally_comm_rank(handle)
        self.size = lib.tally_comm_size(handle)

    # ---- lifetime ----

    def _handle(self):
        st = self._st
        if st.h:
            if st.orphans:
                st.reap()
            return st.h
        if st.gone and st.gone.startswith("aborted"):
            raise errors.Aborted(f"tally: the communicator was {st.gone}; it cannot be used again: make a new "
                                 "tally.Comm() (every rank)", errors.Aborted.code)
        raise errors.InvalidArgument(f"tally: the communicator was {st.gone or 'freed'}", -1)

    def free(self):
        """Frees the communicator, first completing its pending requests. Arrays from mem_alloc stay
        valid (plain memory from then on) until their last view is gone. In a forked child: dropped."""
        if self._st is not None:
            self._st.close(False, "freed (Comm.free)")

    close = free

    def abort(self):
        """Aborts: calls in flight on other threads end with tally.Aborted, the peers' with an error
        naming this rank; the communicator is gone (mem_alloc arrays stay valid, as with free)."""
        if self._st is not None:
            self._st.close(True, "aborted (Comm.abort)")

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is None:
            self.free()
        else:
            self.abort()  # a peer may be gone: no goodbyes that could wait on it

    def __del__(self):
        self.free()

    @property
    def transport(self):
        return lib.tally_comm_transport(self._handle()).decode()

    @property
    def large_path(self):
        """What large messages do between ranks on this host (tally_comm_large_path); "" over tcp."""
        return lib.tally_comm_large_path(self._handle()).decode()

    @property
    def mem_min(self):
        """Bytes from which arrays from mem_alloc are read in place by the other ranks on this host
        (tally_comm_mem_min); 0 where none are (tcp, self, TALLY_SHM_LARGE=off)."""
        return lib.tally_comm_mem_min(self._handle())

    def algo_for(self, nbytes):
        return lib.tally_comm_algo_for(self._handle(), _int(nbytes, "nbytes")).decode()

    # ---- running a call ----

    def _run(self, fn, what, args, keep):
        """The call as its non-blocking form fn (tally_i<what>), waited for in slices (Ctrl-C is noticed
        within SLICE_S; it aborts the communicator if the call is still in flight). keep: the arrays it
        uses, alive here until it is done."""
        h = self._handle()
        req = c_req_p()
        rc, waited = 0, False
        try:  # the post inside: a signal's exception can land as the ctypes call returns, req already set
            rc = fn(h, *args, ctypes.byref(req))
            if rc:
                _raise(rc)
            rc, waited = _await(self._st, req.value, what), True
        except BaseException as e:
            if req.value and not isinstance(e, errors.Error):
                self._st.interrupted(req.value, what, e)  # raised before _await's own wait began
            raise
        finally:
            _settle(self._st, req.value, waited, keep)
        _raise(rc)
        return keep

    def _post(self, fn, what, args, result, keep):
        """The non-blocking form: a Request keeping `keep` alive until done."""
        h = self._handle()
        req = c_req_p()
        owner = Request(self._st, None, result, keep, what)  # one owner at every step, before the post
        try:
            rc = fn(h, *args, ctypes.byref(req))
            owner._h = req.value
            if rc:
                _raise(rc)
            return owner
        except BaseException:
            if req.value and owner._h is None:  # posted, not yet owned (a signal's exception): kept until done
                self._st.orphan(req.value, keep)
            raise

    # ---- collectives ----

    @staticmethod
    def _allreduce_args(a, out, op):
        """(dtype code, op code, out): out is a itself when None (in place)."""
        t = _check_array(a, "the array", writable=out is None)
        o = _op_code(op)
        if out is None:
            return t, o, a
        _check_array(out, "out", writable=True)
        _same_kind(a, out, "out")
        if out.size != a.size:
            raise ValueError(f"tally: out has {out.size} elements, the input {a.size}")
        return t, o, out

    def allreduce(self, a, out=None, op="sum"):
        """Reduces a across ranks into out, or into a itself (in place) when out is None; returns it."""
        t, o, out = self._allreduce_args(a, out, op)
        self._run(lib.tally_iallreduce, "allreduce", (_ptr(a), _ptr(out), a.size, t, o), (a, out))
        return out

    def iallreduce(self, a, out=None, op="sum"):
        """allreduce that returns at once a Request; a and out must not change until its wait()."""
        t, o, out = self._allreduce_args(a, out, op)
        return self._post(lib.tally_iallreduce, "allreduce", (_ptr(a), _ptr(out), a.size, t, o), out, (a, out))

    def reduce_scatter(self, a, out=None, op="sum"):
        """Rank r gets the reduction of block r of a (a.size / size elements each) in out."""
        t = _check_array(a, "the array")
        o = _op_code(op)
        if a.size % self.size:
            raise ValueError(f"tally: reduce_scatter of {a.size} elements: not a multiple of the size {self.size}")
        k = a.size // self.size
        if out is None:
            out = np.empty(k, dtype=a.dtype)
        else:
            _check_array(out, "out", writable=True)
            _same_kind(a, out, "out")
            if out.size != k:
                raise ValueError(f"tally: out has {out.size} elements; reduce_scatter of {a.size} over "
                                 f"{self.size} ranks gives {k}")
        self._run(lib.tally_ireduce_scatter, "reduce_scatter", (_ptr(a), _ptr(out), k, t, o), (a, out))
        return out

    def allgather(self, a, out=None):
        """Every rank's a, rank-major: out has shape (size,) + a.shape."""
        t = _check_array(a, "the array")
        if out is None:
            out = np.empty((self.size,) + a.shape, dtype=a.dtype)
        else:
            _check_array(out, "out", writable=True)
            _same_kind(a, out, "out")
            if out.size != a.size * self.size:
                raise ValueError(f"tally: out has {out.size} elements; allgather of {a.size} from {self.size} "
                                 f"ranks needs {a.size * self.size}")
        self._run(lib.tally_iallgather, "allgather", (_ptr(a), _ptr(out), a.size, t), (a, out))
        return out

    def broadcast(self, a, root=0):
        """Root's a into every rank's a, in place."""
        t = _check_array(a, "the array", writable=True)
        root = self._root(root)
        self._run(lib.tally_ibroadcast, "broadcast", (_ptr(a), a.size, t, root), a)
        return a

    def barrier(self):
        self._run(lib.tally_ibarrier, "barrier", (), None)

    def _root(self, root):
        root = _int(root, "root")
        if not 0 <= root < self.size:
            raise ValueError(f"tally: root {root} is out of range [0, {self.size})")
        return root

    def _peer(self, peer, what):
        peer = _int(peer, what)
        if not 0 <= peer < self.size:
            raise ValueError(f"tally: {what} rank {peer} is out of range [0, {self.size})")
        return peer

    def _out(self, out, like, n, what):
        """out checked to hold n elements of like's dtype, or a new array of shape n (an int or a shape)."""
        if out is None:
            return np.empty(n, dtype=like.dtype)
        _check_array(out, "out", writable=True)
        _same_kind(like, out, "out")
        want = int(np.prod(n))
        if out.size != want:
            raise ValueError(f"tally: out has {out.size} elements; {what} needs {want}")
        return out

    def _go(self, name, args, result, keep, nonblocking):
        """The blocking call tally_<name> (run as its non-blocking form, waited for in slices), or that
        form's Request."""
        fn = getattr(lib, "tally_i" + name)
        if not nonblocking:
            self._run(fn, name, args, keep)
            return result
        return self._post(fn, name, args, result, keep)

    def reduce(self, a, out=None, op="sum", root=0, nonblocking=False):
        """Root gets the reduction of every rank's a in out (or in a itself when out is None) and it is
        returned there; the other ranks get None (a is only read there)."""
        root = self._root(root)
        if self.rank == root:
            t, o, out = self._allreduce_args(a, out, op)
        else:
            t, o, out = _check_array(a, "the array"), _op_code(op), None
        dst = _ptr(out) if out is not None else None
        return self._go("reduce", (_ptr(a), dst, a.size, t, o, root), out, (a, out), nonblocking)

    def gather(self, a, out=None, root=0, nonblocking=False):
        """Root gets every rank's a, rank-major, in out (shape (size,) + a.shape when None); others None."""
        root = self._root(root)
        t = _check_array(a, "the array")
        if self.rank == root:
            out = self._out(out, a, (self.size,) + a.shape, f"gather of {a.size} from {self.size} ranks")
        else:
            out = None
        dst = _ptr(out) if out is not None else None
        return self._go("gather", (_ptr(a), dst, a.size, t, root), out, (a, out), nonblocking)

    def scatter(self, a, out, root=0, nonblocking=False):
        """Rank r gets block r of root's a (size * out.size elements) in out; a is read on root only (pass
        None elsewhere). Returns out."""
        root = self._root(root)
        t = _check_array(out, "out", writable=True)
        src = None
        if self.rank == root:
            _check_array(a, "the array")
            _same_kind(out, a, "the array")
            if a.size != out.size * self.size:
                raise ValueError(f"tally: scatter's array has {a.size} elements; {self.size} ranks of {out.size} "
                                 f"need {out.size * self.size}")
            src = _ptr(a)
        return self._go("scatter", (src, _ptr(out), out.size, t, root), out, (a, out), nonblocking)

    def alltoall(self, a, out=None, nonblocking=False):
        """Block j of a (a.size / size elements) goes to rank j, landing as block `rank` of its out."""
        t = _check_array(a, "the array")
        if a.size % self.size:
            raise ValueError(f"tally: alltoall of {a.size} elements: not a multiple of the size {self.size}")
        out = self._out(out, a, a.shape, f"alltoall of {a.size}")
        return self._go("alltoall", (_ptr(a), _ptr(out), a.size // self.size, t), out, (a, out), nonblocking)

    def alltoallv(self, a, sendcounts, out, recvcounts, sdispls=None, rdispls=None):
        """sendcounts[j] elements of a (from sdispls[j], by default packed in order) go to rank j; recvcounts[i]
        elements from rank i land in out at rdispls[i]. Returns out."""
        t = _check_array(a, "the array")
        _check_array(out, "out", writable=True)
        _same_kind(a, out, "out")
        sc, rc = self._sizes("sendcounts", sendcounts), self._sizes("recvcounts", recvcounts)
        sd = self._sizes("sdispls", sdispls) if sdispls is not None else self._packed(sc)
        rd = self._sizes("rdispls", rdispls) if rdispls is not None else self._packed(rc)
        for name, counts, displs, arr in (("send", sc, sd, a), ("recv", rc, rd, out)):
            if any(d + c > arr.size for c, d in zip(counts, displs)):
                raise ValueError(f"tally: alltoallv's {name} counts and displacements reach past the "
                                 f"{arr.size} elements of its array")
        self._run(lib.tally_ialltoallv, "alltoallv", (_ptr(a), sc, sd, _ptr(out), rc, rd, t),
                  (a, out, sc, sd, rc, rd))
        return out

    def _sizes(self, name, v):
        vals = [_int(x, f"{name}[{i}]") for i, x in enumerate(v)]
        if len(vals) != self.size or any(x < 0 or x >= 1 << 63 for x in vals):
            raise ValueError(f"tally: {name} must hold {self.size} non-negative counts, got {list(v)!r}")
        return (ctypes.c_size_t * self.size)(*vals)

    def _packed(self, counts):
        displs, at = [], 0
        for c in counts:
            displs.append(at)
            at += c
        return (ctypes.c_size_t * self.size)(*displs)

    # ---- point-to-point ----

    def send(self, a, dst, tag=0):
        """Sends a to rank dst with tag; returns once a may be reused (the receiver need not have asked)."""
        t = _check_array(a, "the array")
        dst, tag = self._peer(dst, "send's destination"), self._tag(tag)
        self._run(lib.tally_isend, "send", (_ptr(a), a.size, t, dst, tag), a)

    def recv(self, out, src=ANY_SOURCE, tag=0):
        """Receives into out the first message with tag from src (ANY_SOURCE: any rank); returns the rank
        it came from. out's size and dtype must be the message's."""
        req = self.irecv(out, src, tag)
        req.wait()
        return req.source

    def isend(self, a, dst, tag=0):
        t = _check_array(a, "the array")
        dst, tag = self._peer(dst, "send's destination"), self._tag(tag)
        return self._post(lib.tally_isend, "send", (_ptr(a), a.size, t, dst, tag), None, a)

    def irecv(self, out, src=ANY_SOURCE, tag=0):
        t = _check_array(out, "out", writable=True)
        if src is None or _int(src, "recv's source") == ANY_SOURCE:
            src = ANY_SOURCE
        else:
            src = self._peer(src, "recv's source")
        tag = self._tag(tag)
        return self._post(lib.tally_irecv, "recv", (_ptr(out), out.size, t, src, tag), out, out)

    @staticmethod
    def _tag(tag):
        tag = _int(tag, "tag")
        if not 0 <= tag <= 0x7FFFFFFF:
            raise ValueError(f"tally: tag {tag} is out of range [0, 2**31)")
        return tag

    # ---- memory peers on this host read in place ----

    def mem_alloc(self, shape, dtype=np.float32):
        """A NumPy array in memory the ranks of this host read in place (one copy, no system call, for
        a large message on shm). The memory lives as long as any view of the array does: given back when
        the last one is gone, even after the communicator is freed or aborted (it is then plain memory)."""
        dt = np.dtype(dtype)
        _dtype_code(np.empty(0, dt), "mem_alloc's dtype")
        dims = (shape,) if not isinstance(shape, (tuple, list)) else tuple(shape)
        dims = tuple(_int(d, f"mem_alloc's dimension {i} ({d!r})") for i, d in enumerate(dims))
        for i, d in enumerate(dims):
            if d < 0:
                raise ValueError(f"tally: mem_alloc's shape {dims}: dimension {i} is {d}, negative")
        count = 1
        for d in dims:
            count *= d  # Python's integers: no wrap
        nbytes = count * dt.itemsize
        if nbytes > MEM_MAX_BYTES:
            raise ValueError(f"tally: mem_alloc of shape {dims} and dtype {dt.name} is {nbytes} bytes; "
                             f"it takes at most {MEM_MAX_BYTES} (2**50)")
        h = self._handle()
        ptr = lib.tally_mem_alloc(h, nbytes)
        if not ptr:
            msg = lib.tally_last_error().decode(errors="replace")
            code = errors.InvalidArgument.code if "made in process" in msg else errors.OutOfMemory.code
            raise errors.from_code(code, msg)
        rc = lib.tally_mem_keep(h, ptr)  # valid past the communicator's free or abort, while a view lives
        if rc:
            err = errors.from_code(rc, lib.tally_last_error().decode(errors="replace"))
            lib.tally_mem_free(h, ptr)
            raise err
        buf = (ctypes.c_char * max(nbytes, 1)).from_address(ptr)
        # buf is every view's base: the last one frees it. Not at exit: a request still in flight may use
        # the memory then, and the process's end returns it anyway.
        weakref.finalize(buf, _release_mem, self._st, ptr).atexit = False
        return np.frombuffer(buf, dtype=dt, count=count).reshape(dims)
