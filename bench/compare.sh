#!/usr/bin/env bash
# Runs tally's allreduce benchmark beside its peers (Open MPI shm and tcp, Gloo, memory bandwidth) in one
# run on this machine, so the figures in BENCHMARKS.md are ratios taken under the same conditions.
# usage: bench/compare.sh [PEERS_DIR] [RANKS...]    (PEERS_DIR: the peers' sources; ranks default "2 4")
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
peers=${1:-$here/../shared/peers}
shift || true
ranks=${*:-2 4}
tally=$here/build/tally
[ -x "$tally" ] || { echo "build first: cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
gcc -O3 -march=native -o "$tmp/stream" "$peers/stream.c"
mpicc -O2 -o "$tmp/mpi_ar" "$peers/mpi_allreduce_bench.c"
echo "## memory bandwidth (stream.c)"; "$tmp/stream"
for n in $ranks; do
  echo "## $n ranks, f32 sum"
  echo "### Open MPI, shared memory"; mpirun --oversubscribe -np "$n" "$tmp/mpi_ar" 16 67108864 20 2>&1 | grep -v '^$'
  echo "### tally, shm"; "$tally" bench allreduce -n "$n" --transport shm -b 16 -e 64M -f 4 --iters 20 -c
  echo "### Open MPI, tcp"; mpirun --oversubscribe --mca btl self,tcp -np "$n" "$tmp/mpi_ar" 16 67108864 20 2>&1 | grep -v '^$'
  echo "### tally, tcp"; "$tally" bench allreduce -n "$n" --transport tcp -b 16 -e 64M -f 4 --iters 20 -c
  if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    echo "### Gloo"; /usr/bin/python3 "$peers/gloo_allreduce_bench.py" "$n" 67108864 1024 2>&1 | grep -v Warning
  fi
done
echo "## small messages, 2 ranks, 1000 iterations"
echo "### Open MPI, shared memory"; mpirun --oversubscribe -np 2 "$tmp/mpi_ar" 8 4096 1000
echo "### tally, shm"; "$tally" bench allreduce -n 2 --transport shm -b 8 -e 4K -f 8 --iters 1000 --warmup 100
echo "### Open MPI, tcp"; mpirun --oversubscribe --mca btl self,tcp -np 2 "$tmp/mpi_ar" 8 4096 1000
echo "### tally, tcp"; "$tally" bench allreduce -n 2 --transport tcp -b 8 -e 4K -f 8 --iters 1000 --warmup 100
