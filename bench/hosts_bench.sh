#!/usr/bin/env bash
# hosts_bench.sh - allreduce across the test hosts of scripts/hosts.sh (network namespaces on a bridge,
# each host's link held to a rate both ways): the flat ring, the hierarchical algorithm and the cost
# model's own choice, beside the bound 2(H-1)/H x S / rate, for each layout and rate given.
# usage: sudo bench/hosts_bench.sh [LAYOUTS] [RATES] [SIZE]   (defaults: "2x2 4x2" "1gbit 10gbit" 64M)
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
tally=${TALLY:-$here/build/tally}
[ -x "$tally" ] || { echo "build first: ./run.sh, or cmake -S . -B build && cmake --build build" >&2; exit 2; }
layouts=${1:-2x2 4x2}
rates=${2:-1gbit 10gbit}
size=${3:-64M}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

bits_of() { # 1gbit -> 1000000000
  [[ "$1" =~ ^([0-9]+)([kmg]?)bit$ ]] || { echo 0; return; }
  local b=${BASH_REMATCH[1]}
  case ${BASH_REMATCH[2]} in k) b=$((b * 1000)) ;; m) b=$((b * 1000000)) ;; g) b=$((b * 1000000000)) ;; esac
  echo $b
}
bytes_of() { # 64M -> bytes
  local n=${1%[KMG]} u=${1##*[0-9]}
  case $u in K) echo $((n << 10)) ;; M) echo $((n << 20)) ;; G) echo $((n << 30)) ;; *) echo "$n" ;; esac
}

# One bench: layout, rate, algo, min size, max size -> "size time_us" lines (out of place).
run() {
  local h=${1%x*} m=${1#*x}
  TALLY_ALGO=$3 TALLY_TIMEOUT=120 bash "$here/scripts/hosts.sh" --hosts "$h" --ranks "$m" --rate "$2" --timeout 600 \
    -- "$tally" bench allreduce -b "$4" -e "$5" -f 128 --iters 5 --warmup 2 2>/dev/null |
    awk '$1 ~ /^[0-9]+$/ {print $1, $6, $NF}'
}

S=$(bytes_of "$size")
echo "| layout | link | size | flat ring | hier | auto (its pick) | bound 2(H-1)/H x S / rate | hier / bound |"
echo "|---|---|---|---|---|---|---|---|"
for l in $layouts; do
  h=${l%x*}
  for r in $rates; do
    bits=$(bits_of "$r")
    ring=$(run "$l" "$r" ring "$size" "$size" | awk '{print $2}')
    hier=$(run "$l" "$r" hier "$size" "$size" | awk '{print $2}')
    read -r _ auto pick < <(run "$l" "$r" auto "$size" "$size" | tail -1)
    awk -v l="$l" -v r="$r" -v sz="$size" -v ring="$ring" -v hier="$hier" -v auto="$auto" -v pick="$pick" \
      -v h="$h" -v s="$S" -v b="$bits" 'BEGIN {
        bound = 2 * (h - 1) / h * s * 8 / b * 1e6
        printf "| %s | %s | %s | %.1f ms | %.1f ms | %.1f ms (%s) | %.1f ms | %.2fx |\n", l, r, sz, ring / 1e3,
          hier / 1e3, auto / 1e3, pick, bound / 1e3, hier / bound }'
  done
done
echo
echo "| layout | link | size | flat (auto's flat pick) | hier |"
echo "|---|---|---|---|---|"
for l in $layouts; do
  for r in $rates; do
    for small in 8 1K; do
      flat=$(run "$l" "$r" rhd "$small" "$small" | awk '{print $2}')
      hier=$(run "$l" "$r" hier "$small" "$small" | awk '{print $2}')
      printf '| %s | %s | %s B | %s us (rhd) | %s us |\n' "$l" "$r" "$small" "$flat" "$hier"
    done
  done
done
