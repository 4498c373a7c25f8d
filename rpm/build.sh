#!/usr/bin/env bash
# Build the RPM from this checkout: the source tarball (tracked and untracked files, minus
# what .gitignore excludes) plus the sysusers file go to dist/rpmbuild/SOURCES, then
# `rpmbuild -bb rpm/hookspool.spec`. RPM_CARGO_TARGET_DIR (default dist/rpm-target) keeps
# compiled crates between runs.
# Prints the path of the built RPM.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^Version: *//p' rpm/hookspool.spec)
top=$PWD/dist/rpmbuild
# Its own target dir by default: rpmbuild compiles with other C flags than dpkg-buildpackage,
# and sharing one dir would rebuild the C crates on every alternation.
export CARGO_TARGET_DIR=${RPM_CARGO_TARGET_DIR:-$PWD/dist/rpm-target}
mkdir -p "$top"/{SOURCES,SPECS,BUILD,RPMS,SRPMS}
git ls-files -co --exclude-standard -z \
    | tar --null -T - --transform "s,^,hookspool-$version/," -czf "$top/SOURCES/hookspool-$version.tar.gz"
cp sysusers.d/hookspool.conf "$top/SOURCES/hookspool.sysusers"
rpmbuild -bb rpm/hookspool.spec --define "_topdir $top" >&2
ls "$top"/RPMS/*/hookspool-"$version"-*.rpm
