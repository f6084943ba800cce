#!/usr/bin/env bash
# Installs the Python package with pip as a user would, offline, from a copy of the source tree: into a venv
# that sees Debian's numpy and torch, then as a wheel into a second venv, and into a bare venv (no NumPy).
# usage: tests/install/pip.sh SOURCE_DIR   exit 0 passed, 1 failed, 77 skipped (no venv, pip, setuptools).
set -eu
src=$(cd "$1" && pwd)
py=/usr/bin/python3
here=$(cd "$(dirname "$0")" && pwd)
fail() { echo "test_install_pip: $*" >&2; exit 1; }
say() { echo "test_install_pip: [${SECONDS}s] $*"; }
skip() { echo "test_install_pip: SKIPPED: $*"; exit 77; }

[ -x $py ] || skip "no $py (Debian's python3)"
$py -c 'import ensurepip, venv' 2>/dev/null || skip "python3 -m venv cannot install pip (apt-get install python3-venv)"
{ $py -c 'import setuptools, wheel' && $py -m pip --version; } >/dev/null 2>&1 ||
  skip "pip, setuptools or wheel missing (apt-get install python3-pip python3-setuptools python3-wheel)"
$py -c 'import numpy' 2>/dev/null || skip "no NumPy for $py (apt-get install python3-numpy)"
with_torch=1
$py -c 'import torch' 2>/dev/null || with_torch=0

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/home" "$tmp/away"
# Every step in a clean environment (no PYTHONPATH, LD_LIBRARY_PATH, pip configuration or TALLY_*), from a
# directory outside the source tree, bounded in time. Extra VAR=value words go before the command.
step() {
  local limit=$1
  shift
  (cd "$tmp/away" && timeout "$limit" env -i PATH=/usr/bin:/bin HOME="$tmp/home" TMPDIR="$tmp" LANG=C.UTF-8 \
    PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1 "$@")
}
pip_flags=(--no-index --no-build-isolation --no-cache-dir)

# The tree as it is (uncommitted changes too), without its builds: pip builds from scratch in the copy.
mkdir "$tmp/src"
if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
  (cd "$src" && git ls-files -z -co --exclude-standard | tar --null -T - --ignore-failed-read -cf - 2>/dev/null) |
    tar -xf - -C "$tmp/src"
else
  tar -C "$src" --exclude='./build*' --exclude='*.egg-info' -cf - . | tar -xf - -C "$tmp/src"
fi
[ -f "$tmp/src/pyproject.toml" ] || fail "the copy of $src has no pyproject.toml"
cp "$here/pip_ranks.py" "$tmp/pip_ranks.py"
ranks() { step 300 "$1/bin/python" "$tmp/pip_ranks.py" "$2" || fail "$2 allreduce on 2 ranks in $1 failed (above)"; }

# 1. pip install . into a venv that sees Debian's packages; the package imports and runs from elsewhere.
step 60 $py -m venv --system-site-packages "$tmp/a" || fail "python3 -m venv --system-site-packages failed"
step 600 "$tmp/a/bin/pip" install -q "${pip_flags[@]}" "$tmp/src" || fail "pip install of the source tree failed"
imports="import tally"
[ $with_torch = 1 ] && imports="import tally, tally.torch"
step 120 "$tmp/a/bin/python" -c "$imports" || fail "'$imports' failed in the venv pip installed into"
ranks "$tmp/a" numpy
if [ $with_torch = 1 ]; then
  ranks "$tmp/a" torch
else
  say "torch is not installed for $py: the backend's steps are left out"
fi
say "1. pip install of the source tree into a venv with Debian's packages: imports and allreduces"

# 2. A wheel (with the backend where torch is, and one without: TALLY_TORCH=OFF), carrying no path of the
# machine that built it.
mkdir "$tmp/wheels" "$tmp/wheels-off"
step 600 "$tmp/a/bin/pip" wheel -q --no-deps -w "$tmp/wheels" "${pip_flags[@]}" "$tmp/src" || fail "pip wheel failed"
step 600 TALLY_TORCH=OFF "$tmp/a/bin/pip" wheel -q --no-deps -w "$tmp/wheels-off" "${pip_flags[@]}" "$tmp/src" ||
  fail "pip wheel with TALLY_TORCH=OFF failed"
whl=$(ls "$tmp"/wheels/tally-*.whl)
whl_off=$(ls "$tmp"/wheels-off/tally-*.whl)
contents() { $py -c 'import sys, zipfile; print("\n".join(zipfile.ZipFile(sys.argv[1]).namelist()))' "$1"; }
files=$(contents "$whl")
files_off=$(contents "$whl_off")
echo "$files" | grep -qx 'tally/libtally.so.0' || fail "the wheel has no tally/libtally.so.0: $files"
if [ $with_torch = 1 ]; then
  echo "$files" | grep -q '^tally/_torch_backend.*\.so$' || fail "the wheel has no backend: $files"
fi
echo "$files_off" | grep -q '_torch_backend' && fail "the TALLY_TORCH=OFF wheel carries the backend: $files_off"
mkdir "$tmp/unzipped"
$py -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$whl" "$tmp/unzipped"
baked=$(grep -rlaF "$tmp" "$tmp/unzipped" || true)
[ -z "$baked" ] || fail "the wheel names the build's folder $tmp in: $baked"
rm -rf "$tmp/src" # as on another machine: nothing of the build is left to lean on
with=libtally
[ $with_torch = 1 ] && with="libtally and the backend"
say "2. pip wheel: $(basename "$whl"), with $with, no build path in it"

# 3. The wheel in a second venv: it imports and runs there.
step 60 $py -m venv --system-site-packages "$tmp/b" || fail "the second venv could not be made"
# --force-reinstall --no-deps: a tally installed system-wide, which this venv sees, must not satisfy it.
step 300 "$tmp/b/bin/pip" install -q --no-index --no-cache-dir --force-reinstall --no-deps "$whl" ||
  fail "pip install of the wheel failed"
step 120 "$tmp/b/bin/python" -c "$imports" || fail "'$imports' failed in the venv the wheel went into"
ranks "$tmp/b" numpy
say "3. the wheel in a second venv: imports and allreduces"

# 4. A bare venv (no NumPy, no torch) with the NumPy-only wheel: pip says it needs numpy, and installed
# anyway (--no-deps), `import tally` says so in one line, not a traceback from inside the package.
step 60 $py -m venv "$tmp/c" || fail "the bare venv could not be made"
out=$(step 300 "$tmp/c/bin/pip" install --no-index --no-cache-dir "$whl_off" 2>&1) &&
  fail "pip installed the package where numpy cannot be had"
echo "$out" | grep -q numpy || fail "pip's refusal does not name numpy: $out"
step 300 "$tmp/c/bin/pip" install -q --no-index --no-cache-dir --no-deps "$whl_off" ||
  fail "pip install --no-deps failed"
out=$(step 120 "$tmp/c/bin/python" -c 'import tally' 2>&1) && fail "import tally worked without NumPy"
echo "$out" | tail -1 | grep -q '^ImportError: tally needs NumPy' ||
  fail "import tally without NumPy does not end saying so: $out"
say "4. a bare venv: pip asks for numpy; without it, import tally says: $(echo "$out" | tail -1)"
echo "$out" | grep -q ModuleNotFoundError && fail "import tally without NumPy shows the inner error too: $out"

say "passed"
