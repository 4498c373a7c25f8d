#!/bin/sh
# Bounded stress commands for the dispatcher's recovery faults (issue 28); see dispatch.md
# beside this file for what each prints and the figures recorded.
#
#   tests/stress/dispatch.sh [flap]
#
# Runs on 127.0.0.1 against the release binary (HOOKSPOOL_BIN overrides it, e.g. to
# measure main's build), on a temporary home, and stops by itself. Exits non-zero when the
# verdict is FAIL.
set -u
cd "$(dirname "$0")/../.." || exit 2
cargo build --release --bin hookspool --example stress_dispatch || exit 2
stress=target/release/examples/stress_dispatch
status=0
run() {
    echo "== stress_dispatch $* (load: $(cut -d' ' -f1-3 /proc/loadavg))"
    timeout 1200 "$stress" "$@" || status=1
}
case "${1:-flap}" in
    # Issue 28: 50 keys, a receiver flapping for 2 minutes (500, 200, refused, hanging).
    flap) run flap 50 120 6 ;;
    *)
        echo "usage: $0 [flap]" >&2
        exit 2
        ;;
esac
exit $status
