#!/usr/bin/env bash
# install-podman.sh - Podman 5 for kcr's container tests, in a private root.
#
# Debian 12 has Podman 4.3, whose checkpoint kcr's tests do not cover. This
# takes Debian unstable's podman (5.8.6 today), crun (1.28), runc (1.3.6),
# conmon (2.1.13) and skopeo (1.22), with their libraries from unstable and
# trixie, into $KCR_PODMAN_PREFIX/root (default /opt/kcr/podman/root), the way
# install-criu.sh does for CRIU (scripts/debroot.sh): nothing enters the
# system's package database, the system's libc is untouched. These programs
# need glibc >= 2.38, so each is patched to load the root's own loader and
# libraries. The CRIU they run is install-criu.sh's (on PATH).
#
# Podman is configured by its own files in $PREFIX/etc, named by the
# wrapper $PREFIX/bin/podman (CONTAINERS_CONF, CONTAINERS_STORAGE_CONF): its
# storage in /var/lib/kcr-podman, no registries, cgroupfs (no systemd here),
# runtimes crun (default) and runc from the root, host networking by default
# (containers reach the loopback broker; Podman 5 still wants netavark). A symlink
# $KCR_PODMAN_LINK_DIR/podman (default /usr/local/bin) points at the wrapper,
# never over a real file.
#
# Idempotent: a stamp makes a repeated run silent and take a few ms.
#
# Environment:
#   KCR_PODMAN_PREFIX    private prefix (default /opt/kcr/podman)
#   KCR_PODMAN_LINK_DIR  where the podman symlink goes (default /usr/local/bin)
#   KCR_PODMAN_FORCE=1   reinstall
#   KCR_DEBIAN_MIRROR, KCR_DEBIAN_KEYRING as for install-criu.sh
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/debroot.sh"

STAMP_FORMAT=4
PREFIX=${KCR_PODMAN_PREFIX:-/opt/kcr/podman}
LINK_DIR=${KCR_PODMAN_LINK_DIR:-/usr/local/bin}
STAMP=$PREFIX/.kcr-podman-stamp
DEBROOT_LOG=$PREFIX/install.log
DEBROOT_NAME=install-podman
WANT_MAJOR=5

# From unstable: the programs, the libc they need and what only unstable has.
SID_PKGS="podman runc crun conmon skopeo netavark aardvark-dns golang-github-containers-common libc6 libgpgme45 libsubid6 libblake3-0 libcriu2"
# From trixie: their libraries (checked below: nothing may resolve outside the root).
TRIXIE_PKGS="patchelf libstdc++6 libgcc-s1 libseccomp2 libsqlite3-0 libsystemd0 libcap2 libjson-c5 libglib2.0-0t64
 libassuan9 libgpg-error0 libpcre2-8-0 libffi8 libselinux1 libmount1 libblkid1 libaudit1 libsemanage2 libcrypt1
 libacl1 libpam0g libbsd0 libcap-ng0 libsepol2 libbz2-1.0 libmd0 libatomic1 libprotobuf-c1 libattr1 libzstd1"
BINS="podman runc crun conmon skopeo"

if [ "${KCR_PODMAN_FORCE:-0}" != 1 ] && [ -r "$STAMP" ] && read -r fmt w <"$STAMP" &&
	[ "$fmt" = "$STAMP_FORMAT" ] && [ -x "$w" ] && [ -e "$LINK_DIR/podman" ]; then
	exit 0
fi
debroot_begin "$PREFIX"

debroot_apt_setup "$WORK"
V=$(debroot_version podman/sid)
[ "${V%%.*}" = "$WANT_MAJOR" ] || debroot_die "Debian unstable's podman is '$V', this script wants Podman $WANT_MAJOR"
R=$WORK/root
# shellcheck disable=SC2086
debroot_unpack "$WORK" "$R" $(printf '%s/sid ' $SID_PKGS) $TRIXIE_PKGS
# The binaries are patched where they will stay: the loader's path is in them.
rm -f "$STAMP"
rm -rf "$PREFIX/root.old"
[ ! -e "$PREFIX/root" ] || mv "$PREFIX/root" "$PREFIX/root.old"
mv "$R" "$PREFIX/root"
rm -rf "$PREFIX/root.old"
R=$PREFIX/root
B=()
for b in $BINS; do B+=("$R/usr/bin/$b"); done
B+=("$R/usr/lib/podman/netavark" "$R/usr/lib/podman/aardvark-dns")
debroot_patch "$R" "${B[@]}"
# crun checkpoints through libcriu, which it opens when asked to.
m=$(debroot_missing "$R" "$R/usr/lib/x86_64-linux-gnu/libcriu.so.2")
[ -z "$m" ] || debroot_die "libraries not found in the private root for libcriu: $m"
for b in $BINS; do
	"$R/usr/bin/$b" --version >>"$DEBROOT_LOG" 2>&1 || debroot_die "the private $b does not run: $R/usr/bin/$b --version failed"
done

mkdir -p "$PREFIX/etc" "$PREFIX/bin"
cat >"$PREFIX/etc/containers.conf" <<EOF
# Written by kcr's scripts/install-podman.sh.
[containers]
netns = "host"
utsns = "host"
ipcns = "private"
cgroupns = "host"
log_driver = "k8s-file"

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime = "crun"
conmon_path = ["$R/usr/bin/conmon"]
helper_binaries_dir = ["$R/usr/lib/podman", "$R/usr/libexec/podman"]
static_dir = "/var/lib/kcr-podman/storage/libpod"
tmp_dir = "/run/kcr-podman/libpod"

[engine.runtimes]
crun = ["$R/usr/bin/crun"]
runc = ["$R/usr/bin/runc"]
EOF
cat >"$PREFIX/etc/storage.conf" <<EOF
# Written by kcr's scripts/install-podman.sh.
[storage]
driver = "overlay"
graphroot = "/var/lib/kcr-podman/storage"
runroot = "/run/kcr-podman/storage"
EOF
cat >"$PREFIX/etc/registries.conf" <<EOF
# Written by kcr's scripts/install-podman.sh: no registry is searched.
unqualified-search-registries = []
EOF
cat >"$PREFIX/etc/policy.json" <<EOF
{"default": [{"type": "reject"}], "transports": {"tarball": {"": [{"type": "insecureAcceptAnything"}]}, "docker-archive": {"": [{"type": "insecureAcceptAnything"}]}, "oci-archive": {"": [{"type": "insecureAcceptAnything"}]}, "containers-storage": {"": [{"type": "insecureAcceptAnything"}]}, "dir": {"": [{"type": "insecureAcceptAnything"}]}}}
EOF
for b in podman skopeo; do
	cat >"$PREFIX/bin/$b.tmp" <<EOF
#!/bin/sh
# Generated by kcr's scripts/install-podman.sh: $b from Debian unstable in
# a private root ($R), with kcr's configuration ($PREFIX/etc).
CONTAINERS_CONF='$PREFIX/etc/containers.conf'
CONTAINERS_STORAGE_CONF='$PREFIX/etc/storage.conf'
CONTAINERS_REGISTRIES_CONF='$PREFIX/etc/registries.conf'
PODMAN_IGNORE_CGROUPSV1_WARNING=1
export CONTAINERS_CONF CONTAINERS_STORAGE_CONF CONTAINERS_REGISTRIES_CONF PODMAN_IGNORE_CGROUPSV1_WARNING
exec '$R/usr/bin/$b' "\$@"
EOF
	chmod 755 "$PREFIX/bin/$b.tmp"
	mv -f "$PREFIX/bin/$b.tmp" "$PREFIX/bin/$b"
done
cp "$WORK/unpacked" "$PREFIX/packages.txt"
note=$(debroot_link "$LINK_DIR/podman" "$PREFIX/bin/podman")
V=$("$PREFIX/bin/podman" --version)
printf '%s %s\n' "$STAMP_FORMAT" "$R/usr/bin/podman" >"$STAMP"
echo "install-podman: installed $V ($(sed -n 's/^crun version /crun /p' <("$R/usr/bin/crun" --version)), $("$R/usr/bin/conmon" --version | head -1), runc $("$R/usr/bin/runc" --version | awk 'NR==1{print $3}')) in $PREFIX${note:-; $LINK_DIR/podman -> $PREFIX/bin/podman}"
