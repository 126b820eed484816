#!/usr/bin/env bash
# install-criu.sh - make sure a working CRIU is available for kcr.
#
# Linux >= 6.16 needs CRIU >= 4.2 (older CRIU cannot dump TCP sockets there),
# 6.13..6.15 needs >= 4.0, and Debian 12's criu 3.17 fails `criu check` on
# new kernels anyway. So:
#
#   1. If $KCR_CRIU (or `criu` on PATH) is new enough and `criu check` passes,
#      use it.
#   2. Otherwise fetch Debian unstable's criu (+ libcompel1, libnet9,
#      libnl-3-200) and the rest of its runtime closure from Debian 13
#      (trixie) with `apt-get download` through a PRIVATE apt config,
#      unpack them with `dpkg -x` into $KCR_CRIU_PREFIX/root (default
#      /opt/kcr/criu/root), and install a wrapper $KCR_CRIU_PREFIX/bin/criu
#      that execs criu through that root's own dynamic loader. A symlink
#      $KCR_CRIU_LINK_DIR/criu (default /usr/local/sbin/criu) points at it.
#
# Nothing is installed into the system package database, the system libc is
# untouched and no apt source is added to the system. The wrapper `exec`s, so
# the PID and every inherited fd survive (go-criu's `criu swrk <fd>`).
#
# Established TCP connections: CRIU's default network lock runs the
# `iptables` binary, which this host does not have. Use --network-lock
# nftables (go-criu: NetworkLock: rpc.CriuNetworkLockMethod_NFTABLES), which
# uses the bundled libnftables in-process, or --tcp-close.
#
# Idempotent: a stamp file makes a repeated run silent and take a few ms.
# Prints one line on success, one clear "install-criu: ERROR: ..." line (plus
# the tail of the log) and exits non-zero on failure.
#
# Environment:
#   KCR_CRIU            criu binary to validate instead of `criu` on PATH
#   KCR_CRIU_PREFIX     private install prefix       (default /opt/kcr/criu)
#   KCR_CRIU_LINK_DIR   where the `criu` symlink goes (default /usr/local/sbin)
#   KCR_DEBIAN_MIRROR   Debian mirror       (default http://deb.debian.org/debian)
#   KCR_DEBIAN_KEYRING  keyring for the Release files
#                       (default /usr/share/keyrings/debian-archive-keyring.gpg)
#   KCR_CRIU_FORCE=1    ignore the stamp and any existing criu; reinstall
set -euo pipefail

# Bump when the install layout or logic changes: invalidates old stamps.
STAMP_FORMAT=1

PREFIX=${KCR_CRIU_PREFIX:-/opt/kcr/criu}
LINK_DIR=${KCR_CRIU_LINK_DIR:-/usr/local/sbin}
MIRROR=${KCR_DEBIAN_MIRROR:-http://deb.debian.org/debian}
KEYRING=${KCR_DEBIAN_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}
FORCE=${KCR_CRIU_FORCE:-0}
STAMP=$PREFIX/.kcr-criu-stamp
LOG=$PREFIX/install.log

# Packages taken from unstable (sid); everything else comes from trixie.
SID_PKGS="criu libcompel1 libnet9 libnl-3-200"
# The closure apt resolves today (informational; apt resolves it for real):
#   sid:    criu libcompel1 libnet9 libnl-3-200
#   trixie: libc6 libgcc-s1 gcc-14-base libbsd0 libmd0 libgnutls30t64
#           libnettle8t64 libhogweed6t64 libgmp10 libidn2-0 libunistring5
#           libp11-kit0 libffi8 libtasn1-6 libnftables1 libnftnl11 libmnl0
#           libjansson4 libxtables12 libprotobuf-c1 libuuid1

# ---------------------------------------------------------------- helpers
log_tail() {
    if [ -s "$LOG" ]; then
        echo "---- last lines of $LOG ----" >&2
        tail -n 15 "$LOG" | sed 's/^/  /' >&2
        echo "----" >&2
    fi
}

die() {
    trap - ERR
    log_tail
    echo "install-criu: ERROR: $*" >&2
    exit 1
}

trap 'die "unexpected failure (exit $?) at line $LINENO: $BASH_COMMAND"' ERR

# ver_ge A B: true if dotted version A >= B (numeric components only).
ver_ge() {
    local -a a b
    local i x y
    IFS=. read -ra a <<<"$1"
    IFS=. read -ra b <<<"$2"
    for i in 0 1 2; do
        x=${a[i]:-0}; y=${b[i]:-0}
        x=${x%%[!0-9]*}; y=${y%%[!0-9]*}
        x=${x:-0}; y=${y:-0}
        if ((10#$x > 10#$y)); then return 0; fi
        if ((10#$x < 10#$y)); then return 1; fi
    done
    return 0
}

# Kernel release without forking.
read -r KREL </proc/sys/kernel/osrelease
KVER=${KREL%%-*}
if ver_ge "$KVER" 6.16; then
    NEED=4.2
elif ver_ge "$KVER" 6.13; then
    NEED=4.0
else
    NEED=0
fi

# The criu kcr would pick up: $KCR_CRIU, else `criu` on PATH.
if [ -n "${KCR_CRIU:-}" ]; then
    TARGET=$KCR_CRIU
else
    TARGET=$(command -v criu || true)
fi

# ------------------------------------------------------------- fast path
# Stamp: "<format> <kernel release> <witness file> <validated criu path>".
# Valid while the kernel is the same, the witness (the real criu binary) is
# there, that criu is still executable and it is still the one kcr would pick
# (or nothing else is on PATH).
stamp_ok() {
    local fmt krel witness path
    [ -r "$STAMP" ] || return 1
    read -r fmt krel witness path <"$STAMP" || return 1
    [ "$fmt" = "$STAMP_FORMAT" ] && [ "$krel" = "$KREL" ] || return 1
    [ -n "$witness" ] && [ -e "$witness" ] || return 1
    [ -n "$path" ] && [ -x "$path" ] || return 1
    [ -z "$TARGET" ] || [ "$TARGET" = "$path" ] || return 1
    return 0
}

if [ "$FORCE" != 1 ] && stamp_ok; then
    exit 0
fi

# ------------------------------------------------------------- slow path
mkdir -p "$PREFIX" 2>/dev/null || die "cannot create $PREFIX (run as root or set KCR_CRIU_PREFIX)"
[ -w "$PREFIX" ] || die "$PREFIX is not writable (run as root or set KCR_CRIU_PREFIX)"

# Serialise concurrent runs; re-check the stamp once we hold the lock.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$PREFIX/.lock"
    flock 9
    if [ "$FORCE" != 1 ] && stamp_ok; then
        exit 0
    fi
fi
: >"$LOG"

write_stamp() { # $1 = witness file, $2 = criu path
    printf '%s %s %s %s\n' "$STAMP_FORMAT" "$KREL" "$1" "$2" >"$STAMP.tmp"
    mv -f "$STAMP.tmp" "$STAMP"
}

# criu_version CMD...: prints "4.2.1" (empty if it does not run).
criu_version() {
    "$@" --version 2>>"$LOG" | sed -n 's/^Version: *//p' | head -n 1 || true
}

# criu_check CMD...: runs `criu check`, output to the log.
criu_check() {
    local t=()
    command -v timeout >/dev/null 2>&1 && t=(timeout 120)
    echo "+ $* check" >>"$LOG"
    "${t[@]}" "$@" check >>"$LOG" 2>&1
}

# The private root is merged-usr (trixie), but cope with either layout.
root_loader() { # $1 = root
    local l
    for l in "$1/usr/lib64/ld-linux-x86-64.so.2" "$1/lib64/ld-linux-x86-64.so.2" \
        "$1/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" "$1/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"; do
        if [ -e "$l" ]; then echo "$l"; return 0; fi
    done
    return 1
}
root_libpath() { echo "$1/usr/lib/x86_64-linux-gnu:$1/lib/x86_64-linux-gnu:$1/usr/lib:$1/lib"; }
root_criu() { [ -x "$1/usr/sbin/criu" ] && echo "$1/usr/sbin/criu" || echo "$1/sbin/criu"; }

# criu_ok PATH: version >= NEED and `criu check` passes; sets V.
criu_ok() {
    V=$(criu_version "$1")
    if [ -n "$V" ] && ver_ge "$V" "$NEED" && criu_check "$1"; then
        return 0
    fi
    echo "criu at $1 (version '${V:-?}', need >= $NEED on $KREL) rejected" >>"$LOG"
    return 1
}

# finish WHAT: link $PREFIX/bin/criu into LINK_DIR, write the stamp, report.
finish() {
    local what=$1 link=$LINK_DIR/criu wrapper=$PREFIX/bin/criu note stamp_path t
    stamp_path=$wrapper
    # Never clobber a real criu binary in LINK_DIR.
    if [ -e "$link" ] && [ ! -L "$link" ]; then
        note="; NOT linked: $link is a real file, use $wrapper or KCR_CRIU=$wrapper"
    else
        mkdir -p "$LINK_DIR"
        ln -sfn "$wrapper" "$link.tmp.$$"
        mv -Tf "$link.tmp.$$" "$link"
        note="; $link -> $wrapper"
        t=$(command -v criu || true)
        if [ -z "${KCR_CRIU:-}" ] && [ "$t" = "$link" ]; then stamp_path=$link; fi
    fi
    if [ "$TARGET_REJECTED" = 1 ] && [ "$TARGET" != "$link" ] && [ "$TARGET" != "$wrapper" ]; then
        if [ -n "${KCR_CRIU:-}" ]; then
            note="$note; WARNING: KCR_CRIU=$KCR_CRIU is not usable, unset it"
        else
            t=$(command -v criu || true)
            if [ "$t" = "$TARGET" ]; then
                note="$note; WARNING: $TARGET comes first on PATH and is not usable"
            fi
        fi
    fi
    write_stamp "$(root_criu "$PREFIX/root")" "$stamp_path"
    echo "install-criu: $what in $PREFIX$note; criu check: Looks good"
}

# 1. An existing criu that is good enough? Our own earlier install?
TARGET_REJECTED=0
if [ "$FORCE" != 1 ]; then
    if [ -n "$TARGET" ]; then
        if [ -x "$TARGET" ] && criu_ok "$TARGET"; then
            write_stamp "$TARGET" "$TARGET"
            echo "install-criu: using existing criu $V at $TARGET (kernel $KREL, criu check: Looks good)"
            exit 0
        fi
        TARGET_REJECTED=1
    fi
    if [ -x "$PREFIX/bin/criu" ] && [ "$TARGET" != "$PREFIX/bin/criu" ] && criu_ok "$PREFIX/bin/criu"; then
        finish "reusing private criu $V"
        exit 0
    fi
fi

# 2. Private install from Debian packages.
command -v apt-get >/dev/null 2>&1 || die "apt-get not found: this script needs a Debian-based host"
command -v dpkg >/dev/null 2>&1 || die "dpkg not found: this script needs a Debian-based host"
[ -r "$KEYRING" ] || die "Debian archive keyring $KEYRING missing (apt-get install debian-archive-keyring, or set KCR_DEBIAN_KEYRING)"
ARCH=$(dpkg --print-architecture)
[ "$ARCH" = amd64 ] || die "only amd64 is supported (this host is $ARCH)"

rm -rf "$PREFIX"/.work.* "$PREFIX/root.old"   # leftovers of an interrupted run
WORK=$(mktemp -d "$PREFIX/.work.XXXXXX")
cleanup() { rm -rf "$WORK"; }
trap cleanup EXIT

APTDIR=$WORK/apt
mkdir -p "$WORK/debs" "$WORK/root"
# debroot.sh's private apt configuration, the SID_PKGS pinned to sid.
# shellcheck source=scripts/debroot.sh
. "$(dirname "${BASH_SOURCE[0]}")/debroot.sh"
DEBROOT_MIRROR=$MIRROR
debroot_apt_config "$APTDIR" "$KEYRING" "$SID_PKGS"
APT_OPTS=("${DEBROOT_APT[@]}")
apt_() { echo "+ apt-get $*" >>"$LOG"; apt-get -q "${APT_OPTS[@]}" "$@" >>"$LOG" 2>&1; }

if ! apt_ update; then
    # Maybe this host's keyring is too old for the Release signatures. Trixie
    # is signed with keys even bookworm's keyring knows: fetch trixie's
    # debian-archive-keyring (verified that way) and retry with it.
    if grep -qE 'NO_PUBKEY|EXPKEYSIG|not signed|signature' "$LOG"; then
        echo "retrying with trixie's debian-archive-keyring" >>"$LOG"
        debroot_sources "$APTDIR/etc/sources.list" "$KEYRING" trixie
        apt_ update || die "cannot verify Debian trixie's Release file with $KEYRING"
        (cd "$WORK/debs" && apt_ download debian-archive-keyring) \
            || die "cannot download debian-archive-keyring from trixie"
        dpkg -x "$WORK"/debs/debian-archive-keyring_*.deb "$WORK/keyring"
        rm -f "$WORK"/debs/debian-archive-keyring_*.deb
        NEWKR=
        for f in "$WORK"/keyring/usr/share/keyrings/debian-archive-keyring.{gpg,pgp}; do
            if [ -z "$NEWKR" ] && [ -s "$f" ]; then NEWKR=$f; fi
        done
        [ -n "$NEWKR" ] || die "trixie's debian-archive-keyring has no keyring file"
        debroot_sources "$APTDIR/etc/sources.list" "$NEWKR"
        apt_ update || die "apt-get update (trixie + sid, private config) failed even with trixie's keyring"
    else
        die "apt-get update of Debian trixie+sid failed (no network or $MIRROR unreachable?)"
    fi
fi

# Resolve the closure with apt itself against an empty dpkg status: the sid
# packages pinned, the rest from trixie. If that does not resolve (sid moved
# on), let apt take from sid whatever criu/sid needs.
resolve() {
    local out
    echo "+ apt-get -s install $*" >>"$LOG"
    out=$(apt-get -q "${APT_OPTS[@]}" -s --no-install-recommends install "$@" 2>&1) || true
    echo "$out" >>"$LOG"
    awk '/^Inst /{v=$3; sub(/^\(/,"",v); s=$4; print $2"="v" "s}' <<<"$out"
}
PKGS=$(resolve criu || true)
if [ -z "$PKGS" ]; then
    PKGS=$(resolve criu/sid || true)
fi
[ -n "$PKGS" ] || die "apt cannot resolve criu from Debian sid + trixie"
CRIU_DEB_VER=$(awk -F'[= ]' '$1=="criu"{print $2}' <<<"$PKGS")
CRIU_ORIGIN=$(awk -F'[= ]' '$1=="criu"{print $3}' <<<"$PKGS")
[ -n "$CRIU_DEB_VER" ] || die "criu is not in Debian sid any more"
CRIU_UPSTREAM=${CRIU_DEB_VER#*:}
CRIU_UPSTREAM=${CRIU_UPSTREAM%%-*}
ver_ge "$CRIU_UPSTREAM" "$NEED" || die "Debian's newest criu is $CRIU_DEB_VER, need >= $NEED for kernel $KREL"

# Download and unpack.
mapfile -t PKGLIST < <(awk '{print $1}' <<<"$PKGS")
(cd "$WORK/debs" && apt_ download "${PKGLIST[@]}") \
    || die "apt-get download failed (no network or $MIRROR unreachable?)"
for deb in "$WORK"/debs/*.deb; do
    dpkg -x "$deb" "$WORK/root" || die "dpkg -x $deb failed"
done

LDSO=$(root_loader "$WORK/root") || die "no ld-linux-x86-64.so.2 in the unpacked libc6"
LP=$(root_libpath "$WORK/root")
BIN=$(root_criu "$WORK/root")
[ -x "$BIN" ] || die "criu binary missing from the unpacked criu package"

# Verify with the private loader that every library resolves inside the
# private root (the loader would also fall back to the host's ld.so.cache,
# i.e. to bookworm libraries: count those as missing too); for a library
# that does not, try the Debian package names its soname usually maps to.
missing_libs() {
    local out
    # (like ldd: `--list` would stop at the first missing library)
    out=$(LD_TRACE_LOADED_OBJECTS=1 LD_WARN=yes "$LDSO" --library-path "$LP" "$BIN" 2>&1) || true
    awk -v r="$WORK/root/" '$2 == "=>" && ($3 == "not" || index($3, r) != 1) {print $1}' <<<"$out" | sort -u
}
for round in 1 2 3; do
    MISSING=$(missing_libs)
    [ -n "$MISSING" ] || break
    [ "$round" != 3 ] || die "libraries not found in the private root for criu: ${MISSING//$'\n'/ }"
    echo "missing after unpack: ${MISSING//$'\n'/ }" >>"$LOG"
    for so in $MISSING; do
        base=${so%%.so*}; num=${so##*.so.}; num=${num%%.*}
        for cand in "$base$num" "$base-$num" "${base}${num}t64" "${base}-${num}t64"; do
            if (cd "$WORK/debs" && apt_ download "$cand"); then
                for deb in "$WORK"/debs/"${cand}"_*.deb; do dpkg -x "$deb" "$WORK/root"; done
                break
            fi
        done
    done
done

# Move into place (replacing an older private install), then the wrapper.
rm -rf "$PREFIX/root.old"
[ ! -e "$PREFIX/root" ] || mv "$PREFIX/root" "$PREFIX/root.old"
mv "$WORK/root" "$PREFIX/root"
rm -rf "$PREFIX/root.old"

R=$PREFIX/root
LDSO=$(root_loader "$R")
LP=$(root_libpath "$R")
BIN=$(root_criu "$R")
mkdir -p "$PREFIX/bin"
cat >"$PREFIX/bin/criu.tmp" <<EOF
#!/bin/sh
# Generated by kcr's scripts/install-criu.sh: CRIU $CRIU_DEB_VER from
# $CRIU_ORIGIN, run through its own private root ($R) and that root's
# dynamic loader, because the host's libc is too old for it. Nothing of it is
# installed into the system. \`exec\` keeps the PID and every inherited fd
# (go-criu runs \`criu swrk <fd>\`).
exec '$LDSO' --library-path '$LP' --argv0 "\$0" '$BIN' "\$@"
EOF
chmod 755 "$PREFIX/bin/criu.tmp"
mv -f "$PREFIX/bin/criu.tmp" "$PREFIX/bin/criu"
WRAPPER=$PREFIX/bin/criu

# Record what was installed.
{
    echo "# installed by kcr scripts/install-criu.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ) for kernel $KREL"
    echo "# package=version origin"
    echo "$PKGS"
} >"$PREFIX/packages.txt"

V=$(criu_version "$WRAPPER")
[ -n "$V" ] || die "the private criu does not run: $WRAPPER --version failed"
ver_ge "$V" "$NEED" || die "the private criu is $V, need >= $NEED"
criu_check "$WRAPPER" || die "criu check failed for the private criu $V ($WRAPPER); see $LOG"

finish "installed criu $V (Debian $CRIU_DEB_VER, $CRIU_ORIGIN; libraries from trixie)"
