#!/usr/bin/env bash
# sim_hosts_validate.sh - `tally sim` against the test hosts of scripts/hosts.sh (network namespaces on one
# kernel, each host's link held to a rate): each of STARTS fresh starts calibrates this machine, measures
# allreduce of each SIZE on each layout and rate with the flat ring and hier, and predicts them from its
# calibration (--shared-cores yes: the namespaces share this machine's CPUs; --nic-payload 0.956: tc's
# token bucket counts a frame's 1514 bytes without FCS, preamble and gap, of which TCP's data is 1448);
# prints the median prediction beside the median and worst measurement.
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

for s in $(seq "$starts"); do # each start measures this machine afresh, then the layouts
  "$tally" sim --calibrate --size 64M --save "$out/conf.$s" >/dev/null
  for l in $layouts; do
    for r in $rates; do
      for algo in ring hier; do
        for z in $sizes; do
          TALLY_ALGO=$algo TALLY_TIMEOUT=120 bash "$here/scripts/hosts.sh" --hosts "${l%x*}" --ranks "${l#*x}" \
            --rate "$r" --timeout 600 -- "$tally" bench allreduce -b "$z" -e "$z" --iters 5 --warmup 2 2>/dev/null |
            awk -v k="$l $r $algo" '$1 ~ /^[0-9]+$/ {print k, $1, $6}' >>"$out/measured"
          "$tally" sim --config "$out/conf.$s" --hosts "${l%x*}" --ranks-per-host "${l#*x}" --nic "${r%bit}bps" \
            --shared-cores yes --nic-payload 0.956 --algo "$algo" --size "$z" --json |
            python3 -c 'import json,sys; r=json.load(sys.stdin)["results"][0]; print(sys.argv[1], r["bytes"], r["seconds"]*1e6)' \
              "$l $r $algo" >>"$out/predicted"
        done
      done
    done
  done
done
python3 - "$out" <<'EOF'
import collections, math, statistics, sys
out = sys.argv[1]
meas, pred = collections.defaultdict(list), collections.defaultdict(list)
for line in open(f"{out}/measured"):
    l, r, a, b, t = line.split()
    meas[(l, r, a, int(b))].append(float(t))
for line in open(f"{out}/predicted"):
    l, r, a, b, t = line.split()
    pred[(l, r, a, int(b))].append(float(t))
print("| layout | link | algorithm | size | measured median / worst (ms) | predicted (ms) | predicted / median |")
print("|---|---|---|---|---|---|---|")
logs, worst = [], (0, None)
for (l, r, a, b), ps in pred.items():
    m, p = meas.get((l, r, a, b)), statistics.median(ps)
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
