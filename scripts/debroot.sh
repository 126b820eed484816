# debroot.sh - private roots of Debian packages, for install-podman.sh and
# install-containerd.sh. Sourced, never run:
#
#   . "$(dirname "${BASH_SOURCE[0]}")/debroot.sh"
#
# The approach of install-criu.sh: `apt-get download` through a PRIVATE apt
# configuration (Debian trixie, with named packages from unstable), `dpkg -x`
# into a private root, nothing in the system's package database, no apt
# source added, the system's libc never upgraded. Programs that need a newer
# libc than the host's are patched (patchelf, from the same root) to load
# that root's dynamic loader and libraries (DT_RPATH, so that the libraries'
# own dependencies resolve there too). Unlike install-criu.sh's wrapper,
# which runs criu through the loader, a patched binary is still itself in
# /proc/self/exe: runc, crun and podman re-execute themselves.
#
# The caller sets `set -euo pipefail`, DEBROOT_LOG (log file) and
# DEBROOT_NAME (message prefix), and defines nothing else.
# shellcheck shell=bash

DEBROOT_MIRROR=${KCR_DEBIAN_MIRROR:-http://deb.debian.org/debian}
DEBROOT_KEYRING=${KCR_DEBIAN_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}

debroot_die() {
	trap - ERR
	if [ -s "${DEBROOT_LOG:-}" ]; then
		echo "---- last lines of $DEBROOT_LOG ----" >&2
		tail -n 15 "$DEBROOT_LOG" | sed 's/^/  /' >&2
		echo "----" >&2
	fi
	echo "$DEBROOT_NAME: ERROR: $*" >&2
	exit 1
}

# debroot_begin PREFIX: as root, takes PREFIX's lock (held on fd 9 until
# exit), empties $DEBROOT_LOG and makes a work directory $WORK in PREFIX,
# removed at exit; an unexpected failure is reported with its line.
debroot_begin() {
	trap 'debroot_die "unexpected failure (exit $?) at line $LINENO: $BASH_COMMAND"' ERR
	[ "$(id -u)" = 0 ] || debroot_die "run as root"
	mkdir -p "$1"
	exec 9>"$1/.lock"
	flock 9
	: >"$DEBROOT_LOG"
	rm -rf "$1"/.work.*
	WORK=$(mktemp -d "$1/.work.XXXXXX")
	trap 'rm -rf "$WORK"' EXIT
}

# debroot_sources FILE KEYRING [RELEASE...]: an apt sources.list of
# Debian's RELEASEs (default trixie and sid) whose Release files KEYRING
# verifies.
debroot_sources() {
	local file=$1 keyring=$2 r
	shift 2
	[ $# -gt 0 ] || set -- trixie sid
	for r in "$@"; do
		echo "deb [signed-by=$keyring target=Packages] $DEBROOT_MIRROR $r main"
	done >"$file"
}

# debroot_apt_config DIR KEYRING [SID_PKGS]: a private apt configuration in
# DIR (empty dpkg status, its own lists and cache): Debian trixie first, sid
# only when asked for (PKG/sid), and the packages of the space-separated
# SID_PKGS from sid. Exports APT_CONFIG; sets DEBROOT_APT (the apt-get
# options).
debroot_apt_config() {
	local a=$1
	mkdir -p "$a/etc/sources.list.d" "$a/etc/preferences.d" "$a/state/lists/partial" "$a/cache/archives/partial"
	: >"$a/state/status"
	debroot_sources "$a/etc/sources.list" "$2"
	cat >"$a/etc/preferences" <<EOF
Package: *
Pin: release n=trixie
Pin-Priority: 900

Package: *
Pin: release n=sid
Pin-Priority: 100
EOF
	if [ -n "${3:-}" ]; then
		cat >>"$a/etc/preferences" <<EOF

Package: $3
Pin: release n=sid
Pin-Priority: 990
EOF
	fi
	# The system's apt.conf.d stays in effect (proxies), but not its update
	# hooks (appstream, packagekit): a private main config, read after
	# apt.conf.d, clears them.
	echo 'Dir::Etc::main "'"$a"'/etc/main.conf";' >"$a/etc/apt.conf"
	{
		if [ -f /etc/apt/apt.conf ]; then echo '#include "/etc/apt/apt.conf";'; fi
		echo '#clear APT::Update::Pre-Invoke;'
		echo '#clear APT::Update::Post-Invoke;'
		echo '#clear APT::Update::Post-Invoke-Success;'
	} >"$a/etc/main.conf"
	export APT_CONFIG=$a/etc/apt.conf
	DEBROOT_APT=(
		-o "Dir::State=$a/state" -o "Dir::State::Lists=$a/state/lists"
		-o "Dir::State::status=$a/state/status" -o "Dir::Cache=$a/cache"
		-o "Dir::Cache::archives=$a/cache/archives"
		-o "Dir::Cache::pkgcache=$a/cache/pkgcache.bin" -o "Dir::Cache::srcpkgcache=$a/cache/srcpkgcache.bin"
		-o "Dir::Etc::SourceList=$a/etc/sources.list" -o "Dir::Etc::SourceParts=$a/etc/sources.list.d"
		-o "Dir::Etc::Preferences=$a/etc/preferences" -o "Dir::Etc::PreferencesParts=$a/etc/preferences.d"
		-o "APT::Architecture=amd64" -o "APT::Architectures::=amd64" -o "APT::Sandbox::User=root"
		-o "APT::Get::List-Cleanup=false" -o "APT::Update::Error-Mode=any" -o "APT::Default-Release="
		-o "Acquire::Languages=none" -o "Acquire::Retries=2" -o "Acquire::http::Timeout=20"
		-o "Debug::NoLocking=true"
	)
}

# debroot_apt_setup WORK: debroot_apt_config in WORK/apt, updated.
debroot_apt_setup() {
	command -v apt-get >/dev/null 2>&1 && command -v dpkg >/dev/null 2>&1 ||
		debroot_die "apt-get and dpkg are needed: this script needs a Debian-based host"
	[ "$(dpkg --print-architecture)" = amd64 ] || debroot_die "only amd64 is supported"
	[ -r "$DEBROOT_KEYRING" ] || debroot_die "Debian archive keyring $DEBROOT_KEYRING missing (apt-get install debian-archive-keyring, or set KCR_DEBIAN_KEYRING)"
	debroot_apt_config "$1/apt" "$DEBROOT_KEYRING"
	echo "+ apt-get update" >>"$DEBROOT_LOG"
	apt-get -q "${DEBROOT_APT[@]}" update >>"$DEBROOT_LOG" 2>&1 ||
		debroot_die "apt-get update of Debian trixie+sid failed (no network, $DEBROOT_MIRROR unreachable, or a keyring too old: see install-criu.sh's retry)"
}

# debroot_version PKG/RELEASE: the candidate version of a package.
debroot_version() {
	apt-cache "${DEBROOT_APT[@]}" show "$1" 2>/dev/null | awk '/^Version:/ && !v {v = $2} END {print v}'
}

# debroot_unpack WORK ROOT PKG...: download the packages (PKG or PKG/sid)
# into WORK/debs and unpack them into ROOT.
debroot_unpack() {
	local work=$1 root=$2 deb
	shift 2
	mkdir -p "$work/debs" "$root"
	echo "+ apt-get download $*" >>"$DEBROOT_LOG"
	(cd "$work/debs" && apt-get -q "${DEBROOT_APT[@]}" download "$@" >>"$DEBROOT_LOG" 2>&1) ||
		debroot_die "apt-get download $* failed (a package left Debian, or no network)"
	for deb in "$work"/debs/*.deb; do
		dpkg -x "$deb" "$root" || debroot_die "dpkg -x $deb failed"
		echo "${deb##*/}" >>"$work/unpacked"
	done
	rm -f "$work"/debs/*.deb
}

# debroot_loader ROOT: the root's dynamic loader.
debroot_loader() { echo "$1/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"; }
debroot_libpath() { echo "$1/usr/lib/x86_64-linux-gnu:$1/lib/x86_64-linux-gnu"; }

# debroot_missing ROOT FILE: the libraries FILE needs that do not resolve
# inside ROOT (the host's count as missing).
debroot_missing() {
	local out
	out=$(LD_TRACE_LOADED_OBJECTS=1 LD_WARN=yes "$(debroot_loader "$1")" --library-path "$(debroot_libpath "$1")" "$2" 2>&1) || true
	awk -v r="$1/" '$2 == "=>" && ($3 == "not" || index($3, r) != 1) {print $1}' <<<"$out" | sort -u | tr '\n' ' '
}

# debroot_patch ROOT BIN...: make each BIN load ROOT's loader and libraries.
# Two patchelf runs: one that changes both the interpreter and the rpath of a
# Go binary leaves one that segfaults (patchelf 0.18), two in turn do not.
debroot_patch() {
	local root=$1 b m pe
	shift
	pe=("$(debroot_loader "$root")" --library-path "$(debroot_libpath "$root")" "$root/usr/bin/patchelf")
	for b in "$@"; do
		m=$(debroot_missing "$root" "$b")
		[ -z "$m" ] || debroot_die "libraries not found in the private root for ${b##*/}: $m"
		"${pe[@]}" --force-rpath --set-rpath "$(debroot_libpath "$root")" "$b" >>"$DEBROOT_LOG" 2>&1 ||
			debroot_die "patchelf --set-rpath $b failed"
		"${pe[@]}" --set-interpreter "$(debroot_loader "$root")" "$b" >>"$DEBROOT_LOG" 2>&1 ||
			debroot_die "patchelf --set-interpreter $b failed"
	done
}

# debroot_link LINK TARGET: a symlink, never over a real file. Prints a note.
debroot_link() {
	if [ -e "$1" ] && [ ! -L "$1" ]; then
		echo "; NOT linked: $1 is a real file"
		return 0
	fi
	mkdir -p "${1%/*}"
	ln -sfn "$2" "$1.tmp.$$"
	mv -Tf "$1.tmp.$$" "$1"
}
