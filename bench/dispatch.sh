#!/usr/bin/env bash
# Dispatcher benchmarks (issue 5). Builds --release, then runs examples/bench_dispatch.rs:
#   throughput  5 000 immediate batches over 5 000 keys, pre-filled through the store API and
#               drained by the real `hookspool dispatch` (parallel 16, max_inflight 16) into a
#               local hyper receiver; deliveries/s from the first claim to the last mark
#   latency     20 signed webhooks sent one at a time through the real `hookspool run`
#               (immediate route, http destination = the receiver): send -> receive p50/p99
#   tick        Engine::tick() with nothing ready on a spool of 1 000 000 delivered batches
#               (with events and attempts) and 10 000 open batches: mean/p99, per store call,
#               and the query plans
# Usage: bench/dispatch.sh [all|throughput [n]|latency [n]|tick [delivered] [open]]
# (default all). Needs about 1 GiB free in $TMPDIR for the tick spool.
set -euo pipefail

HERE=$(cd "$(dirname "$0")/.." && pwd)
cd "$HERE"
nice -n 10 cargo build --release --quiet --bin hookspool --example bench_dispatch
echo "hookspool dispatcher benchmark, $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)"
HOOKSPOOL_BIN="$HERE/target/release/hookspool" \
    cargo run --release --quiet --example bench_dispatch -- "${@:-all}"
