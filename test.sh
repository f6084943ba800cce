#!/usr/bin/env bash
# Runs the whole test suite: a release build, then the same tests under AddressSanitizer+UBSan, then
# the threaded tests under ThreadSanitizer.
# The sanitizer pass runs the same tests with TALLY_TEST_LIGHT=1 (largest sizes trimmed).
# TALLY_TEST_QUICK=1 skips the sanitizer build.
set -eu
cd "$(dirname "$0")"
bash scripts/deps.sh --tests # the suite tests PyTorch's tally backend and renders the charts in chromium
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure --timeout 900)
if [ "${TALLY_TEST_QUICK:-0}" != 1 ]; then
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DTALLY_SANITIZE=ON >/dev/null
  cmake --build build-asan -j"$jobs"
  (cd build-asan && TALLY_TEST_LIGHT=1 ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure --timeout 900)
  # The threaded parts (the monitor thread, faults raised from it, abort from another thread, the engine
  # and ZeRO communication threads, shm+tcp's helper thread, the non-blocking calls' thread) under ThreadSanitizer; TALLY_TEST_THREADS=1 keeps test_zero to its
  # threaded cases.
  cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DTALLY_TSAN=ON >/dev/null
  cmake --build build-tsan -j"$jobs" --target test_boot test_faults test_abort test_ddp test_zero test_mixed test_requests tally
  (cd build-tsan && TALLY_TEST_THREADS=1 TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure --timeout 900 \
    -R '^(test_boot|test_faults|test_abort|test_ddp|test_zero|test_mixed|test_requests)$')
fi
