#!/usr/bin/env bash
# Synchronous against asynchronous (SSP) training with slow ranks: 4 ranks, the same samples for every run;
# prints the BENCHMARKS.md table (samples/s, accuracy). straggler (the default): rank 1 made 4x slower by
# --straggler; jitter: every rank sleeps a random delay each step (--jitter, mean 3 plain steps).
# usage: bench/async.sh [EPOCHS] [straggler|jitter]   (default 1 straggler; Fashion-MNIST MLP 784-512-512-10,
# batch 64 per rank)
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
tally=$here/build/tally
[ -x "$tally" ] || { echo "build first: cmake -S . -B build && cmake --build build" >&2; exit 2; }
epochs=${1:-1}
slow=${2:-straggler}
case $slow in straggler | jitter) ;; *) echo "bench/async.sh: '$slow' is not straggler or jitter" >&2; exit 2 ;; esac
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
common="-n 4 --model mlp --batch 64 --optimizer sgd --momentum 0.9 --lr 0.05 --seed 1"

field() { /usr/bin/python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }

# A plain step: data + compute of one rank in a synchronous run without a straggler. The straggler
# sleeps 3 of those, so its step is 4 times the others'; under jitter each rank's delay has that mean.
"$tally" train $common --steps 100 --no-eval --quiet --json "$tmp/plain.json" >/dev/null
plain=$(field "$tmp/plain.json" 's["step_ms"]["data"] + s["step_ms"]["compute"]')
ms=$(/usr/bin/python3 -c "print(max(1, round(3 * $plain)))")
if [ "$slow" = jitter ]; then slow_flags="--jitter $ms"; else slow_flags="--straggler 1:$ms"; fi
echo "plain step (data + compute, sync, 4 ranks): $plain ms; $slow_flags"
echo
echo "| run | samples/s | test acc | steps of rank 0 | staleness histogram (0..S) | pulls held back | step ms (rank 0) |"
echo "|---|---|---|---|---|---|---|"
row() {
  local label=$1; shift
  "$tally" train $common --epochs "$epochs" $slow_flags --quiet --json "$tmp/r.json" "$@" >/dev/null
  /usr/bin/python3 - "$label" "$tmp/r.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[2]))
a = s["async"]
h = [] if a is None else a["staleness_hist"]
hist = "-" if a is None else " ".join(str(x) for x in h) if len(h) <= 5 else "%s ... %s (max %d)" % (
    " ".join(str(x) for x in h[:3]), " ".join(str(x) for x in h[-2:]), a["max_staleness"])
held = "-" if a is None else "%d of %d" % (a["pulls_waited"], a["pulls"])
print("| %s | %.0f | %.4f | %d | %s | %s | %.2f |" % (sys.argv[1], s["samples_per_s"], s["test_accuracy"],
      s["steps"], hist, held, s["step_ms"]["total"]))
PY
}
row "sync (allreduce)"
row "async S=0 (server rounds)" --mode async --staleness 0
for S in 1 4 16; do row "async S=$S, every worker every step" --mode async --staleness $S; done
for S in 1 4 16; do row "async S=$S, --quota shared" --mode async --staleness $S --quota shared; done
row "async S=16, --quota shared, --stale-lr none" --mode async --staleness 16 --quota shared --stale-lr none
row "async S=1000, --quota shared (~fully async)" --mode async --staleness 1000 --quota shared
