#!/usr/bin/env bash
# Build or refresh a signed apt repository of hookspool packages:
#
#   HOOKSPOOL_APT_KEY=<key id or fingerprint> packaging/apt-repo.sh REPO_DIR [DEB...]
#
# Each DEB is copied into REPO_DIR/pool/main/h/hookspool/; what the pool already holds
# stays, so the repository keeps its older versions (an operator can go back to one, and a
# downgrade onto a newer spool schema is refused by the package itself). Then, for suite
# HOOKSPOOL_APT_SUITE (default "stable") and component "main", apt-ftparchive writes the
# Packages indexes of every architecture in the pool and the Release file, gpg signs it
# (InRelease and Release.gpg, SHA512), and the public key is exported as
# REPO_DIR/hookspool-archive-keyring.gpg, the file operators point `Signed-By:` at.
# Publish REPO_DIR as it is (any static web server).
#
# The key comes from gpg's keyring (GNUPGHOME selects it): a release is signed with the
# project's release key, the systemd upgrade test with a throwaway key it makes. Needs
# apt-ftparchive (apt-utils) and gpg. Prints REPO_DIR.
set -euo pipefail

die() { echo "apt-repo: $*" >&2; exit 1; }
[ $# -ge 1 ] || die "usage: HOOKSPOOL_APT_KEY=<key> $0 REPO_DIR [DEB...]"
repo=$1; shift
key=${HOOKSPOOL_APT_KEY:-}
suite=${HOOKSPOOL_APT_SUITE:-stable}
[ -n "$key" ] || die "set HOOKSPOOL_APT_KEY to the signing key's id or fingerprint"
command -v apt-ftparchive >/dev/null || die "apt-ftparchive not found (apt-get install apt-utils)"
command -v gpg >/dev/null || die "gpg not found (apt-get install gnupg)"
gpg --batch --list-secret-keys "$key" >/dev/null 2>&1 || die "no secret key '$key' in the keyring (GNUPGHOME=${GNUPGHOME:-~/.gnupg})"

pool=pool/main/h/hookspool
mkdir -p "$repo/$pool"
for deb in "$@"; do
    [ "$(dpkg-deb -f "$deb" Package)" = hookspool ] || die "$deb is not a hookspool package"
    cp "$deb" "$repo/$pool/"
done
cd "$repo"
ls "$pool"/*.deb >/dev/null 2>&1 || die "the pool $repo/$pool holds no package"

# Architecture: all packages are listed in every binary-<arch> index, as Debian does.
archs=$(for d in "$pool"/*.deb; do dpkg-deb -f "$d" Architecture; done | grep -vx all | sort -u | tr '\n' ' ')
[ -n "$archs" ] || archs=$(dpkg --print-architecture)
dists=dists/$suite
rm -rf "$dists"
for arch in $archs; do
    dir=$dists/main/binary-$arch
    mkdir -p "$dir"
    # Run from the repository root: each Filename: is then relative to it, as apt wants.
    apt-ftparchive --arch "$arch" packages "$pool" >"$dir/Packages"
    gzip -9n <"$dir/Packages" >"$dir/Packages.gz"
done
# The Release file lists the indexes' checksums; it is written beside them afterwards so
# that it does not list itself.
apt-ftparchive \
    -o APT::FTPArchive::Release::Origin=hookspool \
    -o APT::FTPArchive::Release::Label=hookspool \
    -o APT::FTPArchive::Release::Suite="$suite" \
    -o APT::FTPArchive::Release::Codename="$suite" \
    -o APT::FTPArchive::Release::Architectures="${archs% }" \
    -o APT::FTPArchive::Release::Components=main \
    -o APT::FTPArchive::Release::Description="hookspool packages" \
    release "$dists" >"$dists/Release.new"
mv "$dists/Release.new" "$dists/Release"
gpg --batch --yes --digest-algo SHA512 --local-user "$key" --clearsign -o "$dists/InRelease" "$dists/Release"
gpg --batch --yes --digest-algo SHA512 --local-user "$key" --armor --detach-sign -o "$dists/Release.gpg" "$dists/Release"
gpg --batch --yes --export "$key" >hookspool-archive-keyring.gpg
pwd
