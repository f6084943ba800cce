"""numpy_ranks.py - one rank of the NumPy tests, started by `tally run -n N python3 numpy_ranks.py CASE`
(test_numpy.py runs each case). Prints one line "result RANK passed FAILED [what failed]" at the end.
Cases: collectives (every collective, dtype and op against NumPy, sizes 0, 1, odd, not divisible by N,
large), more (reduce, gather, scatter, all-to-all, point-to-point, int8/int16/bool and the bitwise ops), checks (ValueError for what tally would refuse), death (the last rank dies: the others raise
tally.PeerLost naming it), mismatch (the last rank passes another count: tally.Mismatch everywhere),
config (a Comm from keyword arguments with no TALLY_* left in the environment, which it never changes; its
log callback; bad fields refused by name), lifetime (2 ranks: arrays a dropped pending request uses stay
alive, mem_alloc arrays outlive their views' communicator, shapes and non-integer ranks refused, a forked
child refused at once while the parents go on, a signal handler run while a call is blocked, Ctrl-C ending
a blocked call within a second with the communicator aborted)."""
import atexit
import faulthandler
import gc
import os
import signal
import sys
import threading
import time
import weakref

import numpy as np

import tally

from verdict import check, report


def data(rank, n, dtype):
    """Rank r's values: small integers so every op is exact in every dtype (f16 and bf16 included)."""
    v = (np.arange(n) % 5 + rank + 1)
    return v.astype(dtype)


def reference(size, n, dtype, op):
    vs = np.stack([data(r, n, np.float64) for r in range(size)])
    out = {"sum": vs.sum(0), "prod": vs.prod(0), "min": vs.min(0), "max": vs.max(0), "avg": vs.mean(0)}[op]
    if np.dtype(dtype).kind in "iu" and op == "avg":
        out = vs.sum(0) // size  # integer average truncates, as tally's does
    return out


def case_collectives(c):
    dtypes = [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8]
    try:
        import ml_dtypes  # bfloat16 as NumPy knows it, where installed
        dtypes.append(ml_dtypes.bfloat16)
    except ImportError:
        pass
    sizes = [0, 1, 7, 1001, 3 * c.size + 1, 1 << 20]
    if c.transport == "shm":  # says which buffers are read in place
        check(c.large_path.startswith("tally_mem_alloc buffers"), f"large_path over shm: {c.large_path!r}")
        check(c.mem_min == 256 << 10, f"mem_min over shm: {c.mem_min}")
    for dt in dtypes:
        name = np.dtype(dt).name
        for n in sizes:
            for op in ("sum", "prod", "min", "max", "avg"):
                if op == "prod" and n > 1001:
                    continue  # products of large vectors overflow every dtype
                if name == "uint8" and op in ("sum", "avg", "prod") and c.size > 3:
                    continue
                a = data(c.rank, n, dt)
                want = reference(c.size, n, dt, op)
                got = c.allreduce(a.copy(), op=op)  # in place
                out = np.empty_like(a)
                got2 = c.allreduce(a, out=out, op=op)  # into out
                tol = 1e-2 if name in ("float16", "bfloat16") else 1e-6
                ok = np.allclose(got.astype(np.float64), want, rtol=tol) and got2 is out and np.array_equal(out, got)
                check(ok, f"allreduce {name} n={n} {op}")
            a = data(c.rank, n * c.size, dt)
            rs = c.reduce_scatter(a)
            want = reference(c.size, n * c.size, dt, "sum")[c.rank * n:(c.rank + 1) * n]
            check(np.allclose(rs.astype(np.float64), want, rtol=1e-2), f"reduce_scatter {name} n={n}")
            a = data(c.rank, n, dt)
            ag = c.allgather(a)
            check(ag.shape == (c.size, n) and all(np.array_equal(ag[r], data(r, n, dt)) for r in range(c.size)),
                  f"allgather {name} n={n}")
            root = c.size - 1
            b = data(c.rank, n, dt)
            c.broadcast(b, root=root)
            check(np.array_equal(b, data(root, n, dt)), f"broadcast {name} n={n}")
    c.barrier()
    # Non-blocking: two in flight, waited for in reverse.
    a1, a2 = data(c.rank, 1001, np.float32), data(c.rank, 5, np.float64)
    r1, r2 = c.iallreduce(a1), c.iallreduce(a2, op="max")
    check(np.array_equal(r2.wait(), reference(c.size, 5, np.float64, "max")), "iallreduce max")
    check(np.allclose(r1.wait(), reference(c.size, 1001, np.float32, "sum")), "iallreduce sum")
    # Memory the host's ranks read in place.
    m = c.mem_alloc((3, 1000), np.float32)
    m[:] = c.rank + 1
    c.allreduce(m)
    check(m.shape == (3, 1000) and np.all(m == c.size * (c.size + 1) / 2), "mem_alloc array allreduce")
    del m


def case_more(c):
    """The rooted collectives, all-to-all, point-to-point, and the one-byte, two-byte and bool elements with
    the bitwise ops, against NumPy."""
    size, rank = c.size, c.rank
    for n in (0, 1, 7, 3 * size + 1, 1 << 18):
        for root in range(size):
            a = data(rank, n, np.float64)
            got = c.reduce(a.copy(), op="max", root=root)
            check(got is None if rank != root else np.array_equal(got, reference(size, n, np.float64, "max")),
                  f"reduce n={n} root={root}")
            g = c.gather(data(rank, n, np.int32), root=root)
            check(g is None if rank != root else
                  all(np.array_equal(g[r], data(r, n, np.int32)) for r in range(size)), f"gather n={n} root={root}")
            whole = np.arange(size * n, dtype=np.float32) + 100 * root
            out = c.scatter(whole if rank == root else None, np.empty(n, np.float32), root=root)
            check(np.array_equal(out, whole[rank * n:(rank + 1) * n]), f"scatter n={n} root={root}")
        a = np.array([[1000 * rank + 10 * j + k for k in range(n)] for j in range(size)], np.int64)
        got = c.alltoall(a)
        want = np.array([[1000 * i + 10 * rank + k for k in range(n)] for i in range(size)], np.int64)
        check(np.array_equal(got.reshape(size, n), want.reshape(size, n)), f"alltoall n={n}")
    # alltoallv: rank i sends i + j + (n % 3) elements to rank j, some of them zero.
    counts = lambda i, j: (i + j) % 3  # noqa: E731
    sc = [counts(rank, j) for j in range(size)]
    rc = [counts(i, rank) for i in range(size)]
    a = np.concatenate([np.full(sc[j], 10 * rank + j, np.int16) for j in range(size)] or [np.empty(0, np.int16)])
    out = c.alltoallv(a, sc, np.empty(sum(rc), np.int16), rc)
    want = np.concatenate([np.full(rc[i], 10 * i + rank, np.int16) for i in range(size)])
    check(np.array_equal(out, want), f"alltoallv {sc} {rc}")
    # The new elements and the bitwise ops.
    for dt in (np.int8, np.int16, np.uint8, np.int32, np.int64):
        a = (np.arange(37) * (rank + 3)).astype(dt)
        vs = [(np.arange(37) * (r + 3)).astype(dt) for r in range(size)]
        for op, f in (("band", np.bitwise_and), ("bor", np.bitwise_or), ("bxor", np.bitwise_xor)):
            want = vs[0]
            for v in vs[1:]:
                want = f(want, v)
            check(np.array_equal(c.allreduce(a.copy(), op=op), want), f"allreduce {np.dtype(dt).name} {op}")
    b = np.array([rank == 0, True, False, rank % 2 == 1])
    check(np.array_equal(c.allreduce(b.copy(), op="bor"), np.array([True, True, False, size > 1])), "bool bor")
    check(np.array_equal(c.allreduce(b.copy(), op="band"), np.array([size == 1, True, False, False])), "bool band")
    i8 = np.full(5, rank - 2, np.int8)
    c.broadcast(i8, root=size - 1)
    check(np.all(i8 == size - 3), "broadcast int8")
    raises(tally.InvalidArgument, lambda: c.allreduce(np.ones(3, np.float32), op="bxor"), ["bxor", "f32"],
           "bxor on float32")
    # Point-to-point: a ring of tagged messages, two tags received in the other order, any source at rank 0.
    if size > 1:
        # A send made before a collective, received after it by a rank that made no point-to-point call yet.
        if rank == 0:
            c.send(np.arange(5, dtype=np.int32), 1, tag=11)
        c.barrier()
        if rank == 1:
            first = np.empty(5, np.int32)
            check(c.recv(first, 0, tag=11) == 0 and np.array_equal(first, np.arange(5)), "send before a barrier")
        nxt, prv = (rank + 1) % size, (rank - 1) % size
        r5 = c.isend(np.full(1001, rank, np.float32), nxt, tag=5)
        r3 = c.isend(np.full(3, rank, np.int8), nxt, tag=3)
        got3 = np.empty(3, np.int8)
        check(c.recv(got3, prv, tag=3) == prv and np.all(got3 == prv), "recv tag 3 before tag 5")
        got5 = np.empty(1001, np.float32)
        check(c.recv(got5, prv, tag=5) == prv and np.all(got5 == prv), "recv tag 5")
        r5.wait()
        r3.wait()
        if rank == 0:
            seen = set()
            for _ in range(size - 1):
                v = np.empty(1, np.int64)
                src = c.recv(v, tally.ANY_SOURCE, tag=9)
                check(v[0] == src, f"any-source message from {src} holds {v[0]}")
                seen.add(src)
            check(seen == set(range(1, size)), f"any-source senders {seen}")
        else:
            c.send(np.array([rank], np.int64), 0, tag=9)
    c.barrier()


def raises(exc, fn, words, what):
    try:
        fn()
    except exc as e:
        check(all(w in str(e) for w in words), f"{what}: message '{e}' lacks {words}")
        return
    except Exception as e:  # noqa: BLE001 - the wrong kind is the failure being tested
        check(False, f"{what}: raised {type(e).__name__} '{e}', not {exc.__name__}")
        return
    check(False, f"{what}: no error")


def case_checks(c):
    a = np.ones((4, 6), np.float32)
    raises(ValueError, lambda: c.allreduce(a[:, ::2]), ["C-contiguous"], "strided array")
    raises(ValueError, lambda: c.allreduce(np.ones(3, np.complex64)), ["complex64", "float32"], "complex dtype")
    raises(ValueError, lambda: c.allreduce(np.ones(3, np.float32), out=np.ones(4, np.float32)), ["4", "3"],
           "out of the wrong size")
    raises(ValueError, lambda: c.allreduce(np.ones(3, np.float32), out=np.ones(3, np.float64)), ["float64"],
           "out of another dtype")
    raises(ValueError, lambda: c.reduce_scatter(np.ones(c.size * 2 + 1, np.float32)), ["multiple"],
           "reduce_scatter not divisible")
    raises(ValueError, lambda: c.broadcast(np.ones(3, np.float32), root=c.size), ["root"], "root out of range")
    raises(ValueError, lambda: c.allreduce(np.ones(3, np.float32), op="xor"), ["xor"], "unknown op")
    raises(ValueError, lambda: c.allreduce([1.0, 2.0]), ["NumPy array"], "a list")
    ro = np.ones(3, np.float32)
    ro.flags.writeable = False
    raises(ValueError, lambda: c.allreduce(ro), ["read-only"], "read-only array in place")
    check(issubclass(tally.Mismatch, tally.Error) and issubclass(tally.InvalidArgument, ValueError),
          "error classes")
    c.barrier()


def case_config():
    """Rank, size, address and token as arguments, the TALLY_* variables tally run set gone first."""
    given = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("TALLY_")}
    before = dict(os.environ)
    rank, size = int(given["TALLY_RANK"]), int(given["TALLY_WORLD_SIZE"])
    lines = []
    c = tally.Comm(rank, size, addr=given["TALLY_ADDR"], token=given["TALLY_TOKEN"], timeout=20, transport="tcp",
                   algo="ring", cost_alpha_us=2, cost_beta_gbps=5, cost_gamma_gbps=10, log_level=1,
                   log=lambda level, line: lines.append((level, line)))
    check(c.rank == rank and c.size == size and c.transport == "tcp" and c.algo_for(1 << 20) == "ring",
          f"rank {c.rank} of {c.size} over {c.transport}, {c.algo_for(1 << 20)}")
    check(c.large_path == "", f"tcp has no large-message path to name: {c.large_path!r}")
    check(c.mem_min == 0, f"tcp reads nothing in place: mem_min {c.mem_min}")
    v = np.full(5, rank + 1, np.float32)
    c.allreduce(v)
    check(np.all(v == size * (size + 1) / 2), "allreduce over the configured communicator")
    c.free()
    check(any(level == 1 and f"tally[rank {rank}] debug:" in line for level, line in lines),
          f"the log callback got no debug line of this rank: {lines[:3]}")
    check(dict(os.environ) == before, "the environment changed")
    raises(tally.InvalidArgument, lambda: tally.Comm(0, 1, timeout=0), ["tally_config.timeout='0'"], "timeout 0")
    raises(tally.InvalidArgument, lambda: tally.Comm(0, 1, algo="fast"), ["tally_config.algo='fast'"], "algo fast")
    raises(ValueError, lambda: tally.Comm(0, 1, transport="ib"), ["transport", "ib"], "transport ib")
    raises(TypeError, lambda: tally.Comm(0, 1, timeout_s=5), ["timeout_s"], "an unknown field")
    raises(TypeError, lambda: tally.Comm(0.5, 1), ["rank", "float"], "rank=0.5")
    raises(TypeError, lambda: tally.Comm(0, 1, tcp_streams=2.0), ["tcp_streams"], "tcp_streams=2.0")
    raises(TypeError, lambda: tally.Comm(0, 1, transport=1.7), ["transport", "1.7"], "transport=1.7")
    raises(TypeError, lambda: tally.Comm(0, 1, isa=True), ["isa", "True"], "isa=True")
    raises(TypeError, lambda: tally.Comm(0, 1, timeout=True), ["timeout", "bool"], "timeout=True")
    raises(TypeError, lambda: tally.Comm(0, 1, timeout="5"), ["timeout", "str"], "timeout='5'")
    one = tally.Comm(0, 1, shm_cma=False, transport=1)  # a switch takes a bool; a word's number is an int
    one.free()
    os.environ["TALLY_TCP_STREAMS"] = "17"  # the environment's defaults are read, and named when bad
    raises(tally.InvalidArgument, lambda: tally.Comm(0, 1), ["TALLY_TCP_STREAMS='17'"], "TALLY_TCP_STREAMS=17")
    del os.environ["TALLY_TCP_STREAMS"]
    return rank


def case_death(c):
    v = np.ones(1 << 16, np.float32)
    c.allreduce(v)
    if c.rank == c.size - 1:
        os._exit(0)  # no goodbye
    t0 = time.monotonic()
    try:
        for _ in range(100):
            c.allreduce(v)
        check(False, "no error after the last rank died")
    except tally.PeerLost as e:
        check(e.code == -5 and f"rank {c.size - 1}" in str(e) and time.monotonic() - t0 < 15,
              f"PeerLost naming rank {c.size - 1}: '{e}' after {time.monotonic() - t0:.1f} s")
        print(f"rank {c.rank} got: {type(e).__name__}: {e}", flush=True)
    except tally.Error as e:
        check(False, f"not PeerLost: {type(e).__name__} {e}")
    c.abort()


def case_lifetime(c):
    size, rank, peer = c.size, c.rank, 1 - c.rank
    # Ranks, roots, tags and counts are ints: a float is a TypeError naming the argument, never rounded.
    a = np.ones(4, np.float32)
    for what, fn, words in (
            ("broadcast root=0.9", lambda: c.broadcast(a, root=0.9), ["root", "float"]),
            ("reduce root=1.0", lambda: c.reduce(a, root=1.0), ["root"]),
            ("gather root=True", lambda: c.gather(a, root=True), ["root", "bool"]),
            ("scatter root='0'", lambda: c.scatter(a, a, root="0"), ["root", "str"]),
            ("send dst=0.5", lambda: c.send(a, 0.5), ["destination"]),
            ("isend tag=1.5", lambda: c.isend(a, peer, tag=1.5), ["tag"]),
            ("irecv src=1.0", lambda: c.irecv(a, 1.0), ["source"]),
            ("alltoallv counts", lambda: c.alltoallv(a, [2.0, 2.0], a, [2, 2]), ["sendcounts[0]"]),
            ("algo_for(1.5)", lambda: c.algo_for(1.5), ["nbytes"]),
            ("mem_alloc((2.5,))", lambda: c.mem_alloc((2.5,)), ["dimension 0"])):
        raises(TypeError, fn, words, what)
    b = np.full(3, rank + 1.0)
    c.broadcast(b, root=np.int64(1))
    check(np.all(b == 2), "broadcast with a NumPy integer root")
    # test() that says done, then wait(): the result, as torch's Work gives it (it raised "waited for").
    r = c.iallreduce(np.ones(5, np.float32))
    deadline = time.monotonic() + 30
    while not r.test() and time.monotonic() < deadline:
        time.sleep(0.001)
    out = r.wait()
    check(out is not None and np.all(out == size) and np.all(r.wait() == size), "wait() after test() said done")
    # Shapes: checked in Python's integers, before any call.
    raises(ValueError, lambda: c.mem_alloc((-5,)), ["dimension 0", "-5"], "mem_alloc((-5,))")
    raises(ValueError, lambda: c.mem_alloc((3, -1)), ["dimension 1"], "mem_alloc((3, -1))")
    raises(ValueError, lambda: c.mem_alloc((1 << 62,)), ["2**50"], "mem_alloc((1 << 62,))")
    raises(ValueError, lambda: c.mem_alloc((1 << 40, 1 << 40), np.float64), ["2**50"], "mem_alloc of 2**83 bytes")
    check(c.mem_alloc(3).shape == (3,) and c.mem_alloc((0, 4)).size == 0, "mem_alloc of an int and of 0 elements")

    # A request dropped while pending keeps its arrays until it is done (it used to crash: SIGSEGV).
    for _ in range(4):
        big = np.ones(1 << 22, np.float32)
        gone = weakref.ref(big)
        c.iallreduce(big)
        del big
        gc.collect()
        x = np.full(2, rank + 1.0, np.float32)
        c.allreduce(x)
        check(np.all(x == 3), "allreduce after a dropped iallreduce")
    c.barrier()  # a call frees the dropped requests that are done (all: the allreduce ran after them)
    check(gone() is None, "a dropped iallreduce's array outlived its request")
    for name, post in (("reduce", lambda v: c.reduce(v, root=0, nonblocking=True)),
                       ("gather", lambda v: c.gather(v, root=1, nonblocking=True)),
                       ("alltoall", lambda v: c.alltoall(v, nonblocking=True))):
        v = np.ones(1 << 20, np.float32)
        post(v)
        del v
        gc.collect()
    c.barrier()
    # A kept array outlives its wait only as long as the request does.
    big = np.ones(1 << 20, np.float32)
    alive = weakref.ref(big)
    r = c.iallreduce(big)
    del big
    gc.collect()
    check(alive() is not None, "a pending request's array was let go")
    r.wait()
    del r
    gc.collect()
    check(alive() is None, "the array outlived its done request")
    # A receive dropped before its message comes: the message still lands in its (kept) array.
    got = np.zeros(1 << 16, np.float32)
    seen = weakref.ref(got)
    c.irecv(got, peer, tag=4)
    del got
    gc.collect()
    c.barrier()
    c.send(np.full(1 << 16, 7, np.float32), peer, tag=4)
    c.barrier()
    for _ in range(200):  # each call frees the dropped requests that are done; the ranks stop together
        if c.allreduce(np.array([seen() is not None], np.int32), op="max")[0] == 0:
            break
    check(seen() is None, "a dropped receive's array never let go")

    # mem_alloc: the memory lives while a view does, past free() too.
    m = c.mem_alloc((4, 1000), np.float32)
    row = m[2]
    del m
    gc.collect()
    row[:] = rank + 1
    c.allreduce(row)
    check(np.all(row == 3), "a view of a mem_alloc array whose array is gone")
    whole = c.mem_alloc(1 << 18, np.float64)
    whole[:] = rank
    c.free()
    whole[:] += 1  # crashed: the memory went with the communicator
    row[:] = 9
    check(np.all(whole == rank + 1) and np.all(row == 9), "mem_alloc arrays written after free()")
    raises(tally.InvalidArgument, lambda: c.allreduce(row), ["freed"], "a call after free()")
    del whole, row
    gc.collect()

    # A request dropped pending just as another thread freed the communicator: its drop comes after the
    # free, which completed it; it is freed then, not kept (with its arrays) by a communicator gone.
    cz = tally.Comm()
    late = cz.iallreduce(np.ones(8, np.float32))
    handle, late._h = late._h, None  # as the dropped Request's finalizer holds it, past its test()
    cz.free()
    cz._st.orphan(handle, (np.ones(8),))
    check(cz._st.orphans == [], "a request dropped after its communicator's free is kept for good")

    # The same past abort().
    c2 = tally.Comm()
    m2 = c2.mem_alloc(1000, np.int32)
    m2[:] = 5
    c2.barrier()
    c2.abort()
    m2[:] += 1
    check(np.all(m2 == 6), "a mem_alloc array written after abort()")
    raises(tally.Aborted, lambda: c2.barrier(), ["aborted"], "a call after abort()")
    del m2

    c3 = tally.Comm()
    # A forked child: every call refused at once, naming both processes; the parents go on.
    pending = c3.irecv(np.zeros(3, np.float32), peer, tag=6)
    held = c3.mem_alloc(100, np.float32)
    parent = os.getpid()
    kid = os.fork()
    if kid == 0:
        ok = True
        want = f"made in process {parent}, used in process {os.getpid()}"
        for call in (lambda: c3.allreduce(np.ones(2, np.float32)), c3.barrier, lambda: c3.iallreduce(held),
                     lambda: c3.send(held, peer), lambda: c3.mem_alloc(10), pending.wait):
            t0 = time.monotonic()
            try:
                call()
                ok = False
                print("child: a call on the parent's communicator succeeded", flush=True)
            except tally.InvalidArgument as e:
                if want not in str(e) or "forked child" not in str(e) or time.monotonic() - t0 > 1:
                    ok = False
                    print(f"child: '{e}'", flush=True)
        del pending, held
        c3.free()  # only dropped
        gc.collect()
        atexit._run_exitfuncs()  # the finalizers a normal exit runs: none may touch the parent's state
        os._exit(0 if ok else 1)
    _, status = os.waitpid(kid, 0)
    check(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"the forked child's checks (status {status})")
    # Forked while another thread holds the communicator's lock (as a free or a finalizer does): the
    # child's free and finalizers drop the parent's communicator without waiting on that lock.
    locked, go_on = threading.Event(), threading.Event()

    def hold_lock():
        with c3._st.lock:
            locked.set()
            go_on.wait(30)

    holder = threading.Thread(target=hold_lock)
    holder.start()
    locked.wait(30)
    kid = os.fork()
    if kid == 0:
        signal.alarm(5)  # a child that waits on the inherited lock is killed, and fails the check
        c3.free()  # only dropped, without the lock another thread of the parent held at the fork
        gc.collect()
        atexit._run_exitfuncs()
        os._exit(0)
    _, status = os.waitpid(kid, 0)
    go_on.set()
    holder.join()
    check(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0,
          f"a child forked while the lock was held: its free waited on it (status {status})")
    c3.send(np.full(3, rank, np.float32), peer, tag=6)
    check(np.all(pending.wait() == peer), "the parent's pending receive, after the fork")
    v = np.full(1000, rank + 1.0)
    held[:] = rank + 1
    c3.allreduce(v)
    c3.allreduce(held)
    check(np.all(v == 3) and np.all(held == 3), "the parents' collectives after the fork")
    del held

    # A signal whose handler returns runs while the call is blocked (the peer sleeps), which goes on.
    ran = []
    signal.signal(signal.SIGUSR1, lambda *_: ran.append(time.monotonic()))
    if rank == 0:
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1)).start()
    else:
        time.sleep(1.0)
    t0 = time.monotonic()
    v = np.full(8, rank + 1.0)
    c3.allreduce(v)
    done = time.monotonic()
    if rank == 0:
        check(len(ran) == 1 and ran[0] - t0 < 0.6 and done - ran[0] > 0.2,
              f"SIGUSR1's handler ran {[round(r - t0, 3) for r in ran]} s into a call that took {done - t0:.2f} s")
    check(np.all(v == 3), "the allreduce the handler ran in")

    # Ctrl-C: rank 0 blocked (rank 1 sleeps) gets KeyboardInterrupt within a second, its communicator
    # aborted; rank 1 then fails at once, naming it.
    if rank == 0:
        sent = []
        threading.Timer(0.3, lambda: (sent.append(time.monotonic()), os.kill(os.getpid(), signal.SIGINT))).start()
        try:
            c3.allreduce(np.ones(8, np.float32))
            check(False, "no KeyboardInterrupt")
        except KeyboardInterrupt:
            late = time.monotonic() - sent[0]
            check(late < 1.0, f"KeyboardInterrupt {late:.2f} s after SIGINT")
        raises(tally.Aborted, lambda: c3.barrier(), ["KeyboardInterrupt", "allreduce"], "a call after Ctrl-C")
    else:
        time.sleep(2.0)
        t0 = time.monotonic()
        try:
            c3.allreduce(np.ones(8, np.float32))
            check(False, "rank 1: no error after rank 0 was interrupted")
        except (tally.Aborted, tally.PeerLost) as e:
            check("rank 0" in str(e) and time.monotonic() - t0 < 5, f"rank 1 got '{e}'")
        c3.free()


def case_logfree():
    """Comm.free() while the communication thread runs Python: the log callback, on that thread, drops
    the last view of a mem_alloc array, whose finalizer takes the communicator's lock. A free that held
    that lock while waiting for the thread deadlocked here."""
    holder, fired = [], []

    def log(level, line):
        if holder and "allreduce of 4096 bytes" in line:
            fired.append(threading.current_thread() is not threading.main_thread())
            holder.clear()  # the array's last view: its finalizer runs now, on this thread

    c = tally.Comm(log=log, log_level=1)
    rank = c.rank
    holder.append(c.mem_alloc(1000, np.float32))
    faulthandler.dump_traceback_later(30, exit=True)  # a deadlock fails the case instead of hanging it
    if rank == 1:
        time.sleep(0.3)  # rank 0 is in free() by then, its request waiting for this one
    pending = c.iallreduce(np.ones(1024, np.float32))  # a size not used before: its choice is logged
    if rank == 1:
        pending.wait()
    c.free()
    faulthandler.cancel_dump_traceback_later()
    check(fired == [True], f"the log callback dropped the array on the communication thread: {fired}")
    check(not holder and not c._st.deferred and not c._st.orphans, "an array or request left behind by free()")
    del pending
    return rank


def case_mismatch(c):
    n = 8 if c.rank == c.size - 1 else 7
    try:
        c.allreduce(np.ones(n, np.float32))
        check(False, "no error for counts 7 and 8")
    except tally.Mismatch as e:
        check(e.code == -6 and "count 8" in str(e) and "count 7" in str(e), f"Mismatch names both: '{e}'")
    c.abort()


def main():
    case = sys.argv[1]
    if case in ("config", "logfree"):  # its Comm is the first of the process: its log callback is taken
        report(globals()["case_" + case]())
        return
    c = tally.Comm()
    globals()["case_" + case](c)
    rank = c.rank
    if case in ("collectives", "checks", "more"):
        c.free()
    report(rank)


if __name__ == "__main__":
    main()
