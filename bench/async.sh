#!/usr/bin/env bash
# Synchronous against asynchronous (SSP) training with one slow rank: 4 ranks, rank 1 made 4x slower
# by --straggler, the same samples for every run; prints the BENCHMARKS.md table (samples/s, accuracy).
# usage: bench/async.sh [EPOCHS]   (default 1; Fashion-MNIST MLP 784-512-512-10, batch 64 per rank)
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
tally=$here/build/tally
[ -x "$tally" ] || { echo "build first: cmake -S . -B build && cmake --build build" >&2; exit 2; }
epochs=${1:-1}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
common="-n 4 --model mlp --batch 64 --optimizer sgd --momentum 0.9 --lr 0.05 --seed 1"

field() { /usr/bin/python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }

# A plain step: data + compute of one rank in a synchronous run without a straggler. The straggler
# sleeps 3 of those, so its step is 4 times the others'.
"$tally" train $common --steps 100 --no-eval --quiet --json "$tmp/plain.json" >/dev/null
plain=$(field "$tmp/plain.json" 's["step_ms"]["data"] + s["step_ms"]["compute"]')
ms=$(/usr/bin/python3 -c "print(max(1, round(3 * $plain)))")
echo "plain step (data + compute, sync, 4 ranks): $plain ms; --straggler 1:$ms"
echo
echo "| run | samples/s | test acc | steps/worker | staleness histogram (0..S) | pulls held back | step ms (rank 0) |"
echo "|---|---|---|---|---|---|---|"
row() {
  local label=$1; shift
  "$tally" train $common --epochs "$epochs" --straggler "1:$ms" --quiet --json "$tmp/r.json" "$@" >/dev/null
  /usr/bin/python3 - "$label" "$tmp/r.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[2]))
a = s["async"]
hist = "-" if a is None else " ".join(str(x) for x in a["staleness_hist"])
held = "-" if a is None else "%d of %d" % (a["pulls_waited"], a["pulls"])
print("| %s | %.0f | %.4f | %d | %s | %s | %.2f |" % (sys.argv[1], s["samples_per_s"], s["test_accuracy"],
      s["steps"], hist, held, s["step_ms"]["total"]))
PY
}
row "sync (allreduce)"
row "async S=0 (server rounds)" --mode async --staleness 0
for S in 1 4 16; do row "async S=$S, lr/(1+staleness)" --mode async --staleness $S; done
for S in 4 16; do row "async S=$S, undamped lr" --mode async --staleness $S --stale-lr none; done
