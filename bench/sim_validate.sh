#!/usr/bin/env bash
# sim_validate.sh - `tally sim` against this machine: each of STARTS fresh starts calibrates (`tally sim
# --calibrate`: the shm link, its wake-ups and call overhead, the CPUs) before it measures shm allreduce at
# each of 2, 3, 4 and 8 ranks from 1 KiB to 64 MiB (`tally bench --shared-mem`, out of place, as tally bench reports
# first) and predicts them from its own calibration; prints the median prediction beside
# the median and worst measurement, the geometric-mean error, and the floor: the same error between the
# odd and the even starts' measurements.
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

for s in $(seq "$starts"); do
  for n in "${ranks[@]}"; do
    # the links measured afresh just before each rank count's allreduces: this VM's copy rates move
    # with where its CPUs run from minute to minute; small sizes many times, large ones fewer
    "$tally" sim --calibrate --size 64M --save "$out/conf.$n.$s" >/dev/null
    { "$tally" bench allreduce -n "$n" -b 1K -e 256K -f 4 --iters 300 --warmup 30 --shared-mem
      "$tally" bench allreduce -n "$n" -b 1M -e 64M -f 4 --iters 10 --warmup 2 --shared-mem; } >"$out/bench.$n.$s"
    "$tally" sim --config "$out/conf.$n.$s" --ranks-per-host "$n" --size "$sizes" --json >"$out/sim.$n.$s"
  done
done
python3 - "$out" "$starts" "${ranks[@]}" <<'EOF'
import json, math, statistics, sys
out, starts, ranks = sys.argv[1], int(sys.argv[2]), [int(r) for r in sys.argv[3:]]
for s in range(1, starts + 1):
    for n in ranks:
        c = json.load(open(f"{out}/sim.{n}.{s}"))["shm"]
        cache = f", 1 MiB {1e-9/c['cache_beta']:.2f} GB/s" if c["cache_bytes"] > 0 else ""
        print(f"start {s}, before {n} ranks: shm {c['alpha']*1e6:.2f} us ({c['crowded_alpha']*1e6:.2f} us crowded, "
              f"call {c['call']*1e6:.2f} us), copy {1e-9/c['beta']:.2f} GB/s{cache}, "
              f"reduce {1e-9/c['gamma'] if c['gamma'] > 0 else 0:.2f} GB/s")
print("| ranks | size | measured median / worst (us) | bench algo | predicted (us) | sim algo | predicted / median | in place: median (us), predicted / median |")
print("|---|---|---|---|---|---|---|---|")
logs, logs_in, worst = [], [], (0, None)
for n in ranks:
    meas = {}
    for s in range(1, starts + 1):
        for line in open(f"{out}/bench.{n}.{s}"):
            f = line.split()
            if not f or f[0].startswith("#"):
                continue
            meas.setdefault(int(f[0]), []).append((float(f[5]), f[-1], float(f[9])))
    sims = [{r["bytes"]: r for r in json.load(open(f"{out}/sim.{n}.{s}"))["results"]} for s in range(1, starts + 1)]
    for size in sorted(meas):
        times = [m[0] for m in meas[size]]
        inplace = statistics.median(m[2] for m in meas[size])
        med, bad = statistics.median(times), max(times)
        p = statistics.median(x[size]["seconds"] for x in sims) * 1e6
        ratio = p / med
        logs.append(abs(math.log(ratio)))
        logs_in.append(abs(math.log(p / inplace)))
        if abs(math.log(ratio)) > worst[0]:
            worst = (abs(math.log(ratio)), (n, size, ratio))
        print(f"| {n} | {size} | {med:.1f} / {bad:.1f} | {meas[size][0][1]} | {p:.1f} | {sims[0][size]['algo']} | {ratio:.2f} | {inplace:.1f}, {p / inplace:.2f} |")
gm = math.exp(sum(logs) / len(logs)) - 1
print(f"\ngeometric-mean error: {100*gm:.1f}% over {len(logs)} points; worst: {worst[1][0]} ranks, "
      f"{worst[1][1]} bytes, predicted {worst[1][2]:.2f}x the median")
print(f"against the in-place column (what the calibration times): {100*(math.exp(sum(logs_in) / len(logs_in)) - 1):.1f}%")
# the floor: this machine against itself, the median of the odd starts against that of the even ones
if starts >= 2:
    floor = []
    for n in ranks:
        half = [{}, {}]
        for s in range(1, starts + 1):
            for line in open(f"{out}/bench.{n}.{s}"):
                f = line.split()
                if f and not f[0].startswith("#"):
                    half[s % 2].setdefault(int(f[0]), []).append(float(f[5]))
        floor += [abs(math.log(statistics.median(half[1][z]) / statistics.median(half[0][z]))) for z in half[0]]
    print(f"the measurements against themselves (odd starts' median against even starts'): "
          f"{100*(math.exp(sum(floor) / len(floor)) - 1):.1f}%")
EOF
