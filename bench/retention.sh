#!/usr/bin/env bash
# Retention benchmark (issue 11). Builds --release, then runs examples/bench_retention.rs on
# three copies of a spool of [batches] delivered batches x [events_per_batch] events of
# [payload_bytes], all past retention (default 2 000 x 500 x 1 KiB = 1 000 000 event rows,
# about 1.2 GiB per copy): the retention of before issue 11
# (1 000 batches with their events per transaction), the PrunePass (<= 1 000 rows per
# transaction) and the real Engine::tick() running it, each beside an intake-like writer.
# Prints the longest write lock, the writer's longest wait and the longest tick.
# Usage: bench/retention.sh [batches] [events_per_batch] [payload_bytes]. Needs about 4 GiB
# free in $TMPDIR.
set -euo pipefail

HERE=$(cd "$(dirname "$0")/.." && pwd)
cd "$HERE"
nice -n 10 cargo build --release --quiet --example bench_retention
echo "hookspool retention benchmark, $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)"
cargo run --release --quiet --example bench_retention -- "$@"
