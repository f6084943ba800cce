#!/usr/bin/env bash
# The soak benchmark: 10,000 random collectives on 4 ranks, every result checked (tests/coll/test_soak.c,
# which ctest runs with a small count); prints collectives/s and "#wrong".
# usage: bench/soak.sh [BUILD_DIR] [COUNT] [SEED]     (defaults: build, 10000, from the clock)
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
soak=$build/tests/test_soak
[ -x "$soak" ] || { echo "build the tests first (./run.sh builds none): cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTALLY_TESTS=ON && cmake --build build" >&2; exit 2; }
export TALLY_SOAK_COUNT=${2:-10000}
[ -n "${3:-}" ] && export TALLY_SOAK_SEED=$3
exec "$soak"
