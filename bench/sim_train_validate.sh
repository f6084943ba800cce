#!/usr/bin/env bash
# sim_train_validate.sh - `tally sim --train` against `tally train`: `tally sim --calibrate` gives the links,
# and for each model STARTS runs of one rank on each CPU at once give the rest (the medians of its step but
# the update on the faster CPU and how much slower the other is, of the update, and of its compute's spread from
# step to step, the parameters); then each of STARTS fresh starts
# trains at each N of RANKS (one host) and, as root, on 2 test hosts of one rank at 1 Gbit/s (scripts/hosts.sh), and
# each measured step (median, worst) is printed beside the prediction.
# usage: [sudo] bench/sim_train_validate.sh [STARTS] [MODELS] [RANKS]   (defaults: 3 "mlp gpt" "2 4")
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
tally=${TALLY_BIN:-$here/build/tally}
starts=${1:-3}
models=${2:-mlp gpt}
ranks=${3:-2 4}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
args_of() { # the run each model trains: short, no evaluation
  case $1 in
    mlp) echo "--model mlp --steps 60 --no-eval --quiet" ;;
    gpt) echo "--model gpt --steps 12 --batch 8 --no-eval --quiet" ;;
  esac
}
field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, d))' "$1" "$2"; }

"$tally" sim --calibrate --size 16M --save "$out/conf" >/dev/null
cpus=$(python3 -c 'import os; print(" ".join(map(str, sorted(os.sched_getaffinity(0)))))')
ncpu=$(echo "$cpus" | wc -w)

echo "| model | layout | measured step median / worst (ms) | predicted (ms) | predicted / median |"
echo "|---|---|---|---|---|"
for m in $models; do
  # one rank on each CPU, all at once, STARTS times: the medians of its step but the update, and of the
  # update, are the inputs. At once, as a run's ranks compute: this VM's CPUs slow each other (a GPT step
  # of 287 ms alone took 390-490 ms on 2 ranks in some passes), and are not always alike (one has run it
  # 1.6x slower than the other for minutes), so the slower CPU's ranks are named slow by the ratio
  for _ in $(seq "$starts"); do
    for cpu in $cpus; do
      # shellcheck disable=SC2046 # the run's flags are words
      taskset -c "$cpu" "$tally" train -n 1 $(args_of "$m") --json "$out/one.$cpu.json" >/dev/null &
    done
    wait
    for cpu in $cpus; do
      field "$out/one.$cpu.json" 'step_ms["total"] - step_ms["update"]' >>"$out/compute.$m.$cpu"
      field "$out/one.$cpu.json" 'step_ms["update"]' >>"$out/update.$m"
      field "$out/one.$cpu.json" 'step_ms["compute_sd"] / step_ms["compute"]' >>"$out/sd.$m"
    done
  done
  P=$(field "$out/one.$cpu.json" params)
  median() { python3 -c 'import statistics,sys; print(round(statistics.median(float(x) for x in open(sys.argv[1])), 4))' "$1"; }
  read -r C slow_cpu F <<<"$(for cpu in $cpus; do echo "$cpu $(median "$out/compute.$m.$cpu")"; done | python3 -c '
import sys
per = [(float(t), int(c)) for c, t in (l.split() for l in sys.stdin)]
fast, slow = min(per), max(per)
print(fast[0], slow[1], round(slow[0] / fast[0], 3))')"
  U=$(median "$out/update.$m")
  SD=$(median "$out/sd.$m")
  echo "| $m | inputs: one rank on each CPU at once, median of $starts | step but the update $C ms (CPU $slow_cpu: ${F}x), update $U ms, compute's spread $SD, $P parameters | | |"
  layouts=""
  for n in $ranks; do [ "$n" = 1 ] || layouts="$layouts 1x$n"; done
  [ "$(id -u)" = 0 ] && layouts="$layouts 2x1@1gbit"
  for l in $layouts; do
    h=${l%%x*} rest=${l#*x} n=${rest%@*} rate=
    [[ $l == *@* ]] && rate=${l#*@}
    for _ in $(seq "$starts"); do
      if [ -n "$rate" ]; then
        # shellcheck disable=SC2046
        bash "$here/scripts/hosts.sh" --hosts "$h" --ranks "$n" --rate "$rate" --out "$out/h" -- \
          "$tally" train $(args_of "$m") --json "$out/run.json" >/dev/null 2>&1 || true
      else
        # shellcheck disable=SC2046
        "$tally" train -n "$n" $(args_of "$m") --json "$out/run.json" >/dev/null
      fi
      field "$out/run.json" 'step_ms["total"]' >>"$out/meas.$m.$l"
    done
    extra=""
    [ -n "$rate" ] && extra="--nic ${rate%bit}bps --shared-cores yes --nic-payload 0.956" # as sim_hosts_validate.sh
    # the ranks on the slower CPU: rank r runs on CPU r mod the CPUs (pinned, or spread by the scheduler)
    for ((r = slow_cpu; r < h * n; r += ncpu)); do extra="$extra --slow $r:$F"; done
    # shellcheck disable=SC2086
    # many drawn steps, so the mean of the slowest rank's compute is not itself a draw
    pred=$("$tally" sim --config "$out/conf" --train --params "$P" --compute "${C}ms" --update "${U}ms" \
      --compute-sd "$SD" --steps 400 --hosts "$h" --ranks-per-host "$n" $extra --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["step_s"]*1e3)')
    python3 - "$m" "$l" "$pred" "$out/meas.$m.$l" <<'EOF'
import statistics, sys
m, l, pred, path = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
t = [float(x) for x in open(path)]
med = statistics.median(t)
print(f"| {m} | {l} | {med:.2f} / {max(t):.2f} | {pred:.2f} | {pred/med:.2f} |")
EOF
  done
done
