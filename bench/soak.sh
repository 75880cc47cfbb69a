#!/usr/bin/env bash
# Soak test (not a unit test): rounds of a long mixed workload under aether-journal, half of
# them killed with SIGKILL (the whole process group) at a random moment, each followed by an
# undo and a whole-tree comparison. Prints one line per round and a summary.
#
#   bench/soak.sh [ROUNDS]          (default 20; SOAK_SECONDS caps the workload, default 4)
#
# A round passes when the tree is exactly as before (type, mode, owner, size, content hash,
# link target of every entry) and the undo said so; it is acceptable when the tree differs but
# the undo said it was incomplete. A round where the tree differs and the undo claimed
# completeness is a failure of the one rule, and makes the script exit 1.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
rounds=${1:-20}
cap=${SOAK_SECONDS:-4}
cargo build --release --quiet --manifest-path "$here/Cargo.toml"
aj="$here/target/release/aether-journal"
work=$(mktemp -d "${TMPDIR:-/tmp}/aether-journal-soak.XXXXXX")
trap '[ -n "${SOAK_KEEP:-}" ] || rm -rf "$work"' EXIT
# `run` names each session in the state directory too: keep those links out of the user's.
export XDG_STATE_HOME="$work/state"

manifest() {
  (cd "$1" && find . -printf '%y %m %u:%g %s %p -> %l\n' | sort && find . -type f -print0 | sort -z | xargs -0r sha256sum)
}

make_tree() {
  local t=$1
  mkdir -p "$t/src/lib" "$t/docs" "$t/build"
  for i in $(seq 1 60); do printf 'line %s\nvalue = %s\n' "$i" "$((i * 7))" > "$t/src/file$i.txt"; done
  for i in $(seq 1 20); do head -c $((i * 997)) /dev/urandom > "$t/build/obj$i.o"; done
  printf 'readme\n' > "$t/docs/README"; chmod 640 "$t/docs/README"
  ln -s ../docs/README "$t/src/readme-link"
  (cd "$t" && git init -q -b main repo && cd repo && git config user.email s@x && git config user.name s \
    && for i in $(seq 1 30); do echo "v$i" > "f$i"; done && git add -A && git commit -qm one \
    && git checkout -qb other && for i in $(seq 1 15); do echo "w$i" > "f$i"; done && git commit -qam two && git checkout -q main)
  sqlite3 "$t/db.sqlite" 'create table t(a, b); insert into t values (1, 2);'
  tar cf "$t/pack.tar" -C "$t" src
}

workload='
set +e
end=$((SECONDS + CAP))
while [ $SECONDS -lt $end ]; do
  sed -i "s/value/VALUE/" src/file*.txt
  python3 -c "
import os, random, shutil
r = random.Random(os.getpid())
for i in range(30):
    p = \"src/file%d.txt\" % r.randint(1, 60)
    if os.path.exists(p):
        with open(p, \"a\") as f: f.write(\"more\\n\")
    os.replace(\"src/file%d.txt\" % r.randint(1, 60), \"src/moved%d\" % i) if r.random() < 0.2 and os.path.exists(\"src/file%d.txt\" % 1) else None
"
  (cd repo && git checkout -q other && git checkout -q main)
  sqlite3 db.sqlite "insert into t values (random(), random()); update t set b = b + 1;"
  rm -rf build && mkdir build && for i in 1 2 3; do head -c 5000 /dev/urandom > build/new$i.o; done
  mkdir -p out && tar xf pack.tar -C out && cp -a src out/copy && rm -rf out
  chmod 600 docs/README; chmod 640 docs/README
  # A static program: every change it makes reaches the supervisor (rewrites kept in packs).
  if command -v busybox >/dev/null; then
    busybox sh -c "for f in src/file3*.txt src/file4*.txt; do [ -f \$f ] && echo static >> \$f && echo rewritten > \$f; done"
    busybox sed -i s/line/LINE/ src/file5*.txt
  fi
done
'

pass=0 honest=0 fail=0 killed=0
for round in $(seq 1 "$rounds"); do
  t="$work/round$round/tree"; s="$work/round$round/session"
  mkdir -p "$t"; make_tree "$t"
  before=$(manifest "$t")
  kill_it=$((RANDOM % 2))
  start=$(date +%s.%N)
  ( cd "$t" && CAP=$cap setsid "$aj" run --journal "$s" -- bash -c "$workload" >/dev/null 2>&1; true ) 2>/dev/null &
  runner=$!
  if [ "$kill_it" = 1 ]; then
    sleep "$(awk -v r=$RANDOM -v c="$cap" 'BEGIN { printf "%.2f", 0.3 + (r / 32768) * (c - 0.5) }')"
    pgid=$(ps -o pgid= -p "$(pgrep -P $runner | head -1)" 2>/dev/null | tr -d ' ' || true)
    [ -n "$pgid" ] && kill -9 -- "-$pgid" 2>/dev/null || true
    killed=$((killed + 1))
  fi
  { wait "$runner"; } 2>/dev/null || true
  records=$("$aj" log --json --journal "$s" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["records"]))')
  set +e
  "$aj" undo --journal "$s" > "$work/round$round/undo.txt" 2>&1
  code=$?
  set -e
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  if [ "$before" = "$(manifest "$t")" ]; then
    if [ $code = 0 ]; then verdict=exact; pass=$((pass + 1)); else verdict="exact-but-reported-incomplete"; honest=$((honest + 1)); fi
  elif [ $code != 0 ]; then
    verdict=differs-reported-incomplete; honest=$((honest + 1))
  else
    verdict=DIFFERS-BUT-CLAIMED-COMPLETE; fail=$((fail + 1))
    diff <(echo "$before") <(manifest "$t") | head -20 || true
  fi
  printf 'round %3d  %-7s  %6s records  %5ss  undo exit %s  %s\n' "$round" "$([ $kill_it = 1 ] && echo killed || echo ran)" "$records" "$secs" "$code" "$verdict"
done
echo "soak: $rounds rounds ($killed killed mid-flight): $pass exact and complete, $honest honestly incomplete, $fail claimed completeness wrongly"
[ "$fail" = 0 ]
