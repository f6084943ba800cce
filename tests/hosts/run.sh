#!/usr/bin/env bash
# run.sh - every collective over 2 test hosts x 2 ranks (scripts/hosts.sh: network namespaces joined by a
# bridge, each link held to 10 Gbit/s), once per algorithm, each result compared exactly with the
# reference (tests/coll/test_coll.c --as-rank), and once more over 3 tcp streams per pair. Needs root and
# network namespaces: skipped (77) otherwise.
# usage: tests/hosts/run.sh BUILD_DIR SOURCE_DIR
set -u
build=$1 src=$2
skip() { echo "test_hosts: skipped: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "the test hosts are network namespaces, which only root can make"
command -v ip >/dev/null && command -v tc >/dev/null || skip "ip and tc are missing (Debian: iproute2)"
probe=tlyprobe$$
ip netns add "$probe" 2>/dev/null || skip "this kernel or container cannot make network namespaces"
ip netns del "$probe"
status=0
for algo in ring tree rhd direct hier auto; do
  start=$SECONDS
  if TALLY_ALGO=$algo TALLY_TIMEOUT=60 bash "$src/scripts/hosts.sh" --hosts 2 --ranks 2 --rate 10gbit --timeout 300 \
    -- "$build/tests/test_coll" --as-rank; then
    echo "  2 hosts x 2 ranks, $algo: every collective exact ($((SECONDS - start)) s)"
  else
    echo "  2 hosts x 2 ranks, $algo: FAILED"
    status=1
  fi
done
# Three connections per pair across the hosts (TALLY_TCP_STREAMS): large messages go in stripes.
start=$SECONDS
if TALLY_TCP_STREAMS=3 TALLY_TIMEOUT=60 bash "$src/scripts/hosts.sh" --hosts 2 --ranks 2 --rate 10gbit --timeout 300 \
  -- "$build/tests/test_coll" --as-rank; then
  echo "  2 hosts x 2 ranks, auto, 3 tcp streams: every collective exact ($((SECONDS - start)) s)"
else
  echo "  2 hosts x 2 ranks, auto, 3 tcp streams: FAILED"
  status=1
fi
exit $status
