"""comm.py - tally.Comm: the communicator over NumPy arrays (the collectives, point-to-point messages,
abort, memory peers read in place), every check and error in Python's terms."""
import ctypes
import weakref

import numpy as np

from . import config, errors
from ._lib import lib, c_comm_p, c_req_p

# tally_dtype and tally_op, in include/tally.h's order.
DTYPES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3, "int32": 4, "int64": 5, "uint8": 6, "int8": 7,
          "int16": 8, "bool": 9}
OPS = {"sum": 0, "avg": 1, "prod": 2, "min": 3, "max": 4, "band": 5, "bor": 6, "bxor": 7}
ANY_SOURCE = -1  # TALLY_ANY_SOURCE: recv from whichever rank sends first

def _raise(rc):
    if rc:
        raise errors.from_code(rc, lib.tally_last_error().decode(errors="replace"))
    return rc


def _dtype_code(a, what):
    # bfloat16 has no NumPy dtype of its own: an array whose dtype is named so (ml_dtypes') is taken as one.
    code = DTYPES.get(a.dtype.name)
    if code is None:
        raise ValueError(f"tally: {what} has dtype {a.dtype.name}; tally takes "
                         + ", ".join(DTYPES) + " (bfloat16 where the array's dtype is named so)")
    return code


def _check_array(a, what, writable=False):
    if not isinstance(a, np.ndarray):
        raise ValueError(f"tally: {what} must be a NumPy array, not {type(a).__name__}")
    if not a.flags.c_contiguous:
        raise ValueError(f"tally: {what} must be C-contiguous (np.ascontiguousarray makes a copy that is)")
    if writable and not a.flags.writeable:
        raise ValueError(f"tally: {what} is read-only, and the result is written into it")
    return _dtype_code(a, what)


def _op_code(op):
    code = OPS.get(str(op).lower())
    if code is None:
        raise ValueError(f"tally: op {op!r} is not one of " + ", ".join(OPS))
    return code


def _same_kind(a, out, what):
    if out.dtype != a.dtype:
        raise ValueError(f"tally: {what} has dtype {out.dtype.name}, the input {a.dtype.name}")


class Request:
    """A non-blocking call in flight: wait() returns its result array (or raises tally's error); a receive's
    source is the rank its message came from, once done."""

    def __init__(self, handle, result, keep):
        self._h, self._result, self._keep = handle, result, keep
        self.source = None

    def test(self):
        """True once done (raising its error if it failed)."""
        done = ctypes.c_int(0)
        _raise(lib.tally_test(self._h, ctypes.byref(done)))
        return bool(done.value)

    def wait(self):
        if not self._h:
            raise errors.InvalidArgument("tally: this request was waited for already", -1)
        rc = lib.tally_wait(self._h)
        src = lib.tally_request_source(self._h)
        self.source = src if src >= 0 else None
        self._free()
        _raise(rc)
        return self._result

    def _free(self):
        if self._h:
            lib.tally_request_free(self._h)
            self._h, self._keep = None, None

    def __del__(self):
        self._free()


class Comm:
    """A tally communicator. Comm() takes rank, size and the rendezvous from the environment (tally run,
    torchrun, mpirun, srun, or TALLY_RANK / TALLY_WORLD_SIZE / TALLY_ADDR); what is given here is used
    instead: rank, size, addr ("host:port" where rank 0 listens; or address=), token, and any other field
    of tally_config by name (timeout=30, transport="tcp", algo="ring", log_level=1, ...: docs/config.md),
    with log=callable(level, line) to take tally's log lines. The environment is only read, never set.
    Collective over all ranks."""

    def __init__(self, rank=None, size=None, addr=None, token=None, log=None, **fields):
        if addr is not None and fields.get("address") is not None:
            raise ValueError("tally: give addr or address, not both")
        if addr is not None:
            fields["address"] = addr
        cfg = config.make(log=log, rank=rank, size=size, token=token, **fields)
        handle = c_comm_p()
        _raise(lib.tally_comm_init_config(ctypes.byref(handle), ctypes.byref(cfg)))
        self._h = handle
        self._mem = {}
        self.rank = lib.tally_comm_rank(handle)
        self.size = lib.tally_comm_size(handle)

    # ---- lifetime ----

    def _handle(self):
        if not self._h:
            raise errors.InvalidArgument("tally: the communicator was freed or aborted", -1)
        return self._h

    def free(self):
        """Frees the communicator (its tally_mem_alloc arrays must no longer be used)."""
        if getattr(self, "_h", None):
            h, self._h = self._h, None
            self._mem.clear()
            lib.tally_comm_free(h)

    close = free

    def abort(self):
        """Aborts: calls in flight on other threads end with tally.Aborted, the peers' with an error
        naming this rank; the communicator is gone."""
        if self._h:
            h, self._h = self._h, None
            self._mem.clear()
            lib.tally_comm_abort(h)

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

    def algo_for(self, nbytes):
        return lib.tally_comm_algo_for(self._handle(), nbytes).decode()

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
        _raise(lib.tally_allreduce(self._handle(), a.ctypes.data, out.ctypes.data, a.size, t, o))
        return out

    def iallreduce(self, a, out=None, op="sum"):
        """allreduce that returns at once a Request; a and out must not change until its wait()."""
        t, o, out = self._allreduce_args(a, out, op)
        req = c_req_p()
        _raise(lib.tally_iallreduce(self._handle(), a.ctypes.data, out.ctypes.data, a.size, t, o, ctypes.byref(req)))
        return Request(req, out, (a, out))

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
        _raise(lib.tally_reduce_scatter(self._handle(), a.ctypes.data, out.ctypes.data, k, t, o))
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
        _raise(lib.tally_allgather(self._handle(), a.ctypes.data, out.ctypes.data, a.size, t))
        return out

    def broadcast(self, a, root=0):
        """Root's a into every rank's a, in place."""
        t = _check_array(a, "the array", writable=True)
        if not 0 <= int(root) < self.size:
            raise ValueError(f"tally: root {root} is out of range [0, {self.size})")
        _raise(lib.tally_broadcast(self._handle(), a.ctypes.data, a.size, t, int(root)))
        return a

    def barrier(self):
        _raise(lib.tally_barrier(self._handle()))

    def _root(self, root):
        if not 0 <= int(root) < self.size:
            raise ValueError(f"tally: root {root} is out of range [0, {self.size})")
        return int(root)

    def _peer(self, peer, what):
        if not 0 <= int(peer) < self.size:
            raise ValueError(f"tally: {what} rank {peer} is out of range [0, {self.size})")
        return int(peer)

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
        """The blocking call tally_<name>, or its non-blocking form returning a Request."""
        if not nonblocking:
            _raise(getattr(lib, "tally_" + name)(self._handle(), *args))
            return result
        req = c_req_p()
        _raise(getattr(lib, "tally_i" + name)(self._handle(), *args, ctypes.byref(req)))
        return Request(req, result, keep)

    def reduce(self, a, out=None, op="sum", root=0, nonblocking=False):
        """Root gets the reduction of every rank's a in out (or in a itself when out is None) and it is
        returned there; the other ranks get None (a is only read there)."""
        root = self._root(root)
        if self.rank == root:
            t, o, out = self._allreduce_args(a, out, op)
        else:
            t, o, out = _check_array(a, "the array"), _op_code(op), None
        dst = out.ctypes.data if out is not None else None
        return self._go("reduce", (a.ctypes.data, dst, a.size, t, o, root), out, (a, out), nonblocking)

    def gather(self, a, out=None, root=0, nonblocking=False):
        """Root gets every rank's a, rank-major, in out (shape (size,) + a.shape when None); others None."""
        root = self._root(root)
        t = _check_array(a, "the array")
        if self.rank == root:
            out = self._out(out, a, (self.size,) + a.shape, f"gather of {a.size} from {self.size} ranks")
        else:
            out = None
        dst = out.ctypes.data if out is not None else None
        return self._go("gather", (a.ctypes.data, dst, a.size, t, root), out, (a, out), nonblocking)

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
            src = a.ctypes.data
        return self._go("scatter", (src, out.ctypes.data, out.size, t, root), out, (a, out), nonblocking)

    def alltoall(self, a, out=None, nonblocking=False):
        """Block j of a (a.size / size elements) goes to rank j, landing as block `rank` of its out."""
        t = _check_array(a, "the array")
        if a.size % self.size:
            raise ValueError(f"tally: alltoall of {a.size} elements: not a multiple of the size {self.size}")
        out = self._out(out, a, a.shape, f"alltoall of {a.size}")
        return self._go("alltoall", (a.ctypes.data, out.ctypes.data, a.size // self.size, t), out, (a, out),
                        nonblocking)

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
        _raise(lib.tally_alltoallv(self._handle(), a.ctypes.data, sc, sd, out.ctypes.data, rc, rd, t))
        return out

    def _sizes(self, name, v):
        vals = [int(x) for x in v]
        if len(vals) != self.size or any(x < 0 for x in vals):
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
        self.isend(a, dst, tag).wait()

    def recv(self, out, src=ANY_SOURCE, tag=0):
        """Receives into out the first message with tag from src (ANY_SOURCE: any rank); returns the rank
        it came from. out's size and dtype must be the message's."""
        req = self.irecv(out, src, tag)
        req.wait()
        return req.source

    def isend(self, a, dst, tag=0):
        t = _check_array(a, "the array")
        req = c_req_p()
        _raise(lib.tally_isend(self._handle(), a.ctypes.data, a.size, t, self._peer(dst, "send's destination"),
                               self._tag(tag), ctypes.byref(req)))
        return Request(req, None, a)

    def irecv(self, out, src=ANY_SOURCE, tag=0):
        t = _check_array(out, "out", writable=True)
        src = ANY_SOURCE if src is None or src == ANY_SOURCE else self._peer(src, "recv's source")
        req = c_req_p()
        _raise(lib.tally_irecv(self._handle(), out.ctypes.data, out.size, t, src, self._tag(tag), ctypes.byref(req)))
        return Request(req, out, out)

    @staticmethod
    def _tag(tag):
        if not 0 <= int(tag) <= 0x7FFFFFFF:
            raise ValueError(f"tally: tag {tag} is out of range [0, 2**31)")
        return int(tag)

    # ---- memory peers on this host read in place ----

    def mem_alloc(self, shape, dtype=np.float32):
        """A NumPy array in memory the ranks of this host read in place (one copy, no system call, for
        a large message on shm). Released when the array (and its views) are gone, or with the comm."""
        dt = np.dtype(dtype)
        _dtype_code(np.empty(0, dt), "mem_alloc's dtype")
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        h = self._handle()
        ptr = lib.tally_mem_alloc(h, n)
        if not ptr:
            _raise(errors.OutOfMemory.code)
        buf = (ctypes.c_char * max(n, 1)).from_address(ptr)
        arr = np.frombuffer(buf, dtype=dt, count=n // dt.itemsize).reshape(shape)
        self._mem[ptr] = True
        weakref.finalize(buf, Comm._mem_release, weakref.ref(self), ptr)
        return arr

    @staticmethod
    def _mem_release(ref, ptr):
        comm = ref()
        if comm is not None and comm._h and comm._mem.pop(ptr, None):
            lib.tally_mem_free(comm._h, ptr)
