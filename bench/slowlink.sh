#!/usr/bin/env bash
# Two ranks of `tally train` in two network namespaces joined by a veth pair whose both ends are held to
# RATE by a token-bucket filter (tc tbf), over the tcp transport: a slow link on one machine. Runs each
# codec (or local SGD) and prints samples/s, bytes per step, the test figure and the training time.
# Removes the namespaces when it ends.
#
# usage: sudo bench/slowlink.sh [RATE] [CODEC...] [-- TRAIN_FLAGS...]
#   RATE      tc rate (default 1gbit; e.g. 100mbit)
#   CODEC     --compress values (default: none fp16 bf16 topk:0.01 powersgd:4); "topk:0.01/noef" runs top-k
#             with --no-error-feedback; "local:H" runs --local-steps H, "local:H/int8" (or /fp16) with
#             --outer-compress; ",--flag=value" after any of them adds that run's own flags
#   TRAIN_FLAGS  passed to every run (default: --epochs 1)
# Needs root, iproute2 (ip, tc) and a kernel with network namespaces and sch_tbf (netem is not needed).
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
tally=${TALLY:-$here/build/tally}
[ -x "$tally" ] || { echo "build first: ./run.sh, or cmake -S . -B build && cmake --build build" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "slowlink.sh makes network namespaces: run it as root" >&2; exit 2; }
command -v ip >/dev/null && command -v tc >/dev/null || { echo "needs ip and tc (Debian: iproute2)" >&2; exit 2; }

rate=1gbit
if [ $# -gt 0 ] && [[ "$1" =~ ^[0-9]+[kmg]?(bit|bps)$ ]]; then rate=$1; shift; fi
codecs=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do codecs+=("$1"); shift; done
[ $# -gt 0 ] && shift
flags=("$@")
[ ${#codecs[@]} -gt 0 ] || codecs=(none fp16 bf16 topk:0.01 powersgd:4)
[ ${#flags[@]} -gt 0 ] || flags=(--epochs 1)

# Names carry our pid, so two runs (or a run left behind by a kill -9) never collide.
ns0=tly$$a ns1=tly$$b dev0=tly$$v0 dev1=tly$$v1
ip0=10.213.0.1 ip1=10.213.0.2
tmp=$(mktemp -d)
cleanup() {
  ip netns pids "$ns0" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  ip netns pids "$ns1" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  ip netns del "$ns0" 2>/dev/null || true
  ip netns del "$ns1" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

ip netns add "$ns0"
ip netns add "$ns1"
ip link add "$dev0" type veth peer name "$dev1"
ip link set "$dev0" netns "$ns0"
ip link set "$dev1" netns "$ns1"
ip -n "$ns0" addr add "$ip0/24" dev "$dev0"
ip -n "$ns1" addr add "$ip1/24" dev "$dev1"
for n in "$ns0" "$ns1"; do ip -n "$n" link set lo up; done
ip -n "$ns0" link set "$dev0" up
ip -n "$ns1" link set "$dev1" up
# The bucket must hold at least one timer tick of traffic (rate / HZ) or tbf cannot reach its rate.
[[ "$rate" =~ ^([0-9]+)([kmg]?)(bit|bps)$ ]] || { echo "RATE must be like 1gbit or 100mbit, not $rate" >&2; exit 2; }
bits=${BASH_REMATCH[1]}
case ${BASH_REMATCH[2]} in k) bits=$((bits * 1000)) ;; m) bits=$((bits * 1000000)) ;; g) bits=$((bits * 1000000000)) ;; esac
[ "${BASH_REMATCH[3]}" = bps ] && bits=$((bits * 8))
burst=$((bits / 8 / 250)); [ $burst -lt 65536 ] && burst=65536
for pair in "$ns0 $dev0" "$ns1 $dev1"; do
  set -- $pair
  tc -n "$1" qdisc add dev "$2" root tbf rate "$rate" burst "$burst" latency 100ms
done

# One run: rank 0 in ns0, rank 1 in ns1, each told the job's address and token directly.
run() {
  local codec=${1%%,*} extra=()
  [ "$codec" != "$1" ] && IFS=, read -r -a extra <<<"${1#*,}"
  case $codec in */noef) extra+=(--no-error-feedback); codec=${codec%/noef} ;; esac
  local port=$((29600 + RANDOM % 2000)) token
  token=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
  local env=(TALLY_WORLD_SIZE=2 "TALLY_ADDR=$ip0:$port" "TALLY_TOKEN=$token" TALLY_TRANSPORT=tcp)
  local cflag=()
  case $codec in
  none) ;;
  local:*/*) spec=${codec#local:}; cflag=(--local-steps "${spec%%/*}" --outer-compress "${spec#*/}") ;;
  local:*) cflag=(--local-steps "${codec#local:}") ;;
  *) cflag=(--compress "$codec") ;;
  esac
  ip netns exec "$ns1" env "${env[@]}" TALLY_RANK=1 "$tally" train --quiet "${cflag[@]}" "${extra[@]}" \
    "${flags[@]}" >"$tmp/r1.out" 2>&1 &
  local p1=$!
  if ! ip netns exec "$ns0" env "${env[@]}" TALLY_RANK=0 "$tally" train --quiet --json "$tmp/s.json" \
    "${cflag[@]}" "${extra[@]}" "${flags[@]}" >"$tmp/r0.out" 2>&1; then
    wait $p1 || true
    echo "| $1 | failed: $(tail -n 2 "$tmp/r0.out" "$tmp/r1.out" | tr '\n' ' ') |"
    return
  fi
  wait $p1 || { echo "| $1 | rank 1 failed: $(tail -n 2 "$tmp/r1.out" | tr '\n' ' ') |"; return; }
  /usr/bin/python3 - "$1" "$tmp/s.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[2]))
if s.get("val_loss") is not None:
    score = "val loss %.4f" % s["val_loss"]
else:
    score = "-" if s.get("test_accuracy") is None else "%.4f" % s["test_accuracy"]
print("| %s | %.0f | %.0f | %.1f%% | %s | %.1f |" % (sys.argv[1], s["samples_per_s"], s["bytes_sent_per_step"],
      100 * s["comm_share"], score, s["train_seconds"]))
EOF
}

echo "slow link: $rate each way (tc tbf, burst $burst bytes), 2 ranks over tcp; tally train ${flags[*]}"
echo
echo "| codec | samples/s | bytes sent per step per rank | communication share | test accuracy or validation loss | training s |"
echo "|---|---|---|---|---|---|"
for c in "${codecs[@]}"; do run "$c"; done
