#!/usr/bin/env bash
# kubelet-up.sh - run the kubelet of install-kubelet.sh standalone (static
# pods from a directory, no API server) against the private containerd of
# containerd-up.sh, for kcr's Kubernetes tests. scripts/kubelet-down.sh
# stops it and removes everything it created on the host.
#
# Standalone, the kubelet needs: failCgroupV1 false (a cgroup v1/v2 hybrid
# host), a cgroupRoot that exists (created here in every v1 hierarchy),
# anonymous authentication with AlwaysAllow on 127.0.0.1:10250 (its
# checkpoint API), no webhook. It changes host sysctls at start
# (vm.overcommit_memory, kernel.panic, kernel.panic_on_oops): it runs in a
# mount namespace of its own where those /proc/sys files are bind mounts of
# private copies, so the host keeps its values; its bind mount of its root
# directory stays in that namespace too. The host paths it creates whatever
# its flags (/var/lib/kubelet/device-plugins, /var/log/containers,
# /usr/libexec/kubernetes, /var/log/pods) are recorded when absent and
# removed by kubelet-down.sh.
#
# With KCR_KUBELET_KUBECONFIG (kube-up.sh's HOME/kubelet.kubeconfig) it
# also registers as the node kcr-node of that API server and runs the pods
# scheduled to it; its static pods still run. The node's address is the
# host's (the kubelet refuses a loopback --node-ip) while its API stays on
# 127.0.0.1: the API server cannot reach it for logs or exec, and a probe
# of a service on loopback names host 127.0.0.1.
#
# Prints the static pod directory.
#
# Environment:
#   KCR_KUBELET_HOME  its files (default /var/tmp/kcr-kubelet-run)
#   KCR_KUBELET_KUBECONFIG  the API server to register with (default none:
#                     standalone)
#   KCR_CONTAINERD_SOCK as for containerd-up.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_root

HOME_=${KCR_KUBELET_HOME:-/var/tmp/kcr-kubelet-run}
SOCK=${KCR_CONTAINERD_SOCK:-/run/kcr-containerd/containerd.sock}
CGROOT=kcr-kubelet
KUBELET=$(scripts/install-kubelet.sh)
api=()
if [ -n "${KCR_KUBELET_KUBECONFIG:-}" ]; then
	[ -r "$KCR_KUBELET_KUBECONFIG" ] || die "KCR_KUBELET_KUBECONFIG $KCR_KUBELET_KUBECONFIG: not readable: run scripts/kube-up.sh first"
	api=(--kubeconfig "$KCR_KUBELET_KUBECONFIG")
fi
[ -S "$SOCK" ] || die "no containerd at $SOCK: run scripts/containerd-up.sh first"
if [ -r "$HOME_/kubelet.pid" ] && alive "$(cat "$HOME_/kubelet.pid")"; then
	echo "$HOME_/manifests"
	exit 0
fi
mkdir -p "$HOME_/manifests" "$HOME_/root" "$HOME_/sysctl"
chmod 0700 "$HOME_"
# What the kubelet creates on the host: recorded only if absent now.
: >"$HOME_/created"
for p in /var/lib/kubelet /var/log/containers /var/log/pods /usr/libexec/kubernetes; do
	[ -e "$p" ] || echo "$p" >>"$HOME_/created"
done
for d in /sys/fs/cgroup/*/; do
	case $d in */unified/) continue ;; esac
	if [ ! -d "$d$CGROOT" ]; then
		mkdir "$d$CGROOT" && echo "$d$CGROOT" >>"$HOME_/cgroups"
	fi
done
cat >"$HOME_/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: $HOME_/manifests
fileCheckFrequency: 1s
syncFrequency: 5s
address: 127.0.0.1
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
failCgroupV1: false
failSwapOn: false
cgroupDriver: cgroupfs
cgroupRoot: /$CGROOT
containerRuntimeEndpoint: unix://$SOCK
imageServiceEndpoint: unix://$SOCK
resolvConf: ""
evictionHard:
  memory.available: "0%"
  nodefs.available: "0%"
  imagefs.available: "0%"
imageGCHighThresholdPercent: 100
serializeImagePulls: false
EOF
LOG=$HOME_/kubelet.log
# The sysctls it would set: private copies in its own mount namespace.
sysctls="vm/overcommit_memory kernel/panic kernel/panic_on_oops"
setsid unshare --mount --propagation private bash -c '
	set -e
	for s in '"$sysctls"'; do
		f='"$HOME_"'/sysctl/${s//\//.}
		cat /proc/sys/$s >"$f"
		mount --bind "$f" /proc/sys/$s
	done
	exec "$0" --config '"$HOME_"'/config.yaml --root-dir '"$HOME_"'/root --cert-dir '"$HOME_"'/pki \
		--hostname-override kcr-node --v 2 "${@:1}"
' "$KUBELET" "${api[@]}" </dev/null >>"$LOG" 2>&1 &
echo $! >"$HOME_/kubelet.pid"
for _ in $(seq 1 300); do
	if curl -sf http://127.0.0.1:10248/healthz >/dev/null 2>&1; then
		echo "$HOME_/manifests"
		exit 0
	fi
	alive "$(cat "$HOME_/kubelet.pid")" || { tail -n 20 "$LOG" >&2; die "the kubelet exited; log $LOG"; }
	sleep 0.2
done
tail -n 20 "$LOG" >&2
die "the kubelet did not answer on 127.0.0.1:10248 within 60 s; log $LOG"
