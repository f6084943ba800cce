#!/usr/bin/env bash
# run.sh - the kernels built once per instruction set (TALLY_SIMD_CLONES: the layers', the gradient's norm)
# as CPUs without AVX-512 run them: the test programs that check them against their references, under
# QEMU's user-mode emulation of a Haswell (AVX2: the clones built for "avx2") and of a Nehalem (SSE4.2: the
# "default" clones). This machine runs only the clone for its own CPU. Skipped (77) without qemu-x86_64
# (Debian: qemu-user).
# usage: tests/isa/run.sh BUILD_DIR SOURCE_DIR
set -u
build=$1 src=$2
command -v qemu-x86_64 >/dev/null || { echo "test_isa: skipped: qemu-x86_64 is missing (Debian: qemu-user)"; exit 77; }
[ "$(uname -m)" = x86_64 ] || { echo "test_isa: skipped: the clones are x86-64's"; exit 77; }
cd "$src" # test_gpt_ref reads tests/fixtures from here
export TALLY_TEST_TIER=quick TALLY_BIN=$build/tally TALLY_SOURCE_DIR=$src # test_guard's training runs natively
status=0
for cpu in Nehalem Haswell; do
  for t in test_layers test_layers_gpt test_gpt_ref test_guard; do
    start=$SECONDS
    if out=$(qemu-x86_64 -cpu "$cpu" "$build/tests/$t" 2>&1); then
      echo "  $cpu: $t passed ($((SECONDS - start)) s)"
    else
      echo "  $cpu: $t FAILED"
      printf '%s\n' "$out" | grep -v '^qemu-x86_64: warning' | tail -n 20
      status=1
    fi
  done
done
exit $status
