#!/usr/bin/env bash
# Trains the default GPT (L4 C256 H4 T128, batch 16 per rank, the King James Bible) with tally and with
# the PyTorch peer (../shared/peers/ddp_gpt.py: DDP over gloo) in one sitting, STARTS fresh starts of
# each configuration interleaved, and prints each one's tokens/s with the median and the worst.
# usage: bench/gpt_compare.sh [PEERS_DIR] [STARTS] [STEPS]        (defaults: ../shared/peers 3 40)
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
peers=${1:-$here/../shared/peers}
starts=${2:-3}
steps=${3:-40}
tally=$here/build/tally
[ -x "$tally" ] || { echo "build first: ./run.sh, or cmake -S . -B build && cmake --build build" >&2; exit 2; }
. "$here/bench/same_blas.sh"
/usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "the peer needs python3-torch (apt-get install python3-torch)" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

tally_run() { # ranks -> tokens/s
  "$tally" train -n "$1" --model gpt --steps "$steps" --batch 16 --no-eval --quiet --json "$tmp/s.json" >/dev/null
  sed -n 's/.*"tokens_per_s": \([0-9.]*\).*/\1/p' "$tmp/s.json"
}
peer_run() { # world, threads -> tokens/s
  THREADS=$2 /usr/bin/python3 "$peers/ddp_gpt.py" "$1" "$steps" 2>/dev/null | sed -n 's/.*tokens\/s=\([0-9.]*\).*/\1/p'
}
stats() { # label, values... -> median and worst (the lowest)
  local label=$1; shift
  printf '%s\n' "$@" | sort -n | awk -v l="$label" '{v[NR]=$1} END {m = NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2;
    printf "%-34s median %7.0f  worst %7.0f tokens/s  (%s starts)\n", l, m, v[1], NR}'
}

declare -a t2 t1 p2 p1
for i in $(seq "$starts"); do
  t2+=("$(tally_run 2)"); t1+=("$(tally_run 1)")
  p2+=("$(peer_run 2 1)"); p1+=("$(peer_run 1 2)")
  echo "start $i: tally 2 ranks ${t2[-1]}, tally 1 rank ${t1[-1]}, DDP 2 ranks ${p2[-1]}, torch 1 x 2 threads ${p1[-1]}"
done
stats "tally, 2 ranks" "${t2[@]}"
stats "tally, 1 rank" "${t1[@]}"
stats "PyTorch DDP (gloo), 2 ranks x 1 thread" "${p2[@]}"
stats "PyTorch, 1 process x 2 threads" "${p1[@]}"
"$tally" train -n 2 --model gpt --steps "$steps" --batch 16 --no-eval --quiet --json "$tmp/m.json" >/dev/null
echo "tally 2 ranks, one more start: $(grep -o '"mfu": [0-9.]*\|"sgemm_peak_gflops": [0-9.]*\|"gflops_per_rank": [0-9.]*' "$tmp/m.json" | tr '\n' ' ')"
