#!/usr/bin/env bash
# ctest's entry to PyTorch's own distributed tests (torch_suite.py compare): gloo and tally at the world sizes
# of TORCH_SUITE_SIZES (default 2,3,4), results in BUILD/torch_suite. usage: run.sh BUILD [compare's options]
set -u
build=$1
shift
py=${TALLY_PYTHON:-/usr/bin/python3}
if ! command -v "$py" >/dev/null; then
  echo "torch_suite: skipped: no $py (Debian's python3 with python3-torch: scripts/deps.sh --torch)" >&2
  exit 77
fi
exec "$py" "$(dirname "$0")/torch_suite.py" compare --build "$build" -n "${TORCH_SUITE_SIZES:-2,3,4}" -q "$@"
