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
# One clang-format for every file (a process per file took 25 s); it names each file it would change.
rc=0
out=$(printf '%s\n' $files | xargs "$cf" --dry-run -Werror 2>&1) || rc=$?
bad_files=$(echo "$out" | sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: error: code should be clang-formatted.*/\1/p' | sort -u)
for f in $bad_files; do
  echo "check-format: $f is not as .clang-format lays it out; run: $cf -i $f"
done
if [ "$rc" -ne 0 ] && [ -z "$bad_files" ]; then # it failed for another reason: show why
  echo "check-format: $cf failed (exit $rc):"
  echo "$out" | head -20
  exit 1
fi
[ -z "$bad_files" ] && echo "check-format: $(echo "$files" | wc -w) files as .clang-format lays them out"
[ -z "$bad_files" ]
