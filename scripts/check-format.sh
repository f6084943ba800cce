#!/usr/bin/env bash
# check-format.sh - every tracked C file laid out as .clang-format says, so a change's diff holds its
# change and no reformatting. Skips (ctest's code 77) where clang-format 14, the one Debian 12 ships, is absent.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cf=$(command -v clang-format-14 || command -v clang-format || true)
if [ -z "$cf" ] || ! "$cf" --version | grep -q 'version 14\.'; then
  echo "check-format: clang-format 14 is not installed (apt-get install clang-format); skipped"
  exit 77
fi
cd "$root"
if [ -d .git ] || git rev-parse --git-dir >/dev/null 2>&1; then
  files=$(git ls-files '*.c' '*.h')
else
  files=$(find include src tools tests examples fuzz -name '*.[ch]' 2>/dev/null)
fi
bad=0
for f in $files; do
  if ! "$cf" --dry-run -Werror "$f" >/dev/null 2>&1; then
    echo "check-format: $f is not as .clang-format lays it out; run: $cf -i $f"
    bad=1
  fi
done
[ "$bad" = 0 ] && echo "check-format: $(echo "$files" | wc -w) files as .clang-format lays them out"
exit "$bad"
