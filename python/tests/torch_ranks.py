"""torch_ranks.py - one rank of the PyTorch backend's tests (test_torch.py runs each case): started by
`tally run`, torchrun, or mp.spawn. Prints "result RANK passed FAILED [what]" at the end.
Cases: collectives (every collective through torch.distributed, each dtype and op, sizes 0, 1, odd, large,
blocking and async, against references), more (point-to-point, reduce, gather, scatter, all-to-all,
coalesced and object collectives, int8/int16/bool, bitwise ops), ddp BACKEND OUT (the MLP under DistributedDataParallel; rank 0
saves its parameters), death (the last rank dies: a RuntimeError naming it), mismatch (counts 7 and 8)."""
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch
import torch.distributed as dist

import tally.torch  # noqa: F401  registers the "tally" backend

from verdict import check, report


def data(rank, n, dtype):
    return (torch.arange(n) % 5 + rank + 1).to(dtype)


def reference(size, n, dtype, op):
    vs = torch.stack([data(r, n, torch.float64) for r in range(size)])
    if op == dist.ReduceOp.SUM:
        return vs.sum(0)
    if op == dist.ReduceOp.PRODUCT:
        return vs.prod(0)
    if op == dist.ReduceOp.MIN:
        return vs.min(0).values
    if op == dist.ReduceOp.MAX:
        return vs.max(0).values
    return vs.sum(0) // size if not dtype.is_floating_point else vs.mean(0)  # AVG


def case_collectives():
    dist.init_process_group("tally")
    rank, size = dist.get_rank(), dist.get_world_size()
    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8]
    ops = [dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX]
    for dt in dtypes:
        tol = 1e-2 if dt in (torch.float16, torch.bfloat16) else 1e-6
        for n in (0, 1, 7, 1001, 1 << 18):
            for op in ops:
                if op == dist.ReduceOp.PRODUCT and n > 1001:
                    continue
                t = data(rank, n, dt)
                work = dist.all_reduce(t, op=op, async_op=(n == 7))
                if work is not None:
                    work.wait()
                check(torch.allclose(t.double(), reference(size, n, dt, op), rtol=tol), f"all_reduce {dt} {n} {op}")
            b = data(rank, n, dt)
            dist.broadcast(b, src=size - 1)
            check(torch.equal(b, data(size - 1, n, dt)), f"broadcast {dt} {n}")
            outs = [torch.empty(n, dtype=dt) for _ in range(size)]
            dist.all_gather(outs, data(rank, n, dt))
            check(all(torch.equal(outs[r], data(r, n, dt)) for r in range(size)), f"all_gather {dt} {n}")
            flat = torch.empty(n * size, dtype=dt)
            dist.all_gather_into_tensor(flat, data(rank, n, dt))
            check(torch.equal(flat, torch.cat([data(r, n, dt) for r in range(size)])), f"all_gather_into_tensor {dt} {n}")
            full = data(rank, n * size, dt)
            out = torch.empty(n, dtype=dt)
            dist.reduce_scatter(out, list(full.chunk(size)) if n else [torch.empty(0, dtype=dt)] * size)
            want = reference(size, n * size, dt, dist.ReduceOp.SUM)[rank * n:(rank + 1) * n]
            check(torch.allclose(out.double(), want, rtol=tol), f"reduce_scatter {dt} {n}")
    # Strided (non-contiguous) tensors are staged and written back.
    m = torch.ones(4, 6) * (rank + 1)
    col = m[:, 1]
    dist.all_reduce(col)
    check(torch.all(m[:, 1] == size * (size + 1) / 2) and torch.all(m[:, 0] == rank + 1), "strided all_reduce")
    dist.barrier()
    try:
        dist.all_reduce(torch.ones(3).to_sparse())
        check(False, "sparse all_reduce refused")
    except RuntimeError as e:
        check("sparse" in str(e) and "gloo" in str(e) and "all" in str(e), f"sparse's message: {e}")
    dist.barrier()
    dist.destroy_process_group()


def case_more():
    """What PyTorch users reach for beyond the DDP collectives: point-to-point, reduce, gather, scatter, all-to-all,
    the coalesced forms, the object collectives, int8/int16/bool and the bitwise ops."""
    dist.init_process_group("tally")
    rank, size = dist.get_rank(), dist.get_world_size()
    for n in (0, 1, 7, 1001):
        for root in range(size):
            t = data(rank, n, torch.float32)
            dist.reduce(t, dst=root, op=dist.ReduceOp.MAX)
            if rank == root:
                check(torch.equal(t.double(), reference(size, n, torch.float32, dist.ReduceOp.MAX)), f"reduce {n}")
            outs = [torch.empty(n, dtype=torch.int16) for _ in range(size)] if rank == root else None
            dist.gather(data(rank, n, torch.int16), outs, dst=root)
            if rank == root:
                check(all(torch.equal(outs[r], data(r, n, torch.int16)) for r in range(size)), f"gather {n}")
            parts = [data(r + 10, n, torch.int8) for r in range(size)] if rank == root else None
            got = torch.empty(n, dtype=torch.int8)
            dist.scatter(got, parts, src=root)
            check(torch.equal(got, data(rank + 10, n, torch.int8)), f"scatter {n}")
        inp = torch.arange(size * n, dtype=torch.float64) + 1000 * rank
        out = torch.empty(size * n, dtype=torch.float64)
        dist.all_to_all_single(out, inp)
        want = torch.cat([torch.arange(rank * n, (rank + 1) * n, dtype=torch.float64) + 1000 * i for i in range(size)])
        check(torch.equal(out, want), f"all_to_all_single {n}")
    # Uneven splits: rank i sends (i + j) % 3 rows of 2 to rank j.
    ins = [(rank + j) % 3 for j in range(size)]
    outs = [(i + rank) % 3 for i in range(size)]
    inp = torch.cat([torch.full(((rank + j) % 3, 2), 10 * rank + j) for j in range(size)])
    out = torch.empty(sum(outs), 2, dtype=inp.dtype)
    dist.all_to_all_single(out, inp, outs, ins)
    want = torch.cat([torch.full(((i + rank) % 3, 2), 10 * i + rank) for i in range(size)])
    check(torch.equal(out, want), "all_to_all_single with split sizes")
    lists_out = [torch.empty(j + 1, dtype=torch.bool) for j in range(size)]
    dist.all_to_all(lists_out, [torch.full((rank + 1,), j % 2 == 1) for j in range(size)])
    check(all(torch.equal(lists_out[i], torch.full((i + 1,), rank % 2 == 1)) for i in range(size)), "all_to_all")
    # Point-to-point: tags out of order, any source, isend/irecv, batch_isend_irecv.
    if size > 1:
        nxt, prv = (rank + 1) % size, (rank - 1) % size
        w5 = dist.isend(torch.full((1001,), float(rank)), nxt, tag=5)
        w3 = dist.isend(torch.full((3,), rank, dtype=torch.int8), nxt, tag=3)
        g3, g5 = torch.empty(3, dtype=torch.int8), torch.empty(1001)
        dist.recv(g3, prv, tag=3)
        dist.recv(g5, prv, tag=5)
        check(torch.all(g3 == prv) and torch.all(g5 == prv), "send/recv with tags")
        w5.wait()
        w3.wait()
        if rank == 0:
            seen = set()
            for _ in range(size - 1):
                v = torch.empty(1, dtype=torch.int64)
                src = dist.recv(v)
                check(int(v) == src, f"recv from any source: {src} sent {int(v)}")
                seen.add(src)
            check(seen == set(range(1, size)), f"any-source senders {seen}")
        else:
            dist.send(torch.tensor([rank]), 0)
        got = torch.empty(4)
        ops = [dist.P2POp(dist.isend, torch.full((4,), float(rank)), nxt, tag=7),
               dist.P2POp(dist.irecv, got, prv, tag=7)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        check(torch.all(got == prv), "batch_isend_irecv")
    # int8, int16, bool and the bitwise ops.
    for dt in (torch.int8, torch.int16, torch.uint8, torch.int32, torch.int64):
        vs = [(torch.arange(37) * (r + 3)).to(dt) for r in range(size)]
        for op, f in ((dist.ReduceOp.BAND, torch.bitwise_and), (dist.ReduceOp.BOR, torch.bitwise_or),
                      (dist.ReduceOp.BXOR, torch.bitwise_xor)):
            want = vs[0]
            for v in vs[1:]:
                want = f(want, v)
            t = vs[rank].clone()
            dist.all_reduce(t, op=op)
            check(torch.equal(t, want), f"all_reduce {dt} {op}")
    b = torch.tensor([rank == 0, True, False])
    dist.all_reduce(b)  # SUM on bool: or
    check(torch.equal(b, torch.tensor([True, True, False])), "bool all_reduce")
    i8 = torch.full((5,), rank - 2, dtype=torch.int8)
    dist.broadcast(i8, src=size - 1)
    check(torch.all(i8 == size - 3), "broadcast int8")
    # Coalesced and object forms.
    ts = [torch.ones(3) * (rank + 1), torch.ones(2, 2, dtype=torch.float32) * rank]
    dist.all_reduce_coalesced(ts)
    check(torch.all(ts[0] == size * (size + 1) / 2) and torch.all(ts[1] == size * (size - 1) / 2),
          "all_reduce_coalesced")
    staging_cases(rank, size)
    objs = [None] * size
    dist.all_gather_object(objs, {"rank": rank, "name": "r" * rank})
    check(objs == [{"rank": r, "name": "r" * r} for r in range(size)], "all_gather_object")
    got = [None] * size if rank == 0 else None
    dist.gather_object(("x", rank), got, dst=0)
    check(rank != 0 or got == [("x", r) for r in range(size)], "gather_object")
    mine = [None]
    dist.scatter_object_list(mine, [[r] * r for r in range(size)] if rank == 0 else None, src=0)
    check(mine[0] == [rank] * rank, "scatter_object_list")
    dist.barrier()
    dist.destroy_process_group()


def tally_memory_held():
    """Whether this process holds a tally_mem_alloc region (a memfd named tally-mem)."""
    fds = "/proc/self/fd"
    names = []
    for fd in os.listdir(fds):
        try:
            names.append(os.readlink(os.path.join(fds, fd)))
        except OSError:
            pass  # the directory's own descriptor, gone by now
    return any("tally-mem" in name for name in names)


def staging_cases(rank, size):
    """Lists of tensors the backend uses where they lie (views back to back, as chunk() leaves them) or through
    its kept staging block (apart, or overlapping the other side: in place), at a size past the block's floor
    (64 KiB) and one past the floor of tally memory (on shm the block lies there, read in place by the peers),
    twice over, and two operations in flight at once (the second cannot have the block)."""
    pg = dist.distributed_c10d._get_default_group()
    shm = pg.transport == "shm"
    check(pg.mem_min == (256 << 10 if shm else 0), f"mem_min {pg.mem_min} over {pg.transport}")
    for n, apart in ((20000, False), (20000, True), (80000, True)):  # 80000: 320 KB a part, past 256 KiB
        for _ in range(2):
            whole = torch.empty(size * n)
            outs = [torch.empty(n) for _ in range(size)] if apart else list(whole.chunk(size))
            dist.all_gather(outs, torch.full((n,), float(rank)))
            check(all(torch.all(outs[r] == r) for r in range(size)), f"all_gather apart={apart}")
            src = [torch.full((n,), 100.0 * r + rank) for r in range(size)]
            ins = src if apart else list(torch.cat(src).chunk(size))
            got = torch.empty(n)
            dist.reduce_scatter(got, ins)
            check(torch.all(got == sum(100.0 * rank + r for r in range(size))), f"reduce_scatter apart={apart}")
            parts = [torch.full((n,), r + 0.5) for r in range(size)]
            if not apart:
                parts = list(torch.cat(parts).chunk(size))
            got = torch.empty(n)
            dist.scatter(got, parts if rank == 0 else None, src=0)
            check(torch.all(got == rank + 0.5), f"scatter apart={apart}")
            outs = ([torch.empty(n) for _ in range(size)] if apart else list(torch.empty(size * n).chunk(size)))
            dist.gather(torch.full((n,), 7.0 * rank), outs if rank == 0 else None, dst=0)
            check(rank != 0 or all(torch.all(outs[r] == 7.0 * r) for r in range(size)), f"gather apart={apart}")
            ts = list(torch.ones(3 * n).split([n, 2 * n])) if not apart else [torch.ones(n), torch.ones(2 * n)]
            dist.all_reduce_coalesced(ts)
            check(all(torch.all(t == size) for t in ts), f"all_reduce_coalesced apart={apart}")
            lo = [torch.empty(n) for _ in range(size)] if apart else list(torch.empty(size * n).chunk(size))
            li = [torch.full((n,), 10.0 * rank + j) for j in range(size)]
            dist.all_to_all(lo, li if apart else list(torch.cat(li).chunk(size)))
            check(all(torch.all(lo[i] == 10.0 * i + rank) for i in range(size)), f"all_to_all apart={apart}")
    check(not shm or tally_memory_held(), "on shm the staging block past 256 KiB is tally_mem_alloc memory")
    # in place: all_gather's input is its own slot of the outputs; reduce_scatter's output one of its inputs
    whole = torch.arange(size * n, dtype=torch.float32)
    outs = list(whole.chunk(size))
    mine = outs[rank]
    mine.fill_(float(rank))
    dist.all_gather(outs, mine)
    check(all(torch.all(outs[r] == r) for r in range(size)), "all_gather in place")
    ins = list(torch.full((size * n,), float(rank + 1)).chunk(size))
    dist.reduce_scatter(ins[rank], ins)
    check(torch.all(ins[rank] == size * (size + 1) / 2), "reduce_scatter in place")
    # two in flight: the first holds the staging block while the second is posted
    a = [torch.empty(n) for _ in range(size)]
    b = [torch.empty(n) for _ in range(size)]
    wa = dist.all_gather(a, torch.full((n,), 1.0 + rank), async_op=True)
    wb = dist.all_gather(b, torch.full((n,), 2.0 + rank), async_op=True)
    wa.wait()
    wb.wait()
    check(all(torch.all(a[r] == 1.0 + r) and torch.all(b[r] == 2.0 + r) for r in range(size)), "two in flight")


def mlp_data(steps, batch, size):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(steps, size, batch, 784, generator=g)
    y = torch.randint(0, 10, (steps, size, batch), generator=g)
    return x, y


def case_ddp(backend, out):
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group(backend)
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    ddp = DDP(model, bucket_cap_mb=1)  # several buckets: they go while backward runs
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    steps, batch = 12, 32
    x, y = mlp_data(steps, batch, size)
    for s in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ddp(x[s, rank]), y[s, rank])
        loss.backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    same = [torch.empty_like(flat) for _ in range(size)]
    dist.all_gather(same, flat)
    check(all(torch.equal(same[0], t) for t in same), f"{backend}: replicas identical")
    if rank == 0:
        torch.save(flat, out)
    dist.destroy_process_group()


def init_and_meet():
    """init, then a barrier: every rank is past init's store barrier (rank 0 hosts the store) before one
    of them leaves."""
    dist.init_process_group("tally")
    dist.barrier()
    return dist.get_rank(), dist.get_world_size()


def case_death():
    rank, size = init_and_meet()
    t = torch.ones(1 << 16)
    dist.all_reduce(t)
    if rank == size - 1:
        os._exit(0)
    t0 = time.monotonic()
    try:
        for _ in range(100):
            dist.all_reduce(t)
        check(False, "no error after the last rank died")
    except RuntimeError as e:
        check(f"rank {size - 1}" in str(e) and time.monotonic() - t0 < 15, f"error naming rank {size - 1}: {e}")
        print(f"rank {rank} got: {e}", flush=True)


def case_mismatch():
    rank, size = init_and_meet()
    try:
        dist.all_reduce(torch.ones(8 if rank == size - 1 else 7))
        check(False, "no error for counts 7 and 8")
    except RuntimeError as e:
        check("mismatch" in str(e) and "count 8" in str(e), f"mismatch named: {e}")


def main(rank_hint=None):
    case = sys.argv[1]
    if case == "ddp":
        case_ddp(sys.argv[2], sys.argv[3])
    else:
        globals()["case_" + case]()
    rank = os.environ.get("RANK", "?")
    report(rank)
    if case in ("death", "mismatch"):
        os._exit(0)  # the communicator is broken; nothing to tear down gracefully


if __name__ == "__main__":
    main()
