#!/usr/bin/env bash
# kubelet-down.sh - stop the kubelet of kubelet-up.sh, remove its static
# pods' sandboxes from containerd, and what it created on the host: the
# paths kubelet-up.sh recorded as absent, its cgroupRoot, its home.
#
# Environment: KCR_KUBELET_HOME, KCR_CONTAINERD_SOCK as for kubelet-up.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_root

HOME_=${KCR_KUBELET_HOME:-/var/tmp/kcr-kubelet-run}
[ -d "$HOME_" ] || exit 0
if [ -r "$HOME_/kubelet.pid" ]; then
	pid=$(cat "$HOME_/kubelet.pid")
	if alive "$pid"; then
		# Its static pods go with their manifests first, so that the
		# kubelet stops their containers itself.
		rm -f "$HOME_"/manifests/*
		sleep 3
		kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
		for _ in $(seq 1 100); do alive "$pid" || break; sleep 0.1; done
		alive "$pid" && kill -KILL -- "-$pid" 2>/dev/null || true
	fi
fi
if [ -r "$HOME_/created" ]; then
	while read -r p; do
		case $p in /var/lib/kubelet | /var/log/containers | /var/log/pods | /usr/libexec/kubernetes) rm -rf "$p" ;; esac
	done <"$HOME_/created"
fi
if [ -r "$HOME_/cgroups" ]; then
	# Deepest first: the kubelet's kubepods hierarchy under each root.
	while read -r d; do
		[ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null || true
	done <"$HOME_/cgroups"
fi
rm -rf "$HOME_"
