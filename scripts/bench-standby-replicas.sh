#!/usr/bin/env bash
# Replicas under kcr standby --replicas, measured on a real broker: three
# replicas of the demo pipeline (examples/pipeline, each order costing
# KCR_BENCH_ORDER_COST_MS, so one replica's capacity is known), each under its
# own kcr standby with the same group, coordinating through Kafka alone.
#
#   sudo scripts/bench-standby-replicas.sh
#
# Per client library, after all three sleep (test/apps/replicabench):
#   - a burst of KCR_BENCH_BURST orders → the first result's latency, and
#     how many replicas woke;
#   - a sustained load at 2.5× one replica's capacity for KCR_BENCH_LOAD →
#     the time until the three run, the changes of the group's member set
#     (one per rebalance), the highest order → result latency (the oldest
#     unprocessed order's age);
#   - load stopped → the time until all three sleep;
#   - orders missing and duplicated over the run (an independent reader of
#     the results; both must be 0).
# With KCR_BENCH_CYCLES=N, collective sleeps instead: N times, all three are
# woken by hand, fall asleep together once idle, and one order is sent at
# once: its order → first result latency (p50, p95, max) and the orders
# missing; no burst, load or cold starts.
#
#   sudo KCR_BENCH_CYCLES=20 scripts/bench-standby-replicas.sh
#
# Then the same pipeline started cold for an order (scripts/bench-standby.sh's
# way), and KEDA's model on the same numbers: its Kafka scaler polls the lag
# every 30 s (a first wake waits 15 s on average), the HPA syncs every 15 s,
# each pod pays the cold start, and it scales to zero after its 300 s
# cooldown.
#
# Environment: KCR_KAFKA_PROD_BROKERS (a broker with production group
# settings; else KCR_KAFKA_BROKERS, default 127.0.0.1:9092),
# KCR_BENCH_CLIENTS (default "franz kafka-go"; also franz-848,
# kafka-go-handover), KCR_BENCH_ORDER_COST_MS (default 20: 50 orders/s a
# replica), KCR_BENCH_BURST (default 20), KCR_BENCH_LOAD (seconds, default
# 30), KCR_BENCH_IDLE (--idle, default 2s), KCR_BENCH_SCALE_UP (
# --scale-up-after, default 3s), KCR_BENCH_COLD (cold starts, default 3),
# KCR_BENCH_KEEP=1 keeps the work directory.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_build_run
brokers="${KCR_KAFKA_PROD_BROKERS:-${KCR_KAFKA_BROKERS:-127.0.0.1:9092}}"
clients="${KCR_BENCH_CLIENTS:-franz kafka-go}"
cost_ms="${KCR_BENCH_ORDER_COST_MS:-20}"
burst="${KCR_BENCH_BURST:-20}"
load="${KCR_BENCH_LOAD:-30}"
idle="${KCR_BENCH_IDLE:-2s}"
scale_up="${KCR_BENCH_SCALE_UP:-3s}"
cold_cycles="${KCR_BENCH_COLD:-3}"
cycles="${KCR_BENCH_CYCLES:-0}"
[[ $cycles =~ ^[0-9]+$ ]] || die "KCR_BENCH_CYCLES must be a number"
[[ $cost_ms =~ ^[1-9][0-9]*$ && $burst =~ ^[1-9][0-9]*$ && $load =~ ^[1-9][0-9]*$ && $cold_cycles =~ ^[1-9][0-9]*$ ]] ||
	die "KCR_BENCH_ORDER_COST_MS, KCR_BENCH_BURST, KCR_BENCH_LOAD and KCR_BENCH_COLD must be positive integers"
for c in $clients; do pipeline_client_args "$c" >/dev/null || die "KCR_BENCH_CLIENTS: see above"; done

sb_pids=()
stop_all() {
	local p
	for p in "${sb_pids[@]}"; do stop_standby "$p"; done
	stop_standby "" "$work"/*/r?
	[ -e "$work/cold.pid" ] && kill -TERM "$(cat "$work/cold.pid")" 2>/dev/null || true
}
start_work kcr-bench-replicas "${KCR_BENCH_KEEP:-}" stop_all
bin="$work/bin"
build_bins "$bin" cmd/kcr examples/pipeline test/apps/wakeprobe test/apps/replicabench
probe="$bin/wakeprobe"
"$probe" -brokers "$brokers" -create 1 -orders "kcr-bench-ping-$$" -results "kcr-bench-pong-$$" >/dev/null ||
	die "broker $brokers does not answer: start one (KCR_KAFKA_PROD=1 scripts/kafka-up.sh) or set KCR_KAFKA_PROD_BROKERS"
cost="${cost_ms}ms"
capacity=$((1000 / cost_ms)) # one replica's orders/s
rate=$((capacity * 5 / 2))

results=()
for c in $clients; do
	read -r -a cargs <<<"$(pipeline_client_args "$c")"
	run="$work/$c"
	mkdir -p "$run"
	tag="kcr-bench-replicas-$c-$$-$(date +%s)"
	orders="$tag-orders" res="$tag-results" group="$tag"
	"$probe" -brokers "$brokers" -create 6 -orders "$orders" -results "$res"
	svc=("$bin/pipeline" -brokers "$brokers" -group "$group" -in "$orders" -out "$res" "${cargs[@]}"
		-warmup 3s -cache-mb 64 -stats-every 0 -batch 10 -order-cost "$cost")
	dirs=()
	for i in 0 1 2; do
		setsid "$bin/kcr" standby --image-dir "$run/r$i" --idle "$idle" --brokers "$brokers" --group "$group" --topics "$orders" \
			--replicas --replicas-topic "$tag-claims" --scale-up-after "$scale_up" -- "${svc[@]}" -client-id "pipeline-$i" \
			</dev/null >"$run/standby-$i.log" 2>&1 &
		sb_pids+=($!)
		dirs+=("$run/r$i")
	done
	dirlist=$(
		IFS=,
		echo "${dirs[*]}"
	)
	"$bin/replicabench" -brokers "$brokers" -orders "$orders" -results "$res" -group "$group" -kcr "$bin/kcr" -dirs "$dirlist" \
		-burst "$burst" -rate "$rate" -load "${load}s" -cycles "$cycles" >"$run/replicas.json" ||
		{ tail -n 20 "$run"/standby-*.log >&2; die "the replicas run failed ($c)"; }
	for p in "${sb_pids[@]}"; do stop_standby "$p"; done
	sb_pids=()
	stop_standby "" "${dirs[@]}"
	if ((cycles > 0)); then
		results+=("$c|$(cat "$run/replicas.json")|")
		continue
	fi

	# The same pipeline cold, one order per start.
	bench_cold_starts "$probe" "$brokers" "$orders-cold" "$res-cold" "$cold_cycles" "$tag-cold" "$run" "$bin/kcr" \
		"$bin/pipeline" -brokers "$brokers" -group "$group-cold" -in "$orders-cold" -out "$res-cold" "${cargs[@]}" \
		-warmup 3s -cache-mb 64 -stats-every 0 -order-cost "$cost" || die "cold cycles failed ($c)"
	results+=("$c|$(cat "$run/replicas.json")|$(tail -n1 "$run/cold.jsonl")")
done

echo "kcr standby --replicas, 3 replicas of examples/pipeline on $brokers, $(date -u +%F), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'):"
echo "  order cost $cost (one replica: $capacity orders/s), burst $burst, load $rate orders/s for ${load}s, --idle $idle, --scale-up-after $scale_up, load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in "${results[@]}"; do
	IFS='|' read -r c j k <<<"$r"
	f() { jq -r "$1" <<<"$j"; }
	if ((cycles > 0)); then
		printf '%s: %s collective sleeps → one order: first result p50 %.0f ms, p95 %.0f ms, max %.0f ms; orders %s, missing %s, duplicated %s\n' \
			"$c" "$(f .cycles)" "$(f .collective_p50_ms)" "$(f .collective_p95_ms)" "$(f .collective_max_ms)" "$(f .orders)" "$(f .missing)" "$(f .duplicated)"
		echo "  each (ms): $(f '.collective_first_result_ms | map(floor) | join(" ")')"
		continue
	fi
	cold=$(jq .p50_ms <<<"$k")
	echo "$c:"
	printf '  %-46s %8.0f ms, %s of 3 replicas woken\n' "burst to the sleeping group → first result" "$(f .burst_first_result_ms)" "$(f .burst_replicas_woken)"
	printf '  %-46s %8.0f ms (most running at once: %s), %s member-set changes\n' "load 2.5× → all 3 running" "$(f .load_all_running_ms)" "$(f .load_most_running)" "$(f .load_member_changes)"
	printf '  %-46s %8.0f ms\n' "highest order → result (lag age) under load" "$(f .load_highest_lag_age_ms)"
	printf '  %-46s %8.0f ms (results drained after %.0f ms)\n' "load stopped → all 3 asleep" "$(f .stop_all_asleep_ms)" "$(f .stop_results_drained_ms)"
	printf '  %-46s %8.0f ms (p50 of %s)\n' "cold start: order → result" "$cold" "$cold_cycles"
	printf '  %-46s %8.0f ms mean, %.0f worst\n' "KEDA's model: burst → first result" "$(awk -v c="$cold" 'BEGIN{print 15000+c}')" "$(awk -v c="$cold" 'BEGIN{print 30000+c}')"
	printf '  %-46s %8.0f ms mean\n' "KEDA's model: load → 3 running" "$(awk -v c="$cold" 'BEGIN{print 15000+15000+c}')"
	printf '  %-46s %8.0f ms\n' "KEDA's model: load stopped → zero" 300000
	echo "  orders $(f .orders), missing $(f .missing), duplicated $(f .duplicated)"
done
