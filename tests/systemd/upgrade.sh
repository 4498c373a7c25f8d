#!/usr/bin/env bash
# `apt install hookspool` from a signed apt repository, then `apt upgrade` to the next
# version under load, on a real systemd (the container of tests/systemd/sandbox.sh), and the
# six steps of issue 18: install by name; events spooled with the receiver down; a load
# client through the whole upgrade; after it the new version, the kept config, the migrated
# schema and exactly-once delivery; the downgrade refused, remove and purge; lintian on both
# versions; and (step 7) an upgrade while the intake is idle, where a connection arriving as
# the new binary lands must still be served. One PASS/FAIL line per step (details
# indented), then "N passed, M failed"; exits 1 when a step failed.
#
# The two versions: this checkout (packaging/build-deb.sh, or HOOKSPOOL_DEB) and the test
# build of tests/systemd/build-next.sh (or HOOKSPOOL_NEXT_DEB), which bumps the version and
# adds one additive migration. The repository (packaging/apt-repo.sh) is signed with a
# throwaway key made here and trusted in the container with Signed-By=; it is served over
# HTTP on loopback inside the container.
#
# Skips (a SKIPPED line, exit 0) only when the container cannot run here: not root, or
# systemd-nspawn cannot boot; with HOOKSPOOL_NO_SKIP=1 (CI) a skip is a failure.
#
# Knobs: CARGO_TARGET_DIR, HOOKSPOOL_DEB, HOOKSPOOL_NEXT_DEB, SANDBOX_TOOL, SANDBOX_NAME,
# SANDBOX_DIR (default: the e2e test's, so both share one debootstrapped rootfs),
# E2E_KEEP=1 (leave the container running).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
REPO=$PWD
HERE=$REPO/tests/systemd

export SANDBOX_NAME=${SANDBOX_NAME:-hookspool-upgrade}
export SANDBOX_DIR=${SANDBOX_DIR:-/var/tmp/hookspool-e2e-sandbox}
export SANDBOX_INCLUDE=${SANDBOX_INCLUDE-python3}
SBX=${SANDBOX_TOOL:-$HERE/sandbox.sh}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target}
WORK=$(mktemp -d /tmp/hookspool-upgrade.XXXXXX)
CONFIG=/etc/hookspool/config.toml
INTAKE=127.0.0.1:8650                   # the packaged socket
RETRY_AFTER_MAX_S=60                    # a 503 must say when to come back, and soon
SHARE_503_MAX=0.05                      # at most this share of the load's answers is 503
DRAIN_HOLD_S=9                          # the slow receiver's hold; the dispatcher drains 10 s
DELIVER_WAIT_S=150                      # receiver back -> every batch delivered

passes=0; fails=0
pass() { echo "PASS $1"; passes=$((passes + 1)); }
fail() { echo "FAIL $1"; fails=$((fails + 1)); }
note() { echo "    $*"; }
why=()
problem() { why+=("$*"); note "not ok: $*"; }
ok() { note "ok: $*"; }
step_t0=$(date +%s)
finish_step() {  # finish_step "N description"
    local t=$(( $(date +%s) - step_t0 ))
    if [ ${#why[@]} -eq 0 ]; then pass "$1 (${t}s)"; else fail "$1 (${t}s; ${why[0]})"; fi
    why=(); step_t0=$(date +%s)
}
skip() {
    if [ "${HOOKSPOOL_NO_SKIP:-0}" = 1 ]; then
        echo "FAIL the upgrade test cannot run here and HOOKSPOOL_NO_SKIP=1: $*"
        echo "0 passed, 1 failed"; exit 1
    fi
    echo "SKIPPED: $*"
    echo "0 passed, 0 failed (skipped: the systemd container cannot run on this machine)"
    exit 0
}

S() { "$SBX" "$@"; }
X() { "$SBX" exec "$@"; }
XU() { "$SBX" exec runuser -u hookspool -- env HOOKSPOOL_CONFIG=$CONFIG "$@"; }
prop() { X systemctl show "$1" -p "$2" --value 2>/dev/null; }
APT() { X env DEBIAN_FRONTEND=noninteractive "$@" </dev/null; }
# Judgements of upgrade/check.py, one "ok ..." or "not-ok ..." line each.
judge() {
    local verdict text
    while read -r verdict text; do
        if [ "$verdict" = ok ]; then ok "$text"; else problem "$text"; fi
    done < <(X python3 /root/check.py "$@" 2>&1 || echo "not-ok check.py $1 failed")
}
export_spool() { XU hookspool export >"$WORK/export.jsonl" 2>/dev/null && S copy "$WORK/export.jsonl" /root/export.jsonl; }
unfinished() { export_spool && X python3 /root/check.py states /root/export.jsonl; }
send_one() {  # send_one SOURCE KEY MARKER: prints the status
    X python3 /root/load.py once $INTAKE "/hooks/$1" /etc/hookspool/secrets/load "$2" "$3"
}
journal_tail() { X journalctl -u "$1" --no-pager -n "${2:-5}" -o cat 2>/dev/null | sed 's/^/      | /'; }
exe_version() { X sh -c '[ "$1" != 0 ] && "/proc/$1/exe" --version' sh "$1" 2>/dev/null; }
listen_inode() {  # the inode of the socket listening on 127.0.0.1:8650 (0100007F:21CA)
    X awk '$2 == "0100007F:21CA" && $4 == "0A" { print $10 }' /proc/net/tcp
}

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

# ------------------------------------------------------------------ host tools
need=()
command -v dh >/dev/null || need+=(debhelper fakeroot)
command -v apt-ftparchive >/dev/null || need+=(apt-utils)
command -v gpg >/dev/null || need+=(gnupg)
command -v lintian >/dev/null || need+=(lintian)
if [ ${#need[@]} -gt 0 ]; then
    echo "== installing host tools: ${need[*]}"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"; } >"$WORK/host-tools.log" 2>&1 \
        || { tail -5 "$WORK/host-tools.log"; echo "FAIL host tools could not be installed"; echo "0 passed, 1 failed"; exit 1; }
fi

# ------------------------------------------------------------------ the two packages
t0=$(date +%s)
deb1=${HOOKSPOOL_DEB:-}
if [ -z "$deb1" ]; then
    echo "== building the current version (packaging/build-deb.sh)"
    deb1=$(packaging/build-deb.sh 2>"$WORK/build1.log") || { tail -20 "$WORK/build1.log"; deb1=""; }
fi
deb2=${HOOKSPOOL_NEXT_DEB:-}
if [ -z "$deb2" ]; then
    echo "== building the next version (tests/systemd/build-next.sh)"
    deb2=$(tests/systemd/build-next.sh 2>"$WORK/build2.log") || { tail -20 "$WORK/build2.log"; deb2=""; }
fi
if [ ! -f "$deb1" ] || [ ! -f "$deb2" ]; then
    echo "FAIL the packages could not be built (current '${deb1}', next '${deb2}')"; echo "0 passed, 1 failed"; exit 1
fi
deb1=$(realpath "$deb1"); deb2=$(realpath "$deb2")
v1=$(dpkg-deb -f "$deb1" Version); v2=$(dpkg-deb -f "$deb2" Version)
echo "   current $v1: $deb1"
echo "   next    $v2: $deb2 (built or found in $(( $(date +%s) - t0 ))s)"
dpkg --compare-versions "$v2" gt "$v1" || { echo "FAIL $v2 is not newer than $v1"; echo "0 passed, 1 failed"; exit 1; }

# ------------------------------------------------------------------ the signed repository
export GNUPGHOME=$WORK/gnupg
mkdir -m 0700 "$GNUPGHOME"
gpg --batch --passphrase '' --quick-gen-key "hookspool upgrade test, throwaway <upgrade-test@hookspool.invalid>" ed25519 sign 1d >/dev/null 2>&1
KEY=$(gpg --batch --with-colons --list-secret-keys 2>/dev/null | awk -F: '$1 == "fpr" { print $10; exit }')
[ -n "$KEY" ] || { echo "FAIL could not make the throwaway signing key"; echo "0 passed, 1 failed"; exit 1; }
APTREPO=$WORK/apt
HOOKSPOOL_APT_KEY=$KEY packaging/apt-repo.sh "$APTREPO" "$deb1" >/dev/null \
    || { echo "FAIL packaging/apt-repo.sh failed"; echo "0 passed, 1 failed"; exit 1; }

# ------------------------------------------------------------------ the container
echo "== booting the systemd container ($SANDBOX_NAME)"
export SYSTEMD_SECCOMP=0     # as in e2e.sh: the units' own filters are what is tested
S down >/dev/null 2>&1 || true
if ! S up >"$WORK/up.log" 2>&1; then
    tail -15 "$WORK/up.log" | sed 's/^/   | /'
    S down >/dev/null 2>&1 || true
    skip "the systemd-nspawn container did not boot here (see above)"
fi
trap cleanup EXIT
for f in receiver.py load.py upgrade/check.py; do S copy "$HERE/$f" /root/; done
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
APT_PORT=$(free_port); MAIN_PORT=$(free_port); SLOW_PORT=$(free_port)
S copy "$APTREPO" /srv/hookspool-apt
X systemd-run --unit=upgrade-apt-http --quiet /usr/bin/python3 -m http.server "$APT_PORT" --bind 127.0.0.1 --directory /srv/hookspool-apt
S copy "$APTREPO/hookspool-archive-keyring.gpg" /etc/apt/keyrings/hookspool-archive-keyring.gpg
X chmod 0644 /etc/apt/keyrings/hookspool-archive-keyring.gpg
sources() {  # sources KEYRING: the operator's deb822 entry, as the README has it
    printf 'Types: deb\nURIs: http://127.0.0.1:%s/\nSuites: stable\nComponents: main\nSigned-By: %s\n' "$APT_PORT" "$1" >"$WORK/hookspool.sources"
    S copy "$WORK/hookspool.sources" /etc/apt/sources.list.d/hookspool.sources
}
step_t0=$(date +%s)

# ================================================================== 1. apt install hookspool
# The signature is enforced: trusting another key, apt refuses the repository.
sources /usr/share/keyrings/debian-archive-keyring.gpg
if APT apt-get update >"$WORK/update-wrong.log" 2>&1; then
    problem "apt-get update accepted the repository signed by a key it was not told to trust"
else
    ok "with Signed-By= another key, apt-get update refuses it: $(grep -m1 -o 'NO_PUBKEY [0-9A-F]*\|is not signed' "$WORK/update-wrong.log")"
fi
sources /etc/apt/keyrings/hookspool-archive-keyring.gpg
if APT apt-get update >"$WORK/update.log" 2>&1; then ok "apt-get update with Signed-By=/etc/apt/keyrings/hookspool-archive-keyring.gpg"
else problem "apt-get update failed"; tail -5 "$WORK/update.log" | sed 's/^/      | /'; fi
cand=$(X apt-cache policy hookspool | sed -n 's/^ *Candidate: //p')
[ "$cand" = "$v1" ] && ok "candidate $cand from $(X apt-cache policy hookspool | grep -m1 -o "http://127.0.0.1:$APT_PORT stable/main [a-z0-9]*")" || problem "candidate is '$cand', want $v1"
if APT apt install -y hookspool >"$WORK/install.log" 2>&1; then ok "apt install -y hookspool"
else problem "apt install hookspool failed"; tail -10 "$WORK/install.log" | sed 's/^/      | /'; fi
sleep 3
got=$(X dpkg-query -W -f '${Version} ${db:Status-Abbrev}' hookspool 2>/dev/null)
[ "$got" = "$v1 ii " ] && ok "installed: hookspool $got" || problem "dpkg says '$got'"
[ "$(prop hookspool-intake.socket ActiveState)" = active ] && ok "hookspool-intake.socket active" || problem "socket $(prop hookspool-intake.socket ActiveState)"
d_pid=$(prop hookspool-dispatch.service MainPID)
d_user=$( [ "${d_pid:-0}" != 0 ] && X stat -c %U "/proc/$d_pid" 2>/dev/null )
[ "$(prop hookspool-dispatch.service SubState)" = running ] && [ "$d_user" = hookspool ] && ok "dispatcher running as $d_user (pid $d_pid)" \
    || { problem "dispatcher $(prop hookspool-dispatch.service SubState) as '${d_user:-none}'"; journal_tail hookspool-dispatch.service 4; }
[ "$(prop hookspool-intake.service ActiveState)" = inactive ] && ok "intake waits for its first connection" || problem "intake is $(prop hookspool-intake.service ActiveState)"
got=$(X stat -c '%U:%G %a' $CONFIG 2>/dev/null)
[ "$got" = "root:hookspool 640" ] && X cmp -s $CONFIG /usr/share/hookspool/config.toml \
    && ok "$CONFIG $got, written from /usr/share/hookspool/config.toml" || problem "$CONFIG is '${got:-missing}' or not the shipped default"
cf=$(X dpkg-query -W -f '${Conffiles}' hookspool)
[ -z "$cf" ] && ok "no conffiles: an upgrade has nothing to prompt about" || problem "conffiles: $cf"
finish_step "1 apt install hookspool from the signed repository; services up as the hardened user"

# ------------------------------------------------------------------ the administrator's edit
head -c 32 /dev/urandom | base64 | tr -d '\n' >"$WORK/load-secret"
printf 'whsec_%s' "$(head -c 32 /dev/urandom | base64 | tr -d '\n')" >"$WORK/receiver-secret"
sed -e "s/@MAIN_PORT@/$MAIN_PORT/" -e "s/@SLOW_PORT@/$SLOW_PORT/" "$HERE/upgrade/config.toml" >"$WORK/config.toml"
configure() {  # the secrets and the edited config, then a dispatcher on them
    S copy "$WORK/load-secret" /etc/hookspool/secrets/load
    S copy "$WORK/receiver-secret" /etc/hookspool/secrets/receiver
    X sh -c 'cd /etc/hookspool/secrets && chown hookspool:hookspool load receiver && chmod 0600 load receiver'
    S copy "$WORK/config.toml" $CONFIG; X chown root:hookspool $CONFIG; X chmod 0640 $CONFIG
    XU hookspool check >"$WORK/check.log" 2>&1 || { echo "   hookspool check refused the test config:"; sed 's/^/   | /' "$WORK/check.log"; }
    X systemctl restart hookspool-dispatch.service
}
configure
config_sum=$(X sha256sum $CONFIG | cut -d' ' -f1)
X systemd-run --unit=upgrade-receiver-slow --quiet --setenv=RECEIVER_HOLD_S=$DRAIN_HOLD_S /usr/bin/python3 /root/receiver.py "$SLOW_PORT" /root/received-slow
X touch /root/received-slow /root/received-main

# ================================================================== 2. spooled with the receiver down
X rm -f /root/load-pre.stop /root/load-pre.jsonl /root/acked.txt
X systemd-run --unit=upgrade-load-pre --quiet /usr/bin/python3 /root/load.py $INTAKE /hooks/load /etc/hookspool/secrets/load /root/load-pre.jsonl /root/load-pre.stop --rate 20 --workers 2 --keys 12
sleep 3; X touch /root/load-pre.stop
for m in hold-2-a hold-2-b; do
    code=$(send_one hold hold-2 "$m")
    [ "$code" = 200 ] && X sh -c 'echo "$1" >>/root/acked.txt' sh "$m" || problem "POST /hooks/hold ($m) -> $code"
done
for _ in $(seq 1 20); do [ "$(prop upgrade-load-pre.service ActiveState)" = active ] || break; sleep 0.5; done
n_pre=$(X sh -c 'grep -c "\"status\": 200" /root/load-pre.jsonl' 2>/dev/null)
[ "${n_pre:-0}" -gt 0 ] && ok "$n_pre webhooks accepted on /hooks/load (12 keys), 2 on /hooks/hold" || problem "no webhook accepted before the upgrade"
seen=""
for _ in $(seq 1 40); do
    st=$(unfinished)
    if [[ " $st " == *" open="* && " $st " == *" sealed="* && " $st " == *" retry="* ]]; then seen=$st; break; fi
    sleep 1
done
[ -n "$seen" ] && ok "batches: $seen" || problem "not all of open, sealed (pending) and retry present: $st"
[ "$(X sh -c 'grep -c body /root/received-main' 2>/dev/null)" = 0 ] && ok "the main receiver is down: nothing delivered" || problem "something reached the main receiver"
# A batch that has failed on the old version: its whole life is looked up in step 4.
jbatch=$(X python3 -c '
import json
for l in open("/root/export.jsonl"):
    r = json.loads(l)
    if r.get("record") == "batch" and r["state"] == "retry":
        print(r["id"]); break')
[ -n "$jbatch" ] && ok "batch $jbatch is in retry (for the journal in step 4)" || problem "no batch in retry to follow"
i_pid_old=$(prop hookspool-intake.service MainPID); d_pid_old=$(prop hookspool-dispatch.service MainPID)
schema_old=$(XU hookspool --json status 2>/dev/null | grep -o '"schema": *[0-9]*' | tr -dc 0-9)
note "before the upgrade: intake pid $i_pid_old, dispatcher pid $d_pid_old, schema $schema_old"
finish_step "2 events spooled with the receiver down: open, pending and retry batches"

# ================================================================== 3. apt upgrade under load
HOOKSPOOL_APT_KEY=$KEY packaging/apt-repo.sh "$APTREPO" "$deb2" >/dev/null || problem "publishing $v2 failed"
S copy "$APTREPO" /srv/hookspool-apt
# From now on the hookspool repository is the container's only source, so `apt upgrade`
# upgrades exactly hookspool whatever the Debian mirror has published since the rootfs.
X sh -c 'mv /etc/apt/sources.list /etc/apt/sources.list.off 2>/dev/null; for f in /etc/apt/sources.list.d/*; do case $f in */hookspool.sources) ;; *) mv "$f" "$f.off" ;; esac; done; true'
APT apt-get update >"$WORK/update2.log" 2>&1 || problem "apt-get update (with $v2 published) failed"
versions=$(X apt-cache madison hookspool | awk -F'|' '{gsub(/ /,"",$2); print $2}' | tr '\n' ' ')
[[ " $versions " == *" $v1 "* && " $versions " == *" $v2 "* ]] && ok "the repository holds $versions" || problem "the repository holds '$versions'"
sock_since=$(prop hookspool-intake.socket ActiveEnterTimestampMonotonic); inode_old=$(listen_inode)
X sh -c 'rm -f /root/load.stop /root/load.jsonl'
X systemd-run --unit=upgrade-load --quiet /usr/bin/python3 /root/load.py $INTAKE /hooks/load /etc/hookspool/secrets/load /root/load.jsonl /root/load.stop --rate 40 --workers 4 --keys 12
sleep 2
# A delivery in flight when the upgrade stops the dispatcher: the slow receiver holds it.
code=$(send_one drain drain-3 SLOW-drain-3)
[ "$code" = 200 ] && X sh -c 'echo SLOW-drain-3 >>/root/acked.txt' || problem "POST /hooks/drain -> $code"
for _ in $(seq 1 40); do X grep -q SLOW-drain-3 /root/received-slow && break; sleep 0.25; done
X grep -q SLOW-drain-3 /root/received-slow && ok "the slow receiver holds a delivery (${DRAIN_HOLD_S}s)" || problem "the drain delivery never arrived"
t_up0=$(date +%s.%N)
if APT apt upgrade -y >"$WORK/upgrade.log" 2>&1; then rc=0; else rc=$?; fi
t_up1=$(date +%s.%N)
up_s=$(awk -v a="$t_up0" -v b="$t_up1" 'BEGIN { printf "%.1f", b - a }')
[ "$rc" = 0 ] && ok "apt upgrade -y: rc 0 in ${up_s}s, stdin /dev/null, no --force-conf* option" || { problem "apt upgrade failed (rc $rc)"; tail -15 "$WORK/upgrade.log" | sed 's/^/      | /'; }
grep -n 'hookspool\|applied\|migrate\|Unpacking\|Setting up' "$WORK/upgrade.log" | grep -v '^.*WARNING' | sed 's/^/      | /' | head -12
grep -qi 'conffile\|Configuration file' "$WORK/upgrade.log" && problem "the upgrade mentions a configuration file prompt" || ok "no conffile prompt"
sleep 3; X touch /root/load.stop
for _ in $(seq 1 80); do [ "$(prop upgrade-load.service ActiveState)" = active ] || break; sleep 0.5; done
cover=$(X python3 -c '
import json, sys
rows = [json.loads(l) for l in open("/root/load.jsonl")]
print(int(min(r["t0"] for r in rows) < float(sys.argv[1]) and max(r["t1"] for r in rows) > float(sys.argv[2])))' "$t_up0" "$t_up1" 2>/dev/null)
[ "$cover" = 1 ] && ok "the load ran before, through and after apt upgrade" || problem "the load did not cover the whole upgrade"
judge answers /root/load.jsonl "$RETRY_AFTER_MAX_S" "$SHARE_503_MAX"
[ "$(prop hookspool-intake.socket ActiveEnterTimestampMonotonic)" = "$sock_since" ] && [ "$(listen_inode)" = "$inode_old" ] && [ -n "$inode_old" ] \
    && ok "the socket never stopped: same listening socket (inode $inode_old), active since before the upgrade" || problem "the socket was restarted (inode $inode_old -> $(listen_inode))"
i_pid_new=$(prop hookspool-intake.service MainPID)
[ "$i_pid_new" != "$i_pid_old" ] && [ "$i_pid_new" != 0 ] && ok "the intake was restarted behind it (pid $i_pid_old -> $i_pid_new)" || problem "intake pid $i_pid_old -> $i_pid_new"
export_spool
judge spool /root/export.jsonl /root/load-pre.jsonl /root/load.jsonl /root/acked.txt
finish_step "3 apt upgrade under load: nothing refused, no 5xx but a bounded 503, every 2xx in the spool"

# ================================================================== 4. after the upgrade
got=$(X dpkg-query -W -f '${Version} ${db:Status-Abbrev}' hookspool 2>/dev/null)
[ "$got" = "$v2 ii " ] && ok "installed: hookspool $got" || problem "dpkg says '$got'"
d_pid_new=$(prop hookspool-dispatch.service MainPID)
for pid in "$i_pid_new" "$d_pid_new"; do
    ver=$(exe_version "$pid")
    [[ $ver == *"$v2"* ]] && ok "pid $pid runs '$ver'" || problem "pid $pid runs '${ver:-nothing}', want $v2"
    # build-next.sh's binary says what it is (HOOKSPOOL_TEST_BUILD, build.rs).
    [[ $ver == *"(test build: "* ]] && ok "pid $pid's --version says it is a test build" || problem "pid $pid's --version does not say it is a test build: '${ver:-nothing}'"
done
[ "$(X sha256sum $CONFIG | cut -d' ' -f1)" = "$config_sum" ] && ok "$CONFIG unchanged (sha256 ${config_sum:0:16}...)" || problem "$CONFIG changed"
X grep -q "upgrade test build $v2" /usr/share/hookspool/config.toml && ok "the new default is beside it, in /usr/share/hookspool/config.toml" || problem "/usr/share/hookspool/config.toml is not $v2's"
left=$(X sh -c 'ls /etc/hookspool | grep -v "^config.toml$\|^secrets$"')
[ -z "$left" ] && ok "no .dpkg-dist/.dpkg-new/.dpkg-old beside it" || problem "left in /etc/hookspool: $left"
schema_new=$(XU hookspool --json status 2>/dev/null | grep -o '"schema": *[0-9]*' | tr -dc 0-9)
[ -n "$schema_old" ] && [ "$schema_new" = $((schema_old + 1)) ] && ok "schema $schema_old -> $schema_new (current for $v2)" || problem "schema '$schema_old' -> '$schema_new'"
grep -c "^applied 0*$schema_new .*upgrade_probe" "$WORK/upgrade.log" | grep -qx 1 \
    && ok "postinst ran the migration once: '$(grep -m1 "applied 0*$schema_new" "$WORK/upgrade.log")'" || problem "the upgrade log does not show the migration applied exactly once"
probe=$(X runuser -u hookspool -- python3 -c '
import sqlite3
c = sqlite3.connect("file:/var/lib/hookspool/spool.db?mode=ro", uri=True)
rows = c.execute("SELECT applied_at FROM upgrade_probe").fetchall()
print(len(rows), rows[0][0] if rows else 0)' 2>&1)
read -r probe_n probe_t <<<"$probe"
d_start=$(date -d "$(prop hookspool-dispatch.service ExecMainStartTimestamp)" +%s 2>/dev/null)
if [ "$probe_n" = 1 ] && [ -n "$d_start" ] && awk -v a="$probe_t" -v b="$d_start" 'BEGIN { exit !(a <= b + 1) }'; then
    ok "upgrade_probe holds 1 row: migrated at $(date -d "@${probe_t%.*}" +%T), the new dispatcher started at $(date -d "@$d_start" +%T)"
else
    problem "upgrade_probe: '$probe' (want 1 row, before the dispatcher's start $d_start)"
fi
if XU hookspool migrate >"$WORK/migrate.log" 2>&1; then problem "hookspool migrate ran beside the dispatcher"
else rc=$?; [ "$rc" = 3 ] && ok "dispatch.lock: hookspool migrate beside the dispatcher exits 3 ($(head -c 100 "$WORK/migrate.log"))" || problem "hookspool migrate exited $rc"; fi
# The drain: the old dispatcher was told to stop while the slow receiver held its delivery,
# waited for the answer, and nobody delivered that batch again.
stop_t=$(X journalctl -u hookspool-dispatch.service -o json --no-pager | python3 -c '
import json, sys
t0, t1 = float(sys.argv[1]), float(sys.argv[2])
for l in sys.stdin:
    r = json.loads(l)
    t = int(r["__REALTIME_TIMESTAMP"]) / 1e6
    if r.get("MESSAGE", "").startswith("Stopping") and r.get("_PID") == "1" and t0 <= t <= t1:
        print(t); break' "$t_up0" "$t_up1" 2>/dev/null)
answered_t=$(X python3 -c '
import json
for l in open("/root/received-slow"):
    r = json.loads(l)
    if r.get("held_answered"): print(r["t"]); break' 2>/dev/null)
if [ -n "$stop_t" ] && [ -n "$answered_t" ] && awk -v s="$stop_t" -v a="$answered_t" 'BEGIN { exit !(s < a) }'; then
    ok "the old dispatcher was stopped $(awk -v s="$stop_t" -v a="$answered_t" 'BEGIN { printf "%.1f", a - s }')s before the held delivery was answered"
else
    problem "no delivery was in flight when the dispatcher stopped (stop at '${stop_t}', answer at '${answered_t}')"
fi
X journalctl -u hookspool-dispatch.service --no-pager -o cat | grep -q 'attempts in flight' \
    && problem "a dispatcher stopped with attempts in flight" || ok "no dispatcher stopped with attempts in flight"
# Bobbins: every file the package ships matches the new package, nothing else is there.
v=$(X dpkg --verify hookspool 2>&1)
[ -z "$v" ] && ok "dpkg --verify hookspool: every shipped file is $v2's" || problem "dpkg --verify: $(head -3 <<<"$v" | tr '\n' ' ')"
X grep -q "upgrade test build $v2" /usr/share/hookspool/bobbins/README.md && ok "/usr/share/hookspool/bobbins/README.md is $v2's" || problem "the bobbins are not $v2's"
extra=$(X sh -c 'find /usr/share/hookspool/bobbins -type f | sort >/tmp/on-disk; dpkg -L hookspool | grep "^/usr/share/hookspool/bobbins/" | sort >/tmp/listed; comm -23 /tmp/on-disk /tmp/listed')
[ -z "$extra" ] && ok "no file under /usr/share/hookspool/bobbins that $v2 does not ship" || problem "left over: $extra"
# The receiver comes back: every event, before and during the upgrade, delivered once.
X systemd-run --unit=upgrade-receiver-main --quiet /usr/bin/python3 /root/receiver.py "$MAIN_PORT" /root/received-main
t_back=$(date +%s)
for _ in $(seq 1 $((DELIVER_WAIT_S / 2))); do
    st=$(unfinished); [[ $st == *" unfinished=0" ]] && break; sleep 2
done
[[ $st == *" unfinished=0" ]] && ok "receiver back: every batch delivered within $(( $(date +%s) - t_back ))s ($st)" || problem "after ${DELIVER_WAIT_S}s: $st"
sleep 2; export_spool
judge delivered /root/export.jsonl /root/received-main /root/received-slow -- /root/load-pre.jsonl /root/load.jsonl /root/acked.txt
if [ -n "$jbatch" ]; then
    pids=$(X journalctl BATCH="$jbatch" -o json --no-pager | python3 -c 'import sys,json; print(" ".join(sorted({json.loads(l).get("_PID","?") for l in sys.stdin if l.strip()})))')
    note "journalctl BATCH=$jbatch: pids {$pids}"
    for want in "$i_pid_old:intake $v1" "$d_pid_old:dispatcher $v1" "$d_pid_new:dispatcher $v2"; do
        [[ " $pids " == *" ${want%%:*} "* ]] && ok "lines from the ${want#*:} (pid ${want%%:*})" || problem "no BATCH=$jbatch line from the ${want#*:} (pid ${want%%:*})"
    done
    X journalctl BATCH="$jbatch" --no-pager -o short-precise | sed -n '1,2p;$p' | sed 's/^/      | /'
fi
finish_step "4 after the upgrade: new version, config kept, schema current, each batch delivered once, BATCH= across both versions"

# ================================================================== 5. downgrade refused; remove, purge
sum_before=$(XU hookspool export 2>/dev/null | sha256sum | cut -d' ' -f1)
if APT apt install -y --allow-downgrades "hookspool=$v1" >"$WORK/downgrade.log" 2>&1; then
    problem "the downgrade to $v1 was not refused"
else
    ok "apt install --allow-downgrades hookspool=$v1 refused (rc $?)"
fi
grep -m4 'hookspool: refusing\|knows schema\|restore the backup' "$WORK/downgrade.log" | sed 's/^/      | /'
grep -q "is at schema $schema_new" "$WORK/downgrade.log" && grep -q "knows schema $schema_old at most" "$WORK/downgrade.log" \
    && grep -q 'restore the backup' "$WORK/downgrade.log" && ok "the refusal names schema $schema_new and $schema_old and what to do" || problem "the refusal does not name both schemas and what to do"
got=$(X dpkg-query -W -f '${Version} ${db:Status-Abbrev}' hookspool 2>/dev/null)
[ "$got" = "$v2 ii " ] && ok "still installed: $got" || problem "after the refusal dpkg says '$got'"
[ "$(XU hookspool export 2>/dev/null | sha256sum | cut -d' ' -f1)" = "$sum_before" ] && ok "the spool's export is byte-identical before and after" || problem "the spool changed"
schema_now=$(XU hookspool --json status 2>/dev/null | grep -o '"schema": *[0-9]*' | tr -dc 0-9)
[ "$schema_now" = "$schema_new" ] && ok "schema still $schema_now" || problem "schema now '$schema_now'"
sleep 2
code=$(send_one load load-k0 after-refusal-5)
[ "$code" = 200 ] && ok "the intake still accepts (POST -> $code), dispatcher $(prop hookspool-dispatch.service SubState)" || problem "after the refusal POST -> $code"
# The product refuses the same way: the current version's binary on the newer spool.
S copy "$deb1" /root/current.deb
X sh -c 'rm -rf /opt/hookspool-current && dpkg-deb -x /root/current.deb /opt/hookspool-current'
out=$(XU /opt/hookspool-current/usr/bin/hookspool check 2>&1); rc=$?
[ "$rc" = 2 ] && [[ $out == *"schema $schema_new is newer than schema $schema_old"* ]] && ok "hookspool $v1 itself: exit 2, '$(grep -m1 -o "database schema.*" <<<"$out" | head -c 220)'" \
    || problem "hookspool $v1 on schema $schema_new: exit $rc, '$(head -c 200 <<<"$out")'"
# Remove and purge, as the README says.
if APT apt remove -y hookspool >"$WORK/remove.log" 2>&1; then ok "apt remove"; else problem "apt remove failed"; fi
for unit in hookspool-intake.socket hookspool-intake.service hookspool-dispatch.service; do
    st=$(prop "$unit" ActiveState); case $st in inactive|failed) ok "$unit $st" ;; *) problem "$unit is $st after remove" ;; esac
done
X test -e /usr/bin/hookspool && problem "binary left after remove" || ok "binary removed"
[ "$(X sha256sum $CONFIG 2>/dev/null | cut -d' ' -f1)" = "$config_sum" ] && ok "remove keeps $CONFIG as edited" || problem "remove changed $CONFIG"
X test -f /var/lib/hookspool/spool.db && ok "remove keeps the spool" || problem "remove deleted the spool"
if APT apt purge -y hookspool >"$WORK/purge.log" 2>&1; then ok "apt purge"; else problem "apt purge failed"; fi
grep -m1 'kept the spool' "$WORK/purge.log" | sed 's/^/      | /'
X test -e /etc/hookspool && problem "/etc/hookspool left after purge" || ok "purge removed /etc/hookspool (config and secrets)"
X test -f /var/lib/hookspool/spool.db && ok "purge keeps /var/lib/hookspool" || problem "purge deleted the spool"
X getent passwd hookspool >/dev/null && ok "the hookspool user stays" || problem "purge removed the user"
# With the binary gone, the guard reads the kept spool's header: installing the older
# version over it is refused the same way.
if APT apt install -y "hookspool=$v1" >"$WORK/reinstall.log" 2>&1; then
    problem "installing $v1 over the kept schema-$schema_new spool was not refused"
else
    grep -q "is at schema $schema_new" "$WORK/reinstall.log" && ok "a fresh install of $v1 over the kept spool is refused too (read from its header)" \
        || problem "installing $v1 over the kept spool failed without the refusal"
fi
finish_step "5 the downgrade is refused, naming both schemas, spool untouched; remove and purge as the README says"

# ================================================================== 7. upgrade with an idle intake
# No sender right before the upgrade: the intake is not running when the new binary lands,
# and the dispatcher is draining a delivery, so postinst migrates only some seconds later.
# A webhook sent right then must still be accepted, by the old intake that preinst started:
# the new binary refuses the not yet migrated spool, and a few quick failures make systemd
# take the socket down (service-start-limit-hit).
X rm -rf /var/lib/hookspool
if APT apt install -y "hookspool=$v1" >"$WORK/install7.log" 2>&1; then ok "fresh spool: apt install hookspool=$v1"; else problem "apt install hookspool=$v1 failed"; tail -5 "$WORK/install7.log" | sed 's/^/      | /'; fi
configure
code=$(send_one drain drain-7 SLOW-drain-7)
for _ in $(seq 1 40); do X grep -q SLOW-drain-7 /root/received-slow && break; sleep 0.25; done
X grep -q SLOW-drain-7 /root/received-slow && ok "a delivery in flight (POST -> $code), held ${DRAIN_HOLD_S}s by the slow receiver" || problem "the drain delivery never arrived (POST -> $code)"
X systemctl stop hookspool-intake.service 2>/dev/null
[ "$(prop hookspool-intake.service ActiveState)" = inactive ] && [ "$(prop hookspool-intake.socket ActiveState)" = active ] \
    && ok "socket active, intake idle (spool schema $(X od -An -j 60 -N 4 -t u1 /var/lib/hookspool/spool.db | awk '{print $4}'))" || problem "intake $(prop hookspool-intake.service ActiveState), socket $(prop hookspool-intake.socket ActiveState)"
X rm -f /root/watch.out
X systemd-run --unit=upgrade-watch --quiet -p StandardOutput=file:/root/watch.out /usr/bin/python3 /root/load.py watch /usr/bin/hookspool $INTAKE /hooks/load /etc/hookspool/secrets/load 120
sleep 0.5
if APT apt upgrade -y >"$WORK/upgrade7.log" 2>&1; then ok "apt upgrade -y to $v2"; else problem "apt upgrade failed"; tail -5 "$WORK/upgrade7.log" | sed 's/^/      | /'; fi
for _ in $(seq 1 80); do [ "$(prop upgrade-watch.service ActiveState)" = active ] || break; sleep 0.5; done
answer=$(X cat /root/watch.out 2>/dev/null)
[ "$answer" = 200 ] && ok "a webhook sent the moment the binary was replaced: $answer" || problem "a webhook sent as the binary was replaced: '${answer}'"
grep -q "^applied 0*$schema_new .*upgrade_probe" "$WORK/upgrade7.log" && ok "migrated: $(grep -m1 '^applied' "$WORK/upgrade7.log")" || problem "no migration in the upgrade log"
[ "$(prop hookspool-intake.socket ActiveState)" = active ] && ok "the socket is active (result $(prop hookspool-intake.socket Result))" || problem "the socket is $(prop hookspool-intake.socket ActiveState) ($(prop hookspool-intake.socket Result))"
ver=$(exe_version "$(prop hookspool-intake.service MainPID)")
[[ $ver == *"$v2"* ]] && ok "the intake runs '$ver'" || problem "the intake runs '${ver:-nothing}'"
finish_step "7 upgrade with an idle intake and a draining dispatcher: a webhook sent as the package is unpacked is accepted"

# ================================================================== 6. lintian on both versions
for deb in "$deb1" "$deb2"; do
    changes=${deb%.deb}.changes
    [ -f "$changes" ] || changes=$deb
    if out=$(lintian --fail-on error,warning "$changes" 2>&1 | grep -v 'running with root privileges is not recommended'; exit "${PIPESTATUS[0]}"); then
        ok "lintian $(basename "$changes"): clean$( [ -n "$out" ] && echo " (${out//$'\n'/; })")"
    else
        problem "lintian $(basename "$changes")"; sed 's/^/      | /' <<<"$out"
    fi
done
finish_step "6 lintian clean on both versions"

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
