#!/usr/bin/env bash
# install-containerd.sh - containerd 2 for kcr's CRI tests, in a private root.
#
# Debian 12's containerd 1.6 has no CRI checkpoint. This takes Debian
# unstable's containerd (2.1.9 today: CRI CheckpointContainer, and restore by
# CreateContainer from a checkpoint archive) into $KCR_CONTAINERD_PREFIX/root
# (default /opt/kcr/containerd/root), the way install-criu.sh does for CRIU
# (scripts/debroot.sh). containerd, its runc shim and ctr are Go programs
# that need only glibc 2.34, so they run on the host's libc as they are. The
# runc they start is the system's (install-runc.sh), the CRIU install-criu.sh's.
#
# scripts/containerd-up.sh starts it with its own configuration, socket and
# state; nothing here touches a system containerd.
#
# Idempotent: a stamp makes a repeated run silent and take a few ms.
#
# Environment:
#   KCR_CONTAINERD_PREFIX  private prefix (default /opt/kcr/containerd)
#   KCR_CONTAINERD_FORCE=1 reinstall
#   KCR_DEBIAN_MIRROR, KCR_DEBIAN_KEYRING as for install-criu.sh
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/debroot.sh"

STAMP_FORMAT=1
PREFIX=${KCR_CONTAINERD_PREFIX:-/opt/kcr/containerd}
STAMP=$PREFIX/.kcr-containerd-stamp
DEBROOT_LOG=$PREFIX/install.log
DEBROOT_NAME=install-containerd
WANT_MAJOR=2

if [ "${KCR_CONTAINERD_FORCE:-0}" != 1 ] && [ -r "$STAMP" ] && read -r fmt w <"$STAMP" &&
	[ "$fmt" = "$STAMP_FORMAT" ] && [ -x "$w" ]; then
	exit 0
fi
debroot_begin "$PREFIX"

debroot_apt_setup "$WORK"
V=$(debroot_version containerd/sid)
[ "${V%%.*}" = "$WANT_MAJOR" ] || debroot_die "Debian unstable's containerd is '$V', this script wants containerd $WANT_MAJOR"
debroot_unpack "$WORK" "$WORK/root" containerd/sid
for b in containerd containerd-shim-runc-v2 ctr; do
	"$WORK/root/usr/bin/$b" -v >>"$DEBROOT_LOG" 2>&1 ||
		debroot_die "$b $V does not run on this host's libc: $WORK/root/usr/bin/$b --version failed"
done
rm -rf "$PREFIX/root.old"
[ ! -e "$PREFIX/root" ] || mv "$PREFIX/root" "$PREFIX/root.old"
mv "$WORK/root" "$PREFIX/root"
rm -rf "$PREFIX/root.old"
mkdir -p "$PREFIX/bin"
for b in containerd containerd-shim-runc-v2 ctr; do
	ln -sfn "$PREFIX/root/usr/bin/$b" "$PREFIX/bin/$b"
done
cp "$WORK/unpacked" "$PREFIX/packages.txt"
printf '%s %s\n' "$STAMP_FORMAT" "$PREFIX/bin/containerd" >"$STAMP"
echo "install-containerd: installed $("$PREFIX/bin/containerd" -v) in $PREFIX (start it with scripts/containerd-up.sh)"
