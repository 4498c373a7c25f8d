#!/bin/sh
# Bounded stress commands for the intake's hostile-sender faults (issue 17); see README.md
# beside this file for what each prints and the figures recorded.
#
#   tests/stress/intake.sh [slow-bodies|idle-flood|idle-flood-over-cap|two-intakes|body-starve|allocators|all]
#
# Everything runs on 127.0.0.1 against the release binary (HOOKSPOOL_BIN overrides it, e.g.
# to measure main's build), on a temporary home, and stops by itself. `allocators` runs
# slow-bodies and idle-flood once per binary named in HOOKSPOOL_ALLOCATOR_BINS
# ("name=/path name=/path ..."). Exits non-zero when any command's verdict is FAIL.
set -u
cd "$(dirname "$0")/../.." || exit 2
cargo build --release --bin hookspool --example stress_intake || exit 2
stress=target/release/examples/stress_intake
status=0
run() {
    echo "== stress_intake $* (load: $(cut -d' ' -f1-3 /proc/loadavg))"
    timeout 600 "$stress" "$@" || status=1
}
case "${1:-all}" in
    slow-bodies) run slow-bodies 2000 97 ;;
    idle-flood) run idle-flood 5000 500 15 ;;
    # Past the cap (8 192) with a flood that reconnects at once: figures only.
    idle-flood-over-cap) run idle-flood 12000 500 15 ;;
    two-intakes) run two-intakes 15 32 ;;
    # Issue 28: starving the budget of unverified bodies, then the same over many connections.
    body-starve)
        run body-starve 100 800 1000 20
        run body-starve 0 3000 30000 20
        ;;
    allocators)
        for pair in ${HOOKSPOOL_ALLOCATOR_BINS:?name=/path pairs}; do
            echo "=== allocator ${pair%%=*}"
            HOOKSPOOL_BIN=${pair#*=} run slow-bodies 2000 97
            HOOKSPOOL_BIN=${pair#*=} run idle-flood 5000 500 10
        done
        ;;
    all)
        run slow-bodies 2000 97
        run idle-flood 5000 500 15
        run two-intakes 15 32
        run body-starve 100 800 1000 20
        run body-starve 0 3000 30000 20
        ;;
    *)
        echo "usage: $0 [slow-bodies|idle-flood|idle-flood-over-cap|two-intakes|body-starve|allocators|all]" >&2
        exit 2
        ;;
esac
exit $status
