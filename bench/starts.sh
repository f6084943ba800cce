#!/usr/bin/env bash
# starts.sh - what a user gets, not the best run: K fresh starts of a 2-rank allreduce at 8 B, 1 KiB, 1 MiB
# and 64 MiB, tally (shm, tcp; bound and --bind none) beside Open MPI (its default binding and --bind-to none).
# usage: bench/starts.sh [K] [PEERS_DIR]      K fresh starts per row (default 20); prints median and worst.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
starts=${1:-20}
peers=${2:-$here/../shared/peers}
tally=$here/build/tally
[ -x "$tally" ] || { echo "build first: cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
have_mpi=0
if command -v mpicc >/dev/null && mpicc -O2 -o "$tmp/mpi_ar" "$peers/mpi_allreduce_bench.c" 2>/dev/null; then have_mpi=1; fi

sizes=(8 1024 1048576 67108864)
iters_for() { case $1 in 8 | 1024) echo 2000 ;; 1048576) echo 100 ;; *) echo 5 ;; esac; }

# One start's time in us: tally's out-of-place column, Open MPI's time column.
tally_us() { # transport size bind
  "$tally" bench allreduce -n 2 --transport "$1" -b "$2" -e "$2" --iters "$(iters_for "$2")" --warmup 20 \
    --bind "$3" | awk '$1 ~ /^[0-9]+$/ {print $6; exit}'
}
mpi_us() { # btl size binding
  local btl=()
  [ "$1" = tcp ] && btl=(--mca btl self,tcp)
  mpirun --oversubscribe "${btl[@]}" --bind-to "$3" -np 2 "$tmp/mpi_ar" "$2" "$2" "$(iters_for "$2")" 2>/dev/null |
    awk '$1 ~ /^[0-9]+$/ {print $3; exit}'
}

# Median and worst of the starts, us; the size's busbw at the median for the large sizes.
summary() { # size values...
  local size=$1
  shift
  printf '%s\n' "$@" | sort -g | awk -v n="$#" -v s="$size" '
    {v[NR] = $1} END {
      med = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2; worst = v[n]
      if (s >= 1048576) printf "%10.2f %10.2f %9.2f %9.2f", med, worst, s / med / 1e3, s / worst / 1e3
      else printf "%10.2f %10.2f %9s %9s", med, worst, "-", "-"
    }'
}

row() { # label size command...
  local label=$1 size=$2
  shift 2
  local vals=() v
  for ((i = 0; i < starts; i++)); do
    v=$("$@") || v=
    [ -n "$v" ] && vals+=("$v")
  done
  [ ${#vals[@]} -gt 0 ] || { printf '%-28s %10s  (no result)\n' "$label" "$size"; return; }
  printf '%-28s %10s %s  (%d starts)\n' "$label" "$size" "$(summary "$size" "${vals[@]}")" "${#vals[@]}"
}

echo "# bench/starts.sh: $starts fresh starts per row, 2 ranks, f32 sum; median and worst time (us) and the"
echo "# busbw (GB/s, 2 ranks: algbw x 1) they give for the large sizes; $(nproc) CPUs, load $(cut -d' ' -f1 /proc/loadavg)"
printf '%-28s %10s %10s %10s %9s %9s\n' "who" "bytes" "median us" "worst us" "med GB/s" "worst"
for s in "${sizes[@]}"; do
  for tp in shm tcp; do
    row "tally $tp, bound" "$s" tally_us "$tp" "$s" core
    row "tally $tp, --bind none" "$s" tally_us "$tp" "$s" none
    if [ "$have_mpi" = 1 ]; then
      row "Open MPI $tp, bind-to core" "$s" mpi_us "$tp" "$s" core
      row "Open MPI $tp, bind-to none" "$s" mpi_us "$tp" "$s" none
    fi
  done
done
