#!/usr/bin/env bash
# sim_validate.sh - `tally sim` against this machine: each of STARTS fresh starts calibrates (`tally sim
# --calibrate`: the shm link, its wake-ups and call overhead, the CPUs), measures shm allreduce at 2, 3, 4
# and 8 ranks from 1 KiB to 64 MiB (`tally bench --shared-mem`, out of place, as tally bench reports
# first) and predicts them from its own calibration; prints the median prediction beside
# the median and worst measurement, and the geometric-mean error.
# usage: bench/sim_validate.sh [STARTS] [RANKS...]     (from the repository, after a build in build/)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
tally=${TALLY_BIN:-$here/build/tally}
starts=${1:-3}
shift || true
ranks=("$@")
[ ${#ranks[@]} -gt 0 ] || ranks=(2 3 4 8)
sizes=1K,4K,16K,64K,256K,1M,4M,16M,64M
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

for s in $(seq "$starts"); do # each start measures the links afresh, then the allreduces
  "$tally" sim --calibrate --size 64M --save "$out/conf.$s" >/dev/null
  for n in "${ranks[@]}"; do # small sizes many times (their time is microseconds), large ones fewer
    { "$tally" bench allreduce -n "$n" -b 1K -e 256K -f 4 --iters 300 --warmup 30 --shared-mem
      "$tally" bench allreduce -n "$n" -b 1M -e 64M -f 4 --iters 10 --warmup 2 --shared-mem; } >"$out/bench.$n.$s"
    "$tally" sim --config "$out/conf.$s" --ranks-per-host "$n" --size "$sizes" --json >"$out/sim.$n.$s"
  done
done
python3 - "$out" "$starts" "${ranks[@]}" <<'EOF'
import json, math, statistics, sys
out, starts, ranks = sys.argv[1], int(sys.argv[2]), [int(r) for r in sys.argv[3:]]
for s in range(1, starts + 1):
    c = json.load(open(f"{out}/sim.{ranks[0]}.{s}"))["shm"]
    print(f"start {s}: shm {c['alpha']*1e6:.2f} us ({c['crowded_alpha']*1e6:.2f} us crowded, call {c['call']*1e6:.2f} us), "
          f"copy {1e-9/c['beta']:.2f} GB/s, reduce {1e-9/c['gamma'] if c['gamma'] > 0 else 0:.2f} GB/s")
print("| ranks | size | measured median / worst (us) | bench algo | predicted (us) | sim algo | predicted / median |")
print("|---|---|---|---|---|---|---|")
logs, worst = [], (0, None)
for n in ranks:
    meas = {}
    for s in range(1, starts + 1):
        for line in open(f"{out}/bench.{n}.{s}"):
            f = line.split()
            if not f or f[0].startswith("#"):
                continue
            meas.setdefault(int(f[0]), []).append((float(f[5]), f[-1]))
    sims = [{r["bytes"]: r for r in json.load(open(f"{out}/sim.{n}.{s}"))["results"]} for s in range(1, starts + 1)]
    for size in sorted(meas):
        times = [t for t, _ in meas[size]]
        med, bad = statistics.median(times), max(times)
        p = statistics.median(x[size]["seconds"] for x in sims) * 1e6
        ratio = p / med
        logs.append(abs(math.log(ratio)))
        if abs(math.log(ratio)) > worst[0]:
            worst = (abs(math.log(ratio)), (n, size, ratio))
        print(f"| {n} | {size} | {med:.1f} / {bad:.1f} | {meas[size][0][1]} | {p:.1f} | {sims[0][size]['algo']} | {ratio:.2f} |")
gm = math.exp(sum(logs) / len(logs)) - 1
print(f"\ngeometric-mean error: {100*gm:.1f}% over {len(logs)} points; worst: {worst[1][0]} ranks, "
      f"{worst[1][1]} bytes, predicted {worst[1][2]:.2f}x the median")
EOF
