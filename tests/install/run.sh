#!/usr/bin/env bash
# Installs the build into a scratch prefix, builds tests/install/hello.c against it with pkg-config,
# and runs it under Open MPI's mpirun with 3 ranks (no MPI code in tally: it reads OMPI_* variables).
set -eu
build=$1; src=$2
prefix=$(mktemp -d); trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig:$prefix/lib/x86_64-linux-gnu/pkgconfig"
cc -o "$prefix/hello" "$src/tests/install/hello.c" $(pkg-config --cflags --libs tally)
libdir=$(pkg-config --variable=libdir tally)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(LD_LIBRARY_PATH="$libdir" timeout 120 mpirun --oversubscribe -x LD_LIBRARY_PATH -np 3 "$prefix/hello")
echo "$out"
[ "$(echo "$out" | grep -c 'sum of ranks 3')" -eq 3 ] && echo "test_install_mpirun: 1 passed, 0 failed"
