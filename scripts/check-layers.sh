#!/usr/bin/env bash
# check-layers.sh - the source tree's layering, as docs/DESIGN.md draws it: each folder of src/ includes only
# the folders below it, the library never writes to stdout, and (given a build directory) no object file
# uses a symbol of a folder above its own, and no two object files depend on each other around a loop.
# usage: scripts/check-layers.sh [BUILD_DIR]     exit 0 when every rule holds, 1 naming each breach.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

# What each folder may use besides itself. <tally.h> (error codes, dtypes, the communicator) is open to all.
declare -A allowed=(
  [core]=""
  [boot]="core"
  [transport]="core boot"
  [coll]="core boot transport"
  [nn]="core"
  [data]="core"
  [optim]="core"
  [ckpt]="core"
  [dp]="core boot transport coll nn optim ckpt"
  [ps]="core boot transport coll nn optim"
  [sim]="core boot transport coll"
  [plan]="core boot transport coll nn data optim ckpt dp ps sim"
  [train]="core boot transport coll nn data optim ckpt dp ps sim plan"
)
# The public headers that belong to a folder above core.
declare -A public=([tally/layers.h]=nn [tally/data.h]=data [tally/optim.h]=optim [tally/ddp.h]=dp)

bad=0
breach() {
  echo "check-layers: $*" >&2
  bad=1
}
may_use() { # folder target
  [ "$1" = "$2" ] && return 0
  case " ${allowed[$1]} " in *" $2 "*) return 0 ;; esac
  return 1
}

for dir in src/*/; do
  folder=$(basename "$dir")
  [ -n "${allowed[$folder]+set}" ] || breach "src/$folder/ is not in the layer table (scripts/check-layers.sh, docs/DESIGN.md)"
done

# 1. Includes.
for f in src/*/*.[ch]; do
  folder=$(basename "$(dirname "$f")")
  [ -n "${allowed[$folder]+set}" ] || continue
  while IFS= read -r inc; do
    target=$(realpath -m --relative-to=src "$(dirname "$f")/$inc")
    tf=${target%%/*}
    case $target in ../*) breach "$f includes \"$inc\", outside src/"; continue ;; esac
    may_use "$folder" "$tf" || breach "$f includes \"$inc\": $folder/ may not use $tf/"
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
  while IFS= read -r inc; do
    tf=${public[$inc]:-}
    [ -z "$tf" ] || may_use "$folder" "$tf" || breach "$f includes <$inc>: $folder/ may not use $tf/"
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*<\(tally[^>]*\)>.*/\1/p' "$f")
done

# 2. The library never prints: stdout belongs to the program (the CLI draws progress from the trainer's events).
while IFS= read -r hit; do
  breach "${hit%%:*}: the library writes to stdout (${hit#*:})"
done < <(grep -nE '(^|[^a-z_])(printf|puts|putchar|vprintf)[[:space:]]*\(|stdout' src/*/*.[ch] |
  grep -vE '^[^:]*:[0-9]+:[[:space:]]*(/?\*|//)' | sed -E 's/^([^:]*):([0-9]+):[[:space:]]*/\1:\2:/')

# 3. Symbols, from the objects of a build: who defines what, who uses it.
if [ $# -ge 1 ]; then
  build=$1
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # The two libraries' objects only: a build directory may keep objects of targets since renamed.
  find "$build" \( -path '*/tally_comm_objs.dir/src/*' -o -path '*/tally_train_objs.dir/src/*' \) -name '*.c.o' |
    sort >"$tmp/objs"
  [ -s "$tmp/objs" ] || { echo "check-layers: no objects of src/ under $build: build first" >&2; exit 2; }
  while IFS= read -r o; do
    src=src/${o##*/src/}
    src=${src%.o}
    [ -f "$src" ] || continue # an object left in the build by a file since moved or deleted
    nm "$o" | awk -v f="$src" '$1 == "U" {print "U", f, $2} NF == 3 && $2 ~ /^[TDBRC]$/ {print "D", f, $3}'
  done <"$tmp/objs" >"$tmp/syms"
  # One edge per pair of files: user, definer.
  awk '$1 == "D" {def[$3] = $2} $1 == "U" {n++; uf[n] = $2; us[n] = $3}
       END {for (i = 1; i <= n; i++) if ((us[i] in def) && def[us[i]] != uf[i]) print uf[i], def[us[i]]}' \
    "$tmp/syms" | sort -u >"$tmp/edges"
  while read -r user definer; do
    uf=${user#src/}
    uf=${uf%%/*}
    df=${definer#src/}
    df=${df%%/*}
    may_use "$uf" "$df" || breach "$user uses $definer's symbols: $uf/ may not use $df/"
  done <"$tmp/edges"
  if ! tsort "$tmp/edges" >/dev/null 2>"$tmp/loops"; then
    breach "object files that depend on each other (a cycle): $(sed -n 's/^tsort: \(src\/.*\)$/\1/p' "$tmp/loops" | tr '\n' ' ')"
  fi
fi

[ "$bad" = 0 ] && echo "check-layers: every folder uses only the ones below it; no stdout; no cycles between files"
exit "$bad"
