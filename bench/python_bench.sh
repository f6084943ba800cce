#!/usr/bin/env bash
# PyTorch over tally beside PyTorch over Gloo, in one run: the peers' own scripts (../shared/peers) with
# BACKEND=tally and BACKEND=gloo, each a fresh start STARTS times (default 3), the two backends' starts
# taking turns so that the machine's slow spells fall on both; prints medians and worsts.
# usage: bench/python_bench.sh [STARTS] [PARTS]   PARTS: any of allreduce,mlp,gpt (default all three)
# (needs the build with the backend: scripts/deps.sh --torch)
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
peers=${TALLY_PEERS:-$here/../shared/peers}
starts=${1:-3}
parts=,${2:-allreduce,mlp,gpt},
want() { case $parts in *,$1,*) return 0 ;; *) return 1 ;; esac; }
export PYTHONPATH=$here/build/python
[ -e "$here/build/python/tally/_where.py" ] || { echo "build first: ./test.sh or cmake --build build" >&2; exit 2; }
/usr/bin/python3 -c 'import tally.torch' || { echo "the PyTorch backend is not built (scripts/deps.sh --torch)" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
tally=$here/build/tally
. "$here/bench/same_blas.sh"

stats() { # FILE: "median worst" of its numbers (worst = the smallest for rates, the largest for times)
  /usr/bin/python3 - "$1" "$2" <<'PY'
import statistics, sys
v = [float(x) for x in open(sys.argv[1]).read().split()]
worst = min(v) if sys.argv[2] == "rate" else max(v)
print(f"{statistics.median(v):.3g} {worst:.3g} ({len(v)} starts: {' '.join(f'{x:.3g}' for x in v)})")
PY
}

want allreduce && echo "## allreduce through torch.distributed, 2 ranks (gloo_allreduce_bench.py 2 67108864)"
want allreduce && for s in $(seq "$starts"); do
  for b in gloo tally; do
    BACKEND=$b timeout 600 /usr/bin/python3 "$peers/gloo_allreduce_bench.py" 2 67108864 2>/dev/null >"$tmp/ar.$b.$s"
    awk '$1 == 1048576 {print $4}' "$tmp/ar.$b.$s" >>"$tmp/bw1m.$b"
    awk '$1 == 1024 {print $2}' "$tmp/ar.$b.$s" >>"$tmp/t1k.$b"
    awk '$1 == 67108864 {print $4}' "$tmp/ar.$b.$s" >>"$tmp/bw64m.$b"
  done
done
want allreduce && for b in gloo tally; do
  echo "$b: 1 KiB us $(stats "$tmp/t1k.$b" time); 1 MiB busbw GB/s $(stats "$tmp/bw1m.$b" rate); 64 MiB busbw GB/s $(stats "$tmp/bw64m.$b" rate)"
done

want mlp && echo "## DDP, Fashion-MNIST MLP, 1 epoch (ddp_fashion_mlp.py N 1)"
want mlp && for s in $(seq "$starts"); do
  for n in 1 2; do
    for b in gloo tally; do
      BACKEND=$b timeout 600 /usr/bin/python3 "$peers/ddp_fashion_mlp.py" "$n" 1 2>/dev/null |
        sed -n 's/.*samples\/s=\([0-9]*\).*/\1/p' >>"$tmp/mlp.$b.$n"
    done
  done
done
want mlp && for b in gloo tally; do
  for n in 1 2; do echo "$b, $n rank(s): samples/s $(stats "$tmp/mlp.$b.$n" rate)"; done
done

want gpt && echo "## DDP, byte-level GPT on the KJV, 2 ranks, 30 steps (ddp_gpt.py 2 30)"
want gpt && for s in $(seq "$starts"); do
  for b in gloo tally; do
    BACKEND=$b timeout 900 /usr/bin/python3 "$peers/ddp_gpt.py" 2 30 2>/dev/null |
      sed -n 's/.*tokens\/s=\([0-9.]*\).*/\1/p' >>"$tmp/gpt.$b"
  done
done
want gpt && for b in gloo tally; do echo "$b: tokens/s $(stats "$tmp/gpt.$b" rate)"; done
