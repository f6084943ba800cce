#!/usr/bin/env bash
# params_hashes.sh - the final parameters' SHA-256 of a fixed set of training runs, one line each: what a
# restructuring of the trainer must leave bit-identical. usage: bench/params_hashes.sh [OUT_FILE]
# Runs on the synthetic data set (no package needed) with fixed seeds; about two minutes on 2 CPUs.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
tally=$here/build/tally
out=${1:-/dev/stdout}
[ -x "$tally" ] || { echo "build first: cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
common=(--data synthetic:2048 --steps 24 --batch 32 --seed 7 --quiet --no-eval --transport shm)

# name, then the flags of one run; prints "name sha256".
hash_of() {
  local name=$1
  shift
  if ! "$tally" train "${common[@]}" "$@" --json "$tmp/$name.json" >"$tmp/$name.log" 2>&1; then
    echo "$name FAILED: $(tail -1 "$tmp/$name.log")"
    return
  fi
  echo "$name $(sed -n 's/.*"params_sha256": "\([0-9a-f]*\)".*/\1/p' "$tmp/$name.json")"
}

{
  for m in linear mlp cnn; do
    for n in 1 2 3; do hash_of "$m-n$n" -n "$n" --model "$m"; done
  done
  for z in 1 2 3; do hash_of "mlp-zero$z-n2" -n 2 --model mlp --zero "$z" --optimizer adamw; done
  for c in fp16 bf16 topk:0.1 powersgd:2; do hash_of "mlp-${c%%:*}-n2" -n 2 --model mlp --compress "$c"; done
  hash_of mlp-accum2-n2 -n 2 --model mlp --accum 2 --warmup 4 --decay cosine
  hash_of mlp-async0-n2 -n 2 --model mlp --mode async --staleness 0
  # A resume: 12 steps with a checkpoint, then on to 24 from it.
  "$tally" train "${common[@]}" -n 2 --model mlp --optimizer adamw --steps 12 --ckpt "$tmp/ck-resume" >/dev/null 2>&1 || true
  hash_of mlp-resume-n2 -n 2 --model mlp --optimizer adamw --ckpt "$tmp/ck-resume" --resume
  # Written at N = 4, loaded at N = 2.
  "$tally" train "${common[@]}" -n 4 --model mlp --optimizer adamw --steps 12 --ckpt "$tmp/ck-4to2" >/dev/null 2>&1 || true
  hash_of mlp-4to2 -n 2 --model mlp --optimizer adamw --ckpt "$tmp/ck-4to2" --resume
} >"$out"
