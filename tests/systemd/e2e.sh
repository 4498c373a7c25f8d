#!/usr/bin/env bash
# hookspool on a real systemd: build the .deb from this checkout, install it with apt-get in
# a booted Debian bookworm container (tests/systemd/sandbox.sh), and walk the steps of the
# packaging issue (1-11), then the bobbins' (12: a built-in bobbin instance added with a
# reload; 13: a private bobbin's exec processor under the dispatch unit), then the admin
# socket's (14: activation, the group rule, the idle exit). Prints one
# PASS/FAIL line per step (with indented details) and a final "N passed, M failed" line;
# exits 1 when a step failed.
#
# Skips (a SKIPPED line, exit 0) only when the container cannot run here at all: not root,
# or systemd-nspawn cannot boot the sandbox; with HOOKSPOOL_NO_SKIP=1 (CI) that is a failure.
#
# Knobs:
#   CARGO_TARGET_DIR   cargo's target dir; keep it between runs (default: ./target)
#   HOOKSPOOL_DEB      use this .deb instead of building one
#   SANDBOX_TOOL       default tests/systemd/sandbox.sh
#   SANDBOX_NAME, SANDBOX_DIR, SANDBOX_INCLUDE   passed to the tool. The default rootfs has
#                      python3 and no procps, so /bin/kill is absent: ExecReload must not
#                      need it.
#   E2E_KEEP=1         leave the container running at the end (for debugging)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
REPO=$PWD
HERE=$REPO/tests/systemd

export SANDBOX_NAME=${SANDBOX_NAME:-hookspool-e2e}
export SANDBOX_DIR=${SANDBOX_DIR:-/var/tmp/hookspool-e2e-sandbox}
export SANDBOX_INCLUDE=${SANDBOX_INCLUDE-python3}
SBX=${SANDBOX_TOOL:-$REPO/tests/systemd/sandbox.sh}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target}
WORK=$(mktemp -d /tmp/hookspool-e2e.XXXXXX)
CONFIG=/etc/hookspool/config.toml
INTAKE_PORT=8650          # the packaged socket's port
WATCHDOG_WAIT_S=75        # WatchdogSec=30s, RestartSec=2s, plus the restart itself
DELIVER_WAIT_S=30

passes=0; fails=0
pass() { echo "PASS $1"; passes=$((passes + 1)); }
fail() { echo "FAIL $1"; fails=$((fails + 1)); }
note() { echo "    $*"; }
# Each step collects problems in $why; the step passes when there are none.
why=()
problem() { why+=("$*"); note "not ok: $*"; }
ok() { note "ok: $*"; }
finish_step() {  # finish_step "N description"
    if [ ${#why[@]} -eq 0 ]; then pass "$1"; else fail "$1 (${why[0]})"; fi
    why=()
}

skip() {
    if [ "${HOOKSPOOL_NO_SKIP:-0}" = 1 ]; then
        echo "FAIL the systemd e2e test cannot run here and HOOKSPOOL_NO_SKIP=1: $*"
        echo "0 passed, 1 failed"; exit 1
    fi
    echo "SKIPPED: $*"
    echo "0 passed, 0 failed (skipped: the systemd container cannot run on this machine)"
    exit 0
}

S() { "$SBX" "$@"; }
X() { "$SBX" exec "$@"; }                       # run in the container
XU() { "$SBX" exec runuser -u hookspool -- env HOOKSPOOL_CONFIG=$CONFIG "$@"; }  # as hookspool
prop() { X systemctl show "$1" -p "$2" --value 2>/dev/null; }

cleanup() {
    if [ "${E2E_KEEP:-0}" = 1 ]; then
        echo "(E2E_KEEP=1: container $SANDBOX_NAME left running; stop it with SANDBOX_NAME=$SANDBOX_NAME SANDBOX_DIR=$SANDBOX_DIR $SBX down)"
    else
        S down >/dev/null 2>&1 || true
    fi
    rm -rf "$WORK"
}

# ------------------------------------------------------------------ can the container run?
[ "$(id -u)" = 0 ] || skip "needs root (systemd-nspawn, debootstrap, nsenter)"
[ -x "$SBX" ] || skip "sandbox tool not found at $SBX"

# ------------------------------------------------------------------ the package
deb=${HOOKSPOOL_DEB:-}
if [ -z "$deb" ]; then
    echo "== building the .deb (dpkg-buildpackage -b -us -uc; cargo target $CARGO_TARGET_DIR)"
    t0=$(date +%s)
    if ! command -v dh >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debhelper fakeroot >/dev/null 2>&1 \
            || { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debhelper fakeroot >/dev/null 2>&1; }
    fi
    if deb=$(packaging/build-deb.sh 2>"$WORK/build.log"); then
        echo "   built $deb in $(( $(date +%s) - t0 ))s"
    else
        deb=""
        echo "   the package build failed; last lines:"; tail -25 "$WORK/build.log" | sed 's/^/   | /'
    fi
fi

# ------------------------------------------------------------------ the container
if ! ss -Hltn "sport = :$INTAKE_PORT" 2>/dev/null | grep -q .; then :; else
    echo "   note: 127.0.0.1:$INTAKE_PORT is already in use on this host (the container shares its network); the socket unit cannot bind it"
fi
echo "== booting the systemd container ($SANDBOX_NAME)"
# systemd-nspawn puts its own seccomp filter on the container, and it refuses the landlock
# calls the dispatcher's script sandbox makes (EPERM), which a real host does not. Turning
# nspawn's filter off gives the container the host kernel's system calls, so the units' own
# SystemCallFilter= and the script sandbox are what is tested (step 11).
export SYSTEMD_SECCOMP=0
S down >/dev/null 2>&1 || true
if ! S up >"$WORK/up.log" 2>&1; then
    tail -15 "$WORK/up.log" | sed 's/^/   | /'
    S down >/dev/null 2>&1 || true
    skip "the systemd-nspawn container did not boot here (see above)"
fi
trap cleanup EXIT
X sh -c 'command -v kill >/dev/null; test -e /bin/kill' && note "(this rootfs has /bin/kill)" || note "(no /bin/kill in this rootfs: ExecReload must not need it)"
for f in receiver.py send.py admin.py; do S copy "$HERE/$f" /root/; done

# Host-side helpers.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
sign() { printf '%s' "$2" | openssl dgst -sha256 -hmac "$1" -r | cut -d' ' -f1; }
# send KIND WHERE PATH SECRET MARKER [extra send.py args]: a signed JSON webhook whose
# body carries MARKER; prints the status code or ERROR.
send() {
    local kind=$1 where=$2 path=$3 secret=$4 marker=$5; shift 5
    local body="{\"k\":\"$marker\",\"marker\":\"$marker\"}"
    printf '%s' "$body" >"$WORK/body"
    S copy "$WORK/body" /root/body >/dev/null
    X python3 /root/send.py "$kind" "$where" "$path" /root/body -H "X-Signature: $(sign "$secret" "$body")" "$@"
}
delivered() {  # how many deliveries carried MARKER so far
    local n; n=$(X sh -c 'grep -c -- "$1" /root/received 2>/dev/null' sh "$1")
    echo "${n:-0}"
}
wait_delivered() {  # wait_delivered MARKER [seconds]
    local i
    for i in $(seq 1 $(( ${2:-$DELIVER_WAIT_S} * 2 ))); do
        [ "$(delivered "$1")" -ge 1 ] && return 0
        sleep 0.5
    done
    return 1
}
journal_tail() { X journalctl -u "$1" --no-pager -n "${2:-5}" -o cat 2>/dev/null | sed 's/^/      | /'; }
journal_cursor() { X journalctl -u "$1" -n 0 --show-cursor --no-pager 2>/dev/null | sed -n 's/^-- cursor: //p'; }
# journal_since UNIT CURSOR: the unit's lines after CURSOR (all of them without one).
journal_since() { X journalctl -u "$1" ${2:+--after-cursor="$2"} --no-pager -o cat 2>/dev/null; }
# install_config FILE: FILE becomes $CONFIG with the packaged owner and mode.
install_config() { S copy "$1" $CONFIG >/dev/null; X chown root:hookspool $CONFIG; X chmod 0640 $CONFIG; }
# install_secret NAME VALUE: /etc/hookspool/secrets/NAME, hookspool's alone (0600).
install_secret() {
    printf '%s' "$2" >"$WORK/secret-$1"; S copy "$WORK/secret-$1" "/etc/hookspool/secrets/$1" >/dev/null
    X chown hookspool:hookspool "/etc/hookspool/secrets/$1"; X chmod 0600 "/etc/hookspool/secrets/$1"
}
# reload_intake STATUS_BEFORE: what an operator runs after editing the config, `systemctl
# reload hookspool-intake`. systemctl returns when ExecReload exits, before the intake has
# reloaded: wait for the intake's own answer (RELOADING=1 then READY=1 with a STATUS= other
# than STATUS_BEFORE, or its 'config reloaded' journal line). Records problems.
reload_intake() {
    local status_before=$1 cursor seen="" st as i
    cursor=$(journal_cursor hookspool-intake.service)
    if X systemctl reload hookspool-intake.service >"$WORK/reload.log" 2>&1; then
        ok "systemctl reload hookspool-intake: rc 0"
    else
        problem "systemctl reload failed: $(tr '\n' ' ' <"$WORK/reload.log")"; journal_tail hookspool-intake.service 4
        return
    fi
    for i in $(seq 1 40); do
        st=$(prop hookspool-intake.service StatusText); as=$(prop hookspool-intake.service ActiveState)
        if [ "$as" = active ] && [ -n "$st" ] && [ "$st" != "$status_before" ]; then seen="STATUS changed to '$st'"; break; fi
        if [ "$as" = active ] && journal_since hookspool-intake.service "$cursor" | grep -q 'config reloaded'; then seen="the intake logged 'config reloaded'"; break; fi
        sleep 0.5
    done
    [ -n "$seen" ] && ok "intake READY again: $seen" || problem "no sign of the intake's own READY after the reload (STATUS '${status_before}' unchanged, no reload line)"
}
# wait_dispatch_reloaded CURSOR: the dispatcher has no ExecReload; it reloads by itself when
# the config's mtime changes (checked every tick). Wait for its 'config reloaded' line after
# CURSOR (taken before the config was written). Records problems.
wait_dispatch_reloaded() {
    local i
    for i in $(seq 1 40); do
        if journal_since hookspool-dispatch.service "$1" | grep -q 'config reloaded'; then
            ok "the dispatcher reloaded the config by itself (its mtime changed)"; return
        fi
        sleep 0.5
    done
    problem "the dispatcher logged no 'config reloaded' within 20s of the config change"
    journal_tail hookspool-dispatch.service 4
}
# delivered_json MARKER: the body of the first delivery carrying MARKER, as one JSON line.
delivered_json() {
    X python3 -c '
import json, sys
for line in open("/root/received"):
    r = json.loads(line)
    if sys.argv[1] in r.get("body", ""):
        print(json.dumps(json.loads(r["body"]))); break
' "$1" 2>/dev/null
}
# field JSON EXPR: a Python expression over the document d, printed (empty when it fails).
field() { python3 -c 'import json, sys; d = json.loads(sys.argv[1]); print(eval(sys.argv[2]))' "$1" "$2" 2>/dev/null; }
SECRET=e2e-secret-$RANDOM$RANDOM
SECRET2=e2e-secret2-$RANDOM$RANDOM
RECEIVER_PORT=$(free_port)

# ================================================================== 1. install
if [ -n "$deb" ] && [ -f "$deb" ]; then
    S copy "$deb" /root/ && debname=$(basename "$deb")
    # Fresh package lists: the package's dependencies (ca-certificates) and nginx come from
    # the mirror.
    X apt-get update -qq >"$WORK/install.log" 2>&1
    if X env DEBIAN_FRONTEND=noninteractive apt-get install -y "/root/$debname" >>"$WORK/install.log" 2>&1; then
        ok "apt-get install /root/$debname"
    else
        problem "apt-get install failed"; tail -10 "$WORK/install.log" | sed 's/^/      | /'
    fi
else
    problem "no package was built"
fi
sleep 3   # let a failing dispatcher show itself (Restart=always, RestartSec=2s)
u=$(X getent passwd hookspool)
[[ $u == hookspool:*:/var/lib/hookspool:/usr/sbin/nologin ]] && ok "user: $u" || problem "user hookspool: '${u}'"
X getent group hookspool-proxy >/dev/null && ok "group hookspool-proxy exists" || problem "no hookspool-proxy group"
for spec in "/var/lib/hookspool hookspool:hookspool 700 directory" \
            "/etc/hookspool root:hookspool 750 directory" \
            "/etc/hookspool/config.toml root:hookspool 640 regular file" \
            "/etc/hookspool/secrets root:hookspool 750 directory" \
            "/run/hookspool root:root 755 directory" \
            "/run/hookspool/intake.sock root:hookspool-proxy 660 socket"; do
    read -r path want_owner want_mode want_type <<<"$spec"
    got=$(X stat -c '%U:%G %a %F' "$path" 2>/dev/null)
    [ "$got" = "$want_owner $want_mode $want_type" ] && ok "$path $got" || problem "$path is '${got:-missing}', want '$want_owner $want_mode $want_type'"
done
X grep -qx 'Environment=HOOKSPOOL_CONFIG=/etc/hookspool/config.toml' /lib/systemd/system/hookspool-intake.service \
    && ok "units point HOOKSPOOL_CONFIG at $CONFIG" || problem "HOOKSPOOL_CONFIG not set in the intake unit"
for unit in hookspool-intake.socket hookspool-dispatch.service; do
    [ "$(X systemctl is-enabled "$unit" 2>/dev/null)" = enabled ] && ok "$unit enabled" || problem "$unit not enabled"
done
[ "$(prop hookspool-intake.socket ActiveState)" = active ] && ok "hookspool-intake.socket active" || problem "socket not active: $(prop hookspool-intake.socket SubState)"
listen=$(prop hookspool-intake.socket Listen | tr '\n' ';')
note "socket Listen=$listen FileDescriptorName=$(prop hookspool-intake.socket FileDescriptorName)"
# Listening, seen from the kernel (connecting would start the intake).
X grep -q ' 0100007F:21CA 00000000:0000 0A ' /proc/net/tcp && ok "127.0.0.1:8650 is in LISTEN" || problem "nothing listens on 127.0.0.1:8650"
X awk '$6 == "01" && $8 == "/run/hookspool/intake.sock"' /proc/net/unix | grep -q . && ok "/run/hookspool/intake.sock is listening" || problem "/run/hookspool/intake.sock is not listening"
d_state=$(prop hookspool-dispatch.service ActiveState)/$(prop hookspool-dispatch.service SubState)
d_pid=$(prop hookspool-dispatch.service MainPID)
d_user=$( [ "${d_pid:-0}" != 0 ] && X stat -c %U "/proc/$d_pid" 2>/dev/null )
if [ "$d_state" = active/running ] && [ "$d_user" = hookspool ]; then
    ok "dispatcher running as $d_user (pid $d_pid)"
else
    problem "dispatcher is $d_state (user '${d_user:-none}', restarts $(prop hookspool-dispatch.service NRestarts))"
    journal_tail hookspool-dispatch.service 4
fi
i_state=$(prop hookspool-intake.service ActiveState)
[ "$i_state" = inactive ] && ok "intake service inactive until the first connection" || problem "intake service is $i_state before any connection"
# --man=no: the minimal rootfs has no man-db to resolve Documentation=man:hookspool(1); the
# page itself is checked below.
v=$(X systemd-analyze verify --man=no /lib/systemd/system/hookspool-intake.socket /lib/systemd/system/hookspool-intake.service /lib/systemd/system/hookspool-dispatch.service 2>&1)
[ -z "$v" ] && ok "systemd-analyze verify: clean" || { problem "systemd-analyze verify complains"; echo "$v" | sed 's/^/      | /'; }
X test -f /usr/share/man/man1/hookspool.1.gz && X test -f /usr/share/man/man5/hookspool.toml.5.gz \
    && X test -f /usr/share/bash-completion/completions/hookspool \
    && ok "man page and completions installed" || problem "man page or completions missing"
for unit in hookspool-intake.service hookspool-dispatch.service; do
    line=$(X systemd-analyze security --no-pager "$unit" 2>/dev/null | grep 'Overall exposure level')
    score=$(sed -n 's/.*: \([0-9.]*\) .*/\1/p' <<<"$line")
    if [ -n "$score" ] && awk -v s="$score" 'BEGIN{exit !(s < 3.0)}'; then ok "security $unit: ${line#*: }"; else problem "security $unit: '${line#*: }' (want OK or better, exposure < 3.0)"; fi
done
finish_step "1 install: socket listening, dispatcher running as hookspool, intake not started"

# ------------------------------------------------------------------ configure a source
X systemd-run --unit=e2e-receiver --quiet /usr/bin/python3 /root/receiver.py "$RECEIVER_PORT" /root/received
sed "s/@RECEIVER_PORT@/$RECEIVER_PORT/" "$HERE/e2e-config.toml" >"$WORK/config.toml"
S copy "$WORK/config.toml" $CONFIG
printf '%s' "$SECRET" >"$WORK/secret"; S copy "$WORK/secret" /etc/hookspool/secrets/demo
printf '%s' "$SECRET2" >"$WORK/secret2"; S copy "$WORK/secret2" /etc/hookspool/secrets/demo2
# A Standard Webhooks secret: whsec_ and the base64 of 32 random bytes.
printf 'whsec_%s' "$(head -c 32 /dev/urandom | base64 | tr -d '\n')" >"$WORK/secret3"; S copy "$WORK/secret3" /etc/hookspool/secrets/receiver
X chown root:hookspool $CONFIG; X chmod 0640 $CONFIG
X sh -c 'cd /etc/hookspool/secrets && chown hookspool:hookspool demo demo2 receiver && chmod 0600 demo demo2 receiver'
X systemctl reset-failed hookspool-dispatch.service >/dev/null 2>&1
X systemctl restart hookspool-dispatch.service >/dev/null 2>&1

# ================================================================== 2. TCP
code=$(send tcp 127.0.0.1:$INTAKE_PORT /hooks/demo "$SECRET" e2e-tcp-2)
[ "$code" = 200 ] && ok "POST 127.0.0.1:8650/hooks/demo -> $code" || problem "POST over TCP -> $code"
[ "$(prop hookspool-intake.service ActiveState)" = active ] && ok "the connection started hookspool-intake.service (pid $(prop hookspool-intake.service MainPID))" \
    || { problem "intake service is $(prop hookspool-intake.service ActiveState)/$(prop hookspool-intake.service Result)"; journal_tail hookspool-intake.service 4; }
if [ "$code" = 200 ]; then
    wait_delivered e2e-tcp-2 && ok "delivered to the receiver" || problem "not delivered within ${DELIVER_WAIT_S}s"
fi
got=$(X stat -c '%U:%G %a' /var/lib/hookspool/spool.db 2>/dev/null)
[ "$got" = "hookspool:hookspool 600" ] && ok "spool.db $got" || problem "spool.db is '${got:-missing}', want 'hookspool:hookspool 600'"
finish_step "2 signed webhook on 127.0.0.1:8650 starts the intake and is delivered"

# ================================================================== 3. Unix socket
code=$(send unix /run/hookspool/intake.sock /hooks/demo "$SECRET" e2e-unix-3)
[ "$code" = 200 ] && ok "POST via /run/hookspool/intake.sock -> $code" || problem "POST over the Unix socket -> $code"
if [ "$code" = 200 ]; then
    wait_delivered e2e-unix-3 && ok "delivered" || problem "not delivered within ${DELIVER_WAIT_S}s"
fi
finish_step "3 webhook through /run/hookspool/intake.sock is delivered"

# ================================================================== 4. reload
pid_before=$(prop hookspool-intake.service MainPID)
status_before=$(prop hookspool-intake.service StatusText)
code=$(send tcp 127.0.0.1:$INTAKE_PORT /hooks/demo2 "$SECRET2" e2e-before-reload-4)
note "before the reload: POST /hooks/demo2 -> $code (an unknown source)"
cat "$WORK/config.toml" "$HERE/e2e-config-reload.toml" >"$WORK/config2.toml"
S copy "$WORK/config2.toml" $CONFIG; X chown root:hookspool $CONFIG; X chmod 0640 $CONFIG
reload_intake "$status_before"
code=$(send tcp 127.0.0.1:$INTAKE_PORT /hooks/demo2 "$SECRET2" e2e-reload-4)
[ "$code" = 200 ] && ok "POST /hooks/demo2 after the reload -> $code" || problem "new source after reload -> $code"
pid_after=$(prop hookspool-intake.service MainPID)
[ "$pid_after" = "$pid_before" ] && [ "$pid_after" != 0 ] && ok "same main PID $pid_after" || problem "main PID $pid_before -> $pid_after"
if [ "$code" = 200 ]; then wait_delivered e2e-reload-4 && ok "delivered" || problem "not delivered"; fi
finish_step "4 systemctl reload picks up a new source without a new main PID"

# ================================================================== 5. stop, then socket-activated again
pid_before=$(prop hookspool-intake.service MainPID)
X systemctl stop hookspool-intake.service >/dev/null 2>&1
st=$(prop hookspool-intake.service ActiveState)
[ "$st" = inactive ] && ok "intake stopped ($st); socket $(prop hookspool-intake.socket ActiveState)" || problem "after stop the intake is $st"
code=$(send tcp 127.0.0.1:$INTAKE_PORT /hooks/demo "$SECRET" e2e-restart-5)
[ "$code" = 200 ] && ok "POST after stop -> $code (accepted, no connection refused)" || problem "POST after stop -> $code"
pid_now=$(prop hookspool-intake.service MainPID)
[ "$(prop hookspool-intake.service ActiveState)" = active ] && [ "$pid_now" != "$pid_before" ] && ok "started again from the socket (pid $pid_before -> $pid_now)" \
    || problem "intake not restarted by the socket ($(prop hookspool-intake.service ActiveState), pid $pid_now)"
if [ "$code" = 200 ]; then wait_delivered e2e-restart-5 && ok "delivered" || problem "not delivered"; fi
finish_step "5 stop the intake; the next webhook starts it from the socket and is accepted"

# ================================================================== 6. watchdog
d_pid=$(prop hookspool-dispatch.service MainPID); n0=$(prop hookspool-dispatch.service NRestarts)
if [ "$(prop hookspool-dispatch.service ActiveState)" != active ] || [ "${d_pid:-0}" = 0 ]; then
    problem "the dispatcher is not running ($(prop hookspool-dispatch.service ActiveState)/$(prop hookspool-dispatch.service SubState))"
else
    X systemctl kill -s SIGSTOP --kill-who=main hookspool-dispatch.service
    ok "SIGSTOP to dispatcher pid $d_pid"
    code=$(send tcp 127.0.0.1:$INTAKE_PORT /hooks/demo "$SECRET" e2e-watchdog-6)
    [ "$code" = 200 ] && ok "webhook spooled while the dispatcher is stopped -> $code" || problem "POST while stopped -> $code"
    [ "$(delivered e2e-watchdog-6)" = 0 ] && ok "not delivered while stopped" || problem "delivered although the dispatcher was stopped"
    restarted=""
    for i in $(seq 1 $WATCHDOG_WAIT_S); do
        p=$(prop hookspool-dispatch.service MainPID)
        if [ "$p" != "$d_pid" ] && [ "$p" != 0 ] && [ "$(prop hookspool-dispatch.service ActiveState)" = active ]; then restarted=$p; break; fi
        sleep 1
    done
    if [ -n "$restarted" ]; then
        ok "watchdog restarted the dispatcher after ~${i}s (pid $d_pid -> $restarted, NRestarts $n0 -> $(prop hookspool-dispatch.service NRestarts))"
        X journalctl -u hookspool-dispatch.service --no-pager -o cat | grep -m1 -i 'watchdog' | sed 's/^/      | /'
    else
        problem "no watchdog restart within ${WATCHDOG_WAIT_S}s"
        X systemctl kill -s SIGCONT --kill-who=main hookspool-dispatch.service >/dev/null 2>&1
    fi
    if [ "$code" = 200 ]; then wait_delivered e2e-watchdog-6 && ok "the spool drained: delivered after the restart" || problem "not delivered after the restart"; fi
fi
finish_step "6 SIGSTOP the dispatcher: the watchdog restarts it and the spool drains"

# ================================================================== 7. SIGKILL mid-delivery
d_pid=$(prop hookspool-dispatch.service MainPID)
if [ "$(prop hookspool-dispatch.service ActiveState)" != active ] || [ "${d_pid:-0}" = 0 ]; then
    problem "the dispatcher is not running"
else
    code=$(send tcp 127.0.0.1:$INTAKE_PORT /hooks/demo "$SECRET" SLOW-kill-7)
    [ "$code" = 200 ] && ok "slow webhook accepted -> $code" || problem "POST -> $code"
    if [ "$code" = 200 ] && wait_delivered SLOW-kill-7 20; then
        X systemctl kill -s SIGKILL --kill-who=main hookspool-dispatch.service
        ok "SIGKILL to dispatcher pid $d_pid while the receiver holds the delivery"
        for i in $(seq 1 60); do [ "$(delivered SLOW-kill-7)" -ge 2 ] && break; sleep 1; done
        n=$(delivered SLOW-kill-7)
        [ "$n" -ge 2 ] && ok "delivered again after the restart (pid $(prop hookspool-dispatch.service MainPID), $n arrivals)" || problem "not redelivered after the restart ($n arrivals)"
        sleep 2
        left=$(XU hookspool --json list 2>/dev/null | python3 -c 'import sys,json; rows=json.load(sys.stdin); print(sum(1 for r in rows if r.get("state") != "delivered"))' 2>/dev/null)
        [ "$left" = 0 ] && ok "hookspool list: every batch delivered" || problem "hookspool list: ${left:-?} batches not delivered"
    elif [ "$code" = 200 ]; then
        problem "the delivery never reached the receiver"
    fi
fi
finish_step "7 SIGKILL the dispatcher mid-delivery: the batch is delivered after the restart"

# ================================================================== 8. journal by batch
batch=$(X python3 -c '
import json
for line in open("/root/received"):
    r = json.loads(line)
    if "e2e-tcp-2" in r.get("body", ""):
        print({k.lower(): v for k, v in r["headers"].items()}.get("x-hookspool-batch", "")); break
' 2>/dev/null)
if [ -z "$batch" ]; then
    # No X-Hookspool-Batch header seen: take the oldest batch of source demo instead.
    batch=$(XU hookspool --json list --source demo 2>/dev/null | python3 -c 'import sys,json; print(min(r["id"] for r in json.load(sys.stdin)))' 2>/dev/null)
    [ -n "$batch" ] && note "no X-Hookspool-Batch header recorded; using the oldest demo batch, $batch"
fi
if [ -z "$batch" ]; then
    problem "no batch to look up"
else
    units=$(X journalctl BATCH="$batch" -o json --no-pager 2>/dev/null | python3 -c 'import sys,json; print(" ".join(sorted({json.loads(l).get("_SYSTEMD_UNIT","?") for l in sys.stdin if l.strip()})))')
    note "journalctl BATCH=$batch: units {$units}"
    [[ " $units " == *" hookspool-intake.service "* ]] && ok "intake lines for batch $batch" || problem "no intake line with BATCH=$batch"
    [[ " $units " == *" hookspool-dispatch.service "* ]] && ok "dispatcher lines for batch $batch" || problem "no dispatcher line with BATCH=$batch"
fi
finish_step "8 journalctl BATCH=<id> shows the batch from both services"

# ================================================================== 9. nginx, chunked, Unix socket
NGINX_PORT=$(free_port)
# Masked before the install so that Debian's nginx does not start its default site on the
# host's port 80 (the container shares the host network).
X systemctl mask nginx.service >/dev/null 2>&1
if X sh -c 'DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx-light' >"$WORK/nginx-install.log" 2>&1; then
    ok "Debian's nginx installed ($(X dpkg-query -W -f '${Version}' nginx-light))"
else
    problem "apt-get install nginx-light failed"; tail -5 "$WORK/nginx-install.log" | sed 's/^/      | /'
fi
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=hooks.test \
    -keyout "$WORK/privkey.pem" -out "$WORK/fullchain.pem" >/dev/null 2>&1
S copy "$WORK/fullchain.pem" /etc/ssl/hookspool/fullchain.pem
S copy "$WORK/privkey.pem" /etc/ssl/hookspool/privkey.pem
# The shipped example, with only the listen address and the server name changed.
X sh -c "sed -e 's/^\( *listen\) 443 ssl/\1 127.0.0.1:$NGINX_PORT ssl/' -e '/listen \[::\]:443/d' \
              -e 's/server_name hooks.example.com;/server_name hooks.test;/' \
              /usr/share/doc/hookspool/examples/nginx/hookspool.conf >/etc/nginx/sites-available/hookspool.conf \
         && rm -f /etc/nginx/sites-enabled/default \
         && ln -sf ../sites-available/hookspool.conf /etc/nginx/sites-enabled/hookspool.conf"
X gpasswd -a www-data hookspool-proxy >/dev/null 2>&1 && ok "www-data joined hookspool-proxy" || problem "could not add www-data to hookspool-proxy"
if X nginx -t >"$WORK/nginx-t.log" 2>&1; then ok "nginx -t: $(grep -m1 'syntax is ok' "$WORK/nginx-t.log" | sed 's/^nginx: //')"; else problem "nginx -t failed"; sed 's/^/      | /' "$WORK/nginx-t.log"; fi
X systemctl unmask nginx.service >/dev/null 2>&1
X systemctl restart nginx.service >/dev/null 2>&1 && ok "nginx running on 127.0.0.1:$NGINX_PORT" || { problem "nginx did not start"; journal_tail nginx.service 5; }
code=$(send tls 127.0.0.1:$NGINX_PORT /hooks/demo "$SECRET" e2e-nginx-9 --chunked)
[ "$code" = 200 ] && ok "chunked POST https://hooks.test/hooks/demo through nginx -> $code" || problem "chunked POST through nginx -> $code"
if [ "$code" = 200 ]; then wait_delivered e2e-nginx-9 && ok "delivered" || problem "not delivered"; fi
finish_step "9 nginx with the shipped example forwards a chunked signed webhook over the Unix socket"

# ================================================================== 11. the script sandbox under the unit
# Issue 6: the script sandbox and the shipped dispatch unit proven together. The self-test
# runs small scripts exactly as a script destination runs them, as user hookspool under the
# [Service] hardening of hookspool-dispatch.service, and reports each restriction.
S copy "$HERE/as-unit.sh" /root/ >/dev/null 2>&1 || true
if out=$(SANDBOX_TOOL=$SBX "$HERE/as-unit.sh" hookspool-dispatch.service /usr/bin/hookspool check --sandbox-selftest 2>&1); then
    ok "sandbox self-test under the dispatch unit"
else
    problem "sandbox self-test failed under the dispatch unit"
fi
printf '%s\n' "$out" | sed 's/^/      | /'
printf '%s\n' "$out" | grep -q ' 0 failed' || problem "a probe failed"
finish_step "11 the script sandbox holds under the dispatch unit's hardening, as user hookspool"

# ================================================================== 12. a built-in bobbin instance
# What an operator does to add a service that hookspool ships a bobbin for (issue 14): append
# one [bobbins.<instance>] table to the config (tests/systemd/e2e-config-bobbin.toml: GitHub's
# repository webhooks, delivering to the receiver), write its secret file, run `hookspool
# check`, then `systemctl reload hookspool-intake`. The dispatcher needs no command: it
# reloads itself when the config's mtime changes (there is no `systemctl reload
# hookspool-dispatch`). The webhook is the bobbin's own accepted capture
# (bobbins/github/repo/captures/push.http), its body byte for byte, signed as GitHub signs
# (X-Hub-Signature-256: sha256= and the hex HMAC-SHA256 of the body) with the operator's secret.
GH_SECRET=e2e-gh-secret-$RANDOM$RANDOM
for f in capture.py; do S copy "$HERE/$f" /root/ >/dev/null; done
S copy "$REPO/bobbins/github/repo/captures/push.http" /root/gh-push.http >/dev/null
X test -f /usr/share/hookspool/bobbins/github/repo/bobbin.toml && ok "the package ships /usr/share/hookspool/bobbins/github/repo" \
    || problem "/usr/share/hookspool/bobbins/github/repo/bobbin.toml is not installed"
install_secret gh "$GH_SECRET"
cat "$WORK/config2.toml" "$HERE/e2e-config-bobbin.toml" >"$WORK/config3.toml"
d_cursor=$(journal_cursor hookspool-dispatch.service)
pid_before=$(prop hookspool-intake.service MainPID)
status_before=$(prop hookspool-intake.service StatusText)
[ "$(prop hookspool-intake.service ActiveState)" = active ] && ok "intake running (pid $pid_before)" || problem "the intake is $(prop hookspool-intake.service ActiveState) before the step"
install_config "$WORK/config3.toml"
if out=$(XU hookspool check 2>&1); then ok "hookspool check (as hookspool): $(tail -1 <<<"$out")"; else problem "hookspool check failed"; printf '%s\n' "$out" | sed 's/^/      | /'; fi
expanded=$(XU hookspool bobbin expand gh 2>&1)
grep -q '^type = "github"' <<<"$expanded" && ok "hookspool bobbin expand gh: [sources.gh] type = \"github\"" || { problem "bobbin expand gh shows no github source"; printf '%s\n' "$expanded" | sed 's/^/      | /'; }
reload_intake "$status_before"
wait_dispatch_reloaded "$d_cursor"
marker=e2e-gh-12-$RANDOM$RANDOM
code=$(X python3 /root/capture.py 127.0.0.1:$INTAKE_PORT /hooks/gh /root/gh-push.http /etc/hookspool/secrets/gh --delivery "$marker")
[ "$code" = 200 ] && ok "push.http signed with the instance's secret: POST /hooks/gh -> $code" || problem "signed GitHub push to /hooks/gh -> $code"
printf '%s' "not-$GH_SECRET" >"$WORK/gh-wrong"; S copy "$WORK/gh-wrong" /root/gh-wrong >/dev/null
code_bad=$(X python3 /root/capture.py 127.0.0.1:$INTAKE_PORT /hooks/gh /root/gh-push.http /root/gh-wrong --delivery "$marker-wrong")
[ "$code_bad" = 401 ] && ok "the same push signed with another secret -> $code_bad" || problem "a push signed with the wrong secret -> $code_bad (want 401)"
if [ "$code" = 200 ]; then
    if wait_delivered "$marker"; then
        doc=$(delivered_json "$marker")
        et=$(field "$doc" 'd["event_meta"][0]["event_type"]'); ref=$(field "$doc" 'd["events"][0]["ref"]')
        [ "$et" = push ] && [ "$ref" = refs/tags/simple-tag ] && ok "delivered to the receiver: event_type $et, payload ref $ref, key $(field "$doc" 'd["key"]')" \
            || problem "delivered, but event_type '$et' and ref '$ref' (want push, refs/tags/simple-tag)"
    else
        problem "not delivered within ${DELIVER_WAIT_S}s"; journal_tail hookspool-dispatch.service 4
    fi
fi
[ "$(delivered "$marker-wrong")" = 0 ] && ok "the wrongly signed push was not delivered" || problem "the wrongly signed push was delivered"
pid_after=$(prop hookspool-intake.service MainPID)
[ "$pid_after" = "$pid_before" ] && [ "$pid_after" != 0 ] && ok "same intake main PID $pid_after" || problem "intake main PID $pid_before -> $pid_after"
finish_step "12 a [bobbins.gh] instance (github.repo) added with a reload: its signed push is accepted at /hooks/gh and delivered"

# ================================================================== 13. a private bobbin's exec processor
# A private bobbin (tests/systemd/bobbin/acme/widgets: the template source and an exec
# processor, process.py) installed where the spec puts private bobbins, a spool.bobbin_path
# directory (/etc/hookspool/bobbins, root-owned and not group- or other-writable: 14.3.6).
# The operator enables an instance (e2e-config-private.toml, and bobbin_path in [spool]),
# checks and reloads as in step 12. The instance expands to destination script:widgets, which
# the dispatcher runs as `hookspool processor widgets` inside its script sandbox, inside the
# dispatch unit; the processor keeps a count in its state (under the state dir) and each of
# its items is delivered to the receiver. process.py reports what it could reach and who ran it.
W_SECRET=e2e-widgets-secret-$RANDOM$RANDOM
S copy "$HERE/bobbin" /etc/hookspool/bobbins >/dev/null
X sh -c 'chown -R root:root /etc/hookspool/bobbins && chmod -R u=rwX,go=rX /etc/hookspool/bobbins && chmod 0755 /etc/hookspool/bobbins/acme/widgets/process.py'
got=$(X stat -c '%U:%G %a' /etc/hookspool/bobbins /etc/hookspool/bobbins/acme/widgets/process.py | tr '\n' ' ')
note "bobbin_path: /etc/hookspool/bobbins and process.py are $got"
install_secret widgets "$W_SECRET"
sed '/^home = /a bobbin_path = ["/etc/hookspool/bobbins"]' "$WORK/config3.toml" | cat - "$HERE/e2e-config-private.toml" >"$WORK/config4.toml"
d_cursor=$(journal_cursor hookspool-dispatch.service)
pid_before=$(prop hookspool-intake.service MainPID)
status_before=$(prop hookspool-intake.service StatusText)
install_config "$WORK/config4.toml"
if out=$(XU hookspool check 2>&1); then ok "hookspool check (as hookspool): $(tail -1 <<<"$out")"; else problem "hookspool check failed"; printf '%s\n' "$out" | sed 's/^/      | /'; fi
listed=$(XU hookspool bobbin list 2>&1)
grep -q 'acme\.widgets' <<<"$listed" && ok "hookspool bobbin list: $(grep -m1 'acme\.widgets' <<<"$listed" | tr -s ' ')" || { problem "bobbin list does not show acme.widgets"; printf '%s\n' "$listed" | sed 's/^/      | /'; }
reload_intake "$status_before"
wait_dispatch_reloaded "$d_cursor"
HOOKSPOOL_UID=$(X id -u hookspool)
STATE_FILE=/var/lib/hookspool/bobbins/widgets/state.json
count_n=0
for n in 1 2; do
    marker=e2e-widgets-13-$n-$RANDOM
    code=$(send tcp 127.0.0.1:$INTAKE_PORT /hooks/widgets "$W_SECRET" "$marker")
    [ "$code" = 200 ] && ok "webhook $n: POST /hooks/widgets -> $code" || { problem "webhook $n to /hooks/widgets -> $code"; continue; }
    if ! wait_delivered "$marker"; then
        problem "webhook $n: no widget item delivered within ${DELIVER_WAIT_S}s"
        journal_since hookspool-dispatch.service "$d_cursor" | grep -i 'widgets' | tail -4 | sed 's/^/      | /'
        continue
    fi
    doc=$(delivered_json "$marker")
    item=$(field "$doc" 'json.dumps(d["events"][0])')
    note "webhook $n: delivered $(field "$doc" 'd["event_meta"][0]["event_type"]') item $item"
    [ "$(field "$doc" 'd["event_meta"][0]["event_type"]')" = widget ] && [ "$(field "$item" 'd["bobbin"]')" = acme.widgets ] \
        && ok "webhook $n: the processor's widget item reached the receiver (source batch $(field "$item" 'd["source_batch"]'))" \
        || problem "webhook $n: the delivery is not acme.widgets' widget item"
    count_n=$(field "$item" 'd["count"]')
    [ "$count_n" = "$n" ] && ok "webhook $n: count $count_n (state kept between batches)" || problem "webhook $n: count '$count_n', want $n"
    if [ "$n" = 1 ]; then
        uid=$(field "$item" 'd["who"]["uid"]'); cg=$(field "$item" '" ".join(l for l in d["who"]["cgroup"].splitlines() if not l.endswith(":/"))'); parent=$(field "$item" '" ".join(d["who"]["parent"])')
        [ "$uid" = "$HOOKSPOOL_UID" ] && ok "the processor ran as uid $uid (hookspool)" || problem "the processor ran as uid '$uid', hookspool is $HOOKSPOOL_UID"
        [[ $cg == *hookspool-dispatch.service* ]] && ok "in the dispatch unit's cgroup ($cg)" || problem "processor cgroup '$cg' is not hookspool-dispatch.service's"
        [[ $parent == *"hookspool processor widgets" ]] && ok "started by '$parent'" || problem "its parent is '$parent', want 'hookspool processor widgets'"
        reach=$(field "$item" '",".join(k for k, v in sorted(d["reach"].items()) if v)')
        [ -z "$reach" ] && [ -n "$item" ] && ok "the sandbox kept it from the spool, the config, the secrets and the network" || problem "the processor could reach: $reach"
    fi
    st=$(X cat "$STATE_FILE" 2>/dev/null)
    [ "$(field "${st:-null}" 'd["values"]["count"]')" = "$n" ] && ok "$STATE_FILE holds count $n" || problem "$STATE_FILE is '${st:-missing}', want count $n"
done
got=$(X stat -c '%U:%G %a' "$STATE_FILE" 2>/dev/null)
[ "$got" = "hookspool:hookspool 600" ] && ok "$STATE_FILE $got" || problem "$STATE_FILE is '${got:-missing}', want 'hookspool:hookspool 600'"
journal_since hookspool-dispatch.service "$d_cursor" | grep -E 'destination=script:widgets .*outcome=ok' | head -2 | sed 's/^/      | /'
pid_after=$(prop hookspool-intake.service MainPID)
[ "$pid_after" = "$pid_before" ] && [ "$pid_after" != 0 ] && ok "same intake main PID $pid_after" || problem "intake main PID $pid_before -> $pid_after"
finish_step "13 a private bobbin (acme.widgets, bobbin_path) with an exec processor: run as hookspool under the dispatch unit, its items delivered, its state kept between batches"

# ================================================================== 14. the admin socket
# hookspool-admin.socket: the first request starts hookspool-admin.service, which serves a
# member of hookspool-admin (the overview, an action audited with the caller's uid), while
# another user cannot connect; it exits once idle (a drop-in shortens the packaged 10min to
# 5s) and the socket starts it again.
ADMIN_SOCK=/run/hookspool/admin.sock
got=$(X stat -c '%U:%G %a %F' $ADMIN_SOCK 2>/dev/null)
[ "$got" = "root:hookspool-admin 660 socket" ] && ok "$ADMIN_SOCK $got" || problem "$ADMIN_SOCK is '${got:-missing}', want 'root:hookspool-admin 660 socket'"
[ "$(X systemctl is-enabled hookspool-admin.socket 2>/dev/null)" = enabled ] && ok "hookspool-admin.socket enabled" || problem "hookspool-admin.socket not enabled"
v=$(X systemd-analyze verify --man=no /lib/systemd/system/hookspool-admin.socket /lib/systemd/system/hookspool-admin.service 2>&1)
[ -z "$v" ] && ok "systemd-analyze verify of the admin units: clean" || { problem "systemd-analyze verify complains about the admin units"; echo "$v" | sed 's/^/      | /'; }
line=$(X systemd-analyze security --no-pager hookspool-admin.service 2>/dev/null | grep 'Overall exposure level')
note "security hookspool-admin.service: ${line#*: }"
X mkdir -p /etc/systemd/system/hookspool-admin.service.d
X sh -c 'printf "[Service]\nExecStart=\nExecStart=/usr/bin/hookspool admin --idle-exit 5s\n" >/etc/systemd/system/hookspool-admin.service.d/e2e.conf'
X systemctl daemon-reload
X useradd --no-create-home --groups hookspool-admin e2e-operator 2>/dev/null
X useradd --no-create-home e2e-other 2>/dev/null
# /root is 0700: the helper goes where both users can run it.
X install -m 0755 /root/admin.py /usr/local/bin/e2e-admin.py
op_uid=$(X id -u e2e-operator)
[ "$(prop hookspool-admin.service ActiveState)" = inactive ] && ok "admin service inactive before the first request" || problem "admin service is $(prop hookspool-admin.service ActiveState) before any request"
out=$(X runuser -u e2e-operator -- python3 /usr/local/bin/e2e-admin.py $ADMIN_SOCK GET / 2>&1)
if [ "$(head -1 <<<"$out")" = 200 ] && grep -q '<h1>hookspool' <<<"$out"; then ok "e2e-operator (hookspool-admin) GET / -> 200, the overview"; else problem "GET / as e2e-operator: $(head -c 300 <<<"$out")"; fi
a_pid=$(prop hookspool-admin.service MainPID)
a_user=$( [ "${a_pid:-0}" != 0 ] && X stat -c %U "/proc/$a_pid" 2>/dev/null )
[ "$(prop hookspool-admin.service ActiveState)" = active ] && [ "$a_user" = hookspool ] && ok "the request started hookspool-admin.service as $a_user (pid $a_pid)" \
    || { problem "admin service is $(prop hookspool-admin.service ActiveState)/$(prop hookspool-admin.service Result), user '${a_user:-none}'"; journal_tail hookspool-admin.service 6; }
out=$(X runuser -u e2e-operator -- python3 /usr/local/bin/e2e-admin.py $ADMIN_SOCK GET /api/v1/status 2>&1)
dest=$(field "$(tail -n +2 <<<"$out")" 'sorted(d["destinations"])[0]')
if [ -n "$dest" ]; then
    out=$(X runuser -u e2e-operator -- python3 /usr/local/bin/e2e-admin.py $ADMIN_SOCK POST "/api/v1/destinations/$dest/pause" '{}' 2>&1)
    by=$(field "$(tail -n +2 <<<"$out")" 'd["by"]')
    [ "$(head -1 <<<"$out")" = 200 ] && [ "$by" = "uid:$op_uid" ] && ok "pause $dest as e2e-operator: audited as $by" || problem "pause as e2e-operator: $(head -c 300 <<<"$out")"
    X runuser -u e2e-operator -- python3 /usr/local/bin/e2e-admin.py $ADMIN_SOCK POST "/api/v1/destinations/$dest/resume" '{}' >/dev/null 2>&1
    journal_since hookspool-admin.service | grep -q "action by uid:$op_uid: pause $dest" && ok "the journal says who paused" || problem "no 'action by uid:$op_uid' line in the admin journal"
else
    problem "no destination in /api/v1/status: $(head -c 300 <<<"$out")"
fi
out=$(X runuser -u e2e-other -- python3 /usr/local/bin/e2e-admin.py $ADMIN_SOCK GET /api/v1/status 2>&1)
[[ $out == refused:* ]] && ok "e2e-other (not in hookspool-admin): $out" || problem "e2e-other reached the API: $(head -c 200 <<<"$out")"
for _ in $(seq 1 30); do
    st=$(prop hookspool-admin.service ActiveState); [ "$st" = inactive ] && break; sleep 1
done
[ "$st" = inactive ] && [ "$(prop hookspool-admin.service Result)" = success ] && ok "idle exit: the service is inactive (result success); socket $(prop hookspool-admin.socket ActiveState)" \
    || { problem "after the idle period the admin service is $st/$(prop hookspool-admin.service Result)"; journal_tail hookspool-admin.service 4; }
out=$(X runuser -u e2e-operator -- python3 /usr/local/bin/e2e-admin.py $ADMIN_SOCK GET /api/v1/status 2>&1)
[ "$(head -1 <<<"$out")" = 200 ] && ok "the next request starts it again (pid $(prop hookspool-admin.service MainPID))" || problem "after the idle exit: $(head -c 200 <<<"$out")"
X rm -rf /etc/systemd/system/hookspool-admin.service.d; X systemctl daemon-reload
finish_step "14 the admin socket starts hookspool-admin on the first request, serves a hookspool-admin member, refuses another user, exits when idle"

# ================================================================== 10. remove and purge
X systemctl stop nginx.service >/dev/null 2>&1
# Removal must stop a live socket and dispatcher: clear failures left by earlier steps and
# start them if they are down.
X systemctl reset-failed 'hookspool-*' >/dev/null 2>&1
X systemctl start hookspool-intake.socket hookspool-dispatch.service >/dev/null 2>&1
note "before remove: socket $(prop hookspool-intake.socket ActiveState), dispatcher $(prop hookspool-dispatch.service ActiveState)/$(prop hookspool-dispatch.service SubState)"
if X env DEBIAN_FRONTEND=noninteractive apt-get remove -y hookspool >"$WORK/remove.log" 2>&1; then ok "apt-get remove"; else problem "apt-get remove failed"; fi
for unit in hookspool-intake.socket hookspool-intake.service hookspool-dispatch.service hookspool-admin.socket hookspool-admin.service; do
    st=$(prop "$unit" ActiveState)/$(prop "$unit" SubState)
    case $st in inactive/*|failed/*) ok "$unit stopped ($st)" ;; *) problem "$unit is $st after remove" ;; esac
done
X test -e /usr/bin/hookspool && problem "/usr/bin/hookspool still there after remove" || ok "binary removed"
X test -f $CONFIG && ok "remove keeps $CONFIG (deleted only by purge)" || problem "remove deleted $CONFIG"
X test -d /var/lib/hookspool && ok "remove keeps /var/lib/hookspool" || problem "remove deleted the spool"
if X env DEBIAN_FRONTEND=noninteractive apt-get purge -y hookspool >"$WORK/purge.log" 2>&1; then ok "apt-get purge"; else problem "apt-get purge failed"; fi
grep -m1 'kept the spool' "$WORK/purge.log" | sed 's/^/      | /'
X test -e /etc/hookspool && problem "/etc/hookspool still there after purge" || ok "purge removed /etc/hookspool (config and secrets)"
X test -d /var/lib/hookspool && ok "purge keeps /var/lib/hookspool, as documented" || problem "purge deleted the spool"
X getent passwd hookspool >/dev/null && ok "the hookspool user stays (it owns the kept spool)" || problem "purge removed the user"
X test -e /run/hookspool/admin.sock && problem "/run/hookspool/admin.sock left behind" || ok "no admin socket left"
X test -e /run/hookspool/intake.sock && problem "/run/hookspool/intake.sock left behind" || ok "no socket left in /run/hookspool"
left=$(X sh -c 'ls /etc/systemd/system/*/hookspool* /lib/systemd/system/hookspool* 2>/dev/null')
[ -z "$left" ] && ok "no unit files or enablement links left" || problem "left behind: $left"
finish_step "10 remove stops and keeps config and spool; purge removes config, keeps the spool"

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
