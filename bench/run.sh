#!/usr/bin/env bash
# Every benchmark of issue 13 in one go, then ONE table: figure, value, ratio, target, and
# whether the target was met. The disk's fdatasync/s is measured first and last, on the
# filesystem the benchmark spools live on ($TMPDIR), and around the intake and dispatcher
# runs, for the record only: it moves by 10x within a minute on a shared machine (3 000 to
# 23 000 between days here), so no target is a ratio to it (issue 36). The speed targets are
# ratios measured in the same run: to the previous binary (the pair rows), to the HTTP
# ceiling, to another backlog shape, to the other backend.
#
# Usage: bench/run.sh [--smoke]
#   --smoke  tiny counts and the dev build (which `cargo test --all-targets` has already
#            built): a few seconds, every figure still printed. CI runs this; it fails when
#            a figure cannot be printed, never because a smoke figure misses its target.
# Needs what .ci/run installs plus wrk (installed with apt-get if absent).
# Each benchmark's own output goes to stderr; the table goes to stdout.
set -euo pipefail

HERE=$(cd "$(dirname "$0")/.." && pwd)
cd "$HERE"
SMOKE=
case "${1:-}" in
    --smoke) SMOKE=--smoke ;;
    "") ;;
    *) echo "usage: bench/run.sh [--smoke]" >&2; exit 2 ;;
esac

if ! command -v wrk >/dev/null; then
    echo "installing wrk with apt-get" >&2
    apt-get install -y -qq wrk >/dev/null 2>&1 ||
        { apt-get update -qq >/dev/null && apt-get install -y -qq wrk >/dev/null; }
fi

if [ -n "$SMOKE" ]; then
    cargo build --quiet --bins --examples
    PROFILE=debug
else
    nice -n 10 cargo build --release --quiet --bins --examples
    PROFILE=release
fi
EX="$HERE/target/$PROFILE/examples"
export HOOKSPOOL_BIN="$HERE/target/$PROFILE/hookspool"

# The binary to compare with in the paired intake runs (issue 36): f42c35e, the commit the
# issue measured as today's, or $BENCH_BASE_REV (any commit, e.g. main's before a change),
# built once from `git archive` into target/base (its own
# target directory: the first build compiles every dependency, ~10 minutes) and kept as
# target/base/hookspool-<commit>. --smoke compares this build with itself.
# base_bin <rev>: the path of <rev>'s release binary, built the first time.
base_bin() {
    local rev bin src
    rev=$(git rev-parse --short=12 "$1")
    bin="$HERE/target/base/hookspool-$rev"
    if [ ! -x "$bin" ]; then
        echo "building the base binary ($rev) into target/base" >&2
        src=$(mktemp -d)
        # -m: the files get the time of extraction, not the commit's, so cargo cannot take
        # an earlier revision's build in target/base (same package, older mtimes) as fresh.
        git archive "$rev" | tar -x -m -C "$src"
        (cd "$src" && nice -n 10 cargo build --release --quiet --bin hookspool \
            --target-dir "$HERE/target/base")
        cp "$HERE/target/base/release/hookspool" "$bin"
        rm -rf "$src"
    fi
    echo "$bin"
}
# The dispatcher's pair (issue 36) pre-fills its spool with this build's store, so its base
# must read this build's schema: $BENCH_DISPATCH_BASE_REV, by default 0f801d1 (main before
# the dispatcher's statements per delivery were cut; f42c35e, the issue's "today", has
# schema 8 and cannot open a schema-11 spool). Schema 12 only added a column SQLite's seal
# never reads, so the pair hands the base the spool as schema 11 (`as_schema_11` in
# examples/bench_dispatch.rs). Move it when the schema changes again.
if [ -n "$SMOKE" ]; then
    BASE_BIN=$HOOKSPOOL_BIN
    DISPATCH_BASE_BIN=$HOOKSPOOL_BIN
else
    BASE_BIN=$(base_bin "${BENCH_BASE_REV:-f42c35e}")
    DISPATCH_BASE_BIN=$(base_bin "${BENCH_DISPATCH_BASE_REV:-0f801d1}")
fi
export TMPDIR="${TMPDIR:-/tmp}"

FIGURES=$(mktemp)
MISSING=$(mktemp)
trap 'rm -f "$FIGURES" "$MISSING"' EXIT
failed=()

# run <label> <command...>: the benchmark's lines to stderr, its FIGURE lines kept.
run() {
    local label=$1 out
    shift
    echo "--- $label: $*" >&2
    out=$(mktemp)
    if ! "$@" >"$out" 2>&1; then
        failed+=("$label")
    fi
    cat "$out" >&2
    grep '^FIGURE ' "$out" >>"$FIGURES" || true
    rm -f "$out"
    # A benchmark that failed part-way has printed some figures; the missing ones fail below.
    return 0
}

{
    echo "hookspool benchmarks ${SMOKE:+(smoke) }$(date -u +%Y-%m-%dT%H:%MZ)"
    echo "machine: $(nproc) cores, $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "spool filesystem: $(df -T "$TMPDIR" | awk 'NR == 2 {print $1, $2}') ($TMPDIR)"
} >&2

run fsync "$EX/bench_fsync" $SMOKE
run enqueue "$EX/bench_enqueue" $SMOKE
run intake "$EX/bench_intake" wrk $SMOKE
# Today's binary, this build and the HTTP ceiling (bench_ceiling), alternated.
run pair env HOOKSPOOL_BASE_BIN="$BASE_BIN" "$EX/bench_intake" pair $SMOKE
# The writer's group bounds against each other (5 s per pair; two pairs at 1 s in smoke).
run sweep "$EX/bench_intake" sweep ${SMOKE:-5}
run coalesce "$EX/bench_intake" coalesce $SMOKE
run throughput "$EX/bench_dispatch" throughput $SMOKE
run dispatch_pair env HOOKSPOOL_BASE_BIN="$DISPATCH_BASE_BIN" "$EX/bench_dispatch" pair $SMOKE
run slots "$EX/bench_dispatch" slots $SMOKE
run backlog "$EX/bench_dispatch" backlog $SMOKE
run latency "$EX/bench_dispatch" latency $SMOKE
run tick "$EX/bench_dispatch" tick $SMOKE
# The PostgreSQL spool (issue 32): the intake and the dispatcher on a throwaway cluster
# against SQLite, alternated in the same run; the candidate query and the idle tick on it.
run pg_intake "$EX/bench_intake" pg $SMOKE
run pg_dispatch "$EX/bench_dispatch" pg $SMOKE
run pg_backlog "$EX/bench_dispatch" pg_backlog $SMOKE
run pg_tick "$EX/bench_dispatch" pg_tick $SMOKE
# Send -> receive on PostgreSQL (issue 33): `hookspool intake` and `hookspool dispatch` as two
# processes on a throwaway cluster, the intake's commit waking the dispatcher through NOTIFY.
run pg_latency "$EX/bench_dispatch" pg_latency $SMOKE
# The admin API (issue 31): the batches query per filter on 1 000 000 batches, and the
# intake's committed req/s with and without the dashboard open (same run).
run admin_query "$EX/bench_admin" query $SMOKE
run admin_intake "$EX/bench_admin" intake $SMOKE
# The retention pass's longest write lock (bench/retention.sh).
run retention "$HERE/bench/retention.sh" $SMOKE
# The disk again at the end: how much it moved while the run went on.
"$EX/bench_fsync" $SMOKE 2>&1 | sed -n 's/^FIGURE fdatasync_per_s /FIGURE fdatasync_end_per_s /p' >>"$FIGURES" || true

# The table. Each row: figure;label;ratio numerator;ratio denominator;ratio name;
# comparison;threshold;what the threshold applies to (value or ratio). An empty comparison
# is a figure printed for the record. The threshold may name another figure.
ROWS='fdatasync_per_s;disk fdatasync/s, 4 KiB overwrite (start of run);;;;;;
enqueue_cpu_us_per_event;store alone: enqueue CPU us per event, groups of 64;;;;;;
enqueue_group1_cpu_us_per_event;store alone: enqueue CPU us per event, groups of 1;;;;;;
pg_enqueue_per_s;store alone on PostgreSQL: enqueue events/s, groups of 64, against SQLite;pg_enqueue_per_s;enqueue_per_s;x SQLite;;;
pg_enqueue_group1_per_s;store alone on PostgreSQL: enqueue events/s, groups of 1, against SQLite;pg_enqueue_group1_per_s;enqueue_group1_per_s;x SQLite;;;
pg_enqueue_cpu_us_per_event;store alone on PostgreSQL: enqueue client CPU us per event, groups of 64;;;;;;
intake_fdatasync_per_s;disk fdatasync/s around the intake runs, fastest probe;;;;;;
intake_fdatasync_min_per_s;disk fdatasync/s around the intake runs, slowest probe;;;;;;
intake_committed_per_s;intake committed req/s, group commit, 64 conns;;;;;;
intake_group1_committed_per_s;intake committed req/s, group of 1, 64 conns;;;;;;
intake_committed_per_s;intake group commit against group of 1;intake_committed_per_s;intake_group1_committed_per_s;x group of 1;>=;6;ratio
intake_p99_ms;intake p99 ms at 64 conns, group commit;;;;<;20;value
intake_p50_ms;intake p50 ms at 64 conns, group commit;;;;;;
intake_peak_rss_mib;intake peak RSS MiB;;;;<;50;value
intake_writer_us_per_event;intake writer thread CPU us per event;;;;;;
intake_process_us_per_event;intake process CPU us per event;;;;;;
intake_requests_per_commit;intake requests per group commit (its /metrics);;;;;;
intake_100_per_s_p50_ms;intake p50 ms at 100 req/s, 1 conn;;;;;;
pair_base_committed_per_s;pair: the base binary (f42c35e), committed req/s, 64 conns;;;;;;
pair_new_committed_per_s;pair: this build, committed req/s, 64 conns;pair_new_committed_per_s;pair_base_committed_per_s;x base;>=;1.5;ratio
pair_ceiling_per_s;pair: HTTP ceiling (bare hyper + HMAC), 2xx/s;;;;;;
pair_new_committed_per_s;pair: this build against the ceiling (compass 0.5x);pair_new_committed_per_s;pair_ceiling_per_s;x ceiling;;;
pair_base_process_us_per_event;pair: the base binary, process CPU us per event;;;;;;
pair_new_process_us_per_event;pair: this build, process CPU us per event;;;;;;
pair_new_writer_us_per_event;pair: this build, writer thread CPU us per event;;;;;;
pair_ceiling_us_per_request;pair: ceiling process CPU us per request;;;;;;
pair_new_p99_ms;pair: this build, p99 ms at 64 conns;;;;<;20;value
pair_new_peak_rss_mib;pair: this build, peak RSS MiB;;;;<;50;value
coalesce_documents;coalescing: documents for the burst;;;;<=;coalesce_documents_max;value
coalesce_in_order;coalescing: every event once and in order (1 = yes);;;;=;1;value
coalesce_events_per_s;coalescing: events/s, first send to last document;;;;;;
dispatch_fdatasync_per_s;disk fdatasync/s around the drain, fastest probe;;;;;;
dispatch_deliveries_per_s;dispatcher deliveries/s, 1 batch per key;;;;;;
slots_deliveries_per_s;dispatcher deliveries/s, 1 batch per key, 64 slots;;;;;;
backlog_reference_deliveries_per_s;dispatcher deliveries/s, 1 per key, drains beside the backlog;;;;;;
backlog_deliveries_per_s;dispatcher deliveries/s, backlog on few keys;backlog_deliveries_per_s;backlog_reference_deliveries_per_s;x 1 per key beside;>=;0.8;ratio
backlog_deliveries_per_s;the same against the 1-per-key row above;backlog_deliveries_per_s;dispatch_deliveries_per_s;x 1 per key;;;
dispatch_candidates_ms;candidate query ms, 1 batch per key;;;;<;2;value
backlog_candidates_ms;candidate query ms, backlog on few keys;;;;<;2;value
dispatch_cpu_us_per_delivery;dispatcher process CPU us per delivery, 1 batch per key;;;;;;
dispatch_pair_base_deliveries_per_s;dispatcher pair: the base binary (BENCH_DISPATCH_BASE_REV), deliveries/s, 1 batch per key;;;;;;
dispatch_pair_new_deliveries_per_s;dispatcher pair: this build, deliveries/s, 1 batch per key;dispatch_pair_new_deliveries_per_s;dispatch_pair_base_deliveries_per_s;x base;>=;1.5;ratio
dispatch_pair_base_cpu_us_per_delivery;dispatcher pair: the base binary, process CPU us per delivery;;;;;;
dispatch_pair_new_cpu_us_per_delivery;dispatcher pair: this build, process CPU us per delivery;;;;;;
dispatch_pair_base_kib_per_delivery;dispatcher pair: the base binary, KiB written per delivery;;;;;;
dispatch_pair_new_kib_per_delivery;dispatcher pair: this build, KiB written per delivery;;;;;;
backlog_cpu_us_per_delivery;dispatcher process CPU us per delivery, backlog on few keys;;;;;;
dispatch_kib_per_delivery;dispatcher KiB written to disk per delivery, 1 batch per key;;;;;;
backlog_kib_per_delivery;dispatcher KiB written to disk per delivery, backlog on few keys;;;;;;
latency_receive_p50_ms;send -> receive p50 ms;latency_receive_p50_ms;latency_ack_p50_ms;x send -> 2xx;<=;1.5;ratio
latency_ack_p50_ms;send -> 2xx p50 ms;;;;;;
tick_p99_ms;idle tick p99 ms;;;;<;5;value
pg_intake_committed_per_s;intake on PostgreSQL: committed req/s, group commit, 64 conns, against SQLite;pg_intake_committed_per_s;pg_intake_sqlite_committed_per_s;x SQLite;>=;0.5;ratio
pg_intake_sqlite_committed_per_s;intake on SQLite, alternated with it: committed req/s;;;;;;
pg_intake_process_us_per_event;intake on PostgreSQL: hookspool process CPU us per event;pg_intake_process_us_per_event;pg_intake_sqlite_process_us_per_event;x SQLite;;;
pg_intake_server_us_per_event;intake on PostgreSQL: PostgreSQL server CPU us per event;;;;;;
pg_intake_p99_ms;intake on PostgreSQL: p99 ms at 64 conns;;;;;;
pg_round_trip_us;PostgreSQL: one round trip (prepared SELECT 1) us;;;;;;
pg_dispatch_deliveries_per_s;dispatcher on PostgreSQL: deliveries/s, 1 batch per key, against SQLite;pg_dispatch_deliveries_per_s;pg_dispatch_sqlite_deliveries_per_s;x SQLite;>=;0.5;ratio
pg_dispatch_sqlite_deliveries_per_s;dispatcher on SQLite, alternated with it: deliveries/s;;;;;;
pg_dispatch_cpu_us_per_delivery;dispatcher on PostgreSQL: hookspool CPU us per delivery;pg_dispatch_cpu_us_per_delivery;pg_dispatch_sqlite_cpu_us_per_delivery;x SQLite;;;
pg_dispatch_server_us_per_delivery;dispatcher on PostgreSQL: PostgreSQL server CPU us per delivery;;;;;;
pg_dispatch_candidates_ms;candidate query ms on PostgreSQL, 1 batch per key;;;;;;
pg_backlog_candidates_ms;candidate query ms on PostgreSQL, backlog on few keys;pg_backlog_candidates_ms;pg_backlog_sqlite_candidates_ms;x SQLite;<;2;value
pg_backlog_analyzed_candidates_ms;the same after ANALYZE batches (for the record);;;;;;
pg_tick_p99_ms;idle tick p99 ms on PostgreSQL;;;;<;5;value
pg_tick_analyzed_p99_ms;the same after ANALYZE batches (for the record);;;;;;
pg_latency_receive_p50_ms;send -> receive p50 ms on PostgreSQL, intake + dispatch processes;pg_latency_receive_p50_ms;pg_latency_ack_p50_ms;x send -> 2xx;<=;1.5;ratio
pg_latency_ack_p50_ms;send -> 2xx p50 ms on PostgreSQL;;;;;;
retention_write_lock_ms;retention pass longest write lock ms;retention_write_lock_ms;intake_busy_timeout_ms;x busy timeout;<=;0.1;ratio
retention_intake_wait_ms;retention pass: intake longest wait ms;;;;;;
admin_batches_none_p99_ms;admin: batches page of 100, no filter, p99 ms;;;;<;50;value
admin_batches_state_dead_p99_ms;admin: batches, state=dead (rare), p99 ms;;;;<;50;value
admin_batches_state_delivered_p99_ms;admin: batches, state=delivered, p99 ms;;;;<;50;value
admin_batches_source_p99_ms;admin: batches, source, p99 ms;;;;<;50;value
admin_batches_route_p99_ms;admin: batches, route, p99 ms;;;;<;50;value
admin_batches_destination_p99_ms;admin: batches, destination, p99 ms;;;;<;50;value
admin_batches_key_prefix_p99_ms;admin: batches, key prefix, p99 ms;;;;<;50;value
admin_batches_event_type_p99_ms;admin: batches, event type, p99 ms;;;;<;50;value
admin_batches_since_until_1h_p99_ms;admin: batches, 1 h window, p99 ms;;;;<;50;value
admin_batches_dedup_id_p99_ms;admin: batches, dedup id (one match), p99 ms;;;;<;50;value
admin_batches_json_path_p99_ms;admin: batches, JSON path = value (rare), p99 ms;;;;<;50;value
admin_batches_search_p99_ms;admin: batches, search (one match), p99 ms;;;;<;50;value
admin_intake_without_dashboard_per_s;admin: intake committed req/s, no dashboard;;;;;;
admin_intake_with_dashboard_per_s;admin: intake with the dashboard open;admin_intake_with_dashboard_per_s;admin_intake_without_dashboard_per_s;x without;>=;0.95;ratio
fdatasync_end_per_s;disk fdatasync/s (end of run);;;;;;'

awk -v rows="$ROWS" -v missing="$MISSING" '
function fmt(v) {
    if (v == "") return "";
    a = v < 0 ? -v : v;
    if (a >= 100) return sprintf("%.0f", v);
    if (a >= 10) return sprintf("%.1f", v);
    if (a >= 1) return sprintf("%.2f", v);
    return sprintf("%.3f", v);
}
function cmp(x, op, t) {
    if (op == ">=") return x >= t;
    if (op == "<=") return x <= t;
    if (op == "<") return x < t;
    if (op == "=") return x == t;
    return 0;
}
$1 == "FIGURE" { fig[$2] = $3 }
END {
    n = split(rows, line, "\n");
    printf "| %-58s | %10s | %-20s | %-26s | %-16s |\n", "figure", "value", "ratio", "target", "result";
    printf "| %-58s | %10s | %-20s | %-26s | %-16s |\n", "---", "---:", "---", "---", "---";
    bad = "";
    for (i = 1; i <= n; i++) {
        split(line[i], f, ";");
        id = f[1]; label = f[2]; num = f[3]; den = f[4]; rname = f[5]; op = f[6]; thr = f[7]; on = f[8];
        if (!(id in fig)) {
            printf "| %-58s | %10s | %-20s | %-26s | %-16s |\n", label, "-", "-", "-", "NOT PRINTED";
            bad = bad " " id;
            continue;
        }
        value = fig[id];
        ratio = ""; rtext = "";
        if (num != "") {
            if ((num in fig) && (den in fig) && fig[den] != 0) {
                ratio = fig[num] / fig[den];
                rtext = fmt(ratio) rname;
            } else {
                rtext = "-";
                if (!(den in fig)) bad = bad " " den;
            }
        }
        target = ""; result = "";
        if (op != "") {
            t = thr;
            tname = thr;
            if (thr in fig) { t = fig[thr]; tname = fmt(fig[thr]); }
            target = (on == "ratio") ? op " " tname rname : op " " tname;
            x = (on == "ratio") ? ratio : value;
            if (x == "") result = "-";
            else result = cmp(x + 0, op, t + 0) ? "met" : "missed";
        }
        printf "| %-58s | %10s | %-20s | %-26s | %-16s |\n", label, fmt(value), rtext, target, result;
    }
    print bad > missing;
}' "$FIGURES"

status=0
if [ "${#failed[@]}" -gt 0 ]; then
    echo "benchmarks that failed: ${failed[*]}" >&2
    status=1
fi
if [ -n "$(tr -d ' \n' <"$MISSING")" ]; then
    echo "figures not printed:$(cat "$MISSING")" >&2
    status=1
fi
exit $status
