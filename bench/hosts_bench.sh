#!/usr/bin/env bash
# hosts_bench.sh - allreduce across the test hosts of scripts/hosts.sh (network namespaces on a bridge,
# each host's link held to a rate both ways): the flat ring, the hierarchical algorithm and the cost
# model's own choice, and Open MPI's MPI_Allreduce over the same namespaces (mpirun in host 0, its
# daemons started through hosts.sh's rsh agent; shared memory inside a host, tcp on the bridge; and
# mpi_yield_when_idle, as Open MPI advises when ranks outnumber cores, which they do here), beside
# the bound 2(H-1)/H x S / rate, for each layout and rate given.
# usage: sudo bench/hosts_bench.sh [LAYOUTS] [RATES] [SIZE]   (defaults: "2x2 4x2" "1gbit 10gbit" 64M)
#   PEERS=dir: the peer programs (default ../shared/peers); without mpicc or them the column says n/a
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
    -- "$tally" bench allreduce -b "$4" -e "$5" -f 128 --iters "${6:-5}" --warmup 2 2>/dev/null |
    awk '$1 ~ /^[0-9]+$/ {print $1, $6, $NF}'
}

# Open MPI over the same namespaces: layout, rate, size -> time_us (or n/a).
peers=${PEERS:-$here/../shared/peers}
mpi_ar=
if command -v mpicc >/dev/null && [ -f "$peers/mpi_allreduce_bench.c" ]; then
  mpicc -O2 -o "$tmp/mpi_ar" "$peers/mpi_allreduce_bench.c" && mpi_ar=$tmp/mpi_ar
fi
run_mpi() {
  [ -n "$mpi_ar" ] || { echo n/a; return; }
  local h=${1%x*} m=${1#*x} b
  b=$(bytes_of "$3")
  # shellcheck disable=SC2016 # expanded inside host 0, where hosts.sh sets them
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 bash "$here/scripts/hosts.sh" --hosts "$h" --ranks "$m" \
    --rate "$2" --timeout 600 --launcher -- bash -c 'mpirun --hostfile "$HOSTS_HOSTFILE" --mca plm_rsh_agent "$HOSTS_RSH" \
      --mca btl self,vader,tcp --mca btl_tcp_if_include "$HOSTS_NET" --mca oob_tcp_if_include "$HOSTS_NET" \
      --mca mpi_yield_when_idle 1 --map-by slot --bind-to none -np '"$((h * m)) $mpi_ar $b $b ${4:-5}" 2>/dev/null |
    awk -v b="$b" '$1 == b {print $3; found = 1} END {if (!found) print "n/a"}'
}

S=$(bytes_of "$size")
echo "| layout | link | size | flat ring | hier | auto (its pick) | Open MPI | bound 2(H-1)/H x S / rate | hier / bound |"
echo "|---|---|---|---|---|---|---|---|---|"
for l in $layouts; do
  h=${l%x*}
  for r in $rates; do
    bits=$(bits_of "$r")
    ring=$(run "$l" "$r" ring "$size" "$size" | awk '{print $2}')
    hier=$(run "$l" "$r" hier "$size" "$size" | awk '{print $2}')
    read -r _ auto pick < <(run "$l" "$r" auto "$size" "$size" | tail -1)
    mpi=$(run_mpi "$l" "$r" "$size")
    awk -v l="$l" -v r="$r" -v sz="$size" -v ring="$ring" -v hier="$hier" -v auto="$auto" -v pick="$pick" \
      -v mpi="$mpi" -v h="$h" -v s="$S" -v b="$bits" 'BEGIN {
        bound = 2 * (h - 1) / h * s * 8 / b * 1e6
        m = mpi == "n/a" ? "n/a" : sprintf("%.1f ms", mpi / 1e3)
        printf "| %s | %s | %s | %.1f ms | %.1f ms | %.1f ms (%s) | %s | %.1f ms | %.2fx |\n", l, r, sz, ring / 1e3,
          hier / 1e3, auto / 1e3, pick, m, bound / 1e3, hier / bound }'
  done
done
echo
echo "| layout | link | size | flat (auto's flat pick) | hier | Open MPI |"
echo "|---|---|---|---|---|---|"
for l in $layouts; do
  for r in $rates; do
    for small in 8 1K; do
      flat=$(run "$l" "$r" rhd "$small" "$small" 200 | awk '{print $2}')
      hier=$(run "$l" "$r" hier "$small" "$small" 200 | awk '{print $2}')
      mpi=$(run_mpi "$l" "$r" "$small" 200)
      printf '| %s | %s | %s B | %s us (rhd) | %s us | %s us |\n' "$l" "$r" "$small" "$flat" "$hier" "$mpi"
    done
  done
done
