#!/usr/bin/env bash
# fresh-check.sh - owns the fresh-machine check: the committed HEAD cloned into a new Debian 12 root
# (debootstrap minbase, bare or with this machine kind's packages) and ./run.sh (--tests: ./test.sh) run there.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: scripts/fresh-check.sh [--image | --bare | --both] [--bare-mlp] [--tests] [--log-dir DIR] [--rebuild]

Checks that the README's commands work on a fresh Debian 12 machine: builds (once, then cached) a
Debian 12 root with debootstrap --variant=minbase, from the bookworm mirror in this machine's apt
sources; clones this repository's committed HEAD (uncommitted changes are not part of the check) into
/root/tally there, and runs ./run.sh in it under chroot, as a new user would (clean environment, stdin
from /dev/null). Needs root and debootstrap (scripts/deps.sh --fresh-check installs it).

  --image     (default) the root first gets the packages this machine kind ships that can mislead an
              install script ($TALLY_FRESH_IMAGE_PACKAGES, default: build-essential cmake git
              pkg-config libblas-dev liblapack-dev python3 zlib1g-dev libssl-dev)
  --bare      the bare minbase root, nothing preinstalled
  --both      --image, then --bare, each in its own root
  --bare-mlp  the bare root runs ./run.sh --mlp: the same install and build, the MLP's 20 s job in place
              of the GPT's two minutes, which the image root runs (.ci/run, to stay within its 20 minutes)
  --tests     also ./test.sh (the quick tier) after ./run.sh
  --log-dir D logs of each step go there (default: CACHE/logs)
  --rebuild   rebuild the cached roots (the downloaded .debs are kept)
  -h, --help  this text

Cache: $TALLY_FRESH_CACHE (default /var/cache/tally/fresh-check) keeps the debootstrapped root and the
image root as tarballs, the .debs apt downloaded (bind-mounted on the root's /var/cache/apt/archives),
and the logs. Each run unpacks a tarball into a new directory under CACHE/roots, which is removed
(after unmounting everything under it) on every exit path.

Time limits (timeout(1) durations): TALLY_FRESH_DEBOOTSTRAP_TIMEOUT (20m), TALLY_FRESH_IMAGE_TIMEOUT
(20m), TALLY_FRESH_RUN_TIMEOUT (30m), TALLY_FRESH_TEST_TIMEOUT (60m).
Exit status: 0 every step passed, 1 a step failed, 2 cannot run the check (usage, not root, no debootstrap).
EOF
}

die() { echo "fresh-check: $*" >&2; exit 2; }
say() { echo "fresh-check: $*"; }

modes=()
with_tests=0
bare_job=
log_dir=
rebuild=0
while [ $# -gt 0 ]; do
  case $1 in
    --image) modes=(image) ;;
    --bare) modes=(bare) ;;
    --both) modes=(image bare) ;;
    --tests) with_tests=1 ;;
    --bare-mlp) bare_job=--mlp ;;
    --log-dir) [ $# -ge 2 ] || die "--log-dir needs a directory"; log_dir=$2; shift ;;
    --log-dir=*) log_dir=${1#*=} ;;
    --rebuild) rebuild=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "fresh-check: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
[ ${#modes[@]} -gt 0 ] || modes=(image)

t_debootstrap=${TALLY_FRESH_DEBOOTSTRAP_TIMEOUT:-20m}
t_image=${TALLY_FRESH_IMAGE_TIMEOUT:-20m}
t_run=${TALLY_FRESH_RUN_TIMEOUT:-30m}
t_test=${TALLY_FRESH_TEST_TIMEOUT:-60m}
image_packages=${TALLY_FRESH_IMAGE_PACKAGES:-build-essential cmake git pkg-config libblas-dev liblapack-dev python3 zlib1g-dev libssl-dev}
cache=${TALLY_FRESH_CACHE:-/var/cache/tally/fresh-check}

[ "$(id -u)" -eq 0 ] || die "must run as root (it uses debootstrap, mount and chroot); try: sudo $0 ${*:-}"
command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ] ||
  die "debootstrap is not installed; install it with: scripts/deps.sh --fresh-check"
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
for tool in chroot mount umount timeout tar git flock awk; do
  command -v "$tool" >/dev/null || die "'$tool' is not installed"
done

repo=$(cd "$(dirname "$0")/.." && pwd)
git -C "$repo" rev-parse --verify -q HEAD >/dev/null || die "$repo is not a git repository with a commit"

case $cache in /*) ;; *) die "TALLY_FRESH_CACHE must be an absolute path (got '$cache')" ;; esac
case $cache in *[[:space:]\\]*) die "TALLY_FRESH_CACHE must not contain white space or backslashes" ;; esac
cache=${cache%/}
[ -n "$cache" ] || die "TALLY_FRESH_CACHE must not be /"
mkdir -p "$cache/roots" "$cache/apt-archives/partial" "$cache/debootstrap-debs"
if [ -z "$log_dir" ]; then # the default one keeps a month of logs
  log_dir=$cache/logs
  mkdir -p "$log_dir"
  find "$log_dir" -maxdepth 1 -name '*.log' -mtime +30 -delete 2>/dev/null || true
fi
mkdir -p "$log_dir"
log_dir=$(cd "$log_dir" && pwd)

if command -v zstd >/dev/null; then
  tar_ext=tar.zst; tar_pack=(zstd -q -T0 -3); tar_unpack=(zstd -q -d -c)
else
  tar_ext=tar.gz; tar_pack=(gzip -1); tar_unpack=(gzip -d -c)
fi
base_tar=$cache/bookworm-minbase.$tar_ext
image_tar=$cache/bookworm-image.$tar_ext

# ---- the host's bookworm mirror: from /etc/apt/sources.list(.d) at run time, never written here ----

# Prints "URI SUITE COMPONENTS..." for each enabled deb entry of the host's apt sources.
host_sources() {
  local f one=() d822=()
  [ -f /etc/apt/sources.list ] && one+=(/etc/apt/sources.list)
  for f in /etc/apt/sources.list.d/*.list; do [ -f "$f" ] && one+=("$f"); done
  for f in /etc/apt/sources.list.d/*.sources; do [ -f "$f" ] && d822+=("$f"); done
  if [ ${#one[@]} -gt 0 ]; then
    awk '
      { sub(/#.*/, ""); gsub(/\t/, " "); sub(/^ +/, "") }
      $1 != "deb" { next }
      { line = substr($0, 4); sub(/^ +/, "", line)
        if (substr(line, 1, 1) == "[") { e = index(line, "]"); if (!e) next; line = substr(line, e + 1); sub(/^ +/, "", line) }
        n = split(line, F, / +/); if (n < 2) next
        comps = ""; for (i = 3; i <= n; i++) comps = comps " " F[i]
        print F[1], F[2] comps }
    ' "${one[@]}"
  fi
  if [ ${#d822[@]} -gt 0 ]; then
    awk '
      function flush(  nu, ns, i, j, U, S) {
        if ((" " types " ") ~ / deb / && enabled != "no" && uris != "" && suites != "") {
          nu = split(uris, U, " "); ns = split(suites, S, " ")
          for (i = 1; i <= nu; i++) for (j = 1; j <= ns; j++) print U[i], S[j], comps
        }
        types = uris = suites = comps = enabled = key = ""
      }
      function add(k, v) {
        gsub(/[ \t]+/, " ", v); sub(/^ /, "", v); sub(/ $/, "", v)
        if (k == "types") types = types " " v
        else if (k == "uris") uris = uris " " v
        else if (k == "suites") suites = suites " " v
        else if (k == "components") comps = comps " " v
        else if (k == "enabled") enabled = tolower(v)
      }
      FNR == 1 { flush() }
      /^[ \t]*#/ { next }
      /^[ \t]*$/ { flush(); next }
      /^[ \t]/ { add(key, $0); next }
      { i = index($0, ":"); if (!i) next; key = tolower(substr($0, 1, i - 1)); add(key, substr($0, i + 1)) }
      END { flush() }
    ' "${d822[@]}"
  fi
}

# The entries that serve bookworm (and its updates and security suites) over http(s), one per URI+suite.
bookworm_sources() {
  host_sources | awk '
    { sub(/\/+$/, "", $1) }
    $1 !~ /^https?:\/\// { next }
    $2 != "bookworm" && $2 != "bookworm-updates" && $2 != "bookworm-security" { next }
    !seen[$1 " " $2]++ { comps = ""; for (i = 3; i <= NF; i++) comps = comps " " $i
                         print $1, $2, (comps == "" ? " main" : comps) }'
}

sources=$(bookworm_sources)
mirror=$(awk '$2 == "bookworm" { print $1; exit }' <<<"$sources")
if [ -z "$mirror" ]; then
  {
    echo "fresh-check: no bookworm mirror in this machine's apt sources"
    echo "  looked for an enabled 'deb' entry with suite bookworm and an http(s) URI in"
    echo "  /etc/apt/sources.list, /etc/apt/sources.list.d/*.list and /etc/apt/sources.list.d/*.sources"
  } >&2
  exit 2
fi

# apt settings of the host that reaching its mirror may need (proxies, Release-date checks for a snapshot).
host_apt_conf() {
  apt-config dump 2>/dev/null | grep -E '^Acquire::((https?|ftp)::Proxy|Check-Valid-Until|Check-Date|Max-FutureTime)' || true
}
http_proxy_host=$(apt-config dump 2>/dev/null | sed -n 's/^Acquire::http::Proxy "\(.*\)";$/\1/p' | head -n1)

# ---- roots, mounts, processes and the cleanup on every exit path ----

current_root=
step_pid=
exit_code=0

mounts_under() { # mount points at or under $1, in mount order
  awk -v r="$1" '$2 == r || index($2, r "/") == 1 { print $2 }' /proc/mounts
}

pids_in_root() { # processes whose root directory is $1 or under it (chroot'ed there)
  local p l
  for p in /proc/[0-9]*; do
    l=$(readlink "$p/root" 2>/dev/null) || continue
    if [ "$l" = "$1" ] || [[ $l == "$1"/* ]]; then echo "${p#/proc/}"; fi
  done
}

kill_in_root() {
  local r=$1 pids sig
  for sig in TERM TERM TERM TERM TERM KILL KILL KILL KILL KILL; do
    pids=$(pids_in_root "$r")
    [ -n "$pids" ] || return 0
    # shellcheck disable=SC2086
    kill -s "$sig" $pids 2>/dev/null || true
    for _ in 1 2 3 4; do
      sleep 0.5
      [ -n "$(pids_in_root "$r")" ] || return 0
    done
  done
  echo "fresh-check: processes still running in $r: $(pids_in_root "$r" | tr '\n' ' ')" >&2
  return 1
}

unmount_all() {
  local r=$1 m
  for _ in 1 2 3; do
    [ -n "$(mounts_under "$r")" ] || return 0
    while read -r m; do
      [ -n "$m" ] || continue
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done < <(mounts_under "$r" | tac)
  done
  [ -z "$(mounts_under "$r")" ]
}

# Stops what runs in the root, unmounts everything under it and deletes it; refuses to delete while
# anything is still mounted there (host /dev, /proc or the .deb cache must never go with it).
remove_root() {
  local r=$1
  case $r in "$cache"/roots/*) ;; *) echo "fresh-check: refusing to remove '$r' (not under $cache/roots)" >&2; return 1 ;; esac
  [ -d "$r" ] || return 0
  kill_in_root "$r" || true
  if ! unmount_all "$r"; then
    echo "fresh-check: still mounted under $r, NOT removing it:" >&2
    mounts_under "$r" | sed 's/^/  /' >&2
    return 1
  fi
  rm -rf --one-file-system -- "$r" || { echo "fresh-check: could not remove $r" >&2; return 1; }
}

# shellcheck disable=SC2317 # cleanup, on_exit and on_signal are run by the traps
cleanup() {
  set +e
  trap '' INT TERM HUP
  if [ -n "$step_pid" ]; then kill -TERM "$step_pid" 2>/dev/null; fi
  if [ -n "$current_root" ]; then
    remove_root "$current_root" || exit_code=1
    current_root=
  fi
  if [ -n "$step_pid" ]; then wait "$step_pid" 2>/dev/null; step_pid=; fi
  rm -f "$cache"/*.part
}
on_exit() {
  local rc=$?
  cleanup
  [ "$exit_code" -ne 0 ] && [ "$rc" -eq 0 ] && rc=$exit_code
  exit "$rc"
}
on_signal() {
  echo >&2
  echo "fresh-check: interrupted (SIG$1): stopping, unmounting and removing ${current_root:-nothing}" >&2
  trap - EXIT
  cleanup
  exit "$2"
}
trap on_exit EXIT
trap 'on_signal INT 130' INT
trap 'on_signal TERM 143' TERM
trap 'on_signal HUP 129' HUP

fmt_secs() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# Runs "$@" in the background under timeout LIMIT, output to LOG, and waits for it (a trapped signal
# interrupts the wait at once). Sets step_rc.
run_step() {
  local limit=$1 log=$2
  shift 2
  env --default-signal=INT,QUIT timeout --kill-after=30s "$limit" "$@" </dev/null >>"$log" 2>&1 9>&- &
  step_pid=$!
  step_rc=0
  wait "$step_pid" || step_rc=$?
  step_pid=
}

new_root() {
  current_root=$(mktemp -d "$cache/roots/run.XXXXXX")
  chmod 755 "$current_root"
}

unpack_root() { # tarball
  "${tar_unpack[@]}" "$1" | tar -C "$current_root" --numeric-owner -xpf -
}

pack_root() { # tarball: the current root (nothing mounted in it) to a tarball, atomically
  rm -rf "${current_root:?}"/var/lib/apt/lists/* "$current_root"/var/cache/apt/archives/*.deb \
    "$current_root"/var/cache/apt/*.bin "$current_root"/root/tally
  tar -C "$current_root" --numeric-owner -cpf - . | "${tar_pack[@]}" >"$1.part"
  mv -f "$1.part" "$1"
}

# What a root needs to reach the mirror: the host's bookworm sources and apt settings, resolv.conf, hosts.
configure_root() {
  local r=$current_root uri suite comps
  : >"$r/etc/apt/sources.list"
  while read -r uri suite comps; do
    echo "deb $uri $suite $comps" >>"$r/etc/apt/sources.list"
  done <<<"$sources"
  rm -f "$r"/etc/apt/sources.list.d/*.list "$r"/etc/apt/sources.list.d/*.sources
  host_apt_conf >"$r/etc/apt/apt.conf.d/90fresh-check-host"
  [ -s "$r/etc/apt/apt.conf.d/90fresh-check-host" ] || rm -f "$r/etc/apt/apt.conf.d/90fresh-check-host"
  rm -f "$r/etc/resolv.conf" "$r/etc/hosts"
  if [ -e /etc/resolv.conf ]; then cp -L /etc/resolv.conf "$r/etc/resolv.conf"; fi
  if [ -e /etc/hosts ]; then cp -L /etc/hosts "$r/etc/hosts"; fi
}

bind() { # source target: a bind mount, private so nothing propagates back to the host
  mkdir -p "$2"
  mount --bind "$1" "$2"
  mount --make-private "$2" 2>/dev/null || true
}

mount_root() {
  local r=$current_root
  bind /proc "$r/proc"
  bind /sys "$r/sys"
  bind /dev "$r/dev"
  bind /dev/pts "$r/dev/pts"
  bind /dev/shm "$r/dev/shm"
  bind "$cache/apt-archives" "$r/var/cache/apt/archives"
}

set_in_root() { # in_root: the command prefix that runs a command in the current root, clean environment
  in_root=(chroot "$current_root" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    "TERM=${TERM:-dumb}" LANG=C.UTF-8)
  if [ -n "${OPENBLAS_CORETYPE:-}" ]; then in_root+=("OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE"); fi
  if [ -n "${OPENBLAS_L2_SIZE:-}" ]; then in_root+=("OPENBLAS_L2_SIZE=$OPENBLAS_L2_SIZE"); fi
}

need_space() { # GiB free under the cache dir
  local avail_k
  avail_k=$(df -Pk "$cache/roots" | awk 'NR == 2 { print $4 }')
  if [ "${avail_k:-0}" -lt $(($1 * 1024 * 1024)) ]; then
    echo "fresh-check: only $((avail_k / 1024)) MiB free under $cache; the check needs about $1 GiB" >&2
    echo "  (set TALLY_FRESH_CACHE to a directory on a larger file system)" >&2
    exit 2
  fi
}

stamp=$(date +%Y%m%d-%H%M%S)

# ---- the cached roots ----

build_base() {
  local log=$log_dir/$stamp-debootstrap.log t0=$SECONDS include=()
  grep -q '^https://' <<<"$mirror" && include=(--include=ca-certificates)
  say "building the Debian 12 minbase root with debootstrap from $mirror (limit $t_debootstrap; log $log)"
  new_root
  echo "# debootstrap --variant=minbase bookworm from $mirror" >"$log"
  local envp=()
  [ -n "$http_proxy_host" ] && envp=("http_proxy=$http_proxy_host")
  run_step "$t_debootstrap" "$log" env "${envp[@]}" debootstrap --variant=minbase "${include[@]}" \
    --cache-dir="$cache/debootstrap-debs" bookworm "$current_root" "$mirror"
  if [ "$step_rc" -ne 0 ]; then
    tail -n 15 "$log" | sed 's/^/  | /'
    say "debootstrap FAILED (exit $step_rc$([ "$step_rc" -eq 124 ] && echo ", timed out after $t_debootstrap")) after $(fmt_secs $((SECONDS - t0)))"
    exit 1
  fi
  unmount_all "$current_root" || { echo "fresh-check: debootstrap left mounts in $current_root" >&2; exit 1; }
  pack_root "$base_tar"
  remove_root "$current_root"; current_root=
  rm -f "$image_tar"
  say "minbase root cached as $base_tar ($(du -h "$base_tar" | cut -f1)) in $(fmt_secs $((SECONDS - t0)))"
}

build_image() {
  local log=$log_dir/$stamp-image.log t0=$SECONDS
  say "building the image root: minbase + $image_packages (limit $t_image; log $log)"
  new_root
  unpack_root "$base_tar"
  configure_root
  mount_root
  echo "# image root: apt-get install $image_packages" >"$log"
  set_in_root
  run_step "$t_image" "$log" "${in_root[@]}" /bin/sh -c "apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y $image_packages"
  if [ "$step_rc" -ne 0 ]; then
    tail -n 15 "$log" | sed 's/^/  | /'
    say "installing the image packages FAILED (exit $step_rc) after $(fmt_secs $((SECONDS - t0)))"
    exit 1
  fi
  kill_in_root "$current_root"
  unmount_all "$current_root" || { echo "fresh-check: cannot unmount under $current_root" >&2; exit 1; }
  pack_root "$image_tar"
  echo "$image_packages" >"$image_tar.packages"
  remove_root "$current_root"; current_root=
  say "image root cached as $image_tar ($(du -h "$image_tar" | cut -f1)) in $(fmt_secs $((SECONDS - t0)))"
}

# ---- one check: a new root, the clone, ./run.sh (and ./test.sh) ----

results=()
failed=0

check_mode() {
  local mode=$1 tarball t0=$SECONDS
  [ "$mode" = image ] && tarball=$image_tar || tarball=$base_tar
  say "== $mode root: unpacking $(basename "$tarball")"
  new_root
  unpack_root "$tarball"
  configure_root
  mount_root
  git clone -q --no-hardlinks --no-checkout "$repo" "$current_root/root/tally"
  git -C "$current_root/root/tally" -c advice.detachedHead=false checkout -q --detach "$head"
  say "$mode root ready in $current_root ($(fmt_secs $((SECONDS - t0)))); commit $head_short cloned into /root/tally"

  local step script limit log rc verdict dt acc
  for step in run test; do
    [ "$step" = test ] && [ "$with_tests" -ne 1 ] && continue
    if [ "$step" = run ]; then script=./run.sh limit=$t_run; else script=./test.sh limit=$t_test; fi
    [ "$step" = run ] && [ "$mode" = bare ] && [ -n "$bare_job" ] && script="./run.sh $bare_job"
    log=$log_dir/$stamp-$mode-$step.log
    {
      echo "# fresh-check $mode root: $script at $head_short ($(git -C "$repo" log -1 --format=%s "$head"))"
      echo "# started $(date -u +%FT%TZ), limit $limit"
    } >"$log"
    say "$mode: running $script (limit $limit; log $log)"
    t0=$SECONDS
    set_in_root
    run_step "$limit" "$log" "${in_root[@]}" /bin/bash -c "cd /root/tally && exec $script"
    rc=$step_rc dt=$(fmt_secs $((SECONDS - t0)))
    kill_in_root "$current_root" || true
    echo "--- last 15 lines of $log:"
    tail -n 15 "$log" | sed 's/^/  | /'
    if [ "$rc" -eq 0 ]; then
      verdict="PASS  $mode  $script  $dt"
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      verdict="FAIL  $mode  $script  $dt  (timed out after $limit)"; failed=1
    else
      verdict="FAIL  $mode  $script  $dt  (exit $rc)"; failed=1
    fi
    if [ "$step" = run ]; then
      acc=$(grep -E '^ *(test accuracy|validation loss)' "$log" | tail -n1 | sed 's/^ *//' || true)
      [ -n "$acc" ] && verdict="$verdict  [$acc]"
    fi
    say "$verdict"
    results+=("$verdict  log: $log")
    [ "$rc" -eq 0 ] || break
  done
  remove_root "$current_root" || failed=1
  current_root=
}

# ---- main ----

exec 9>"$cache/.lock"
if ! flock -n 9; then
  say "another fresh-check is using $cache; waiting for it (up to 2h)"
  flock -w 7200 9 || die "gave up waiting for the lock on $cache/.lock"
fi
for stale in "$cache"/roots/run.*; do # left by a run that was killed outright (SIGKILL)
  [ -d "$stale" ] || continue
  say "removing a root left by an earlier run: $stale"
  remove_root "$stale" || die "cannot remove $stale; unmount what is listed above, then rm -rf it"
done

if [ "$with_tests" -eq 1 ]; then need_space 8; else need_space 4; fi

head=$(git -C "$repo" rev-parse HEAD)
head_short=$(git -C "$repo" rev-parse --short HEAD)
say "checking commit $head_short ($(git -C "$repo" log -1 --format=%s "$head" | cut -c1-80)) of $repo:"
say "  the committed HEAD only; uncommitted changes are not part of the check"
dirty=$(git -C "$repo" status --porcelain 2>/dev/null | wc -l)
[ "$dirty" -eq 0 ] || say "  (here $dirty file(s) differ from HEAD or are untracked: commit them to check them)"
say "mirror: $mirror (suites: $(awk '{ print $2 }' <<<"$sources" | sort -u | paste -sd " "))"

t_all=$SECONDS
if [ "$rebuild" -eq 1 ]; then rm -f "$base_tar" "$image_tar" "$image_tar.packages"; fi
[ -f "$base_tar" ] || build_base
if [[ " ${modes[*]} " == *" image "* ]] && { [ ! -f "$image_tar" ] || [ "$image_tar" -ot "$base_tar" ] ||
  [ "$(cat "$image_tar.packages" 2>/dev/null)" != "$image_packages" ]; }; then
  build_image
fi

for mode in "${modes[@]}"; do
  check_mode "$mode"
done

echo
say "summary (commit $head_short, $(fmt_secs $((SECONDS - t_all))) in all):"
for line in "${results[@]}"; do echo "  $line"; done
exit "$failed"
