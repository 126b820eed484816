#!/usr/bin/env bash
# kcr standby as the entrypoint of a runc container: the recipe of
# docs/standby.md, run. It builds a bundle whose process is
#   kcr standby --image-dir /var/lib/kcr/img ... -- /pipeline ...
# with the capabilities below and nothing more, runs the demo pipeline in
# it against a real broker, and checks that CYCLES orders (default 3), each
# produced while the pipeline sleeps, are answered by a restored instance
# (no cold start, nothing missing or duplicated).
#
#   sudo KCR_KAFKA_BROKERS=127.0.0.1:9092 scripts/standby-runc.sh [CYCLES]
#
# KCR_STANDBY_CAPS overrides the capabilities (to find which are needed).
# The image directory is a bind mount of the host (in Kubernetes: a volume),
# so that the image outlives the container.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_build_run
command -v runc >/dev/null || die "no runc: run scripts/install-runc.sh"
cycles="${1:-3}"
brokers="${KCR_KAFKA_BROKERS:-127.0.0.1:9092}"
# Tested minimal set (runc 1.x, CRIU 4.2.1, kernel 6.18): CAP_SYS_ADMIN for
# the service's PID namespace and CRIU, CAP_NET_ADMIN for CRIU's netlink
# (socket diagnostics, TCP repair), CAP_SYS_TIME for the restored time
# namespace's clock offsets, CAP_SYS_CHROOT for CRIU's pivot into the
# restored root. CAP_SYS_PTRACE and CAP_CHECKPOINT_RESTORE are not needed
# beside CAP_SYS_ADMIN, as root.
caps="${KCR_STANDBY_CAPS:-CAP_SYS_ADMIN CAP_NET_ADMIN CAP_SYS_TIME CAP_SYS_CHROOT}"

id="kcr-standby-$$"
stop_all() {
	runc --root "$root" kill "$id" KILL 2>/dev/null || true
	sleep 0.3
	runc --root "$root" delete -f "$id" 2>/dev/null || true
}
start_work kcr-standby-runc "${KCR_BENCH_KEEP:-}" stop_all
root="$work/runc"

b="$work/bundle"
mkdir -p "$b/rootfs"/{proc,dev,sys,tmp,run,var/lib/kcr,usr,lib,lib64,bin,sbin,opt/kcr} "$work/state" "$work/bin"
chmod 700 "$work/state"
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"
CGO_ENABLED=0 go build -o "$b/rootfs/kcr" ./cmd/kcr
CGO_ENABLED=0 go build -o "$b/rootfs/pipeline" ./examples/pipeline
go build -o "$work/bin/wakeprobe" ./test/apps/wakeprobe
go build -o "$work/bin/kcr" ./cmd/kcr
probe="$work/bin/wakeprobe"
tag="kcr-standby-runc-$$-$(date +%s)"
"$probe" -brokers "$brokers" -create 2 -orders "$tag-orders" -results "$tag-results" ||
	die "broker $brokers does not answer: set KCR_KAFKA_BROKERS"

runc spec --bundle "$b"
caps_json=$(printf '%s\n' $caps | jq -R . | jq -s .)
# The rootfs takes the host's /usr, /lib… read-only: CRIU as installed by
# scripts/install-criu.sh (/opt/kcr/criu, run through /bin/sh). A real image
# copies them in instead.
ro=$(for d in /usr /lib /lib64 /bin /sbin /opt/kcr; do
	jq -n --arg d "$d" '{destination: $d, type: "bind", source: $d, options: ["rbind", "ro"]}'
done | jq -s .)
jq --argjson caps "$caps_json" --argjson ro "$ro" --arg b "$brokers" --arg g "$tag" --arg t "$tag-orders" --arg r "$tag-results" --arg state "$work/state" '
	.process.terminal = false
	| .process.args = ["/kcr", "standby", "--image-dir", "/var/lib/kcr/img", "--idle", "1s",
		"--brokers", $b, "--group", $g, "--topics", $t, "--",
		"/pipeline", "-brokers", $b, "-group", $g, "-in", $t, "-out", $r, "-warmup", "1s", "-cache-mb", "16", "-stats-every", "0"]
	| .process.env += ["GODEBUG=multipathtcp=0", "PATH=/usr/local/sbin:/usr/bin:/bin:/usr/sbin:/sbin"]
	| .process.capabilities = {bounding: $caps, effective: $caps, permitted: $caps}
	# No rlimits: root here lacks CAP_SYS_RESOURCE.
	| del(.process.rlimits)
	| .root.readonly = false
	# The host network (a pod shares one); PID, mount, IPC and UTS namespaces of its own.
	| .linux.namespaces = [.linux.namespaces[] | select(.type != "network")]
	# CRIU uses syscalls and /proc files that the default profile and masks refuse.
	| del(.linux.seccomp) | del(.linux.maskedPaths) | del(.linux.readonlyPaths)
	# CRIU checks tun support at every restore.
	| .linux.devices += [{path: "/dev/net/tun", type: "c", major: 10, minor: 200, fileMode: 438, uid: 0, gid: 0}]
	| .linux.resources.devices += [{allow: true, type: "c", major: 10, minor: 200, access: "rwm"}]
	| .mounts += $ro
	| .mounts += [{destination: "/var/lib/kcr", type: "bind", source: $state, options: ["rbind", "rw"]}]
' "$b/config.json" >"$b/config.json.new"
mv "$b/config.json.new" "$b/config.json"

setsid runc --root "$root" run --bundle "$b" "$id" </dev/null >"$work/standby.log" 2>&1 &
status="$work/bin/kcr standby status --image-dir $work/state/img --json"
"$probe" -brokers "$brokers" -orders "$tag-orders" -results "$tag-results" -cycles "$cycles" -status "$status" -timeout 60s \
	-prefix "$tag" >"$work/probe.jsonl" || { tail -n 20 "$work/standby.log" >&2; die "the cycles failed"; }
sum=$(tail -n1 "$work/probe.jsonl")
wakes=$(grep -c '"wake_latency_ms"' "$work/standby.log" || true)
colds=$(grep -c '"msg":"standby: starting"' "$work/standby.log" || true)
echo "kcr standby in runc ($caps): $cycles orders, $wakes warm wakes, $colds cold start(s); order → result p50 $(jq .p50_ms <<<"$sum") ms, max $(jq .max_ms <<<"$sum") ms; missing $(jq .missing <<<"$sum"), duplicated $(jq .duplicated <<<"$sum")"
[ "$wakes" = "$cycles" ] && [ "$colds" = 1 ] && [ "$(jq .missing <<<"$sum")" = 0 ] && [ "$(jq .duplicated <<<"$sum")" = 0 ] ||
	{ grep '"ERROR"\|"WARN"' "$work/standby.log" | head -n 5 >&2; die "FAIL: want $cycles warm wakes, 1 cold start, nothing missing or duplicated"; }
echo PASS
