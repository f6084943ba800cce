#!/usr/bin/env bash
# check-layers.sh - the source tree's layering, as docs/DESIGN.md draws it: each folder of src/ includes only
# the folders below it, the library never writes to stdout, test seams stay in *_seam.[ch], and (given a
# build directory) no object file uses a symbol of a folder above its own, and no two object files depend
# on each other around a loop; no folder of code or docs holds more than 25 files.
# usage: scripts/check-layers.sh [BUILD_DIR]     exit 0 when every rule holds, 1 naming each breach.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

# What each folder may use besides itself. <tally.h> (error codes, dtypes, the communicator) is open to all.
declare -A allowed=(
  [core]=""
  [boot]="core"
  [transport]="core boot"
  [p2p]="core boot"
  [coll]="core boot transport p2p"
  [nn]="core"
  [data]="core"
  [optim]="core"
  [ckpt]="core"
  [dp]="core boot transport coll nn optim ckpt"
  [ps]="core boot transport coll nn optim"
  [sim]="core boot transport coll"
  [plan]="core boot transport p2p coll nn data optim ckpt dp ps sim"
  [train]="core boot transport p2p coll nn data optim ckpt dp ps sim plan"
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

# 1. Includes: one awk reads every file of src/ and resolves each quoted include against its file's folder
# (a realpath per include took 9 s); lines "FILE|INCLUDE|FOLDER" for quoted ones, "FILE|<INCLUDE>|" for
# public headers, FOLDER ".." when the path leaves src/.
includes=$(awk '
  function resolve(dir, inc,   parts, n, i, out, k) {
    n = split(dir "/" inc, parts, "/"); k = 0
    for (i = 1; i <= n; i++) {
      if (parts[i] == "." || parts[i] == "") continue
      if (parts[i] == "..") { if (k > 0) k--; else return ".."; continue }
      out[++k] = parts[i]
    }
    if (k < 2 || out[1] != "src") return ".."
    return out[2]
  }
  /^[ \t]*#[ \t]*include[ \t]*"/ {
    inc = $0; sub(/^[^"]*"/, "", inc); sub(/".*/, "", inc)
    dir = FILENAME; sub(/\/[^\/]*$/, "", dir)
    print FILENAME "|" inc "|" resolve(dir, inc)
  }
  /^[ \t]*#[ \t]*include[ \t]*<tally/ {
    inc = $0; sub(/^[^<]*</, "", inc); sub(/>.*/, "", inc)
    print FILENAME "|<" inc ">|"
  }' $(find src -mindepth 2 -name '*.[ch]' | sort))
while IFS='|' read -r f inc tf; do
  [ -n "$f" ] || continue
  folder=${f#src/}
  folder=${folder%%/*}
  [ -n "${allowed[$folder]+set}" ] || continue
  case $inc in
  "<"*)
    inc=${inc#<}
    inc=${inc%>}
    tf=${public[$inc]:-}
    [ -z "$tf" ] || may_use "$folder" "$tf" || breach "$f includes <$inc>: $folder/ may not use $tf/"
    ;;
  *)
    [ "$tf" = ".." ] && { breach "$f includes \"$inc\", outside src/"; continue; }
    may_use "$folder" "$tf" || breach "$f includes \"$inc\": $folder/ may not use $tf/"
    ;;
  esac
done <<<"$includes"

# 2. The library never prints: stdout belongs to the program (the CLI draws progress from the trainer's events).
while IFS= read -r hit; do
  breach "${hit%%:*}: the library writes to stdout (${hit#*:})"
done < <(grep -nE '(^|[^a-z_])(printf|puts|putchar|vprintf)[[:space:]]*\(|stdout' $(find src -mindepth 2 -name '*.[ch]') |
  grep -vE '^[^:]*:[0-9]+:[[:space:]]*(/?\*|//)' | sed -E 's/^([^:]*):([0-9]+):[[:space:]]*/\1:\2:/')

# 3. Test seams (faults for the tests, compiled in only with TALLY_TEST_SEAMS) live in their own *_seam.[ch]:
# the rest of the library has one build, with no fault-injection paths of its own.
while IFS= read -r hit; do
  breach "${hit%%:*}: TALLY_TEST_SEAMS outside a *_seam.[ch] file (${hit#*:})"
done < <(grep -n 'TALLY_TEST_SEAMS' $(find src -mindepth 2 -name '*.[ch]') | grep -v '^[^:]*_seam\.[ch]:')

# 4. Symbols, from the objects of a build: who defines what, who uses it.
if [ $# -ge 1 ]; then
  build=$1
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # The two libraries' objects only: a build directory may keep objects of targets since renamed.
  find "$build" \( -path '*/tally_comm_objs.dir/src/*' -o -path '*/tally_train_objs.dir/src/*' \) -name '*.c.o' |
    sort >"$tmp/objs"
  [ -s "$tmp/objs" ] || { echo "check-layers: no objects of src/ under $build: build first" >&2; exit 2; }
  # One nm for every object (one each took 9 s); an object left in the build by a file since moved or
  # deleted is skipped.
  find src -mindepth 2 -name '*.c' | sort >"$tmp/sources"
  xargs nm -A <"$tmp/objs" | awk -v list="$tmp/sources" '
    BEGIN { while ((getline s < list) > 0) have[s] = 1 }
    {
      if (!match($0, /^[^ ]*\.c\.o:/)) next
      f = substr($0, 1, RLENGTH - 3); sub(/.*\/src\//, "src/", f)
      if (!(f in have)) next
      n = split(substr($0, RLENGTH + 1), w, " ")
      if (n == 2 && w[1] == "U") print "U", f, w[2]
      else if (n == 3 && w[2] ~ /^[TDBRC]$/) print "D", f, w[3]
    }' >"$tmp/syms"
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

# 4. No folder of code or docs holds more than 25 files (DESIGN.md): past that a reader cannot see what is
# there; split it by concern (src/core/numeric, tests/LAYER). Data folders (fixtures, fuzz corpora) aside.
while read -r n dir; do
  [ "$n" -le 25 ] || breach "$dir/ holds $n files (at most 25): split it by concern"
done < <(find src tools tests include python scripts bench docs examples fuzz -path fuzz/corpus -prune -o \
  -path tests/fixtures -prune -o -type f -print 2>/dev/null | sed 's#/[^/]*$##' | sort | uniq -c)

[ "$bad" = 0 ] && echo "check-layers: every folder uses only the ones below it; no stdout; seams apart; no cycles between files; no folder over 25 files"
exit "$bad"
