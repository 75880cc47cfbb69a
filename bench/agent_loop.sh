#!/usr/bin/env bash
# W12, the agent loop: what an AI coding agent's shell tool does to a repository, turn after
# turn, each command a fresh `bash -c` (as harnesses run them). Run in a git repository.
#
#   bench/agent_loop.sh [TURNS [FIRST]]   (default 60 turns from turn 1; six commands a turn)
set -euo pipefail
turns=${1:-60}
first=${2:-1}
for i in $(seq "$first" $((first + turns - 1))); do
  bash -c 'git status --porcelain >/dev/null && ls >/dev/null'
  bash -c 'cat g0001.txt >/dev/null && { grep -rn omega --include="*.txt" . >/dev/null || true; }'
  bash -c "mkdir -p work/t$i && printf 'turn %s\n' $i > work/t$i/note.txt"
  bash -c "sed -i 's/turn/TURN/' work/t$i/note.txt"
  bash -c "python3 -c \"open('work/t$i/py.txt', 'w').write('written by python\\\\n')\""
  bash -c "mv work/t$i/py.txt work/t$i/moved.txt && rm -f work/t$((i - 1))/note.txt && git add -A && git diff --cached --stat >/dev/null"
done
