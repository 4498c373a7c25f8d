#!/usr/bin/env bash
# Runs each fuzz target for a bounded time from its committed seed corpus, one after the
# other on one thread, and exits non-zero if any target crashed (a panic, a failed property
# or a signal) or could not run.
#
#   fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]     (default: 60 s, every target)
#
# Needs `cargo install honggfuzz --version 0.5.58 --locked` and Debian's binutils-dev and
# libunwind-dev (.ci/run installs them). Without cargo-hfuzz it prints SKIPPED and exits 0,
# or fails under HOOKSPOOL_NO_SKIP=1. New corpus entries and crashes go to
# fuzz/hfuzz_workspace/<target>/ (ignored by git); the committed corpus is never rewritten.
# A crash reproduces without the fuzzer: fuzz/hfuzz_target/<host triple>/release/<target> FILE
# (any target binary given files runs each once and panics where the fuzzer crashed).
set -euo pipefail
cd "$(dirname "$0")"

secs=${1:-60}
shift || true
targets=("$@")
[ "${#targets[@]}" -gt 0 ] || targets=(capture source_flow select config recipe)

if ! command -v cargo-hfuzz >/dev/null 2>&1; then
    if [ "${HOOKSPOOL_NO_SKIP:-}" = 1 ]; then
        echo "fuzz: FAILED: cargo-hfuzz is not installed (cargo install honggfuzz --version 0.5.58 --locked)" >&2
        exit 1
    fi
    echo "SKIPPED: fuzz: cargo-hfuzz is not installed (cargo install honggfuzz --version 0.5.58 --locked)"
    exit 0
fi

# Every committed input through every target, uninstrumented (cargo test; the root's target
# directory already holds the dependencies), so a regression seed fails fast and readably.
CARGO_TARGET_DIR=../target cargo test --locked --quiet --lib >/dev/null

# The instrumented build; --locked keeps fuzz/Cargo.lock the one that was reviewed. The
# targets are then run with the honggfuzz binary that build made, as `cargo hfuzz run` would
# (which cannot take --locked: it slices every build argument to 9 bytes and panics on it).
mkdir -p hfuzz_workspace
if ! HFUZZ_BUILD_ARGS="--locked" cargo hfuzz build >hfuzz_workspace/build.log 2>&1; then
    tail -n 40 hfuzz_workspace/build.log
    echo "fuzz: FAILED: the instrumented build"
    exit 1
fi
triple=$(rustc -vV | sed -n 's/^host: //p')

failed=0
cpu_total=0
TIMEFORMAT='%3U %3S'
for t in "${targets[@]}"; do
    ws="hfuzz_workspace/$t"
    rm -rf "$ws/crashes" "$ws/new"
    mkdir -p "$ws/crashes" "$ws/new"
    log="$ws/run.log"
    # -n 1: one thread (the machine is shared); --rlimit_rss: an input that makes a target
    # hold more than 2 GiB is a finding too; -F: inputs up to 16 KiB (request heads, configs
    # and selectors are small; a body that large already crosses every code path).
    # The CPU time (user + system) of honggfuzz and the target, from bash's `time`.
    status=0
    { time hfuzz_target/honggfuzz -W "$ws" -f "corpus/$t" -P --run_time "$secs" -n 1 --timeout 10 \
        --rlimit_rss 2048 -F 16384 --output "$ws/new" --crashdir "$ws/crashes" \
        --exit_upon_crash --exit_code_upon_crash 99 --logfile "$log" \
        -- "hfuzz_target/$triple/release/$t" >/dev/null 2>&1; } 2>"$ws/cpu" || status=$?
    cpu_s=$(awk 'NF == 2 { print $1 + $2 }' "$ws/cpu")
    cpu_total=$(awk -v a="$cpu_total" -v b="${cpu_s:-0}" 'BEGIN { print a + b }')
    crashes=$(find "$ws/crashes" -type f -name '*.fuzz' | wc -l)
    summary=$(grep -ao 'Summary.*' "$log" | tail -n 1 || true)
    if [ "$status" -ne 0 ] || [ "$crashes" -gt 0 ] || [ -z "$summary" ]; then
        echo "fuzz $t: FAILED (exit $status, $crashes crash files in fuzz/$ws/crashes)"
        tail -n 40 "$log" 2>/dev/null || true
        failed=1
    else
        echo "fuzz $t: ok, ${secs} s, ${cpu_s:-?} CPU-s, $summary"
    fi
done
echo "fuzz: ${#targets[@]} targets, $(awk -v s="$cpu_total" 'BEGIN { printf "%.2f", s / 60 }') CPU-minutes in all"
exit "$failed"
