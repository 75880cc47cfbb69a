#!/usr/bin/env bash
# W12, the agent loop: what an AI coding agent's shell tool does to a repository, turn after
# turn, each command a fresh `bash -c` (as harnesses run them). Run in a git repository.
#
#   bench/agent_loop.sh [TURNS [FIRST [--lockstep]]]   (default 60 turns from turn 1; six
#                                                      commands a turn)
#
# With --lockstep (bench/bench.py's turn-by-turn pairing), it writes `ready` and the time on
# standard output once started, then each turn first waits for a line on standard input and
# writes when it started and ended (bash's EPOCHREALTIME, seconds) on standard output, so that
# several loops, one per variant, can take turns; the turns themselves, and what they inherit,
# are the same as without it.
set -euo pipefail
turns=${1:-60}
first=${2:-1}
lockstep=${3:-}
turn() {
  local i=$1
  bash -c 'git status --porcelain >/dev/null && ls >/dev/null'
  bash -c 'cat g0001.txt >/dev/null && { grep -rn omega --include="*.txt" . >/dev/null || true; }'
  bash -c "mkdir -p work/t$i && printf 'turn %s\n' $i > work/t$i/note.txt"
  bash -c "sed -i 's/turn/TURN/' work/t$i/note.txt"
  bash -c "python3 -c \"open('work/t$i/py.txt', 'w').write('written by python\\\\n')\""
  bash -c "mv work/t$i/py.txt work/t$i/moved.txt && rm -f work/t$((i - 1))/note.txt && git add -A && git diff --cached --stat >/dev/null"
}
if [ "$lockstep" = --lockstep ]; then
  # The go-ahead and the report on descriptors of their own; the turns get /dev/null.
  exec 3<&0 4>&1 </dev/null >/dev/null
  echo "ready $EPOCHREALTIME" >&4
  for i in $(seq "$first" $((first + turns - 1))); do
    read -r _ <&3
    start=$EPOCHREALTIME
    turn "$i" 3<&- 4>&-
    echo "$start $EPOCHREALTIME" >&4
  done
elif [ -n "$lockstep" ]; then
  echo "agent_loop.sh: unknown option $lockstep" >&2
  exit 2
else
  for i in $(seq "$first" $((first + turns - 1))); do
    turn "$i"
  done
fi
