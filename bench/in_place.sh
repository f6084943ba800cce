#!/usr/bin/env bash
# in_place.sh - where reading a peer's tally_mem_alloc buffer in place pays against the shm slot ring: K fresh
# starts of `tally bench allreduce --shared-mem` each way at 2, 3, 4 and 8 ranks; median (worst) us a call.
# usage: bench/in_place.sh [K] [RANKS]   K fresh starts per mode (default 5); RANKS e.g. "2 4" (default 2 3 4 8)
set -euo pipefail # a failed bench run stops the script rather than thinning a column
here=$(cd "$(dirname "$0")/.." && pwd)
starts=${1:-5}
ranks_list=${2:-2 3 4 8}
tally=$here/build/tally
[ -x "$tally" ] || { echo "build first: cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
sizes="262144 1048576 4194304 16777216"

# One start: "size us" lines, the out-of-place column of a sweep over the sizes. $1 ranks, $2 the slot ring
# forced (TALLY_SHM_LARGE=off) or not.
sweep() {
  local large=()
  [ "$2" = slots ] && large=(env TALLY_SHM_LARGE=off)
  "${large[@]}" "$tally" bench allreduce -n "$1" -b 256K -e 16M -f 4 --iters 40 --shared-mem |
    awk '$1 ~ /^[0-9]+$/ {print $1, $6}'
}

# "median (worst)" of the numbers in a file, us, rounded.
stats() {
  sort -g "$1" | awk '{v[NR] = $1} END {m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
    printf "%.0f (%.0f)", m, v[NR]}'
}

echo "# bench/in_place.sh: $starts fresh starts per mode, f32 sum, 40 calls each, tally_mem_alloc buffers;"
echo "# mean us a call, median (worst); $(nproc) CPUs, load $(cut -d' ' -f1 /proc/loadavg)"
printf '%-6s %-9s %-16s %-16s\n' ranks size "in place" "slot ring"
for n in $ranks_list; do
  for ((s = 0; s < starts; s++)); do # the two modes take turns, so a slow spell falls on both
    for mode in inplace slots; do
      sweep "$n" "$mode" | while read -r size us; do echo "$us" >>"$tmp/$n.$mode.$size"; done
    done
  done
  for size in $sizes; do
    if [ ! -s "$tmp/$n.inplace.$size" ] || [ ! -s "$tmp/$n.slots.$size" ]; then
      echo "ranks $n, $size B: no result" >&2
      exit 1
    fi
    label="$((size / 1024)) KiB"
    [ "$size" -ge 1048576 ] && label="$((size / 1048576)) MiB"
    printf '%-6s %-9s %-16s %-16s\n' "$n" "$label" "$(stats "$tmp/$n.inplace.$size")" \
      "$(stats "$tmp/$n.slots.$size")"
  done
done
