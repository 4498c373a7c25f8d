#!/usr/bin/env bash
# Intake benchmark (issue 3): signed 1 KiB JSON webhooks over loopback, 64 connections.
# Builds --release, starts `hookspool intake` on a temporary home with an HMAC template
# source, and runs wrk three times:
#   1. group commit (intake.group_events_max = 256), 64 connections
#   2. a group of 1 (one transaction per request, the spec's behaviour), 64 connections
#   3. about 100 requests/s on one connection (latency at low load)
# For each run it prints committed requests/s (events in spool.db / duration), wrk's p50
# and p99 latency, non-2xx answers, and the intake's peak RSS (VmHWM).
# Usage: bench/intake.sh [duration_s]   (default 10). Needs wrk (installed with apt-get if
# absent), openssl and sqlite3.
set -euo pipefail

DURATION=${1:-10}
CONNS=64
HERE=$(cd "$(dirname "$0")/.." && pwd)
BIN="$HERE/target/release/hookspool"

if ! command -v wrk >/dev/null; then
    echo "installing wrk with apt-get" >&2
    apt-get install -y wrk >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y wrk >/dev/null; }
fi
for t in openssl sqlite3; do
    command -v "$t" >/dev/null || { echo "bench needs $t" >&2; exit 1; }
done

(cd "$HERE" && nice -n 10 cargo build --release --quiet)

WORK=$(mktemp -d)
trap 'kill "${PID:-0}" 2>/dev/null || true; rm -rf "$WORK"' EXIT
SECRET=bench-secret-0123456789
printf '%s' "$SECRET" > "$WORK/secret"
chmod 600 "$WORK/secret"

# A 1 KiB JSON body and its signature (HMAC over a fixed body is what a sender does).
PREFIX='{"repo":"octo/bench","action":"synchronize","pad":"'
BODY="$PREFIX$(head -c $((1024 - ${#PREFIX} - 2)) /dev/zero | tr '\0' 'x')\"}"
SIG=$(printf '%s' "$BODY" | openssl dgst -sha256 -hmac "$SECRET" -r | cut -d' ' -f1)
cat > "$WORK/post.lua" <<LUA
wrk.method = "POST"
wrk.body = '$BODY'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["X-Signature"] = "sha256=$SIG"
LUA
cp "$WORK/post.lua" "$WORK/slow.lua"
echo 'function delay() return 10 end' >> "$WORK/slow.lua"

run() { # name group_events_max lua conns threads
    local name=$1 group=$2 lua=$3 conns=$4 threads=$5
    local home="$WORK/home-$name"
    mkdir -p "$home"
    local port=$((20000 + RANDOM % 20000))
    cat > "$home/config.toml" <<TOML
[intake]
listen = "127.0.0.1:$port"
group_events_max = $group

[sources.bench]
type = "template"
scheme = "hmac-sha256-hex"
header = "X-Signature"
prefix = "sha256="
key = "payload.repo"
action = "http-sink"
secrets.secret = { file = "$WORK/secret" }

[destinations.http-sink]
type = "http"
url = "https://sink.invalid/hook"
TOML
    HOOKSPOOL_LOG_LEVEL=warn "$BIN" --home "$home" intake 2>"$home/intake.log" &
    PID=$!
    for _ in $(seq 100); do
        curl -s -o /dev/null "http://127.0.0.1:$port/healthz" 2>/dev/null && break
        sleep 0.1
    done
    local out
    out=$(wrk -t"$threads" -c"$conns" -d"${DURATION}s" --latency -s "$lua" "http://127.0.0.1:$port/hooks/bench")
    local events
    events=$(sqlite3 "$home/spool.db" "SELECT count(*) FROM events")
    local hwm
    hwm=$(awk '/VmHWM/ {print $2}' "/proc/$PID/status")
    kill -TERM "$PID"
    wait "$PID" || true
    local p50 p99 non2xx
    p50=$(echo "$out" | awk '$1 == "50%" {print $2}')
    p99=$(echo "$out" | awk '$1 == "99%" {print $2}')
    non2xx=$(echo "$out" | awk '/Non-2xx/ {print $5}')
    printf '%-14s committed %8.0f req/s   p50 %8s   p99 %8s   non-2xx %s   peak RSS %5.1f MiB\n' \
        "$name" "$(echo "$events / $DURATION" | bc -l)" "$p50" "$p99" "${non2xx:-0}" \
        "$(echo "$hwm / 1024" | bc -l)"
}

echo "hookspool intake benchmark: ${DURATION}s per run, 1 KiB signed JSON, $(nproc) cores"
run group-commit 256 "$WORK/post.lua" "$CONNS" 2
run group-of-1 1 "$WORK/post.lua" "$CONNS" 2
run 100-per-s 256 "$WORK/slow.lua" 1 1
