#!/usr/bin/env bash
# sim_hosts_validate.sh - `tally sim` against the test hosts of scripts/hosts.sh (network namespaces on one
# kernel, each host's link held to a rate): calibrates this machine once, then for each of STARTS fresh
# starts measures allreduce of each SIZE on each layout and rate with the flat ring and hier, and prints the
# prediction (--shared-cores yes: the namespaces share this machine's CPUs) beside the median and worst.
# usage: sudo bench/sim_hosts_validate.sh [STARTS] [LAYOUTS] [RATES] [SIZES]
#        (defaults: 3 "2x2 4x2" "1gbit 10gbit" "1M 64M"; from the repository, after a build in build/)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
tally=${TALLY_BIN:-$here/build/tally}
starts=${1:-3}
layouts=${2:-2x2 4x2}
rates=${3:-1gbit 10gbit}
sizes=${4:-1M 64M}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

"$tally" sim --calibrate --size 64M --json >"$out/calib.json"
read -r alpha crowded beta gamma cores nic_alpha tcp < <(python3 -c '
import json,sys; c=json.load(open(sys.argv[1])); s=c["shm"]
print(s["alpha"], s["crowded_alpha"], 1/s["beta"], 1/s["gamma"] if s["gamma"]>0 else 1e12, c["cores"],
      c["nic_alpha"], 1/c["tcp_cpu"] if c["tcp_cpu"]>0 else 1e12)' "$out/calib.json")

for s in $(seq "$starts"); do
  for l in $layouts; do
    for r in $rates; do
      for algo in ring hier; do
        for z in $sizes; do
          TALLY_ALGO=$algo TALLY_TIMEOUT=120 bash "$here/scripts/hosts.sh" --hosts "${l%x*}" --ranks "${l#*x}" \
            --rate "$r" --timeout 600 -- "$tally" bench allreduce -b "$z" -e "$z" --iters 5 --warmup 2 2>/dev/null |
            awk -v k="$l $r $algo" '$1 ~ /^[0-9]+$/ {print k, $1, $6}' >>"$out/measured"
        done
      done
    done
  done
done
for l in $layouts; do
  for r in $rates; do
    for algo in ring hier; do
      for z in $sizes; do
        "$tally" sim --hosts "${l%x*}" --ranks-per-host "${l#*x}" --nic "${r%bit}bps" --shared-cores yes \
          --cores "$cores" --shm-latency "${alpha}s" --crowded-latency "${crowded}s" --shm-bandwidth "${beta}B/s" \
          --reduce-bandwidth "${gamma}B/s" --nic-latency "${nic_alpha}s" --tcp-bandwidth "${tcp}B/s" \
          --algo "$algo" --size "$z" --json |
          python3 -c 'import json,sys; r=json.load(sys.stdin)["results"][0]; print(sys.argv[1], r["bytes"], r["seconds"]*1e6, r.get("levels", ["", ""])[1])' \
            "$l $r $algo" >>"$out/predicted"
      done
    done
  done
done
python3 - "$out" <<'EOF'
import collections, math, statistics, sys
out = sys.argv[1]
meas = collections.defaultdict(list)
for line in open(f"{out}/measured"):
    l, r, a, b, t = line.split()
    meas[(l, r, a, int(b))].append(float(t))
print("| layout | link | algorithm | size | measured median / worst (ms) | predicted (ms) | predicted / median |")
print("|---|---|---|---|---|---|---|")
logs, worst = [], (0, None)
for line in open(f"{out}/predicted"):
    f = line.split()
    l, r, a, b, p = f[0], f[1], f[2], int(f[3]), float(f[4])
    m = meas.get((l, r, a, b))
    if not m:
        continue
    med, bad = statistics.median(m), max(m)
    ratio = p / med
    logs.append(abs(math.log(ratio)))
    if abs(math.log(ratio)) > worst[0]:
        worst = (abs(math.log(ratio)), (l, r, a, b, ratio))
    print(f"| {l} | {r} | {a} | {b} | {med/1e3:.2f} / {bad/1e3:.2f} | {p/1e3:.2f} | {ratio:.2f} |")
if logs:
    print(f"\ngeometric-mean error: {100*(math.exp(sum(logs)/len(logs))-1):.1f}% over {len(logs)} points; worst: "
          f"{worst[1][0]} {worst[1][1]} {worst[1][2]} {worst[1][3]} bytes, predicted {worst[1][4]:.2f}x the median")
EOF
