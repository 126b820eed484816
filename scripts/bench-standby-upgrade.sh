#!/usr/bin/env bash
# A new version deployed while the service sleeps, measured on a real
# broker: the demo pipeline (examples/pipeline) runs under kcr standby from
# a copy of its binary; each upgrade cycle waits until it sleeps, renames a
# new build of it over the copy (as dpkg, rpm and go build -o do), produces
# one order and waits for its result: kcr standby does not restore the
# outdated image and starts the new binary cold. The same number of plain
# warm wakes (no new binary) first, for comparison.
#
#   sudo scripts/bench-standby-upgrade.sh [cycles]     (default 10)
#
# It prints, per client library: order → result p50/p95/max for a warm wake
# and after an upgrade, the lines kcr standby logged for the upgrades (one
# INFO each, no ERROR), and the orders missing and duplicated (both 0).
#
# Environment: KCR_KAFKA_BROKERS (default 127.0.0.1:9092;
# KCR_KAFKA_PROD_BROKERS, if set, is used instead), KCR_BENCH_CLIENTS
# (default "franz kafka-go"; see bench-standby.sh), KCR_BENCH_IDLE (--idle,
# default 1s), KCR_BENCH_WARMUP (the pipeline's warm-up, default 3s: a cold
# start pays it), KCR_BENCH_CACHE_MB (default 64), KCR_BENCH_KEEP=1 keeps the
# work directory.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_build_run
cycles="${1:-10}"
brokers="${KCR_KAFKA_PROD_BROKERS:-${KCR_KAFKA_BROKERS:-127.0.0.1:9092}}"
clients="${KCR_BENCH_CLIENTS:-franz kafka-go}"
idle="${KCR_BENCH_IDLE:-1s}"
warmup="${KCR_BENCH_WARMUP:-3s}"
cache_mb="${KCR_BENCH_CACHE_MB:-64}"

sb_pid=""
stop_all() { stop_standby "$sb_pid" "$work"/*/img; }
start_work kcr-bench-upgrade "${KCR_BENCH_KEEP:-}" stop_all
bin="$work/bin"
build_bins "$bin" cmd/kcr test/apps/wakeprobe
# Two versions of the pipeline: another link, another binary.
for v in 1 2; do
	GOFLAGS=-buildvcs=false go build -ldflags "-X main.kcrBenchVersion=$v" -o "$bin/pipeline-v$v" ./examples/pipeline
done
cmp -s "$bin/pipeline-v1" "$bin/pipeline-v2" && die "the two builds of the pipeline are the same file"
probe="$bin/wakeprobe"
"$probe" -brokers "$brokers" -create 1 -orders "kcr-bench-ping-$$" -results "kcr-bench-pong-$$" >/dev/null ||
	die "broker $brokers does not answer: start one (scripts/kafka-up.sh) or set KCR_KAFKA_BROKERS"
for c in $clients; do pipeline_client_args "$c" >/dev/null || die "KCR_BENCH_CLIENTS: see above"; done

# install V: rename pipeline-vV over the service's binary.
install() {
	cp "$bin/pipeline-v$1" "$bin/svc.new"
	mv "$bin/svc.new" "$bin/svc"
}

results=()
for c in $clients; do
	read -r -a cargs <<<"$(pipeline_client_args "$c")"
	run="$work/$c"
	mkdir -p "$run"
	tag="kcr-bench-upgrade-$c-$$-$(date +%s)"
	orders="$tag-orders" res="$tag-results" group="$tag"
	"$probe" -brokers "$brokers" -create 2 -orders "$orders" -results "$res"
	install 1
	setsid "$bin/kcr" standby --image-dir "$run/img" --idle "$idle" --brokers "$brokers" --group "$group" --topics "$orders" -- \
		"$bin/svc" -brokers "$brokers" -group "$group" -in "$orders" -out "$res" "${cargs[@]}" -warmup "$warmup" -cache-mb "$cache_mb" -stats-every 0 \
		</dev/null >"$run/standby.log" 2>&1 &
	sb_pid=$!
	status="$bin/kcr standby status --image-dir $run/img --json"
	"$probe" -brokers "$brokers" -orders "$orders" -results "$res" -cycles "$cycles" -status "$status" -timeout 120s \
		-prefix "$tag-warm" >"$run/warm.jsonl" || { tail -n 20 "$run/standby.log" >&2; die "warm cycles failed ($c)"; }
	v=1
	: >"$run/upgrade.jsonl"
	for ((i = 0; i < cycles; i++)); do
		for ((j = 0; j < 600; j++)); do
			[ "$($status 2>/dev/null | jq -r .state)" = standby ] && break
			sleep 0.2
		done
		[ "$j" -lt 600 ] || { tail -n 20 "$run/standby.log" >&2; die "kcr standby ($c) did not put the pipeline to sleep within 120 s"; }
		v=$((3 - v))
		install "$v"
		"$probe" -brokers "$brokers" -orders "$orders" -results "$res" -cycles 1 -status "$status" -timeout 120s \
			-prefix "$tag-upgrade-$i" | tail -n1 >>"$run/upgrade.jsonl" || { tail -n 20 "$run/standby.log" >&2; die "upgrade cycle $i failed ($c)"; }
	done
	stop_standby "$sb_pid" "$run/img"
	sb_pid=""
	mapfile -t up < <(jq -r .p50_ms "$run/upgrade.jsonl")
	missing=$(jq -s 'map(.missing) | add' "$run/upgrade.jsonl")
	dup=$(jq -s 'map(.duplicated) | add' "$run/upgrade.jsonl")
	infos=$(grep -c '"msg":"standby: not restoring the image, the binary changed; starting the service cold"' "$run/standby.log" || true)
	errors=$(grep -c '"level":"ERROR"' "$run/standby.log" || true)
	p95=$(printf '%s\n' "${up[@]}" | sort -g | awk '{a[NR]=$1} END {i=int(NR*0.95+0.999); if (i<1) i=1; print a[i]}')
	mx=$(printf '%s\n' "${up[@]}" | sort -g | tail -n1)
	results+=("$c|$(tail -n1 "$run/warm.jsonl")|$(median "${up[@]}")|$p95|$mx|$missing|$dup|$infos|$errors")
done

echo "kcr standby upgrades on $brokers, $(date -u +%F), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'): $cycles warm wakes, then $cycles new binaries while asleep (--idle $idle, warm-up $warmup, cache $cache_mb MiB, load $(cut -d' ' -f1-3 /proc/loadavg))"
for r in "${results[@]}"; do
	IFS='|' read -r c w u50 u95 umax missing dup infos errors <<<"$r"
	echo "$c:"
	printf '  %-40s p50 %7.0f  p95 %7.0f  max %7.0f ms\n' "order → result, warm wake" \
		"$(jq .p50_ms <<<"$w")" "$(jq .p95_ms <<<"$w")" "$(jq .max_ms <<<"$w")"
	printf '  %-40s p50 %7.0f  p95 %7.0f  max %7.0f ms\n' "order → result, new binary (cold start)" "$u50" "$u95" "$umax"
	printf '  %-40s %7.1f x\n' "ratio upgrade / warm (p50)" "$(jq -n --argjson a "$u50" --argjson b "$(jq .p50_ms <<<"$w")" '$a/$b')"
	echo "  kcr standby: $infos INFO lines \"the binary changed\" for $cycles upgrades, $errors ERROR lines"
	echo "  orders missing: $(jq .missing <<<"$w") (warm) $missing (upgrades), duplicated: $(jq .duplicated <<<"$w") (warm) $dup (upgrades)"
done
