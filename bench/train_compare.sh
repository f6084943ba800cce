#!/usr/bin/env bash
# Trains the Fashion-MNIST MLP and CNN with tally and with the PyTorch DDP peer in one run on this
# machine, and prints the figures of BENCHMARKS.md's training tables (samples/s, accuracy) and of the
# notebook, docs/benchmarks-history.md (overlap and bucket effects).
# usage: bench/train_compare.sh [PEERS_DIR] [quick]   (quick: 1-epoch runs only, no accuracy runs)
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
peers=${1:-$here/../shared/peers}
quick=${2:-}
tally=$here/build/tally
[ -x "$tally" ] || { echo "build first: ./run.sh, or cmake -S . -B build && cmake --build build" >&2; exit 2; }
. "$here/bench/same_blas.sh"
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "installing the PyTorch peer (python3-torch)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torch python3-numpy >/dev/null
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# One tally run: prints a row from its JSON summary. Arguments: label, then tally train flags.
row() {
  local label=$1; shift
  "$tally" train --quiet --json "$tmp/s.json" "$@" >/dev/null
  /usr/bin/python3 - "$label" "$tmp/s.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[2]))
acc = "-" if s["test_accuracy"] is None else "%.4f" % s["test_accuracy"]
st = s["step_ms"]
print("| %s | %d | %.0f | %s | %.3f | %.3f | %.3f | %.1f%% | %.0f | %.2f |" % (
    sys.argv[1], s["world"], s["samples_per_s"], acc, st["total"], st["compute"], st["wait"],
    100 * s["comm_share"], s["bytes_sent_per_step"], s["mfu"]))
EOF
}
header() {
  echo "| run | ranks | samples/s | test acc | step ms | compute ms | wait ms | comm share | bytes/step | MFU |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
}
peer() { /usr/bin/python3 "$peers/ddp_fashion_mlp.py" "$@" 2>&1 | grep -v -i warning; }

mlp="--model mlp --batch 64 --optimizer sgd --momentum 0.9 --lr 0.05 --scale-lr"
echo "## MLP 784-512-512-10, batch 64 per rank, SGD momentum 0.9, 1 epoch"
echo "### PyTorch DDP (gloo, 1 thread per rank)"
peer 1 1; peer 2 1
echo "### tally"
header
row "tally mlp" -n 1 $mlp --epochs 1
row "tally mlp" -n 2 $mlp --epochs 1
echo "## What overlap and bucketing buy (2 ranks, 1 epoch)"
header
row "no overlap, 25 MB" -n 2 $mlp --epochs 1 --no-overlap
for b in 25 2 1 0.5 0.25; do row "overlap, $b MB buckets" -n 2 $mlp --epochs 1 --bucket-mb $b; done
row "over tcp, 1 MB buckets" -n 2 $mlp --epochs 1 --bucket-mb 1 --transport tcp
[ "$quick" = quick ] && exit 0
echo "## Accuracy after 5 epochs, 2 ranks"
peer 2 5
header
row "tally mlp, 5 epochs" -n 2 $mlp --epochs 5
echo "## LeNet-5 CNN, batch 64 per rank"
peer 2 1 cnn
header
row "tally cnn, 1 epoch, lr 0.1 as the peer" -n 2 --model cnn --batch 64 --lr 0.05 --scale-lr --normalize none --epochs 1
row "tally cnn, 12 epochs, lr 0.05 cosine" -n 2 --model cnn --batch 64 --lr 0.05 --decay cosine --normalize none --epochs 12
