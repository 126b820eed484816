#!/usr/bin/env bash
# containerd-down.sh - stop the containerd that scripts/containerd-up.sh
# started (its PID file), and nothing else.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
SOCK=${KCR_CONTAINERD_SOCK:-/run/kcr-containerd/containerd.sock}
PIDF=${SOCK%/*}/containerd.pid
[ -r "$PIDF" ] || exit 0
pid=$(cat "$PIDF")
if alive "$pid" && grep -q containerd "/proc/$pid/comm" 2>/dev/null; then
	kill "$pid"
	for _ in $(seq 1 100); do alive "$pid" || break; sleep 0.1; done
fi
rm -f "$PIDF"
