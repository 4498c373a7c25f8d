#!/usr/bin/env bash
# Intake benchmarks (issues 3 and 13): builds --release (the dev build with --smoke), installs
# wrk with apt-get if absent, and runs examples/bench_intake.rs:
#   wrk       the real `hookspool intake` under wrk with signed 1 KiB JSON webhooks: group
#             commit at 64 connections, a group of 1 at 64 connections, and about 100
#             requests/s on one connection; committed req/s, p50/p99, peak RSS, CPU per event
#   coalesce  20 000 signed webhooks over 200 keys with a 1 s quiet window through the real
#             `hookspool run` into a receiver: documents, order, events/s end to end
#   pg        the group-commit run on SQLite and on PostgreSQL (a throwaway cluster, issue 32),
#             alternated: committed req/s of both, hookspool and server CPU per event
# Usage: bench/intake.sh [--smoke] [--profile] [wrk [seconds] | coalesce [events] [keys] |
#   pg [seconds] [rounds] | all]
#   (default all). --profile records the intake with `perf record` during the group-commit
#   run into target/perf-intake.data (read it with `perf report -i ...`).
set -euo pipefail

HERE=$(cd "$(dirname "$0")/.." && pwd)
cd "$HERE"
args=() smoke=
for a in "$@"; do
    case "$a" in
        --smoke) smoke=--smoke ;;
        --profile) export BENCH_PERF_OUT="$HERE/target/perf-intake.data" ;;
        *) args+=("$a") ;;
    esac
done
if ! command -v wrk >/dev/null; then
    echo "installing wrk with apt-get" >&2
    apt-get install -y -qq wrk >/dev/null 2>&1 ||
        { apt-get update -qq >/dev/null && apt-get install -y -qq wrk >/dev/null; }
fi
if [ -n "$smoke" ]; then
    cargo build --quiet --bin hookspool --example bench_intake
    profile=debug
else
    nice -n 10 cargo build --release --quiet --bin hookspool --example bench_intake
    profile=release
fi
echo "hookspool intake benchmark, $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
HOOKSPOOL_BIN="$HERE/target/$profile/hookspool" \
    "$HERE/target/$profile/examples/bench_intake" "${args[@]:-all}" $smoke
