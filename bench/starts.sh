#!/usr/bin/env bash
# starts.sh - what a user gets, not the best run: K fresh starts of an allreduce at 8 B, 1 KiB, 1 MiB and
# 64 MiB on 2 ranks, tally (shm, tcp; bound and --bind none) beside Open MPI (its default binding and
# --bind-to none) and Gloo (when python3-torch is installed); then 4 and 8 ranks on this host's CPUs.
# usage: bench/starts.sh [K] [PEERS_DIR]      K fresh starts per row (default 20); prints median and worst.
# ONLY=2 runs the 2-rank table only, ONLY=crowded the 4- and 8-rank one, ONLY=one-copy the shm table of
# malloc'd buffers against tally_mem_alloc's (read in place) at 2 and 4 ranks, beside Open MPI and STREAM;
# ONLY=tcp the 2-rank table's tcp rows only. Beside the 64 MiB tcp rows, what loopback TCP itself moves
# (bench/tcp_duplex.c: two processes streaming each other 64 MiB at once over one connection, nothing
# else done): a 2-rank ring moves the message's bytes each way, no fewer, and reduces besides.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
starts=${1:-20}
peers=${2:-$here/../shared/peers}
only=${ONLY:-all}
tally=$here/build/tally
[ -x "$tally" ] || { echo "build first: cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
have_mpi=0
if command -v mpicc >/dev/null && mpicc -O2 -o "$tmp/mpi_ar" "$peers/mpi_allreduce_bench.c" 2>/dev/null; then have_mpi=1; fi
have_gloo=0
if [ -f "$peers/gloo_allreduce_bench.py" ] && /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null; then have_gloo=1; fi

have_wire=0
if gcc -O2 -pthread -o "$tmp/tcp_duplex" "$here/bench/tcp_duplex.c" 2>/dev/null; then have_wire=1; fi

iters_for() { case $1 in 8 | 1024) echo 2000 ;; 1048576) echo 100 ;; *) echo 5 ;; esac; }

# One start's time in us: tally's out-of-place column, Open MPI's and Gloo's time column.
tally_us() { # ranks transport size bind [--shared-mem]
  "$tally" bench allreduce -n "$1" --transport "$2" -b "$3" -e "$3" --iters "$(iters_for "$3")" --warmup 20 \
    --bind "$4" ${5:+"$5"} | awk '$1 ~ /^[0-9]+$/ {print $6; exit}'
}
mpi_us() { # ranks btl size binding
  local btl=()
  [ "$2" = tcp ] && btl=(--mca btl self,tcp)
  mpirun --oversubscribe "${btl[@]}" --bind-to "$4" -np "$1" "$tmp/mpi_ar" "$3" "$3" "$(iters_for "$3")" 2>/dev/null |
    awk '$1 ~ /^[0-9]+$/ {print $3; exit}'
}
wire_us() { # size: us per that many bytes streamed each way at once
  "$tmp/tcp_duplex" "$1" "$(iters_for "$1")"
}
gloo_us() { # ranks size (its own iteration count: 10)
  MASTER_PORT=$((20000 + RANDOM % 20000)) /usr/bin/python3 "$peers/gloo_allreduce_bench.py" "$1" "$2" "$2" 2>/dev/null |
    awk '$1 ~ /^[0-9]+$/ {print $2; exit}'
}

# Median and worst of the starts, us; the busbw (nccl-tests: algbw x 2(n-1)/n) they give for large sizes.
summary() { # ranks size values...
  local ranks=$1 size=$2
  shift 2
  printf '%s\n' "$@" | sort -g | awk -v n="$#" -v s="$size" -v r="$ranks" '
    {v[NR] = $1} END {
      med = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2; worst = v[n]; f = 2 * (r - 1) / r
      if (s >= 1048576) printf "%10.2f %10.2f %9.2f %9.2f", med, worst, s / med / 1e3 * f, s / worst / 1e3 * f
      else printf "%10.2f %10.2f %9s %9s", med, worst, "-", "-"
    }'
}

row() { # label ranks size command...
  local label=$1 ranks=$2 size=$3
  shift 3
  local vals=() v
  for ((i = 0; i < starts; i++)); do
    v=$("$@") || v=
    [ -n "$v" ] && vals+=("$v")
  done
  [ ${#vals[@]} -gt 0 ] || { printf '%-30s %5s %10s  (no result)\n' "$label" "$ranks" "$size"; return; }
  printf '%-30s %5s %10s %s  (%d starts)\n' "$label" "$ranks" "$size" "$(summary "$ranks" "$size" "${vals[@]}")" "${#vals[@]}"
}

header() {
  printf '%-30s %5s %10s %10s %10s %9s %9s\n' "who" "ranks" "bytes" "median us" "worst us" "med GB/s" "worst"
}

echo "# bench/starts.sh: $starts fresh starts per row, f32 sum; median and worst time (us) and the busbw"
echo "# (GB/s) they give for the large sizes; $(nproc) CPUs, load $(cut -d' ' -f1 /proc/loadavg)"
if [ "$have_gloo" != 1 ]; then echo "# Gloo: no rows (python3-torch is not installed)"; fi
if [ "$only" = one-copy ]; then
  if gcc -O2 -o "$tmp/stream" "$peers/stream.c" 2>/dev/null; then
    echo "# STREAM (one core, $peers/stream.c): $("$tmp/stream" | tail -1)"
  fi
  "$tally" bench allreduce -n 2 -b 8 -e 8 --iters 1 --warmup 0 | grep '^# large messages' | sed 's/; this run.*//'
  header
  for n in 2 4; do
    mpi_bind=core
    [ "$n" -gt "$(nproc)" ] && mpi_bind=none
    for s in 1024 67108864; do
      row "tally shm, malloc buffers" "$n" "$s" tally_us "$n" shm "$s" core
      row "tally shm, tally_mem_alloc" "$n" "$s" tally_us "$n" shm "$s" core --shared-mem
      if [ "$have_mpi" = 1 ]; then row "Open MPI shm, bind-to $mpi_bind" "$n" "$s" mpi_us "$n" shm "$s" "$mpi_bind"; fi
    done
  done
  exit 0
fi
if [ "$only" != crowded ]; then
  header
  tps="shm tcp"
  [ "$only" = tcp ] && tps=tcp
  for s in 8 1024 1048576 67108864; do
    if [ "$have_wire" = 1 ] && [ "$s" -ge 67108864 ]; then row "plain TCP stream, both ways" 2 "$s" wire_us "$s"; fi
    for tp in $tps; do
      row "tally $tp, bound" 2 "$s" tally_us 2 "$tp" "$s" core
      row "tally $tp, --bind none" 2 "$s" tally_us 2 "$tp" "$s" none
      if [ "$have_mpi" = 1 ]; then
        row "Open MPI $tp, bind-to core" 2 "$s" mpi_us 2 "$tp" "$s" core
        row "Open MPI $tp, bind-to none" 2 "$s" mpi_us 2 "$tp" "$s" none
      fi
    done
    if [ "$have_gloo" = 1 ]; then row "Gloo (tcp)" 2 "$s" gloo_us 2 "$s"; fi
  done
fi
if [ "$only" != 2 ] && [ "$only" != tcp ]; then
  echo "# more ranks than this host's $(nproc) CPUs: nobody can bind a rank to a CPU of its own"
  header
  for n in 4 8; do
    for s in 1024 67108864; do
      row "tally shm (none pinned)" "$n" "$s" tally_us "$n" shm "$s" core
      if [ "$have_mpi" = 1 ]; then row "Open MPI shm, bind-to none" "$n" "$s" mpi_us "$n" shm "$s" none; fi
    done
  done
fi
