#!/usr/bin/env bash
# kube-down.sh - stop the control plane of kube-up.sh and remove its home
# (certificates, etcd's data, volumes). Stop the kubelet first
# (kubelet-down.sh): its pods are the cluster's.
#
# Environment: KCR_KUBE_HOME as for kube-up.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_root

HOME_=${KCR_KUBE_HOME:-/var/tmp/kcr-kube-run}
[ -d "$HOME_" ] || exit 0
# The clients first, etcd last.
for c in kube-scheduler kube-controller-manager kube-apiserver etcd; do
	[ -r "$HOME_/$c.pid" ] || continue
	pid=$(cat "$HOME_/$c.pid")
	alive "$pid" || continue
	kill -TERM "$pid" 2>/dev/null || true
	for _ in $(seq 1 100); do alive "$pid" || break; sleep 0.1; done
	alive "$pid" && kill -KILL "$pid" 2>/dev/null || true
done
rm -rf "$HOME_"
