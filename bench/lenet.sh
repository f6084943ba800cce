#!/usr/bin/env bash
# LeNet-5 with its default schedule (`tally train -n 2 --model cnn`): samples/s beside PyTorch DDP at the
# same batch per rank, fresh starts interleaved, then test accuracy after 5 epochs for seeds 0-3.
# usage: bench/lenet.sh [PEERS_DIR] [STARTS]   (default ../shared/peers, 3 starts; about 5 minutes on 2 CPUs)
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
peers=${1:-$here/../shared/peers}
starts=${2:-3}
tally=$here/build/tally
[ -x "$tally" ] || { echo "build first: ./run.sh, or cmake -S . -B build && cmake --build build" >&2; exit 2; }
[ -f "$peers/ddp_fashion_mlp.py" ] || { echo "bench/lenet.sh: no ddp_fashion_mlp.py in $peers" >&2; exit 2; }
. "$here/bench/same_blas.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
field() { /usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$@"; }
batch=$("$tally" train -n 1 --model cnn --steps 1 --no-eval --quiet --json "$tmp/b.json" >/dev/null &&
  field "$tmp/b.json" batch_per_rank)

# median and worst (lowest) of the numbers on stdin
stats() { sort -n | awk '{v[NR]=$1} END {m = NR % 2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2; printf "%.0f %.0f\n", m, v[1]}'; }

echo "## LeNet-5, 2 ranks, batch $batch per rank, 1 epoch: samples/s ($starts fresh starts each, interleaved)"
: >"$tmp/peer"; : >"$tmp/tally"
for i in $(seq "$starts"); do
  /usr/bin/python3 "$peers/ddp_fashion_mlp.py" 2 1 cnn "$batch" 2>&1 | sed -n 's/.*samples\/s=\([0-9]*\).*/\1/p' >>"$tmp/peer"
  "$tally" train -n 2 --model cnn --epochs 1 --quiet --json "$tmp/t.json" >/dev/null
  field "$tmp/t.json" samples_per_s >>"$tmp/tally"
done
[ "$(wc -l <"$tmp/peer")" -eq "$starts" ] || { echo "bench/lenet.sh: the PyTorch peer printed no samples/s in some start (python3-torch installed?)" >&2; exit 1; }
read -r pm pw < <(stats <"$tmp/peer")
read -r tm tw < <(stats <"$tmp/tally")
echo "| run | median | worst |"
echo "|---|---|---|"
echo "| PyTorch DDP (gloo) | $pm | $pw |"
echo "| tally | $tm | $tw |"
/usr/bin/python3 -c "import sys; m,w,pm,pw = map(float, sys.argv[1:]); print('tally / DDP: %.2fx median, %.2fx worst against worst' % (m/pm, w/pw))" \
  "$tm" "$tw" "$pm" "$pw"
echo
echo "## tally train -n 2 --model cnn --epochs 5: test accuracy by seed"
echo "| seed | test accuracy | samples/s |"
echo "|---|---|---|"
for seed in 0 1 2 3; do
  "$tally" train -n 2 --model cnn --epochs 5 --seed "$seed" --quiet --json "$tmp/a.json" >/dev/null
  echo "| $seed | $(field "$tmp/a.json" test_accuracy) | $(field "$tmp/a.json" samples_per_s) |"
done
