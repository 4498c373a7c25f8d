#!/usr/bin/env bash
# Build the upgrade test's second package: this checkout as the next release would change
# it, so that tests/systemd/upgrade.sh upgrades to a version that really differs.
#
#   tests/systemd/build-next.sh        prints the path of the .deb (log on stderr)
#
# The copy (dist/upgrade-next/hookspool, outside git's view) differs from the checkout in:
# - the version: debian/changelog and Cargo.toml/Cargo.lock say <version>+upgradetest1
#   (HOOKSPOOL_NEXT_VERSION overrides), and HOOKSPOOL_TEST_BUILD is set for build.rs, so
#   `hookspool --version` names the build and says it is a test build;
# - one more migration: tests/systemd/upgrade/migration.sql, numbered one past the newest
#   in migrations/, added to src/store/migrate.rs with SCHEMA_VERSION bumped: the upgrade
#   runs a real migration on the live spool, and a downgrade meets a newer schema;
# - the shipped default config (packaging/config.toml) and a shipped bobbin file get one
#   line more: the upgrade must keep the administrator's config and replace the bobbins.
# It is compiled in a target directory of its own, <target>/next (<target> is
# CARGO_TARGET_DIR or the checkout's target/; HOOKSPOOL_NEXT_TARGET_DIR overrides the
# whole path), never over <target>/release/hookspool: that binary carries the probe
# migration, and whoever ran it on a spool would migrate it past every real release (issue
# 29: a soak started after an upgrade test did). The first build there compiles every
# crate; files whose content did not change keep their timestamps, so a later one
# recompiles only what differs.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
base=$(dpkg-parsechangelog -S Version)
next=${HOOKSPOOL_NEXT_VERSION:-$base+upgradetest1}
work=$repo/dist/upgrade-next
src=$work/hookspool
stage=$work/stage
export CARGO_TARGET_DIR=${HOOKSPOOL_NEXT_TARGET_DIR:-${CARGO_TARGET_DIR:-$repo/target}/next}
# build.rs appends this to the version `hookspool --version` prints.
export HOOKSPOOL_TEST_BUILD="upgrade test $next from tests/systemd/build-next.sh, with a probe migration; never run it on a spool you keep"

rm -rf "$stage"
mkdir -p "$stage" "$src"
git ls-files -co --exclude-standard -z | while IFS= read -r -d '' f; do
    [ -e "$f" ] && printf '%s\0' "$f"
done | tar --null -T - -cf - | tar -C "$stage" -xf -

python3 - "$stage" "$next" "$repo/tests/systemd/upgrade/migration.sql" <<'PY'
import email.utils, pathlib, re, sys

root, next_version, migration = pathlib.Path(sys.argv[1]), sys.argv[2], pathlib.Path(sys.argv[3])

def edit(rel, fn):
    p = root / rel
    old = p.read_text()
    new = fn(old)
    if new == old:
        sys.exit(f"build-next: {rel} did not change; its layout is not what this script knows")
    p.write_text(new)

# One more migration, numbered past the newest.
numbers = [int(m.group(1)) for f in (root / "migrations").glob("*.sql")
           if (m := re.match(r"(\d{4})_", f.name))]
n = max(numbers) + 1
name = f"{n:04d}_upgrade_probe"
(root / "migrations" / f"{name}.sql").write_text(migration.read_text())

def migrate_rs(s):
    s = re.sub(r"(pub const MIGRATIONS: &\[\(i64, &str, &str\)\] = &\[\n.*?)(\n\];)",
               lambda m: m.group(1) + f'\n    ({n}, "{name}", include_str!("../../migrations/{name}.sql")),' + m.group(2),
               s, count=1, flags=re.S)
    return re.sub(r"pub const SCHEMA_VERSION: i64 = \d+;", f"pub const SCHEMA_VERSION: i64 = {n};", s, count=1)
edit("src/store/migrate.rs", migrate_rs)

# The version, everywhere the build reads it.
edit("Cargo.toml", lambda s: re.sub(r'(\[package\]\nname = "hookspool"\nversion = )"[^"]*"',
                                     lambda m: m.group(1) + f'"{next_version}"', s, count=1))
edit("Cargo.lock", lambda s: re.sub(r'(\[\[package\]\]\nname = "hookspool"\nversion = )"[^"]*"',
                                     lambda m: m.group(1) + f'"{next_version}"', s, count=1))
date = email.utils.formatdate(usegmt=True).replace("GMT", "+0000")
edit("debian/changelog", lambda s: (
    f"hookspool ({next_version}) unstable; urgency=medium\n\n"
    "  * Upgrade test build (tests/systemd/build-next.sh): one more migration\n"
    f"    ({name}), a changed default config and a changed bobbin file.\n\n"
    f" -- hookspool maintainers <maintainers@hookspool.invalid>  {date}\n\n") + s)

marker = f"upgrade test build {next_version}"
edit("packaging/config.toml", lambda s: s + f"\n# ({marker}: the shipped default changed)\n")
edit("bobbins/README.md", lambda s: s + f"\n<!-- {marker}: this file changed -->\n")
print(f"build-next: {next_version}, schema {n} ({name})", file=sys.stderr)
PY

# Move the staged tree over the copy, touching only files whose content differs.
(cd "$stage" && find . -type f -print0) | while IFS= read -r -d '' f; do
    if ! cmp -s "$stage/$f" "$src/$f"; then
        mkdir -p "$(dirname "$src/$f")"
        cp -p "$stage/$f" "$src/$f"
    fi
done
(cd "$src" && find . -path ./target -prune -o -path ./dist -prune -o -type f -print0) | while IFS= read -r -d '' f; do
    case $f in ./debian/generated/*|./debian/hookspool/*|./debian/.debhelper/*|./debian/files|./debian/*.substvars|./debian/*.debhelper*|./debian/debhelper-build-stamp) continue ;; esac
    [ -e "$stage/$f" ] || rm -f "$src/$f"
done
rm -rf "$stage"

# dpkg-buildpackage sets SOURCE_DATE_EPOCH from the newest changelog entry, and some crates'
# build scripts rerun when it changes: keep the checkout's, so a rebuild in the same target
# directory reuses them.
SOURCE_DATE_EPOCH=$(dpkg-parsechangelog -S Timestamp)
export SOURCE_DATE_EPOCH
deb=$(cd "$src" && packaging/build-deb.sh)
rm -f "$work"/hookspool_*
mv "$src"/dist/hookspool_* "$work/"
echo "$work/$(basename "$deb")"
