#!/usr/bin/env bash
# What kcr's CRIU hook adds to a checkpoint in the container runtimes of
# docs/runtimes.md, against the same runtime without it (scripts/bench-runc.sh
# does runc itself): the same service (test/apps/kafkaapp, static, producing
# to an embedded kfake broker) in two containers that differ only in the
# CRIU configuration their org.criu.config annotation names: "tcp-close"
# alone ("plain"), or kcr's block (kcr install-runtime-hook --tcp-close,
# "kcr"). Rounds alternate them.
#
#   - Podman 5 (runc): podman container checkpoint --export, then
#     podman container restore --import of the same container;
#   - containerd 2 over CRI: CheckpointContainer (test/apps/cribench), which
#     leaves the container running, as the kubelet's checkpoint API does.
#
# Prints medians in ms and the difference. Needs scripts/install-podman.sh,
# scripts/install-containerd.sh and scripts/containerd-up.sh.
#
#   sudo scripts/bench-runtimes.sh [ROUNDS]     # default 10
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
rounds=${1:-10}
port=${KCR_BENCH_PORT:-19393}
need_root
need_go
need_jq
command -v podman >/dev/null || die "no podman: run scripts/install-podman.sh"
sock=${KCR_CONTAINERD_SOCK:-/run/kcr-containerd/containerd.sock}
[ -S "$sock" ] || die "no containerd at $sock: run scripts/install-containerd.sh and scripts/containerd-up.sh"

work=$(mktemp -d /tmp/kcr-bench-runtimes-XXXXXX)
image=localhost/kcr-bench:$$
cleanup() {
	podman rm -f -t 0 "plain-$$" "kcr-$$" >/dev/null 2>&1 || true
	podman rmi -f "$image" >/dev/null 2>&1 || true
	if [ -n "${broker:-}" ]; then kill "$broker" 2>/dev/null || true; fi
	if [ -n "${KCR_BENCH_KEEP:-}" ]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT

hook_bench_start "$work" "$port"
go build -o "$work/cribench" \
	./test/apps/cribench
mkdir -p "$work/rootfs"
CGO_ENABLED=0 go build -o "$work/rootfs/kafkaapp" \
	./test/apps/kafkaapp
CGO_ENABLED=0 go build -o "$work/rootfs/pause" \
	./test/apps/pause
args=(-brokers "127.0.0.1:$port" -topic bench -produce-rate 200)

# Podman.
pol=()
[ ! -f /opt/kcr/podman/etc/policy.json ] || pol=(--signature-policy /opt/kcr/podman/etc/policy.json)
tar -C "$work/rootfs" -cf "$work/rootfs.tar" .
podman import "${pol[@]}" "$work/rootfs.tar" "$image" >/dev/null 2>&1
start() { # mode
	podman --runtime runc run -d --name "$1-$$" --network host --ulimit host --annotation "org.criu.config=$work/$1.conf" \
		-e GODEBUG=multipathtcp=0 --entrypoint /kafkaapp "$image" "${args[@]}" >/dev/null
}
for mode in plain kcr; do start "$mode"; done
sleep 2
declare -a pc pr kc kr kh cc ck ch
for i in $(seq 1 "$rounds"); do
	for mode in plain kcr; do
		img="$work/podman-$mode-$i.tar"
		t0=$(now_ns)
		podman container checkpoint --export "$img" --compress none "$mode-$$" >/dev/null
		t1=$(now_ns)
		podman rm -f "$mode-$$" >/dev/null
		t2=$(now_ns)
		podman container restore --import "$img" --name "$mode-$$" </dev/null >/dev/null
		t3=$(now_ns)
		if [ "$mode" = plain ]; then
			pc+=("$(elapsed_us "$t0" "$t1")") pr+=("$(elapsed_us "$t2" "$t3")")
		else
			kc+=("$(elapsed_us "$t0" "$t1")") kr+=("$(elapsed_us "$t2" "$t3")")
			# The app's own hooks: the sum of their run times in the reports.
			kh+=("$(tar -xOf "$img" checkpoint/kcr-hooks.json | jq '[.targets[].reports[].duration_ns] | add / 1000 | floor')")
		fi
		rm -f "$img"
		sleep 0.5
	done
done
podman rm -f -t 0 "plain-$$" "kcr-$$" >/dev/null

# containerd over CRI.
while read -r mode t h; do
	if [ "$mode" = plain ]; then cc+=("$t"); else ck+=("$t") ch+=("$h"); fi
done < <("$work/cribench" -sock "$sock" -kafkaapp "$work/rootfs/kafkaapp" -pause "$work/rootfs/pause" -work "$work" \
	-rounds "$rounds" -conf "plain=$work/plain.conf" -conf "kcr=$work/kcr.conf" -- "${args[@]}")
[ "${#ck[@]}" = "$rounds" ] || die "cribench gave ${#ck[@]} of $rounds checkpoints"

row() { # label plain kcr [hooks]
	local a b h=-
	a=$(median_ms "$2") b=$(median_ms "$3")
	[ -z "${4:-}" ] || h=$(median_ms "$4")
	printf '%-44s %9s %9s %8.1f %8s %14s\n' "$1" "$a" "$b" "$(awk -v a="$a" -v b="$b" 'BEGIN { print b - a }')" "$h" \
		"$([ "$h" = - ] && echo - || awk -v a="$a" -v b="$b" -v h="$h" 'BEGIN { printf "%.1f", b - a - h }')"
}
echo "$rounds rounds; medians in ms ($(podman --version), containerd $("${KCR_CONTAINERD_PREFIX:-/opt/kcr/containerd}/bin/containerd" -v | awk '{print $3}'))"
printf '%-44s %9s %9s %8s %8s %14s\n' "" alone "+ kcr" added hooks "added - hooks"
row "podman checkpoint --export (runc)" pc kc kh
row "podman restore --import (runc)" pr kr
row "CRI CheckpointContainer (containerd, runc)" cc ck ch
