#!/usr/bin/env bash
# Installs the build into a scratch prefix and builds against it with pkg-config, as a user would:
# tests/install/hello.c with `tally` alone (the communicator: no BLAS, no zlib, shared and static), and
# examples/linear_ddp.c with `tally-train`; runs both under Open MPI's mpirun (tally reads OMPI_*).
set -eu
build=$1; src=$2
prefix=$(mktemp -d); trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig:$prefix/lib/x86_64-linux-gnu/pkgconfig"
libdir=$(pkg-config --variable=libdir tally)
fail() { echo "test_install_mpirun: $*" >&2; exit 1; }

cc -o "$prefix/hello" "$src/tests/install/hello.c" $(pkg-config --cflags --libs tally)
needed=$(readelf -d "$libdir/libtally.so" "$prefix/hello" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p' | sort -u)
echo "$needed" | grep -Eq 'openblas|blas|libz\.' && fail "libtally or a program of it needs BLAS or zlib: $needed"
# The static library needs no more than what tally.pc's Libs.private say.
cc -o "$prefix/hello_static" "$src/tests/install/hello.c" $(pkg-config --cflags tally) "$libdir/libtally.a" \
  $(pkg-config --libs-only-l --static tally | sed 's/-ltally//')
cc -o "$prefix/linear" "$src/examples/linear_ddp.c" $(pkg-config --cflags --libs tally-train) -lm

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
passed=0
for prog in hello hello_static; do
  out=$(LD_LIBRARY_PATH="$libdir" timeout 120 mpirun --oversubscribe -x LD_LIBRARY_PATH -np 3 "$prefix/$prog")
  echo "$out"
  [ "$(echo "$out" | grep -c 'sum of ranks 3')" -eq 3 ] || fail "$prog: not every rank summed the ranks"
  passed=$((passed + 1))
done
LD_LIBRARY_PATH="$libdir" timeout 120 mpirun --oversubscribe -x LD_LIBRARY_PATH -np 2 "$prefix/linear" ||
  fail "examples/linear_ddp.c built with tally-train failed under mpirun"
passed=$((passed + 1))

# The installed Python package finds the installed libtally by itself, under mpirun too.
pydir=$(ls -d "$prefix"/lib/python3*/dist-packages 2>/dev/null | head -1)
if [ -n "$pydir" ] && /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
  out=$(PYTHONPATH="$pydir" timeout 120 mpirun --oversubscribe -x PYTHONPATH -np 2 /usr/bin/python3 -c '
import numpy as np, tally
c = tally.Comm(); a = np.ones(3, np.float32) * (c.rank + 1); c.allreduce(a)
ok = np.array([all(a == 3) and tally.comm.lib._name.startswith("'"$prefix"'")], np.int32)
c.allreduce(ok, op="min")
if c.rank == 0: print("python ranks summed with the installed library:", bool(ok[0]))')
  echo "$out"
  echo "$out" | grep -q 'installed library: True' ||
    fail "the installed Python package did not load the installed libtally or sum the ranks"
  passed=$((passed + 1))
fi
echo "test_install_mpirun: $passed passed, 0 failed"
