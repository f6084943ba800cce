#!/usr/bin/env bash
# --precision bf16 beside fp32: the default GPT (L4 C256 H4 T128, batch 16 per rank, the King James Bible)
# at 2 ranks, STEPS steps with the validation loss at the end, STARTS fresh starts of each interleaved;
# prints tokens/s (median and worst) and the validation losses. Needs a CPU with AVX512_BF16 (or AMX).
# usage: bench/precision.sh [STARTS] [STEPS]        (defaults: 3 150)
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
starts=${1:-3}
steps=${2:-150}
tally=$here/build/tally
[ -x "$tally" ] || { echo "build first: ./run.sh, or cmake -S . -B build && cmake --build build" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$tally" --version | tail -1

run() { # precision -> "tokens/s val_loss"
  "$tally" train -n 2 --model gpt --steps "$steps" --batch 16 --precision "$1" --quiet --json "$tmp/s.json" >/dev/null
  /usr/bin/python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); print(d["tokens_per_s"], d["val_loss"])' \
    "$tmp/s.json"
}
for i in $(seq "$starts"); do
  for p in fp32 bf16; do run "$p" >>"$tmp/$p"; done
  echo "start $i: fp32 $(tail -1 "$tmp/fp32"), bf16 $(tail -1 "$tmp/bf16") (tokens/s, validation loss)"
done
/usr/bin/python3 - "$tmp/fp32" "$tmp/bf16" <<'PY'
import statistics, sys
rows = {p: [tuple(map(float, l.split())) for l in open(f)] for p, f in zip(("fp32", "bf16"), sys.argv[1:])}
for p, r in rows.items():
    t = [x[0] for x in r]; v = [x[1] for x in r]
    print(f"{p}: tokens/s median {statistics.median(t):.0f} worst {min(t):.0f}; validation loss median {statistics.median(v):.4f}")
t32, t16 = (statistics.median([x[0] for x in rows[p]]) for p in ("fp32", "bf16"))
v32, v16 = (statistics.median([x[1] for x in rows[p]]) for p in ("fp32", "bf16"))
print(f"bf16 / fp32: {t16 / t32:.2f}x tokens/s (worst start {min(x[0] for x in rows['bf16']) / max(x[0] for x in rows['fp32']):.2f}x); "
      f"validation loss {100 * (v16 - v32) / v32:+.2f}%")
PY
