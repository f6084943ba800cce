#!/usr/bin/env bash
# Fresh machine to first result: installs what is missing (the King James Bible and Fashion-MNIST
# included), builds tally, and runs the main job: a GPT trained on the Bible's text by 2 data-parallel
# ranks for about two minutes, then a sample of what it writes. ./run.sh --mlp: the MLP on Fashion-MNIST.
set -eu
cd "$(dirname "$0")"
case "${1:-}" in
  "" | --mlp) ;;
  *) echo "usage: ./run.sh [--mlp]" >&2; exit 2 ;;
esac
bash scripts/deps.sh
# The tests are ./test.sh's to build (it turns them on again): without them the build takes 20 s, not 46.
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTALLY_TESTS=OFF >/dev/null
cmake --build build -j"$(nproc)"
[ "${1:-}" = --mlp ] && exec build/tally train -n 2 --epochs 3
ckpt=$(mktemp -d)
trap 'rm -rf "$ckpt"' EXIT
build/tally train -n 2 --model gpt --steps 300 --batch 16 --ckpt "$ckpt"
echo "--- what it writes after 300 steps (tally generate --ckpt DIR --prompt ...):"
build/tally generate --ckpt "$ckpt" --prompt "And God said" --tokens 300
