"""torch_ops_bench.py - every torch.distributed operation timed on one backend, the nccl-tests way: for each
operation and size, a warm-up call, then calls timed between barriers, the slowest rank's time kept.
usage: /usr/bin/python3 bench/torch_ops_bench.py BACKEND RANKS [SIZES]   (SIZES: bytes, comma-separated;
default 1024,1048576,67108864). Prints one JSON line per (operation, size): op, bytes, us, busbw (GB/s).
Used by bench/torch_ops.sh, which runs gloo and tally side by side."""
import json
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

# busbw's factor on algbw (nccl-tests' PERFORMANCE.md): what each rank's link carries per byte of the op.
FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all_single": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1,
    "reduce": lambda n: 1,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
    "send_recv": lambda n: 1,
}


def calls_for(nbytes):
    """Enough calls that a size takes a measurable time, few enough that 64 MiB on 4 ranks stays short."""
    return 40 if nbytes <= 65536 else 10 if nbytes <= (4 << 20) else 3


def make_op(name, nbytes, rank, n):
    """A closure running one call of the operation on tensors of nbytes (the nccl-tests size: the whole
    vector of all_reduce/broadcast/reduce/all_to_all, the gathered whole of all_gather/gather, the scattered
    whole of reduce_scatter/scatter, one message of send_recv)."""
    elems = max(nbytes // 4, n)
    elems -= elems % n
    t = torch.full((elems,), float(rank + 1))
    part = torch.empty(elems // n)
    if name == "all_reduce":
        return lambda: dist.all_reduce(t)
    if name == "broadcast":
        return lambda: dist.broadcast(t, 0)
    if name == "reduce":
        return lambda: dist.reduce(t, 0)
    # The list forms: Gloo in 1.13 has no _allgather_base or _reduce_scatter_base (the *_tensor calls).
    if name == "all_gather":
        parts = list(t.chunk(n))
        return lambda: dist.all_gather(parts, part)
    if name == "reduce_scatter":
        parts = list(t.chunk(n))
        return lambda: dist.reduce_scatter(part, parts)
    if name == "gather":
        outs = list(t.chunk(n)) if rank == 0 else None
        return lambda: dist.gather(part, outs, dst=0)
    if name == "scatter":
        ins = list(t.chunk(n)) if rank == 0 else None
        return lambda: dist.scatter(part, ins, src=0)
    if name == "all_to_all_single":
        out = torch.empty_like(t)
        return lambda: dist.all_to_all_single(out, t)
    if name == "send_recv":  # rank 0 and rank 1 ping-pong; a call is one message one way (half a round trip)
        def pingpong():
            if rank == 0:
                dist.send(t, 1)
                dist.recv(t, 1)
            elif rank == 1:
                dist.recv(t, 0)
                dist.send(t, 0)
        return pingpong
    raise ValueError(name)


def time_op(name, nbytes, rank, n):
    op = make_op(name, nbytes, rank, n)
    op()
    dist.barrier()
    calls = calls_for(nbytes)
    t0 = time.perf_counter()
    for _ in range(calls):
        op()
    per = (time.perf_counter() - t0) / calls
    if name == "send_recv":
        per /= 2
    worst = torch.tensor([per], dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return worst.item()


def run(rank, backend, n, sizes, port):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    if backend == "tally":
        import tally.torch  # noqa: F401  registers the backend
    dist.init_process_group(backend, rank=rank, world_size=n)
    for name in FACTOR:
        for nbytes in sizes:
            try:
                secs = time_op(name, nbytes, rank, n)
            except RuntimeError as e:  # the backend has no such operation (Gloo: reduce_scatter): said once
                if rank == 0:
                    print(json.dumps({"backend": backend, "ranks": n, "op": name, "bytes": nbytes,
                                      "error": str(e).splitlines()[0]}), flush=True)
                dist.barrier()
                break
            if rank == 0:
                alg = nbytes / secs / 1e9
                print(json.dumps({"backend": backend, "ranks": n, "op": name, "bytes": nbytes, "us": secs * 1e6,
                                  "busbw": alg * FACTOR[name](n)}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main():
    backend, n = sys.argv[1], int(sys.argv[2])
    sizes = [int(s) for s in (sys.argv[3] if len(sys.argv) > 3 else "1024,1048576,67108864").split(",")]
    port = 29600 + os.getpid() % 1000
    mp.spawn(run, args=(backend, n, sizes, port), nprocs=n)


if __name__ == "__main__":
    main()
