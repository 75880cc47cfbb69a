#!/usr/bin/env bash
# Fuzzes the journal reader for a bounded time (default 60 s; FUZZ_SECONDS to change).
# Works on the stable toolchain (no sanitizer). Any crash found is copied into
# tests/fuzz_corpus/, where `cargo test` replays it from then on.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
seconds=${FUZZ_SECONDS:-60}
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz
corpus=$(mktemp -d)
trap 'rm -rf "$corpus"' EXIT
cp "$here"/seeds/* "$corpus"/
cd "$here"
status=0
cargo fuzz run --sanitizer none journal_reader "$corpus" -- -max_total_time="$seconds" -rss_limit_mb=2048 || status=$?
if compgen -G "$here/artifacts/journal_reader/crash-*" >/dev/null; then
  cp "$here"/artifacts/journal_reader/crash-* "$here/../tests/fuzz_corpus/"
  echo "crashes copied to tests/fuzz_corpus/: fix them; cargo test replays them" >&2
fi
exit "$status"
