#!/usr/bin/env bash
# ssp.sh - SSP against synchronous training under jitter, each run to the end of an annealed schedule:
# 4 ranks, the MLP, cosine decay over EPOCHS, seeds 1..SEEDS; prints each mode's samples/s (mean, worst)
# and test accuracy (mean, and each seed's) beside sync's. bench/async.sh is the one-epoch, constant-rate
# table; there one epoch's final accuracy moves by points from seed to seed and start to start.
# usage: bench/ssp.sh [EPOCHS] [SEEDS] [JITTER_MS]   (default 5 epochs, 3 seeds, 3 plain steps of jitter;
# about 12 minutes on 2 CPUs)
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
tally=$here/build/tally
[ -x "$tally" ] || { echo "build first: cmake -S . -B build && cmake --build build" >&2; exit 2; }
epochs=${1:-5}
seeds=${2:-3}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
common="-n 4 --model mlp --batch 64 --optimizer sgd --momentum 0.9 --lr 0.05 --decay cosine --quiet"
field() { /usr/bin/python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }

# The jitter's mean: 3 plain steps (data + compute of a rank in a synchronous run), as bench/async.sh.
if [ -n "${3:-}" ]; then
  ms=$3
else
  "$tally" train $common --steps 100 --no-eval --json "$tmp/plain.json" >/dev/null
  ms=$(/usr/bin/python3 -c "print(max(1, round(3 * $(field "$tmp/plain.json" 's["step_ms"]["data"] + s["step_ms"]["compute"]'))))")
fi
echo "--jitter $ms, $epochs epochs with cosine decay, seeds 1..$seeds"
echo

# One mode over every seed: "label|samples/s ...|accuracy ..." into $tmp/rows.
mode() {
  local label=$1; shift
  local rates="" accs=""
  for seed in $(seq "$seeds"); do
    "$tally" train $common --epochs "$epochs" --jitter "$ms" --seed "$seed" --json "$tmp/r.json" "$@" >/dev/null
    rates="$rates $(field "$tmp/r.json" 's["samples_per_s"]')"
    accs="$accs $(field "$tmp/r.json" 's["test_accuracy"]')"
  done
  echo "$label|$rates|$accs" >>"$tmp/rows"
}
mode "sync (allreduce)"
for S in 1 2 3 4; do mode "SSP S=$S, --stale-lr none" --mode async --staleness "$S" --stale-lr none; done
mode "SSP S=3, --stale-lr inverse (the default)" --mode async --staleness 3

/usr/bin/python3 - "$tmp/rows" <<'PY'
import statistics as st, sys
rows = [l.rstrip("\n").split("|") for l in open(sys.argv[1])]
rows = [(r[0], [float(x) for x in r[1].split()], [float(x) for x in r[2].split()]) for r in rows]
sync_rate, sync_acc = st.mean(rows[0][1]), st.mean(rows[0][2])
print("| run | samples/s: mean (worst) | against sync | test accuracy: mean (each seed) | against sync, points |")
print("|---|---|---|---|---|")
for label, rates, accs in rows:
    print("| %s | %.0f (%.0f) | %.2fx | %.4f (%s) | %+.2f |" % (
        label, st.mean(rates), min(rates), st.mean(rates) / sync_rate, st.mean(accs),
        ", ".join("%.4f" % a for a in accs), 100 * (st.mean(accs) - sync_acc)))
PY
