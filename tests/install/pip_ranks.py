"""pip_ranks.py - the ranks of tests/install/pip.sh: `pip_ranks.py numpy|torch` checks that `import tally`
is the installed package with its own libtally, then starts 2 ranks of itself that allreduce sizes 0, 1,
odd and large through tally.Comm or torch.distributed's "tally" backend against a reference; exit 0 when
both passed, else 1 with what failed. Every wait is bounded; a rank still running at the limit is killed."""
import os
import socket
import subprocess
import sys

SIZES = (0, 1, 7, 1001, (1 << 18) + 3)
RANKS = 2
LIMIT = 120  # seconds for the ranks together, a start of torch included


def values(rank, n):
    """Rank r's integers, small so every sum is exact in float32."""
    return [(i % 5) + rank + 1 for i in range(n)]


def reference(size, n):
    return [sum(v) for v in zip(*(values(r, n) for r in range(size)))] if n else []


def numpy_rank(rank, size, port):
    import numpy as np
    import tally
    bad = []
    with tally.Comm(rank=rank, size=size, addr=f"127.0.0.1:{port}", token="pip-test", timeout=30) as comm:
        for n in SIZES:
            a = np.array(values(rank, n), np.float32)
            comm.allreduce(a)
            if a.tolist() != reference(size, n):
                bad.append(f"numpy allreduce of {n}")
    return bad


def torch_rank(rank, size, port):
    import torch
    import torch.distributed as dist
    import tally.torch  # noqa: F401  registers the backend
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TALLY_TIMEOUT="30")
    dist.init_process_group("tally", rank=rank, world_size=size)
    bad = []
    for n in SIZES:
        t = torch.tensor(values(rank, n), dtype=torch.float32)
        dist.all_reduce(t)
        if t.tolist() != reference(size, n):
            bad.append(f"torch all_reduce of {n}")
    dist.destroy_process_group()
    return bad


def rank_main(kind, rank, size, port):
    bad = (numpy_rank if kind == "numpy" else torch_rank)(rank, size, port)
    print(f"rank {rank}: " + ("ok" if not bad else "FAILED " + ", ".join(bad)), flush=True)
    return 1 if bad else 0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def installed_where():
    """The package must come from this environment's site-packages and load the libtally beside it."""
    import tally
    from tally import _lib
    here = os.path.dirname(os.path.realpath(tally.__file__))
    if not here.startswith(os.path.realpath(sys.prefix)):
        return f"tally was imported from {here}, not from this environment ({sys.prefix})"
    if os.path.dirname(os.path.realpath(_lib.lib._name)) != here:
        return f"tally loaded libtally from {_lib.lib._name}, not from its package {here}"
    return None


def launch(kind):
    wrong = installed_where()
    if wrong:
        print(f"pip_ranks: {wrong}")
        return 1
    port = free_port()
    ranks = [subprocess.Popen([sys.executable, os.path.abspath(__file__), kind, str(r), str(RANKS), str(port)])
             for r in range(RANKS)]
    failed = []
    for r, p in enumerate(ranks):
        try:
            rc = p.wait(timeout=LIMIT)
        except subprocess.TimeoutExpired:
            for q in ranks:
                q.kill()
            for q in ranks:
                q.wait()
            print(f"pip_ranks: {kind}: rank {r} still running after {LIMIT} s; killed the ranks")
            return 1
        if rc:
            failed.append(f"rank {r} exited {rc}")
    print(f"pip_ranks: {kind} allreduce on {RANKS} ranks: " + ("passed" if not failed else ", ".join(failed)))
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) == 5:
        sys.exit(rank_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
    if len(sys.argv) == 2 and sys.argv[1] in ("numpy", "torch"):
        sys.exit(launch(sys.argv[1]))
    sys.exit("usage: pip_ranks.py numpy|torch")
