"""torch_ranks.py - one rank of the PyTorch backend's tests (test_torch.py runs each case): started by
`tally run`, torchrun, or mp.spawn. Prints "result RANK passed FAILED [what]" at the end.
Cases: collectives (every collective through torch.distributed, each dtype and op, sizes 0, 1, odd, large,
blocking and async, against references), ddp BACKEND OUT (the MLP under DistributedDataParallel; rank 0
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
        dist.all_reduce(torch.ones(3, dtype=torch.int8))
        check(False, "int8 refused")
    except RuntimeError as e:
        check("tally" in str(e) and "Char" in str(e), f"int8's message: {e}")
    dist.barrier()
    dist.destroy_process_group()


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
