"""comm.py - tally.Comm: the communicator over NumPy arrays (allreduce, reduce_scatter, allgather,
broadcast, barrier, abort, memory peers read in place), every check and error in Python's terms."""
import ctypes
import weakref

import numpy as np

from . import config, errors
from ._lib import lib, c_comm_p, c_req_p

# tally_dtype and tally_op, in include/tally.h's order.
DTYPES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3, "int32": 4, "int64": 5, "uint8": 6}
OPS = {"sum": 0, "avg": 1, "prod": 2, "min": 3, "max": 4}

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
    """A non-blocking collective in flight: wait() returns its result array (or raises tally's error)."""

    def __init__(self, handle, result, keep):
        self._h, self._result, self._keep = handle, result, keep

    def test(self):
        """True once done (raising its error if it failed)."""
        done = ctypes.c_int(0)
        _raise(lib.tally_test(self._h, ctypes.byref(done)))
        return bool(done.value)

    def wait(self):
        rc = lib.tally_wait(self._h)
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
