#!/usr/bin/env bash
# The aether-journal demo, end to end on a fresh machine:
#   1. builds the shim and the CLI (release; with AETHER_JOURNAL_DEMO_BIN=PROGRAM it uses that
#      installed program instead, as CI does with the Debian package),
#   2. makes a scratch project and takes a manifest of it,
#   3. lets a scripted agent session loose on it under `aether-journal run`,
#   4. shows what the session did (`aether-journal log`, then `review` with diffs),
#   5. rewinds it (`aether-journal undo`) and prints the report,
#   6. proves the project is byte-for-byte, mode-for-mode what it was.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

if [ -n "${AETHER_JOURNAL_DEMO_BIN:-}" ]; then
  aj=$AETHER_JOURNAL_DEMO_BIN
  step "using the installed $aj"
else
  step "building aether-journal (cargo build --release)"
  cargo build --release --quiet --manifest-path "$here/Cargo.toml"
  aj="$here/target/release/aether-journal"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/aether-journal-demo.XXXXXX")
trap 'rm -rf "$work"' EXIT
# `run` also names its session in the state directory; the demo's session goes away with
# its scratch directory, so its link is kept there too, not in the user's.
export XDG_STATE_HOME="$work/state"
project="$work/project"
session="$work/session"

step "making a scratch project in $project"
mkdir -p "$project"/{src,docs,build/obj}
cd "$project"
printf 'from util import helper\n\nprint(helper())\n' > src/main.py
printf 'def helper():\n    return 42\n' > src/util.py
printf '__version__ = "0.1.0"\n' > src/__init__.py
printf '[metadata]\nname = demo\nversion = 0.1.0\n' > setup.cfg
printf '{"debug": true, "retries": 3}\n' > config.json
printf '# Changelog\n- 0.1.0: first release\n' > CHANGELOG.md
printf 'How to use the demo.\n' > docs/usage.md
printf 'Design notes.\n' > docs/design.md
chmod 600 docs/design.md
head -c 4096 /dev/urandom > build/obj/main.o
ln -s obj/main.o build/latest
mkdir -p /tmp/aj-demo-deps.$$/libfoo && printf 'libfoo 1.0\n' > /tmp/aj-demo-deps.$$/libfoo/VERSION
tar cf deps.tar -C /tmp/aj-demo-deps.$$ libfoo && rm -rf /tmp/aj-demo-deps.$$

manifest() {
  # type, mode, owner, size, content hash and link target of every entry
  find . -printf '%y %m %u %s %p -> %l\n' | sort
  find . -type f -exec sha256sum {} + | sort -k2
}
manifest > "$work/before.txt"

step "running the agent session under aether-journal"
"$aj" run --journal "$session" -- bash "$here/examples/agent-session.sh"

step "what the session did (aether-journal log)"
"$aj" log --journal "$session"

step "what it changed, with diffs: the view to decide on (aether-journal review)"
"$aj" review --journal "$session" --no-pager --color never

step "the project now"
find . -printf '%y %p\n' | sort

step "rewinding it (aether-journal undo)"
status=0
"$aj" undo --journal "$session" || status=$?

step "checking the project against its manifest from before the session"
manifest > "$work/after.txt"
if diff -u "$work/before.txt" "$work/after.txt"; then
  echo "identical: every file, mode, link and byte is back (undo exit status $status)"
else
  echo "DIFFERENT: see above (undo exit status $status)"
  exit 1
fi
exit "$status"
