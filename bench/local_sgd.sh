#!/usr/bin/env bash
# Local SGD against synchronous training and the codecs on a slow link: the GPT on 2 ranks in two network
# namespaces (bench/slowlink.sh), at 100 Mbit/s and 1 Gbit/s, the same steps for every run; prints each
# run's tokens/s (samples/s x the context), bytes per step, validation loss and training seconds.
#
# usage: sudo bench/local_sgd.sh [STEPS] [RATE...]     (default 200 steps, 100mbit 1gbit)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
steps=${1:-200}
[ $# -gt 0 ] && shift
rates=("$@")
[ ${#rates[@]} -gt 0 ] || rates=(100mbit 1gbit)
runs=(none topk:0.01 local:4 local:16 local:64 local:16/int8
  local:16,--outer-momentum=0.5 local:16/int8,--outer-momentum=0.5)
for rate in "${rates[@]}"; do
  "$here/slowlink.sh" "$rate" "${runs[@]}" -- --model gpt --steps "$steps" --batch 16 --bucket-mb 2
  echo
done
