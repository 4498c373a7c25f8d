#!/usr/bin/env bash
# Build the .deb from this checkout with dpkg-buildpackage -b -us -uc and move the results
# (the .deb, .buildinfo, .changes) from the parent directory into dist/. Prints the .deb's
# path on stdout; the build log goes to stderr. Set CARGO_TARGET_DIR to keep compiled crates
# between runs (default ./target). Needs debhelper and fakeroot, and Rust >= 1.89 on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -f ../hookspool_*.deb ../hookspool-dbgsym_*.deb ../hookspool_*.buildinfo ../hookspool_*.changes
nice -n 10 dpkg-buildpackage -b -us -uc >&2
mkdir -p dist
rm -f dist/hookspool_*.deb dist/hookspool_*.buildinfo dist/hookspool_*.changes
mv ../hookspool_*.deb ../hookspool_*.buildinfo ../hookspool_*.changes dist/
ls dist/hookspool_*_"$(dpkg --print-architecture)".deb
