#!/usr/bin/env bash
# Fresh machine to first result: installs what is missing, builds tally, runs the main job
# (until the trainer lands: the allreduce benchmark on 2 local ranks, results checked).
set -eu
cd "$(dirname "$0")"
bash scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
exec build/tally bench allreduce -n 2 -b 8 -e 64M -f 8 -c
