#!/usr/bin/env bash
# sandbox.sh — boot a real systemd (Debian bookworm) in a systemd-nspawn container on a
# host where systemd is NOT PID 1, for integration tests. (The team's systemd-sandbox.sh,
# kept in the repository so a clone runs tests/systemd/ without anything beside it.)
#
#   sandbox.sh up            create rootfs if missing, boot, wait until
#                            `systemctl is-system-running` = running|degraded
#   sandbox.sh exec CMD...   run CMD inside the container (exit code passed
#                            through; stdin/stdout/stderr passed through)
#   sandbox.sh copy SRC DEST copy a host file/dir into the container
#                            (file: DEST may be a dir; dir: copied as DEST)
#   sandbox.sh down          stop the container, remove what `up` created
#                            at runtime (the rootfs is kept for reuse)
#   sandbox.sh status        print state
#   sandbox.sh purge         down + delete the rootfs
#
# Environment knobs:
#   SANDBOX_DIR      work dir (default /var/tmp/systemd-sandbox); rootfs = $SANDBOX_DIR/root
#   SANDBOX_NAME     machine/host name (default hookspool-sbx)
#   SANDBOX_INCLUDE  extra debs for debootstrap, comma-separated (default python3,procps)
#   SANDBOX_VOLATILE nspawn --volatile mode (default overlay: every boot starts from
#                    the pristine rootfs, changes live in RAM; "no" = persistent)
#   SANDBOX_MIRROR   Debian mirror (default: read from the host's apt sources)
#   SANDBOX_BOOT_TIMEOUT seconds to wait for boot (default 120)
#   SANDBOX_CGROUP   unified (default: container sees a pure cgroup2 tree, like a
#                    Debian 12 host) or hybrid (nspawn's own choice on a v1/v2
#                    hybrid host). Either way no resource controllers are usable
#                    inside when the host binds them to cgroup v1.
#
# Networking: the container shares the host network namespace (no
# --private-network), so a socket unit on 127.0.0.1:PORT is reachable from the
# host too. Pick ports that are free on the host.
set -euo pipefail
set +m   # no job control: the background launcher must not be a process-group leader

SANDBOX_DIR=${SANDBOX_DIR:-/var/tmp/systemd-sandbox}
NAME=${SANDBOX_NAME:-hookspool-sbx}
ROOT=$SANDBOX_DIR/root
STATE=$SANDBOX_DIR/state-$NAME
INCLUDE_BASE=systemd,systemd-sysv,dbus
INCLUDE_EXTRA=${SANDBOX_INCLUDE-python3,procps}
VOLATILE=${SANDBOX_VOLATILE:-overlay}
BOOT_TIMEOUT=${SANDBOX_BOOT_TIMEOUT:-120}
CGMODE=${SANDBOX_CGROUP:-unified}
SUITE=bookworm
CG_NAME=systemd-sandbox-$NAME
CPATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

die()  { echo "systemd-sandbox: ERROR: $*" >&2; exit 1; }
info() { echo "systemd-sandbox: $*" >&2; }

need_root() { [ "$(id -u)" = 0 ] || die "must run as root (uses debootstrap, nspawn, nsenter)"; }

# ---------------------------------------------------------------- host deps
ensure_host_tools() {
    local missing=()
    command -v systemd-nspawn >/dev/null || missing+=(systemd-container)
    command -v debootstrap    >/dev/null || missing+=(debootstrap)
    command -v nsenter        >/dev/null || missing+=(util-linux)
    [ -e /usr/share/keyrings/debian-archive-keyring.gpg ] || missing+=(debian-archive-keyring)
    [ ${#missing[@]} -eq 0 ] && return 0
    info "installing host packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >"$SANDBOX_DIR/apt-host.log" 2>&1 \
        || { tail -20 "$SANDBOX_DIR/apt-host.log" >&2; die "apt-get update failed (log: $SANDBOX_DIR/apt-host.log)"; }
    # --no-install-recommends: avoids libnss-mymachines, whose postinst edits /etc/nsswitch.conf
    apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$SANDBOX_DIR/apt-host.log" 2>&1 \
        || { tail -20 "$SANDBOX_DIR/apt-host.log" >&2; die "apt-get install ${missing[*]} failed (log: $SANDBOX_DIR/apt-host.log)"; }
    command -v systemd-nspawn >/dev/null || die "systemd-nspawn still missing after install"
    command -v debootstrap >/dev/null || die "debootstrap still missing after install"
}

# Read the Debian mirror apt on this host uses (deb822 *.sources or one-line lists).
host_mirror() {
    if [ -n "${SANDBOX_MIRROR:-}" ]; then echo "$SANDBOX_MIRROR"; return; fi
    local f uri
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        uri=$(awk -v suite="$SUITE" '
            BEGIN{RS=""; FS="\n"}
            { types=""; uris=""; suites="";
              for(i=1;i<=NF;i++){
                if($i ~ /^Types:/){ sub(/^Types:[ \t]*/,"",$i); types=$i }
                if($i ~ /^URIs:/){ sub(/^URIs:[ \t]*/,"",$i); uris=$i }
                if($i ~ /^Suites:/){ sub(/^Suites:[ \t]*/,"",$i); suites=$i } }
              if(types ~ /(^| )deb( |$)/){ n=split(suites,s,/[ \t]+/);
                for(j=1;j<=n;j++) if(s[j]==suite){ split(uris,u,/[ \t]+/); print u[1]; exit } } }' "$f")
        [ -n "$uri" ] && { echo "$uri"; return; }
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        uri=$(sed -e 's/#.*//' -e 's/\[[^]]*\]//' "$f" | awk -v suite="$SUITE" '$1=="deb" && $3==suite {print $2; exit}')
        [ -n "$uri" ] && { echo "$uri"; return; }
    done
    die "could not find a 'deb ... $SUITE' entry in /etc/apt/sources.list{,.d/}; set SANDBOX_MIRROR"
}

# ---------------------------------------------------------------- rootfs
ensure_rootfs() {
    [ -f "$ROOT/.sandbox-complete" ] && return 0
    local mirror inc t0 t1
    mirror=$(host_mirror)
    inc=$INCLUDE_BASE${INCLUDE_EXTRA:+,$INCLUDE_EXTRA}
    info "creating rootfs $ROOT (debootstrap --variant=minbase --include=$inc $SUITE $mirror)"
    rm -rf "$ROOT.partial"
    t0=$(date +%s)
    debootstrap --variant=minbase --include="$inc" "$SUITE" "$ROOT.partial" "$mirror" \
        >"$SANDBOX_DIR/debootstrap.log" 2>&1 \
        || { tail -20 "$SANDBOX_DIR/debootstrap.log" >&2; die "debootstrap failed (log: $SANDBOX_DIR/debootstrap.log)"; }
    # debootstrap copies the host's /etc/hostname; remove it so the container's
    # hostname is the nspawn machine name (-M $SANDBOX_NAME).
    rm -f "$ROOT.partial/etc/hostname"
    # Don't spawn a getty on the (unused) container console.
    ln -sf /dev/null "$ROOT.partial/etc/systemd/system/console-getty.service"
    rm -rf "$ROOT"
    mv "$ROOT.partial" "$ROOT"
    touch "$ROOT/.sandbox-complete"
    t1=$(date +%s)
    info "rootfs ready in $((t1 - t0))s, size $(du -sh "$ROOT" | cut -f1)"
}

# ---------------------------------------------------------------- state helpers
proc_start() { awk '{print $22}' "/proc/$1/stat" 2>/dev/null; }

# nspawn pid if it is still the process we started, else empty
nspawn_pid() {
    [ -f "$STATE/nspawn.pid" ] || return 0
    local pid st
    pid=$(cat "$STATE/nspawn.pid"); st=$(cat "$STATE/nspawn.start" 2>/dev/null || true)
    [ -d "/proc/$pid" ] || return 0
    [ "$(proc_start "$pid")" = "$st" ] || return 0
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q "systemd-nspawn" || return 0
    echo "$pid"
}

# container PID 1 (as seen from the host): a child of nspawn in another pid namespace
leader_pid() {
    local np c
    np=$(nspawn_pid); [ -n "$np" ] || return 0
    for c in $(cat /proc/"$np"/task/*/children 2>/dev/null); do
        if [ "$(readlink /proc/"$c"/ns/pid)" != "$(readlink /proc/self/ns/pid)" ]; then
            echo "$c"; return 0
        fi
    done
}

require_leader() {
    local l; l=$(leader_pid)
    [ -n "$l" ] || die "sandbox '$NAME' is not running (run: $0 up)"
    echo "$l"
}

in_ct() {  # run a command in all namespaces of the container, clean env
    local l=$1; shift
    nsenter -t "$l" -a -r -w -- /usr/bin/env -i PATH="$CPATH" HOME=/root LANG=C.UTF-8 \
        TERM="${TERM:-dumb}" SYSTEMD_PAGER= SYSTEMD_COLORS=0 "$@"
}

cgroup_dirs() {  # the hierarchies nspawn cares about: cgroup2 and name=systemd v1
    awk '$0 ~ / - cgroup2 / {print $5} $0 ~ / - cgroup .*name=systemd/ {print $5}' /proc/self/mountinfo
}

# ---------------------------------------------------------------- commands
cmd_up() {
    need_root
    mkdir -p "$SANDBOX_DIR"
    if [ -n "$(nspawn_pid)" ]; then info "already running (nspawn pid $(nspawn_pid))"; return 0; fi
    [ -d "$STATE" ] && { info "stale state from an earlier run; cleaning"; cleanup_runtime; }
    ensure_host_tools
    ensure_rootfs
    mkdir -p "$STATE"
    [ -d /run/systemd/nspawn ] || touch "$STATE/created-run-nspawn"

    # Own cgroup subtree per sandbox, so nspawn's payload/supervisor cgroups don't
    # land at the root of the host hierarchies and can be removed on `down`.
    local mp
    : >"$STATE/cgroups"
    for mp in $(cgroup_dirs); do
        mkdir -p "$mp/$CG_NAME" && echo "$mp/$CG_NAME" >>"$STATE/cgroups"
    done

    local args=(-D "$ROOT" -b -M "$NAME" --register=no --keep-unit
                --console=read-only --link-journal=no --resolv-conf=copy-host)
    [ "$VOLATILE" != no ] && args+=(--volatile="$VOLATILE")
    info "booting: systemd-nspawn ${args[*]}"
    case "$CGMODE" in
        unified) export SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1 ;;
        hybrid)  unset SYSTEMD_NSPAWN_UNIFIED_HIERARCHY ;;
        *) die "SANDBOX_CGROUP must be 'unified' or 'hybrid', not '$CGMODE'" ;;
    esac
    local t0; t0=$(date +%s.%N)
    # launcher subshell: join our cgroups, then exec nspawn in its own session
    # (setsid does not fork because the subshell is not a process-group leader)
    (
        for cg in $(cat "$STATE/cgroups"); do echo "$BASHPID" >"$cg/cgroup.procs"; done
        exec setsid systemd-nspawn "${args[@]}" </dev/null >"$STATE/console.log" 2>&1
    ) &
    local pid=$!
    echo "$pid" >"$STATE/nspawn.pid"
    proc_start "$pid" >"$STATE/nspawn.start" || true
    for _ in $(seq 1 50); do
        tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q systemd-nspawn && break
        sleep 0.1
    done
    [ -n "$(nspawn_pid)" ] || { tail -30 "$STATE/console.log" >&2 || true; cleanup_runtime
        die "systemd-nspawn (pid $pid) did not start or exited at once (see above)"; }

    local deadline=$(( $(date +%s) + BOOT_TIMEOUT )) l="" s=""
    while :; do
        if [ -z "$(nspawn_pid)" ]; then
            echo "---- console log ----" >&2; tail -30 "$STATE/console.log" >&2
            cleanup_runtime; die "systemd-nspawn exited during boot (see above)"
        fi
        l=$(leader_pid)
        if [ -n "$l" ] && [ "$(cat /proc/"$l"/comm 2>/dev/null)" = systemd ]; then
            s=$(in_ct "$l" systemctl is-system-running 2>/dev/null || true)
            case "$s" in running|degraded) break ;; esac
        fi
        if [ "$(date +%s)" -ge "$deadline" ]; then
            echo "---- console log ----" >&2; tail -30 "$STATE/console.log" >&2
            [ -n "$l" ] && in_ct "$l" systemctl --no-pager list-jobs >&2 || true
            cmd_down; die "container did not reach running/degraded within ${BOOT_TIMEOUT}s (last state: '${s:-none}')"
        fi
        sleep 0.2
    done
    local t1; t1=$(date +%s.%N)
    echo "$l" >"$STATE/leader.pid"
    info "up: state=$s, cgroup=$CGMODE, boot-to-ready $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}')s, nspawn pid $pid, container pid1 = host pid $l"
    if [ "$s" = degraded ]; then in_ct "$l" systemctl --no-pager --failed >&2 || true; fi
}

cmd_exec() {
    need_root
    [ $# -ge 1 ] || die "usage: $0 exec CMD [ARGS...]"
    local l; l=$(require_leader)
    in_ct "$l" "$@"
}

cmd_copy() {
    need_root
    [ $# -eq 2 ] || die "usage: $0 copy SRC DEST   (DEST is a path inside the container)"
    local src=$1 dest=$2 l
    [ -e "$src" ] || die "copy: no such host file: $src"
    l=$(require_leader)
    # Copy through the container's mount namespace (never via $ROOT on the host:
    # /tmp etc. are separate mounts inside, and absolute symlinks in the rootfs
    # would resolve to host paths).
    if [ -d "$src" ]; then
        tar -C "$src" -cf - . | in_ct "$l" sh -c 'mkdir -p "$1" && tar -C "$1" -xf - --no-same-owner' sh "$dest" \
            || die "copy: failed to copy directory $src -> $dest"
    else
        in_ct "$l" sh -c 'd=$1; case "$d" in */) mkdir -p "$d";; esac
                          [ -d "$d" ] && d="${d%/}/$2"; mkdir -p "$(dirname "$d")"
                          cat >"$d" && chmod "$3" "$d"' sh "$dest" "$(basename "$src")" "$(stat -c %a "$src")" <"$src" \
            || die "copy: failed to copy $src -> $dest"
    fi
}

cleanup_runtime() {
    local cg
    if [ -f "$STATE/cgroups" ]; then
        for cg in $(cat "$STATE/cgroups"); do
            [ -d "$cg" ] || continue
            if [ -n "$(find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null)" ]; then
                info "WARNING: processes still in $cg; not removing it"; continue
            fi
            find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null || info "WARNING: could not remove $cg"
        done
    fi
    rm -rf "/run/systemd/nspawn/propagate/$NAME"
    if [ -f "$STATE/created-run-nspawn" ]; then
        local p other=""
        for p in /proc/[0-9]*; do
            [ "$(cat "$p/comm" 2>/dev/null)" = systemd-nspawn ] && other=1
        done
        [ -n "$other" ] || rm -rf /run/systemd/nspawn
    fi
    rm -rf "$STATE"
}

cmd_down() {
    need_root
    local pid; pid=$(nspawn_pid)
    if [ -n "$pid" ]; then
        info "stopping container (SIGTERM to nspawn pid $pid = clean poweroff)"
        kill -TERM "$pid"
        for _ in $(seq 1 300); do [ -d "/proc/$pid" ] || break; sleep 0.2; done
        if [ -d "/proc/$pid" ]; then
            info "still running after 60s; SIGTERM again (immediate termination)"
            kill -TERM "$pid" 2>/dev/null || true; sleep 3
            [ -d "/proc/$pid" ] && { info "SIGKILL nspawn pid $pid"; kill -KILL "$pid" 2>/dev/null || true; sleep 1; }
        fi
        wait "$pid" 2>/dev/null || true
    else
        info "not running"
    fi
    cleanup_runtime
    info "down"
}

cmd_status() {
    local pid; pid=$(nspawn_pid)
    if [ -z "$pid" ]; then echo "stopped"; return 3; fi
    local l; l=$(leader_pid)
    echo "running: nspawn pid $pid, container pid1 = host pid ${l:-?}, state $(in_ct "$l" systemctl is-system-running 2>/dev/null || true)"
}

cmd_purge() { cmd_down; info "removing $ROOT"; rm -rf "$ROOT" "$ROOT.partial"; }

case "${1:-}" in
    up)     shift; cmd_up "$@" ;;
    exec)   shift; cmd_exec "$@" ;;
    copy)   shift; cmd_copy "$@" ;;
    down)   shift; cmd_down "$@" ;;
    status) shift; cmd_status "$@" ;;
    purge)  shift; cmd_purge "$@" ;;
    *) echo "usage: $0 {up|exec CMD...|copy SRC DEST|down|status|purge}" >&2; exit 2 ;;
esac
