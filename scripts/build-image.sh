#!/usr/bin/env bash
# build-image.sh - build kcr's container image (deploy/image/Containerfile)
# with Podman: kcr (static) and CRIU with its libraries, FROM scratch, for
# a service image to build on (deploy/image/Containerfile.service).
#
#   sudo scripts/build-image.sh            # prints the image name
#
# The context is staged in a temporary directory: CRIU's private root of
# scripts/install-criu.sh (Debian's criu and the libraries it links) made a
# root of its own (merged-/usr links, so that its loader and libraries are
# at their usual paths), the directories kcr standby needs, and kcr built
# without cgo. Before building, CRIU is run in that root (chroot, criu
# --version): a root that lacks a library fails here, not in a pod.
#
# Environment:
#   KCR_IMAGE          image name (default localhost/kcr:dev)
#   KCR_CRIU_PREFIX    as for install-criu.sh (default /opt/kcr/criu)
#   KCR_PODMAN_PREFIX  as for install-podman.sh (default /opt/kcr/podman)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_root
need_go
command -v podman >/dev/null || die "no podman: run scripts/install-podman.sh"
IMAGE=${KCR_IMAGE:-localhost/kcr:dev}
CRIU_ROOT=${KCR_CRIU_PREFIX:-/opt/kcr/criu}/root
[ -x "$CRIU_ROOT/usr/sbin/criu" ] || die "no CRIU root at $CRIU_ROOT: run scripts/install-criu.sh"

ctx=$(mktemp -d /var/tmp/kcr-image.XXXXXX)
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/root"
cp -a "$CRIU_ROOT/usr" "$CRIU_ROOT/etc" "$ctx/root/"
# Only what CRIU runs with: no manuals, no docs.
rm -rf "$ctx/root/usr/share"
for d in lib lib64 bin sbin; do ln -s "usr/$d" "$ctx/root/$d"; done
mkdir -p "$ctx/root/run" "$ctx/root/tmp" "$ctx/root/var/lib/kcr-standby" "$ctx/root/usr/local/bin"
chmod 1777 "$ctx/root/tmp"
chmod 0700 "$ctx/root/var/lib/kcr-standby"
out=$(chroot "$ctx/root" /usr/sbin/criu --version 2>&1) || die "CRIU does not run in the staged root: $out"
CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -buildvcs=false" go build -o "$ctx/kcr" ./cmd/kcr
# The private Podman of install-podman.sh reads its policy only when named.
policy=()
pol=${KCR_PODMAN_PREFIX:-/opt/kcr/podman}/etc/policy.json
[ -r "$pol" ] && policy=(--signature-policy "$pol")
podman build --quiet "${policy[@]}" -f deploy/image/Containerfile -t "$IMAGE" "$ctx" >/dev/null
echo "$IMAGE"
