"""linear_numpy.py - least squares (y = x.w + b + noise, 8 features) trained data-parallel from NumPy with
tally: each rank computes the gradient of its own shard, one allreduce averages it, every replica takes the
same step. Run it as `tally run -n 2 python3 examples/linear_numpy.py` (PYTHONPATH=build/python), or under
mpirun, srun or torchrun."""
import numpy as np

import tally

F, N, BATCH, STEPS, LR = 8, 16384, 32, 400, 0.1

comm = tally.Comm()
data_rng = np.random.default_rng(42)  # the same seed on every rank: the same data set
true_w = data_rng.normal(size=F + 1).astype(np.float32)
x = data_rng.normal(size=(N, F)).astype(np.float32)
y = x @ true_w[:F] + true_w[F] + 0.1 * data_rng.normal(size=N).astype(np.float32)

params = np.zeros(F + 1, np.float32)
grad = comm.mem_alloc(F + 1, np.float32)  # the host's ranks read it in place
mine = np.arange(comm.rank, N, comm.size)  # this rank's shard
order = np.random.default_rng(7 + comm.rank)
for step in range(STEPS):
    i = order.choice(mine, BATCH, replace=False)
    err = x[i] @ params[:F] + params[F] - y[i]
    grad[:F] = 2 * x[i].T @ err / BATCH
    grad[F] = 2 * err.mean()
    comm.allreduce(grad, op="avg")
    params -= LR * grad

loss = float(np.mean((x @ params[:F] + params[F] - y) ** 2))
same = comm.allgather(params)
if comm.rank == 0:
    print(f"{comm.size} ranks over {comm.transport}: loss {loss:.5f} after {STEPS} steps (noise floor 0.01), "
          f"largest weight error {np.abs(params - true_w).max():.4f}, replicas identical: "
          f"{bool(np.all(same == same[0]))}")
ok = loss < 0.02 and np.all(same == same[0])
comm.free()
raise SystemExit(0 if ok else 1)
