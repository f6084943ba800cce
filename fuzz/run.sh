#!/usr/bin/env bash
# Builds the libFuzzer targets (build-fuzz, clang) and runs each for RUNS inputs on its corpus, printing
# how many ran and how fast. New inputs go to build-fuzz/work/<target>; --merge folds those that add
# coverage into fuzz/corpus/<target> (libFuzzer's -merge=1), which ctest replays.
#
#   fuzz/run.sh [RUNS] [TARGET...]     RUNS defaults to 10000000; TARGETs to every one built
#   fuzz/run.sh --merge [TARGET...]
#
# Needs clang with libFuzzer and the sanitizer runtimes (Debian: clang-14 and libclang-rt-14-dev).
# FUZZ_FLAGS adds libFuzzer flags (e.g. -seed=1, -max_total_time=60); FUZZ_JOBS build jobs (2).
set -euo pipefail
cd "$(dirname "$0")/.."
merge=0
if [ "${1:-}" = --merge ]; then
  merge=1
  shift
fi
runs=10000000
if [[ "${1:-}" =~ ^[0-9]+$ ]]; then
  runs=$1
  shift
fi
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(frame handshake idx)
  [ -f src/ckpt/ckpt.h ] && targets+=(ckpt manifest)
fi

# Longest input per target: a few frames each (a fault report is ~800 bytes, a TCP message of 255
# eight-byte elements ~2 KiB), small IDX files, checkpoints of a small model.
max_len() {
  case $1 in
    frame) echo 4096 ;;
    handshake) echo 2048 ;;
    idx) echo 4096 ;;
    ckpt) echo 65536 ;;
    manifest) echo 600 ;;
    *) echo "unknown fuzz target: $1" >&2; exit 2 ;;
  esac
}

# Flags of one target: the handshake's listener thread allocates across inputs, so libFuzzer's
# per-input leak check would scan the heap after most inputs (a third of the time); leaks are still
# reported at exit, and descriptors are counted every 500 inputs by the target itself.
target_flags() {
  case $1 in
    handshake) echo -detect_leaks=0 ;;
  esac
}

CC=${CC:-clang} cmake -S . -B build-fuzz -DTALLY_FUZZ=ON >/dev/null
cmake --build build-fuzz -j"${FUZZ_JOBS:-2}" --target "${targets[@]/#/fuzz_}" >/dev/null

# The library logs every connection it refuses: drop those lines, keep libFuzzer's and the targets' own.
# (Not sed -u: it reads a byte at a time, and a target that logs on most inputs then waits on the pipe;
# the handshake target ran at a third of its speed behind it.)
quiet() { grep -av --line-buffered '^tally\[[a-z]* [0-9]*\] error: ' || true; }
files() { find "$1" -maxdepth 1 -type f | wc -l; }

for t in "${targets[@]}"; do
  bin=build-fuzz/fuzz/fuzz_$t
  corpus=fuzz/corpus/$t
  work=build-fuzz/work/$t
  mkdir -p "$work" "$corpus"
  if [ $merge = 1 ]; then
    log=build-fuzz/work/$t.merge.log
    before=$(files "$corpus")
    "$bin" -merge=1 -max_len="$(max_len "$t")" "$corpus" "$work" 2>&1 | quiet >"$log"
    echo "$t: corpus $before -> $(files "$corpus") files (log: $log)"
    continue
  fi
  log=build-fuzz/work/$t.log
  # shellcheck disable=SC2086 # FUZZ_FLAGS is a list of flags
  "$bin" -runs="$runs" -max_len="$(max_len "$t")" -timeout=60 -artifact_prefix="$work-" -malloc_limit_mb=64 -print_final_stats=1 \
    $(target_flags "$t") ${FUZZ_FLAGS:-} "$work" "$corpus" 2>&1 | quiet >"$log" || {
    echo "$t: FAILED (crash or sanitizer report; reproducer and trace in $log)"
    grep -E 'ERROR|SUMMARY|fuzz_[a-z]*:|Test unit written' "$log" | head -20
    exit 1
  }
  n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log")
  echo "$t: $n inputs in ${secs:-?} s, $rate exec/s, no crash; $(files "$work") new inputs in $work (log: $log)"
done
