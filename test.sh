#!/usr/bin/env bash
# test.sh - the test suite by tiers (CONTRIBUTING.md, "Tests"). With no argument, the quick tier: in a Release
# build, in an AddressSanitizer+UBSan build at -O1 (TALLY_TEST_LIGHT=1), and its threaded tests under
# ThreadSanitizer, each with ctest -j across the CPUs; at most 10 minutes on 2 cores, or it fails.
#   --full       every tier (quick, long, external) in the three builds
#   --long       the long tier alone, in the three builds
#   --external   the external tier alone (PyTorch, Chromium, mpirun, test hosts), in the Release build
# Prints each phase's time and the 10 slowest tests; each build keeps ctest's times
# (Testing/Temporary/CTestCostData.txt), so the next run starts the slowest tests first.
# TALLY_TEST_BUDGET=S: the quick tier's limit in seconds (600; 0 for none, under valgrind say).
set -eu -o pipefail
cd "$(dirname "$0")"

mode=${1:-quick}
case "$mode" in
quick | --quick) mode=quick tiers=quick builds="release asan tsan" deps=--torch ;;
--full) mode=full tiers="quick|long|external" builds="release asan tsan" deps=--tests ;;
--long) mode=long tiers=long builds="release asan tsan" deps=--torch ;;
--external) mode=external tiers=external builds=release deps=--tests ;;
-h | --help)
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
  ;;
*)
  echo "test.sh: unknown argument '$1': it takes --full, --long or --external (none: the quick tier); see --help" >&2
  exit 2
  ;;
esac
budget=${TALLY_TEST_BUDGET:-600} # the quick tier's, on the slower 2-core machine kind
case $budget in
"" | *[!0-9]*)
  echo "test.sh: TALLY_TEST_BUDGET='$budget': it takes whole seconds (600 by default; 0: no limit)" >&2
  exit 2
  ;;
esac

# PyTorch's packages for the backend's tests; chromium besides for the external tier's charts.
bash scripts/deps.sh "$deps"
jobs=$(nproc)
t_start=$SECONDS
logs=()
failed=()

phase_time() { # name start
  echo "test.sh: $1: $((SECONDS - $2)) s"
}

run_build() { # name dir cmake-args...
  local name=$1 dir=$2 t0=$SECONDS
  shift 2
  cmake -S . -B "$dir" "$@" >/dev/null
  cmake --build "$dir" -j"$jobs"
  phase_time "$name build" "$t0"
}

run_tests() { # name dir tiers env...: those tiers' tests of one build
  local name=$1 dir=$2 tiers=$3 t0=$SECONDS rc=0
  shift 3
  local log="$dir/Testing/test.sh-$mode.log"
  mkdir -p "$dir/Testing"
  (cd "$dir" && env "$@" ctest --output-on-failure -j"$jobs" -L "^($tiers)\$") 2>&1 | tee "$log" || rc=$?
  logs+=("$name:$log")
  phase_time "$name tests ($tiers)" "$t0"
  [ "$rc" -eq 0 ] || failed+=("$name")
}

for b in $builds; do
  case $b in
  release)
    run_build release build -DCMAKE_BUILD_TYPE=Release -DTALLY_TESTS=ON # run.sh builds this one without
    run_tests release build "$tiers"
    ;;
  asan) # the largest sizes trimmed (TALLY_TEST_LIGHT); leaks are errors
    run_build asan build-asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-g -O1" -DTALLY_SANITIZE=ON
    run_tests asan build-asan "$tiers" TALLY_TEST_LIGHT=1 ASAN_OPTIONS=detect_leaks=1
    ;;
  tsan) # the tests marked THREADS in tests/CMakeLists.txt, the only ones this build has (none external)
    run_build tsan build-tsan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-g -O1" -DTALLY_TSAN=ON
    run_tests tsan build-tsan "$tiers" TSAN_OPTIONS=halt_on_error=1
    ;;
  esac
done

echo "test.sh: the 10 slowest tests of this run:"
for entry in "${logs[@]}"; do
  awk -v build="${entry%%:*}" '/Test +#[0-9]+: / {
    for (i = 1; i <= NF; i++) if ($i == "sec") printf "%9.2f s  %-8s %s\n", $(i - 1), build, $4 }' "${entry#*:}"
done | sort -rn | head -10 || true # a listing cut short is no failure

total=$((SECONDS - t_start))
echo "test.sh: $mode: $total s in all (builds and tests; deps.sh before not counted)"
if [ ${#failed[@]} -gt 0 ]; then
  echo "test.sh: FAILED: tests failed in the ${failed[*]} build(s), above"
  exit 1
fi
if [ "$mode" = quick ] && [ "$budget" -gt 0 ] && [ "$total" -gt "$budget" ]; then
  echo "test.sh: FAILED: the quick tier took $total s, over its $budget s: make the slow tests faster or move" \
    "cases to the long tier (CONTRIBUTING.md, \"Tests\"); never drop what they check"
  exit 1
fi
echo "test.sh: passed"
