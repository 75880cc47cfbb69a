#!/usr/bin/env bash
# The performance suite in one command:
#
#   sudo bench/run.sh [--runs N] [--mode preload|run] [--baseline DIR] [--only W1,...,W12,W12T,EXEC,CMD,CHANGE,RSS,RT,SPAWN,SUPMEM,FILTER,UNDO]
#                     [--json FILE]
#
# Builds the release shim and the helper programs, makes a fresh loop-mounted ext4 (with a
# journal: the root filesystem of the machines this was written on has none, and there file
# creation time swings by 30x with recent deletes; see ../shared/BENCHMARKING.md), runs
# bench/bench.py on it and unmounts it. Without root (no loop mount) it runs in
# BENCH_DIR (default: a directory under /var/tmp) and says so: figures from there are not
# comparable. BENCH_SIZE sets the image size (default 12G; sparse).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cargo build --release --quiet --manifest-path "$here/Cargo.toml"
shim="$here/target/release/libaether_journal.so"
progs="$here/target/bench-progs"
mkdir -p "$progs"
for p in open_close spawn_true spawn_rotate spawn_serve rss roundtrip allowall first_change; do
  cc -O2 -o "$progs/$p" "$here/bench/progs/$p.c"
done
# W9 and W10: a static Go program (CGO_ENABLED=0); W11 runs Bun from PATH.
if command -v go >/dev/null; then
  (cd "$here/bench/progs" && CGO_ENABLED=0 GOCACHE="$progs/gocache" go build -o "$progs/gofiles" gofiles.go)
fi
# The floor for per-exec cost: a preload library that does nothing at all.
echo 'int aether_journal_bench_nothing(void) { return 0; }' > "$progs/nothing.c"
cc -O2 -shared -fPIC -o "$progs/libnothing.so" "$progs/nothing.c"
# And the least a library that journals every exec does (EXEC's paired rows).
cc -O2 -shared -fPIC -o "$progs/libleast_journal.so" "$here/bench/progs/least_journal.c"

img="${BENCH_IMAGE:-/var/tmp/aether-journal-bench.img}"
mnt="${BENCH_DIR:-/var/tmp/aether-journal-bench}"
mounted=""
cleanup() { if [ -n "$mounted" ]; then cd /; umount "$mnt" || true; rm -f "$img"; fi; }
trap cleanup EXIT
mkdir -p "$mnt"
if [ "$(id -u)" = 0 ] && command -v mkfs.ext4 >/dev/null; then
  mountpoint -q "$mnt" && umount "$mnt"
  rm -f "$img"
  truncate -s "${BENCH_SIZE:-12G}" "$img"
  mkfs.ext4 -q -F -N 3000000 "$img"  # room for UNDO's 1,000,000 files
  mount -o loop "$img" "$mnt"
  mounted=1
  echo "bench: fresh ext4 (with journal) on $mnt" >&2
else
  echo "bench: not root: running in $mnt on $(df --output=fstype "$mnt" | tail -1); figures are not comparable" >&2
fi
echo "bench: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), kernel $(uname -r)" >&2
python3 "$here/bench/bench.py" --dir "$mnt" --shim "$shim" --progs "$progs" "$@"
