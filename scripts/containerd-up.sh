#!/usr/bin/env bash
# containerd-up.sh - start the private containerd of install-containerd.sh
# for kcr's CRI tests (test/e2e/cri_test.go), unless it already runs.
#
# Its own configuration, root (/var/lib/kcr-containerd), state and socket
# (/run/kcr-containerd/containerd.sock): a system containerd, if any, is not
# touched. The CRI plugin is configured for kcr's tests:
#   - runc (the system's, install-runc.sh) through the runc v2 shim, and the
#     container or pod annotation org.criu.config passed to it, so that a
#     pod can name the CRIU configuration that runs kcr's hook (kcr
#     install-runtime-hook): the kubelet passes a pod's annotations, not a
#     container's;
#   - no registry: the sandbox ("pause") image is $KCR_CONTAINERD_SANDBOX_IMAGE
#     (default kcr.local/e2e:1), which the tests import themselves;
#   - restrict_oom_score_adj: the sandbox's default oom_score_adj (-998) would
#     need CAP_SYS_RESOURCE, which root here lacks (runc's init dies: "can't
#     get final child's PID from pipe: EOF");
#   - the streaming server on 127.0.0.1 only, NRI off, no CNI (pods use the
#     host network: the tests' broker is on loopback).
# containerd 2.1 restores a container from a checkpoint archive in
# CreateContainer without further configuration (it has no
# enable_experimental_restore_via_create switch; see docs/runtimes.md).
#
# Prints the socket. Stop it with scripts/containerd-down.sh.
#
# Environment:
#   KCR_CONTAINERD_PREFIX         as for install-containerd.sh (default /opt/kcr/containerd)
#   KCR_CONTAINERD_SOCK           socket (default /run/kcr-containerd/containerd.sock)
#   KCR_CONTAINERD_RUNC           runc binary (default: runc on PATH)
#   KCR_CONTAINERD_SANDBOX_IMAGE  sandbox image name (default kcr.local/e2e:1)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_root

PREFIX=${KCR_CONTAINERD_PREFIX:-/opt/kcr/containerd}
SOCK=${KCR_CONTAINERD_SOCK:-/run/kcr-containerd/containerd.sock}
STATE=${SOCK%/*}
ROOT=/var/lib/kcr-containerd
LOGDIR=/var/tmp/kcr-containerd
SANDBOX=${KCR_CONTAINERD_SANDBOX_IMAGE:-kcr.local/e2e:1}
[ -x "$PREFIX/bin/containerd" ] || die "no containerd in $PREFIX: run scripts/install-containerd.sh first"
RUNC=${KCR_CONTAINERD_RUNC:-$(command -v runc || true)}
[ -n "$RUNC" ] || die "runc not found: run scripts/install-runc.sh first"
command -v criu >/dev/null 2>&1 || die "criu not found: run scripts/install-criu.sh first"

ctr_() { "$PREFIX/bin/ctr" --address "$SOCK" "$@"; }
if [ -S "$SOCK" ] && ctr_ version >/dev/null 2>&1; then
	echo "$SOCK"
	exit 0
fi

mkdir -p "$STATE" "$ROOT" "$LOGDIR"
chmod 0700 "$STATE" "$ROOT"
CONF=$STATE/config.toml
cat >"$CONF" <<EOF
# Written by kcr's scripts/containerd-up.sh.
version = 3
root = "$ROOT"
state = "$STATE/state"

[grpc]
  address = "$SOCK"

[ttrpc]
  address = "$SOCK.ttrpc"

[plugins.'io.containerd.nri.v1.nri']
  disable = true

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$SANDBOX"

[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      container_annotations = ["org.criu.config"]
      pod_annotations = ["org.criu.config"]
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "$RUNC"
        SystemdCgroup = false

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
EOF
LOG=$LOGDIR/containerd.log
PATH=$PREFIX/bin:$PATH setsid "$PREFIX/bin/containerd" --config "$CONF" </dev/null >>"$LOG" 2>&1 &
echo $! >"$STATE/containerd.pid"
for _ in $(seq 1 100); do
	if ctr_ version >/dev/null 2>&1; then
		echo "$SOCK"
		exit 0
	fi
	alive "$(cat "$STATE/containerd.pid")" || { tail -n 20 "$LOG" >&2; die "containerd exited; log $LOG"; }
	sleep 0.1
done
tail -n 20 "$LOG" >&2
die "containerd did not answer on $SOCK within 10 s; log $LOG"
