#!/usr/bin/env bash
# Scale to zero with kcr standby, measured on a real broker: the demo
# pipeline (examples/pipeline) runs under kcr standby, which checkpoints it
# once idle; each cycle produces one order while it sleeps, which wakes it
# (consumer lag), and waits for the order's result. Then the same service is
# started cold for each order instead (what a 0 → 1 scaler without a warm
# image does: the order arrives, the service starts), for comparison.
#
#   sudo scripts/bench-standby.sh [cycles]     (default 30)
#
# It prints, per client library: wake latency (order produced → its result
# read back from the broker) p50/p95/max under kcr standby and for a cold
# start, kcr standby's RSS and CPU while the service sleeps, the broker
# requests/s of its Kafka wake and group hold, and the orders missing and
# duplicated over all cycles (both must be 0).
#
# Environment: KCR_KAFKA_BROKERS (the broker; default 127.0.0.1:9092,
# scripts/kafka-up.sh's; KCR_KAFKA_PROD_BROKERS, if set, is used instead: a
# broker with production group settings), KCR_BENCH_CLIENTS (default
# "franz kafka-go"; also "franz-848": franz-go with kgo.ServerSideBalancer,
# KIP-848, and "kafka-go-handover": kafkahooks.WithGroupHandover), KCR_BENCH_IDLE (--idle, default 1s), KCR_BENCH_POLL
# (--poll, default 0: the long-polling fetch), KCR_BENCH_COLD (cold-start cycles, default 5),
# KCR_BENCH_WARMUP (the pipeline's warm-up, default 3s), KCR_BENCH_CACHE_MB
# (default 64), KCR_BENCH_IDLE_SAMPLE (seconds to sample the idle standby,
# default 10), KCR_BENCH_ASLEEP (how long the service stays asleep before each
# order, default 0s: a sleep longer than the group's session timeout is what
# a scaled-to-zero service sees), KCR_BENCH_HOLD (--hold-group, default
# true; false measures without the group hold), KCR_BENCH_KEEP=1 keeps the
# work directory, KCR_BENCH_CLUSTER (the home of a 3-broker cluster,
# KCR_KAFKA_BROKERS_N=3 scripts/kafka-up.sh; default none): each client runs
# on the broker above and again on the cluster, the pipeline over SASL_SSL
# (SCRAM-SHA-512), kcr standby and the measuring client over its PLAINTEXT
# listeners: what TLS, SASL and three brokers add to a wake. KCR_BENCH_KDAT and
# KCR_BENCH_PREPARE (--kdat-cache, --prepare-restore, default true),
# KCR_BENCH_LAZY (--lazy, default false), KCR_BENCH_CACHE_MB (the service's
# warm cache, default 64: what CRIU's restore copies grows with it).
#
# The wake's phases (from the order's send: the wake signal, restored, hooks
# done, first record handed, first result) come from kcr standby's status
# (last_wake) and the probe's own clock. With KCR_BENCH_IN_CHECKPOINT=D (a
# duration, default 0: off) each order is produced instead at a random
# moment within D after a checkpoint began: order → result apart for the
# orders that abandoned the checkpoint (the service resumed) and for those
# that came after its image was complete (restored); set D to about a
# checkpoint's length (kcr standby logs each as "checkpointed").
#
# The phases are given as p50 and as p95, each phase on its own.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_build_run
cycles="${1:-30}"
brokers="${KCR_KAFKA_PROD_BROKERS:-${KCR_KAFKA_BROKERS:-127.0.0.1:9092}}"
clients="${KCR_BENCH_CLIENTS:-franz kafka-go}"
idle="${KCR_BENCH_IDLE:-1s}"
poll="${KCR_BENCH_POLL:-0}"
cold_cycles="${KCR_BENCH_COLD:-5}"
warmup="${KCR_BENCH_WARMUP:-3s}"
cache_mb="${KCR_BENCH_CACHE_MB:-64}"
sample="${KCR_BENCH_IDLE_SAMPLE:-10}"
asleep="${KCR_BENCH_ASLEEP:-0s}"
hold="${KCR_BENCH_HOLD:-true}"
cluster_home="${KCR_BENCH_CLUSTER:-}"
kdat="${KCR_BENCH_KDAT:-true}"
prepare="${KCR_BENCH_PREPARE:-true}"
lazy="${KCR_BENCH_LAZY:-false}"
in_ckpt="${KCR_BENCH_IN_CHECKPOINT:-0}"
for v in hold kdat prepare lazy; do
	[[ ${!v} == true || ${!v} == false ]] || die "KCR_BENCH_${v^^} must be true or false (got '${!v}')"
done

sb_pid=""
stop_all() {
	stop_standby "$sb_pid" "$work"/*/img
	[ -e "$work/cold.pid" ] && kill -TERM "$(cat "$work/cold.pid")" 2>/dev/null || true
}
start_work kcr-bench-standby "${KCR_BENCH_KEEP:-}" stop_all
bin="$work/bin"

build_bins "$bin" cmd/kcr examples/pipeline test/apps/wakeprobe
probe="$bin/wakeprobe"
"$probe" -brokers "$brokers" -create 1 -orders "kcr-bench-ping-$$" -results "kcr-bench-pong-$$" >/dev/null ||
	die "broker $brokers does not answer: start one (scripts/kafka-up.sh) or set KCR_KAFKA_BROKERS"

# pct_cpu PID SECONDS: the CPU PID uses over SECONDS, in % of one core.
pct_cpu() {
	local t0 t1 hz
	hz=$(getconf CLK_TCK)
	t0=$(awk '{print $14+$15}' "/proc/$1/stat")
	sleep "$2"
	t1=$(awk '{print $14+$15}' "/proc/$1/stat")
	awk -v a="$t0" -v b="$t1" -v hz="$hz" -v s="$2" 'BEGIN{printf "%.2f", 100*(b-a)/hz/s}'
}
# metric NAME: a counter of kcr standby's /metrics.
metric() { curl -fsS "http://$metrics/metrics" | awk -v m="$1" '$1==m{print $2}'; }
need_pkg curl curl

for c in $clients; do pipeline_client_args "$c" >/dev/null || die "KCR_BENCH_CLIENTS: see above"; done # bad names fail before anything starts
targets=(broker)
if [[ -n $cluster_home ]]; then
	[[ -r $cluster_home/cluster.env ]] || die "KCR_BENCH_CLUSTER: no $cluster_home/cluster.env (start the cluster: KCR_KAFKA_BROKERS_N=3 scripts/kafka-up.sh)"
	# shellcheck disable=SC1091 # written by scripts/kafka-up.sh
	. "$cluster_home/cluster.env"
	"$probe" -brokers "$KCR_KAFKA_CLUSTER_BROKERS" -create 1 -orders "kcr-bench-ping-$$" -results "kcr-bench-pong-$$" >/dev/null ||
		die "the cluster $KCR_KAFKA_CLUSTER_BROKERS does not answer"
	targets+=(cluster)
fi
results=()
for target in "${targets[@]}"; do
	for c in $clients; do
		read -r -a cargs <<<"$(pipeline_client_args "$c")"
		if [[ $target == cluster ]]; then
			# The measuring client and kcr standby on PLAINTEXT, the service on SASL_SSL.
			pbrokers=$KCR_KAFKA_CLUSTER_BROKERS
			sbrokers=$KCR_KAFKA_CLUSTER_SCRAM_BROKERS
			cargs+=(-tls-ca "$KCR_KAFKA_CLUSTER_CA" -scram-user "$KCR_KAFKA_CLUSTER_SCRAM_USER" -scram-password "$KCR_KAFKA_CLUSTER_SCRAM_PASSWORD")
		else
			pbrokers=$brokers sbrokers=$brokers
		fi
		run="$work/$target-$c"
		mkdir -p "$run"
		tag="kcr-bench-$c-$$-$(date +%s)"
		orders="$tag-orders" res="$tag-results" group="$tag"
		"$probe" -brokers "$pbrokers" -create 2 -orders "$orders" -results "$res"
		svc=("$bin/pipeline" -brokers "$sbrokers" -group "$group" -in "$orders" -out "$res" "${cargs[@]}"
			-warmup "$warmup" -cache-mb "$cache_mb" -stats-every 0)
		port=$((20000 + RANDOM % 20000))
		metrics="127.0.0.1:$port"
		setsid "$bin/kcr" standby --image-dir "$run/img" --idle "$idle" --poll "$poll" --brokers "$pbrokers" \
			--hold-group="$hold" --kdat-cache="$kdat" --prepare-restore="$prepare" --lazy="$lazy" --group "$group" --topics "$orders" --metrics "$metrics" -- "${svc[@]}" \
			</dev/null >"$run/standby.log" 2>&1 &
		sb_pid=$!
		status="$bin/kcr standby status --image-dir $run/img --json"
		for ((i = 0; i < 600; i++)); do
			[ "$($status 2>/dev/null | jq -r .state)" = standby ] && break
			sleep 0.2
		done
		[ "$i" -lt 600 ] || { tail -n 20 "$run/standby.log" >&2; die "kcr standby ($c) did not put the pipeline to sleep within 120 s"; }

		# Idle: the service is gone, kcr standby polls the broker.
		[ "$(jq -r '.state' "$run/img/standby.json")" = standby ] || die "the state file does not say standby"
		req0=$(metric kcr_standby_broker_requests_total)
		cpu=$(pct_cpu "$sb_pid" "$sample")
		req1=$(metric kcr_standby_broker_requests_total)
		rss=$(awk '/^VmRSS/{printf "%.1f", $2/1024}' "/proc/$sb_pid/status")
		rps=$(awk -v a="${req0:-0}" -v b="${req1:-0}" -v s="$sample" 'BEGIN{printf "%.1f", (b-a)/s}')

		"$probe" -brokers "$pbrokers" -orders "$orders" -results "$res" -cycles "$cycles" -status "$status" \
			-asleep "$asleep" -in-checkpoint "$in_ckpt" -prefix "$tag-warm" >"$run/warm.jsonl" || { tail -n 20 "$run/standby.log" >&2; die "standby cycles failed ($c)"; }
		# Put the service to sleep before kcr standby goes: it would be left
		# running otherwise, and answer the cold runs' orders.
		for ((i = 0; i < 600; i++)); do
			"$bin/kcr" standby sleep --image-dir "$run/img" >/dev/null 2>&1 || true
			[ "$($status 2>/dev/null | jq -r .state)" = standby ] && break
			sleep 0.2
		done
		[ "$i" -lt 600 ] || die "kcr standby ($c) did not put the pipeline to sleep for the cold runs"
		kill -TERM "$sb_pid"
		wait "$sb_pid" 2>/dev/null || true
		sb_pid=""
		[ "$(jq -r .state "$run/img/standby.json")" = standby ] || die "the pipeline is not asleep for the cold runs"
		# What kcr standby itself measured (from the wake signal to the
		# restored service's hooks done).
		mapfile -t wl < <(jq -r 'select(.wake_latency_ms) | .wake_latency_ms' "$run/standby.log")
		kwake=$(median "${wl[@]}")
		# The image it left is not needed for the cold runs: the service
		# starts from nothing, in a group of its own.
		bench_cold_starts "$probe" "$pbrokers" "$orders-cold" "$res-cold" "$cold_cycles" "$tag-cold" "$run" "$bin/kcr" \
			"$bin/pipeline" -brokers "$sbrokers" -group "$group-cold" -in "$orders-cold" -out "$res-cold" "${cargs[@]}" \
			-warmup "$warmup" -cache-mb "$cache_mb" -stats-every 0 || die "cold cycles failed ($c)"

		w=$(tail -n1 "$run/warm.jsonl")
		k=$(tail -n1 "$run/cold.jsonl")
		# Each phase's p95 over the cycles (nearest rank, as the probe's).
		p95=$(jq -s -r '[.[] | .phases_ms // empty] as $c | ($c | length) as $n
			| def p95(k): [$c[] | .[k] // empty] | sort | if length == 0 then "?" else .[((95 * length + 99) / 100 | floor) - 1] | floor end;
			"detect \(p95("detect")) → restored \(p95("restored")) → hooks done \(p95("hooks_done")) → first record handed \(p95("first_handed")) → first result \(p95("result"))"' "$run/warm.jsonl")
		results+=("$c on the $target|$w|$k|$rss|$cpu|$rps|$kwake|$p95")
	done
done

where="$brokers"
[[ -n $cluster_home ]] && where+=" (the broker) and the cluster $KCR_KAFKA_CLUSTER_SCRAM_BROKERS (SASL_SSL, SCRAM-SHA-512)"
echo "kcr standby on $where, $(date -u +%F), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'): $cycles idle → wake cycles (--idle $idle, --poll $poll, --hold-group=$hold, --kdat-cache=$kdat, --prepare-restore=$prepare, --lazy=$lazy, cache $cache_mb MiB, asleep $asleep, in checkpoint $in_ckpt, load $(cut -d' ' -f1-3 /proc/loadavg)), $cold_cycles cold starts"
for r in "${results[@]}"; do
	IFS='|' read -r c w k rss cpu rps kwake p95 <<<"$r"
	echo "$c:"
	printf '  %-44s p50 %7.0f  p95 %7.0f  max %7.0f ms\n' "order → result, woken from standby" \
		"$(jq .p50_ms <<<"$w")" "$(jq .p95_ms <<<"$w")" "$(jq .max_ms <<<"$w")"
	printf '  %-44s p50 %7.0f  p95 %7.0f  max %7.0f ms\n' "order → result, cold start" \
		"$(jq .p50_ms <<<"$k")" "$(jq .p95_ms <<<"$k")" "$(jq .max_ms <<<"$k")"
	printf '  %-44s %7.1f x\n' "ratio cold / standby (p50)" "$(jq -n --argjson a "$(jq .p50_ms <<<"$k")" --argjson b "$(jq .p50_ms <<<"$w")" '$a/$b')"
	printf '  %-44s %7.0f ms\n' "kcr's wake signal → restored (median)" "$kwake"
	printf '  %-44s %s\n' "phases, p50 ms from the order's send:" \
		"$(jq -r '.phases_p50_ms // {} | "detect \(.detect // "?") → restored \(.restored // "?") → hooks done \(.hooks_done // "?") → first record handed \(.first_handed // "?") → first result \(.result // "?")"' <<<"$w")"
	printf '  %-44s %s\n' "phases, p95 ms (each phase on its own):" "$p95"
	if [[ $in_ckpt != 0 ]]; then
		printf '  %-44s %s\n' "orders at a random moment of a checkpoint:" \
			"$(jq -r '"abandoned it \(.abandoned // 0) (p50 \(.abandoned_p50_ms // "-") ms, max \(.abandoned_max_ms // "-")), after its image: restored \(.restored // 0) (p50 \(.restored_p50_ms // "-") ms, max \(.restored_max_ms // "-"))"' <<<"$w")"
	fi
	printf '  %-44s %7s MiB RSS, %s %% of a core (service: 0, gone)\n' "kcr standby while the service sleeps" "$rss" "$cpu"
	printf '  %-44s %7s requests/s\n' "broker load of the Kafka wake and hold" "$rps"
	echo "  orders missing: $(jq .missing <<<"$w") (standby) $(jq .missing <<<"$k") (cold), duplicated: $(jq .duplicated <<<"$w") (standby) $(jq .duplicated <<<"$k") (cold)"
done
