#!/usr/bin/env bash
# slurm.sh - a one-node Slurm cluster of its own (munged, slurmctld, slurmd: their key, config, state, logs
# all in one fresh temporary directory) that runs tally jobs; stops it and removes it on every exit path.
#
# usage: sudo scripts/slurm.sh [--install] [--timeout S] [--tally PATH] [--logs DIR] [-- COMMAND...]
#   --install    apt-get install what is missing (Debian: slurm-wlm, munge); without it the script only
#                names the packages and exits 2
#   --timeout S  each job's bound in seconds (default 300; exit status 124); the daemons get 30 s to come up
#   --tally PATH the binary the default jobs run (default: build/tally beside this script)
#   --logs DIR   copy the daemons' logs, slurm.conf and the jobs' output to DIR before the temporary
#                directory goes (on failure the logs' last lines are shown anyway)
# Without COMMAND it runs (a) srun -n 4 tally train --model mlp --data synthetic:2048 --steps 20 --batch 32
# --no-eval, checking that rank 0's summary says 4 ranks, and (b) a batch job (sbatch, #SBATCH -n 2) whose
# srun runs tally bench allreduce -b 8 -e 1M -f 32 -c, waiting for it to end and printing its output;
# either failing fails the script (exit 1). With -- COMMAND it runs COMMAND instead, where it was started,
# with SLURM_CONF set (e.g. scripts/slurm.sh -- srun -n 2 build/tally bench allreduce); the exit status is
# COMMAND's. More tasks than CPUs get srun -O (--overcommit). The node is this host: CPUs = nproc,
# ports chosen free at random, no accounting; /etc/slurm and /etc/munge are neither read nor written,
# and a system munged need not run. Needs root (slurmd starts jobs as their user).
set -eu
install=0 timeout=300 tally='' logs=''
while [ $# -gt 0 ] && [ "$1" != -- ]; do
  case $1 in
    --install) install=1; shift ;;
    --timeout) timeout=${2-}; shift 2 ;;
    --tally) tally=${2-}; shift 2 ;;
    --logs) logs=${2-}; shift 2 ;;
    *) echo "slurm.sh: unknown option $1 (see the usage at the top of the script)" >&2; exit 2 ;;
  esac
done
if [ $# -gt 0 ]; then
  shift
  [ $# -gt 0 ] || { echo "usage: slurm.sh [--install] [--timeout S] [--tally PATH] [--logs DIR] [-- COMMAND...]" >&2; exit 2; }
fi
[[ "$timeout" =~ ^[0-9]+$ ]] && [ "$timeout" -ge 1 ] || { echo "slurm.sh: --timeout takes seconds, not '$timeout'" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "slurm.sh runs slurmctld, slurmd and munged (SlurmUser=root): run it as root" >&2; exit 2; }

root=$(cd "$(dirname "$0")/.." && pwd)
[ -n "$tally" ] || tally=$root/build/tally
if [ $# = 0 ]; then
  case $tally in /*) ;; *) tally=$PWD/$tally ;; esac
  [ -x "$tally" ] || { echo "slurm.sh: $tally is not an executable: build it first (cmake --build build) or pass --tally PATH" >&2; exit 2; }
fi

# The packages: each command, the Debian package that has it.
need=(slurmctld:slurmctld slurmd:slurmd srun:slurm-client sbatch:slurm-client sinfo:slurm-client
  squeue:slurm-client scontrol:slurm-client scancel:slurm-client munged:munge)
have() { # an executable file of that name in PATH, /usr/sbin or /sbin (command -v also takes one without x)
  local d
  for d in ${PATH//:/ } /usr/sbin /sbin; do [ -f "$d/$1" ] && [ -x "$d/$1" ] && return 0; done
  return 1
}
missing=() pkgs=()
for e in "${need[@]}"; do
  have "${e%%:*}" && continue
  missing+=("${e%%:*}")
  [[ " ${pkgs[*]-} " == *" ${e#*:} "* ]] || pkgs+=("${e#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "slurm.sh: missing ${missing[*]}: Debian has them in ${pkgs[*]} (all of them: slurm-wlm munge)" >&2
  if [ $install = 0 ]; then
    echo "slurm.sh: rerun with --install, or: apt-get install -y --no-install-recommends slurm-wlm munge" >&2
    exit 2
  fi
  echo "slurm.sh: apt-get install -y --no-install-recommends slurm-wlm munge" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurm-wlm munge ||
    { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurm-wlm munge; } ||
    { echo "slurm.sh: apt-get install failed" >&2; exit 2; }
  for e in "${missing[@]}"; do
    have "$e" || { echo "slurm.sh: $e is still missing after apt-get install" >&2; exit 2; }
  done
fi
export PATH=$PATH:/usr/sbin:/sbin
# A job of another cluster (this script run inside an allocation) must not leak into ours.
for v in $(compgen -e | grep '^SLURM' || true); do unset "$v"; done

tmp=$(mktemp -d /tmp/tally-slurm.XXXXXX)
chmod 711 "$tmp" # munged wants every directory above its socket searchable by all
mkdir -m 755 "$tmp/run"
mkdir -m 700 "$tmp/state" "$tmp/spool" "$tmp/log" "$tmp/munge"
mkdir -m 755 "$tmp/jobs"
conf=$tmp/slurm.conf
daemons=() # pids: munged, slurmctld, slurmd
job=       # the srun (or COMMAND) running now

# Every process started for this cluster has SLURM_CONF=$conf in its environment (the daemons, slurmstepd,
# the tasks): what outlives its daemon is found by that.
ours() {
  local f p
  for f in $(grep -slzx -- "SLURM_CONF=$conf" /proc/[0-9]*/environ); do
    p=${f#/proc/}
    p=${p%/environ}
    [ "$p" != $$ ] && kill -0 "$p" 2>/dev/null && echo "$p" # grep itself is gone
  done
  return 0
}
stop() { # pid...: TERM, up to 10 s, then KILL
  local p n
  [ $# -gt 0 ] || return 0
  kill -TERM "$@" 2>/dev/null || true
  for ((n = 0; n < 100; n++)); do
    for p in "$@"; do kill -0 "$p" 2>/dev/null && break; done
    kill -0 "$p" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$@" 2>/dev/null || true
}
cleanup() {
  local rc=$? n p left steps
  trap '' INT TERM
  if [ -n "${daemons[1]:-}" ] && kill -0 "${daemons[1]}" 2>/dev/null; then
    timeout 10 scancel --quiet --user=root 2>/dev/null || true
  fi
  [ -n "$job" ] && stop "$job"
  # Steps end when slurmd has killed their tasks (KillWait=5): give them until then (no slurmd: the sweep).
  for ((n = 0; n < 100; n++)); do
    [ -n "${daemons[2]:-}" ] && kill -0 "${daemons[2]}" 2>/dev/null || break
    steps=0
    for p in $(ours); do [ "$(cat "/proc/$p/comm" 2>/dev/null)" = slurmstepd ] && steps=1; done
    [ $steps = 0 ] && break
    sleep 0.1
  done
  for ((n = ${#daemons[@]} - 1; n >= 0; n--)); do stop "${daemons[n]}"; done
  for p in slurmd slurmctld munged; do # what daemonized past our recorded pid
    [ -s "$tmp/run/$p.pid" ] && stop "$(cat "$tmp/run/$p.pid")"
  done
  left=$(ours)
  [ -n "$left" ] && kill -KILL $left 2>/dev/null || true
  wait 2>/dev/null || true
  if [ -n "$logs" ]; then
    mkdir -p "$logs" && cp -r "$tmp/log" "$tmp/jobs" "$conf" "$logs/" 2>/dev/null || true
  fi
  rm -rf "$tmp"
  exit $rc
}
trap cleanup EXIT
trap 'echo "slurm.sh: interrupted: stopping the cluster" >&2; exit 130' INT
trap 'echo "slurm.sh: terminated: stopping the cluster" >&2; exit 143' TERM

die() { # message: the daemons' last words, then exit 1
  local f
  echo "slurm.sh: $1" >&2
  for f in "$tmp"/log/*.log; do
    [ -s "$f" ] || continue
    echo "--- last lines of $(basename "$f"):" >&2
    tail -n 15 "$f" >&2
  done
  exit "${2:-1}"
}
elapsed() { echo "$(($(date +%s%N) / 1000000 - $1))" | awk '{printf "%.1f s", $1 / 1000}'; }
now_ms() { echo $(($(date +%s%N) / 1000000)); }
t_all=$(now_ms)

# A port nothing listens on, below tally's derived rendezvous ports (29500-32767).
free_port() {
  local p n
  for ((n = 0; n < 50; n++)); do
    p=$((20000 + RANDOM % 9000))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo $p; return 0; }
  done
  return 1
}
host=$(hostname -s 2>/dev/null || true)
[[ "$host" =~ ^[A-Za-z0-9][A-Za-z0-9-]*$ ]] || host=localhost
cpus=$(nproc)
mem=$(awk '/^MemTotal:/ { printf "%d", $2 / 1024 * 0.9 }' /proc/meminfo)
ctl_port=$(free_port) && slurmd_port=$(free_port) || die "no free port found for slurmctld and slurmd"
[ "$ctl_port" != "$slurmd_port" ] || slurmd_port=$((ctl_port + 1))
plugins=$(dirname "$(dpkg -L slurm-wlm-basic-plugins 2>/dev/null | grep -m1 '/select_cons_tres\.so$' || true)")
select=select/cons_tres
[ -e "$plugins/select_cons_tres.so" ] || select=select/cons_res

# The daemons run in sessions of their own, so that a ^C reaches this script (which stops them in order)
# and not them. munged: a key of our own, and its socket, pid, log and seed here.
if command -v mungekey >/dev/null; then
  mungekey --create --keyfile="$tmp/munge/munge.key" >/dev/null
else
  dd if=/dev/urandom of="$tmp/munge/munge.key" bs=1024 count=1 status=none
fi
chmod 400 "$tmp/munge/munge.key"
sock=$tmp/run/munge.sock
export SLURM_CONF=$conf
setsid munged --foreground --key-file="$tmp/munge/munge.key" --socket="$sock" --pid-file="$tmp/run/munged.pid" \
  --log-file="$tmp/log/munged.log" --seed-file="$tmp/munge/munged.seed" </dev/null >"$tmp/log/munged.out" 2>&1 &
daemons[0]=$!

cat >"$conf" <<EOF
# written by scripts/slurm.sh for one run; everything it names is under $tmp
ClusterName=tally
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctl_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/run/slurmctld.pid
SlurmdPidFile=$tmp/run/slurmd.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
# (task/affinity works too, but binds tasks beyond the CPU count all to CPU 0; none leaves them to the
# scheduler. MpiDefault=pmi2 would give the tasks PMI_RANK/PMI_SIZE, which tally reads before SLURM_*.)
SelectType=$select
SelectTypeParameters=CR_CPU
MpiDefault=none
SwitchType=switch/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
InactiveLimit=0
KillWait=5
MinJobAge=60
SlurmdTimeout=60
NodeName=$host NodeHostname=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=tally Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF

for ((n = 0; n < 100; n++)); do
  [ -S "$sock" ] && break
  kill -0 "${daemons[0]}" 2>/dev/null || die "munged did not start"
  sleep 0.1
done
[ -S "$sock" ] || die "munged made no socket in 10 s"
setsid slurmctld -D -f "$conf" </dev/null >"$tmp/log/slurmctld.out" 2>&1 &
daemons[1]=$!
setsid slurmd -D -f "$conf" -N "$host" </dev/null >"$tmp/log/slurmd.out" 2>&1 &
daemons[2]=$!

# Up when sinfo says idle; a node down or drained (e.g. by an earlier registration) is resumed.
state='' resumed=0 deadline=$((SECONDS + 30))
while :; do
  for n in 0 1 2; do
    kill -0 "${daemons[n]}" 2>/dev/null || die "$(echo munged slurmctld slurmd | cut -d' ' -f$((n + 1))) exited while the cluster came up"
  done
  state=$(timeout 5 sinfo -h -N -n "$host" -o %T 2>/dev/null || true)
  case $state in
    idle) break ;;
    down* | drain* | fail*)
      if [ $((SECONDS - resumed)) -ge 3 ]; then
        timeout 5 scontrol update nodename="$host" state=resume 2>/dev/null || true
        resumed=$SECONDS
      fi ;;
  esac
  [ $SECONDS -lt $deadline ] || die "node $host not idle after 30 s (sinfo says '${state:-nothing}')"
  sleep 0.3
done
echo "slurm.sh: cluster up in $(elapsed "$t_all"): node $host ($cpus CPUs, ${mem} MB), slurmctld :$ctl_port, slurmd :$slurmd_port, $tmp"
sinfo

# COMMAND in the background (a trapped INT or TERM ends the wait at once), bounded by --timeout.
run_bounded() { # output file or "" (the terminal), command...
  local out=$1 rc=0 end=$((SECONDS + timeout))
  shift
  if [ -n "$out" ]; then "$@" </dev/null >"$out" 2>&1 & else "$@" </dev/null & fi
  job=$!
  while kill -0 "$job" 2>/dev/null; do
    if [ $SECONDS -ge $end ]; then
      echo "slurm.sh: '$*' still running after ${timeout}s: cancelled" >&2
      timeout 10 scancel --quiet --user=root 2>/dev/null || true
      stop "$job"
      wait "$job" 2>/dev/null || true
      job=
      return 124
    fi
    sleep 0.1
  done
  wait "$job" || rc=$?
  job=
  return $rc
}
minutes=$((timeout / 60 + 1)) # Slurm's own time limit on the default jobs, past --timeout
# -O where the tasks outnumber the CPUs (srun refuses otherwise).
over() { [ "$1" -gt "$cpus" ] && echo -O || true; }

if [ $# -gt 0 ]; then
  echo "slurm.sh: $*"
  t=$(now_ms) rc=0
  run_bounded "" "$@" || rc=$?
  echo "slurm.sh: '$*' exited with $rc after $(elapsed "$t")"
  exit $rc
fi

# Both jobs run whatever the first did; a failure is said at once and fails the script at the end.
failed=() status=0
fail() { # message [status]
  echo "slurm.sh: FAILED $1" >&2
  failed+=("$1")
  [ "${2:-1}" = 124 ] && status=124 || { [ $status != 0 ] || status=1; }
  return 0
}

# (a) srun: 4 ranks train; rank 0's summary must say 4 ranks.
ranks=4
opt=$(over $ranks)
cmd=(srun -n "$ranks" ${opt:+"$opt"} -t "$minutes" -J tally-train "$tally" train --model mlp --data synthetic:2048 --steps 20 --batch 32 --no-eval)
echo "slurm.sh: (a) ${cmd[*]}"
t=$(now_ms) rc=0
run_bounded "$tmp/jobs/train.out" "${cmd[@]}" || rc=$?
cat "$tmp/jobs/train.out"
summaries=$(grep -c '^summary: ' "$tmp/jobs/train.out" || true)
if [ $rc != 0 ]; then
  fail "(a) srun tally train exited with $rc after $(elapsed "$t")" $rc
elif grep -Eq "^summary: .*, $ranks ranks " "$tmp/jobs/train.out" && [ "$summaries" = 1 ]; then
  echo "slurm.sh: (a) passed in $(elapsed "$t"): $(grep -m1 '^summary: ' "$tmp/jobs/train.out")"
elif [ "$summaries" = $ranks ] && [ "$(grep -c '^summary: .*, 1 rank ' "$tmp/jobs/train.out")" = $ranks ]; then
  fail "(a) srun tally train: each of the $ranks tasks trained alone, as a world of 1 rank ($summaries summaries saying '1 rank'): tally did not join Slurm's job (SLURM_PROCID/SLURM_NTASKS) [$(elapsed "$t")]"
else
  fail "(a) srun tally train: rank 0's summary does not say $ranks ranks: $(grep -m1 '^summary: ' "$tmp/jobs/train.out" || echo 'no summary line') [$(elapsed "$t")]"
fi

# (b) sbatch: a batch script of 2 tasks whose srun runs the allreduce benchmark; it has ended when
# scontrol says a final state (no accounting, so no sacct).
bench() {
  local ranks=2 id out end jstate='' info='' exitcode n t
  cat >"$tmp/jobs/bench.sbatch" <<EOS
#!/bin/bash
#SBATCH -J tally-bench
#SBATCH -n $ranks
$([ -n "$(over $ranks)" ] && echo "#SBATCH --overcommit")
#SBATCH -t $minutes
#SBATCH -o $tmp/jobs/bench-%j.out
srun "$tally" bench allreduce -b 8 -e 1M -f 32 -c
EOS
  echo "slurm.sh: (b) sbatch (#SBATCH -n $ranks): srun $tally bench allreduce -b 8 -e 1M -f 32 -c"
  t=$(now_ms)
  id=$(timeout 10 sbatch --parsable "$tmp/jobs/bench.sbatch") || { fail "(b) sbatch failed"; return; }
  id=${id%%;*}
  out=$tmp/jobs/bench-$id.out
  end=$((SECONDS + timeout))
  while :; do
    info=$(timeout 5 scontrol -o show job "$id" 2>/dev/null || true)
    jstate=$(sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' <<<"$info")
    case $jstate in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | PREEMPTED | BOOT_FAIL | DEADLINE) break ;;
    esac
    if [ $SECONDS -ge $end ]; then
      timeout 10 scancel "$id" 2>/dev/null || true
      [ -f "$out" ] && cat "$out"
      fail "(b) batch job $id still ${jstate:-unknown} after ${timeout}s: cancelled" 124
      return
    fi
    sleep 0.2
  done
  exitcode=$(sed -n 's/.* ExitCode=\([0-9:]*\).*/\1/p' <<<"$info")
  for ((n = 0; n < 50; n++)); do [ -f "$out" ] && break; sleep 0.1; done
  [ -f "$out" ] || { fail "(b) batch job $id ended ($jstate, exit code $exitcode) without writing $out"; return; }
  cat "$out"
  if [ "$jstate" != COMPLETED ] || [ "$exitcode" != 0:0 ]; then
    fail "(b) batch job $id ended $jstate, exit code $exitcode, after $(elapsed "$t")"
  elif [ "$(grep -c '^# tally bench ' "$out")" = $ranks ]; then
    fail "(b) batch job $id: each of the $ranks tasks ran a benchmark of its own ($ranks tables, '$(grep -m1 '^# tally bench' "$out" | cut -c3-40)...'): tally did not join Slurm's job (SLURM_PROCID/SLURM_NTASKS) [$(elapsed "$t")]"
  elif [ "$(grep -c "^# tally bench allreduce: $ranks ranks" "$out")" != 1 ]; then
    fail "(b) batch job $id: no single table of $ranks ranks ($(grep -c '^# tally bench' "$out") tables: $(grep -m1 '^# tally bench' "$out" || echo none)) [$(elapsed "$t")]"
  elif ! grep -q '^# Out of bounds values : 0 OK' "$out"; then
    fail "(b) batch job $id: the benchmark counted wrong elements [$(elapsed "$t")]"
  else
    echo "slurm.sh: (b) passed in $(elapsed "$t"): batch job $id $jstate, $(grep -m1 '^# tally bench' "$out" | sed 's/^# //')"
  fi
}
bench

if [ ${#failed[@]} -gt 0 ]; then
  echo "slurm.sh: what failed:" >&2
  for f in "${failed[@]}"; do echo "  $f" >&2; done
  die "${#failed[@]} of 2 jobs failed after $(elapsed "$t_all")" $status
fi
echo "slurm.sh: both jobs passed in $(elapsed "$t_all")"
