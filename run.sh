#!/usr/bin/env bash
# Fresh machine to first result: installs what is missing (Fashion-MNIST included), builds tally, and
# runs the main job: the MLP trained on Fashion-MNIST by 2 data-parallel ranks for 3 epochs.
set -eu
cd "$(dirname "$0")"
bash scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
exec build/tally train -n 2 --epochs 3
