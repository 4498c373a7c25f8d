#!/usr/bin/env bash
# Dispatcher benchmarks (issues 5 and 13): builds --release (the dev build with --smoke), then
# runs examples/bench_dispatch.rs:
#   throughput  5 000 sealed batches over 5 000 keys, drained by the real `hookspool dispatch`
#               (parallel 16, max_inflight 16) into a local hyper receiver; deliveries/s from
#               the first claim to the last mark, and one candidate query over the backlog
#   slots       throughput with 64 requests in flight instead of 16 (for the record)
#   backlog     the same with 60 000 batches over 50 keys, drained for at most 20 s, twice,
#               between three 1-per-key drains (the ratio's denominator)
#   latency     50 signed webhooks sent one at a time through the real `hookspool run`
#               (immediate route): send -> 2xx and send -> receive, p50/p99
#   rate        200 sealed batches over 10 keys against a destination with max_per_s = 50,
#               burst = 1 (issue 35): the achieved start rate after the burst against the
#               limit (ratio), and the busiest second's starts against max_per_s + burst
#   tick        Engine::tick() with nothing ready on a spool of 1 000 000 delivered batches
#               (with events and attempts) and 10 000 open batches: mean/p99, per store call,
#               and the query plans
#   pg          throughput on SQLite and on PostgreSQL (a throwaway cluster, issue 32),
#               alternated: deliveries/s of both, hookspool and server CPU per delivery
#   pg_backlog  the candidate query over 60 000 batches on 50 keys, PostgreSQL and SQLite
#   pg_tick     tick on PostgreSQL (1 000 000 delivered batches, 10 000 open)
#   pg_latency  latency on PostgreSQL (issue 33): `hookspool intake` and `hookspool dispatch`
#               as two processes on a throwaway cluster (the wake-up through NOTIFY)
# Usage: bench/dispatch.sh [--smoke] [--profile] [all|throughput [n]|slots [n] [slots]|
#   backlog [n] [keys] [s]|pg [n] [rounds]|pg_backlog [n] [keys]|pg_tick [delivered] [open]|
#   pg_latency [n] [homes] [gap_ms]|latency [n] [gap_ms]|rate [n] [max_per_s] [burst]|tick [delivered] [open]] (default all). --profile records the dispatcher with
#   `perf record` during each drain into target/perf-dispatch.data (later drains: .2, .3, ...
#   appended). Needs about 1 GiB free in
#   $TMPDIR for the tick spool.
set -euo pipefail

HERE=$(cd "$(dirname "$0")/.." && pwd)
cd "$HERE"
args=() smoke=
for a in "$@"; do
    case "$a" in
        --smoke) smoke=--smoke ;;
        --profile) export BENCH_PERF_OUT="$HERE/target/perf-dispatch.data" ;;
        *) args+=("$a") ;;
    esac
done
if [ -n "$smoke" ]; then
    cargo build --quiet --bin hookspool --example bench_dispatch
    profile=debug
else
    nice -n 10 cargo build --release --quiet --bin hookspool --example bench_dispatch
    profile=release
fi
echo "hookspool dispatcher benchmark, $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
HOOKSPOOL_BIN="$HERE/target/$profile/hookspool" \
    "$HERE/target/$profile/examples/bench_dispatch" "${args[@]:-all}" $smoke
