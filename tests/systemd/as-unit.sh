#!/usr/bin/env bash
# Run a command inside the systemd container under a packaged unit's own sandbox: the
# [Service] settings of units/UNIT (user, hardening, state directory, environment), minus
# what only makes sense for the daemon itself (Type, Exec*, watchdog, restart, kill and
# timeout settings). For proving that what a service does (e.g. the dispatcher's script
# sandbox) works under the shipped hardening.
#
#   tests/systemd/as-unit.sh hookspool-dispatch.service python3 -c '...'
#
# Uses tests/systemd/sandbox.sh with the caller's SANDBOX_NAME/SANDBOX_DIR; the container
# must be up and have the hookspool user (install the package or run
# systemd-sysusers with sysusers.d/hookspool.conf).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
SBX=${SANDBOX_TOOL:-$here/sandbox.sh}
unit=$1; shift
props=()
while IFS= read -r line; do
    props+=(-p "$line")
done < <(awk '
    /^\[/ { svc = ($0 == "[Service]"); next }
    svc && /^[A-Za-z]+=/ && !/^(Type|NotifyAccess|Exec[A-Za-z]*|Watchdog[A-Za-z]*|Restart[A-Za-z]*|KillMode|Timeout[A-Za-z]*)=/ { print }
' "$repo/units/$unit")
exec "$SBX" exec systemd-run --wait --pipe --quiet --collect "${props[@]}" "$@"
