#!/usr/bin/env bash
# check-commits.sh - commit messages from the rule's start on (CONTRIBUTING.md): a subject of at most 72
# characters, then a blank line before any body. As a commit-msg hook it checks the message being written.
# usage: scripts/check-commits.sh [--hook MSG_FILE]   exit 0, 1 naming each bad commit, 77 without git history.
set -eu
cd "$(dirname "$0")/.."
# The last commit before the rule: everything after it is held to it.
base=6c26967377faf9436d98380fe2ae252dcba0d936
limit=72

check_message() { # name file: the message's first lines
  local name=$1 subject second
  subject=$(sed -n 1p "$2")
  second=$(sed -n 2p "$2")
  if [ ${#subject} -gt $limit ]; then
    echo "check-commits: $name: subject of ${#subject} characters (at most $limit): '$subject'" >&2
    return 1
  fi
  if [ -n "$second" ]; then
    echo "check-commits: $name: the second line must be blank (subject, blank line, then the why)" >&2
    return 1
  fi
}

if [ "${1:-}" = --hook ]; then
  grep -v '^#' "$2" >"$2.check" || true
  rc=0
  check_message "this commit" "$2.check" || rc=1
  rm -f "$2.check"
  exit $rc
fi

if ! git rev-parse --git-dir >/dev/null 2>&1 || ! git cat-file -e "$base^{commit}" 2>/dev/null; then
  echo "check-commits: no git history with the rule's base commit here: skipped"
  exit 77
fi
bad=0
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
for c in $(git rev-list --no-merges "$base..HEAD"); do
  git log -1 --format=%B "$c" >"$tmp"
  check_message "commit $(git rev-parse --short "$c")" "$tmp" || bad=1
done
[ $bad = 0 ] && echo "check-commits: every commit since $(git rev-parse --short $base) has a subject of at most $limit characters"
exit $bad
