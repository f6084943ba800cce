#!/usr/bin/env bash
# hosts.sh - test hosts on one machine: K network namespaces, each a "host", joined through a bridge (in
# a switch namespace of its own) by veth pairs whose both ends a token-bucket filter (tc tbf) holds to a
# rate; M ranks of COMMAND in each, the rendezvous on host 0's bridge address. Tears it all down on
# every exit path (the ranks killed, the namespaces and their links deleted).
#
# usage: sudo scripts/hosts.sh [--hosts K] [--ranks M] [--rate RATE] [--timeout S] [--out DIR] -- COMMAND...
#   --hosts K    hosts (namespaces), default 2          --ranks M   ranks per host, default 2
#   --rate RATE  each host's link, as tc takes it (default 10gbit; e.g. 1gbit, 100mbit; "none": no limit)
#   --timeout S  kill every rank after S seconds (default 600; exit status 124)
#   --out DIR    rank r's output in DIR/rank-r.out (default: rank 0's on the terminal, the others' shown
#                when they fail)
#   --launcher   run COMMAND once, in host 0, as another launcher's front end (mpirun): it finds
#                HOSTS_HOSTFILE (h0 slots=M, h1 slots=M, ...), HOSTS_RSH (an rsh agent that runs a command
#                in host hK's namespace, with hK as its host name) and HOSTS_NET (the bridge's subnet)
# Rank r runs on host r / M as local rank r % M, with TALLY_RANK, TALLY_WORLD_SIZE, TALLY_ADDR,
# TALLY_TOKEN, LOCAL_RANK and LOCAL_WORLD_SIZE set (and TALLY_TEST_HOST=k, for scripts). The exit status is
# the first failing rank's, or 0. Ranks in different namespaces are different hosts to tally (the host
# id includes the network namespace), so they never share memory. Needs root, iproute2 (ip, tc) and a
# kernel with network namespaces, bridges, veth and sch_tbf (netem is not needed).
set -eu
hosts=2 ranks=2 rate=10gbit timeout=600 out= launcher=0
while [ $# -gt 0 ] && [ "$1" != -- ]; do
  case $1 in
    --launcher) launcher=1; shift ;;
    --hosts) hosts=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "hosts.sh: unknown option $1 (see the usage at the top of the script)" >&2; exit 2 ;;
  esac
done
[ $# -gt 1 ] && [ "$1" = -- ] || { echo "usage: hosts.sh [--hosts K] [--ranks M] [--rate RATE] -- COMMAND..." >&2; exit 2; }
shift
[[ "$hosts" =~ ^[0-9]+$ ]] && [ "$hosts" -ge 1 ] && [ "$hosts" -le 64 ] || { echo "hosts.sh: --hosts takes 1..64, not $hosts" >&2; exit 2; }
[[ "$ranks" =~ ^[0-9]+$ ]] && [ "$ranks" -ge 1 ] && [ "$ranks" -le 64 ] || { echo "hosts.sh: --ranks takes 1..64, not $ranks" >&2; exit 2; }
[[ "$timeout" =~ ^[0-9]+$ ]] && [ "$timeout" -ge 1 ] || { echo "hosts.sh: --timeout takes seconds, not $timeout" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "hosts.sh makes network namespaces: run it as root" >&2; exit 2; }
command -v ip >/dev/null && command -v tc >/dev/null || { echo "hosts.sh needs ip and tc (Debian: iproute2)" >&2; exit 2; }

# Names carry our pid, so two runs (or one left behind by a kill -9) never collide.
tag=tly$$
sw=${tag}sw
ns_of() { echo "${tag}h$1"; }
ip_of() { echo "10.216.0.$(($1 + 1))"; }
tmp=$(mktemp -d)
pids=()
cleanup() {
  local k
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for ((k = 0; k < hosts; k++)); do
    ip netns pids "$(ns_of $k)" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$(ns_of $k)" 2>/dev/null || true
  done
  ip netns del "$sw" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The bucket must hold at least one timer tick of traffic (rate / HZ) or tbf cannot reach its rate.
burst_of() {
  [[ "$1" =~ ^([0-9]+)([kmg]?)(bit|bps)$ ]] || { echo "hosts.sh: --rate must be like 10gbit or 100mbit, not $1" >&2; return 1; }
  local bits=${BASH_REMATCH[1]}
  case ${BASH_REMATCH[2]} in k) bits=$((bits * 1000)) ;; m) bits=$((bits * 1000000)) ;; g) bits=$((bits * 1000000000)) ;; esac
  [ "${BASH_REMATCH[3]}" = bps ] && bits=$((bits * 8))
  local b=$((bits / 8 / 250))
  [ $b -lt 65536 ] && b=65536
  echo $b
}
limit() { # namespace, device
  [ "$rate" = none ] && return 0
  tc -n "$1" qdisc add dev "$2" root tbf rate "$rate" burst "$burst" latency 100ms
}
burst=0
[ "$rate" = none ] || burst=$(burst_of "$rate")

ip netns add "$sw"
ip -n "$sw" link add br0 type bridge
ip -n "$sw" link set br0 up
for ((k = 0; k < hosts; k++)); do
  ns=$(ns_of $k)
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip link add "${tag}v$k" type veth peer name "${tag}p$k"
  ip link set "${tag}v$k" netns "$ns"
  ip link set "${tag}p$k" netns "$sw"
  ip -n "$ns" link set "${tag}v$k" name eth0
  ip -n "$ns" addr add "$(ip_of $k)/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$sw" link set "${tag}p$k" master br0
  ip -n "$sw" link set "${tag}p$k" up
  limit "$ns" eth0
  limit "$sw" "${tag}p$k"
done

# Another launcher's front end, in host 0: its daemons reach the other hosts through the rsh agent.
if [ $launcher = 1 ]; then
  for ((k = 0; k < hosts; k++)); do echo "h$k slots=$ranks"; done >"$tmp/hostfile"
  cat >"$tmp/rsh" <<RSH
#!/usr/bin/env bash
# An rsh agent for the test hosts: \$1 is hK, the rest the command line a remote shell would run.
host=\$1; shift
[[ "\$host" =~ ^h([0-9]+)\$ ]] || { echo "hosts.sh rsh: unknown host \$host" >&2; exit 255; }
exec ip netns exec ${tag}h\${BASH_REMATCH[1]} unshare --uts sh -c "hostname \$host && \$*"
RSH
  chmod +x "$tmp/rsh"
  ip netns exec "$(ns_of 0)" unshare --uts sh -c 'hostname h0 && exec "$@"' sh \
    env HOSTS_HOSTFILE="$tmp/hostfile" HOSTS_RSH="$tmp/rsh" HOSTS_NET=10.216.0.0/24 timeout "$timeout" "$@" &
  pids[0]=$!
  status=0
  wait "${pids[0]}" || status=$?
  exit $status
fi

world=$((hosts * ranks))
port=$((29700 + RANDOM % 2000))
token=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
[ -n "$out" ] && mkdir -p "$out"
for ((r = world - 1; r >= 0; r--)); do
  k=$((r / ranks))
  log=${out:-$tmp}/rank-$r.out
  env=(TALLY_RANK=$r TALLY_WORLD_SIZE=$world "TALLY_ADDR=$(ip_of 0):$port" "TALLY_TOKEN=$token"
    LOCAL_RANK=$((r % ranks)) LOCAL_WORLD_SIZE=$ranks TALLY_TEST_HOST=$k)
  if [ $r = 0 ] && [ -z "$out" ]; then
    ip netns exec "$(ns_of $k)" env "${env[@]}" "$@" &
  else
    ip netns exec "$(ns_of $k)" env "${env[@]}" "$@" >"$log" 2>&1 &
  fi
  pids[r]=$!
done

# Every rank to its end, or the deadline: the first failure's status is the script's.
deadline=$((SECONDS + timeout))
status=0
left=$world
declare -A done_
while [ $left -gt 0 ]; do
  for ((r = 0; r < world; r++)); do
    [ -n "${done_[$r]:-}" ] && continue
    kill -0 "${pids[r]}" 2>/dev/null && continue
    rc=0
    wait "${pids[r]}" || rc=$?
    done_[$r]=1
    left=$((left - 1))
    if [ $rc != 0 ]; then
      [ $status = 0 ] && status=$rc
      if [ -z "$out" ] && [ $r != 0 ]; then
        echo "hosts.sh: rank $r (host $((r / ranks))) exited with $rc:" >&2
        tail -n 20 "$tmp/rank-$r.out" >&2
      fi
    fi
  done
  [ $left = 0 ] && break
  if [ $SECONDS -ge $deadline ]; then
    echo "hosts.sh: $left of $world ranks still running after ${timeout}s: killed" >&2
    status=124
    break
  fi
  sleep 0.1
done
exit $status
