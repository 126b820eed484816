#!/usr/bin/env bash
# Runs the demo (scripts/demo.sh: a Kafka pipeline under load, checkpointed
# and restored) several times and prints the medians: cold start to first
# acknowledged result against restore to first acknowledged result, the
# checkpoint pause (from the gate closing to the end of the dump) and the
# image size against RSS, and the records missing or duplicated by the
# independent verify tool.
#
# It runs on a real Apache Kafka broker with Kafka's default group settings
# (group.initial.rebalance.delay.ms=3000, as in production; see
# scripts/kafka-up.sh, KCR_KAFKA_PROD=1), and on the embedded kfake broker as
# a second column (KCR_BENCH_BROKERS, default "kafka kfake").
#
# KCR_BENCH_CLIENTS (default "kafka-go kafka-go-handover franz franz-848")
# picks the pipeline's client setups, run in turn, alternating:
#   kafka-go           kafkahooks.Reader, leaves its group at the checkpoint
#   kafka-go-handover  kafkahooks.WithGroupHandover: keeps the membership
#   franz              kgohooks, classic group protocol (cooperative-sticky)
#   franz-848          kgohooks with kgo.ServerSideBalancer (KIP-848)
#
#   sudo scripts/bench-kafka.sh [runs]    (default 5)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_root
need_go
need_jq
runs="${1:-5}"
clients="${KCR_BENCH_CLIENTS:-kafka-go kafka-go-handover franz franz-848}"
brokers="${KCR_BENCH_BROKERS:-kafka kfake}"
for b in $brokers; do
	case "$b" in kafka | kfake) ;; *) die "KCR_BENCH_BROKERS: unknown broker '$b' (kafka or kfake)" ;; esac
done
# setup CLIENT: the demo's environment for a client setup.
setup() {
	case "$1" in
	kafka-go) echo KCR_DEMO_CLIENT=kafka-go ;;
	kafka-go-handover) echo KCR_DEMO_CLIENT=kafka-go KCR_DEMO_HANDOVER=1 ;;
	franz) echo KCR_DEMO_CLIENT=franz ;;
	franz-848) echo KCR_DEMO_CLIENT=franz KCR_DEMO_KGO_BALANCER=server ;;
	*) return 1 ;;
	esac
}
for c in $clients; do
	setup "$c" >/dev/null || die "KCR_BENCH_CLIENTS: unknown client setup '$c' (kafka-go, kafka-go-handover, franz or franz-848)"
done
if [[ " $brokers " == *" kafka "* && -z ${KCR_KAFKA_PROD_BROKERS:-} ]]; then
	# Started (or found running) once, not per run; left running.
	KCR_KAFKA_PROD=1 scripts/kafka-up.sh >&2
	export KCR_KAFKA_PROD_BROKERS="127.0.0.1:${KCR_KAFKA_PORT:-9094}"
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for i in $(seq "$runs"); do
	for b in $brokers; do
		for c in $clients; do
			# shellcheck disable=SC2046 # setup prints VAR=value words
			env $(setup "$c") KCR_DEMO_BROKER="$b" KCR_DEMO_RESULT="$dir/$b-$c" scripts/demo.sh >"$dir/demo.log" 2>&1 || {
				tail -n 20 "$dir/demo.log" >&2
				die "demo run $i ($c on $b) failed (its last lines above); run $(setup "$c") KCR_DEMO_BROKER=$b scripts/demo.sh to see it all"
			}
		done
	done
done
# col FILE N: the median of column N of the demo's result lines in FILE.
col() {
	local v
	mapfile -t v < <(awk -v c="$2" '{print $c}' "$1")
	median "${v[@]}"
}
sum() { awk -v c="$2" '{s+=$c} END{print s+0}' "$1"; }
echo "kcr Kafka pipeline, $runs runs per cell (medians)"
[[ " $brokers " != *" kafka "* ]] ||
	echo "  kafka: Apache Kafka at $KCR_KAFKA_PROD_BROKERS, Kafka's default group settings (group.initial.rebalance.delay.ms=3000)"
printf '  %-18s %-6s %9s %11s %8s %10s %14s %8s %5s\n' client broker "cold ms" "restore ms" "ratio" "pause ms" "image/RSS MiB" missing dups
for c in $clients; do
	for b in $brokers; do
		f="$dir/$b-$c"
		cold=$(col "$f" 1)
		rest=$(col "$f" 2)
		printf '  %-18s %-6s %9.0f %11.0f %7.1fx %10.1f %6.1f/%-7.1f %8d %5d\n' "$c" "$b" "$cold" "$rest" \
			"$(awk -v a="$cold" -v b="$rest" 'BEGIN{print a/b}')" "$(awk -v x="$(col "$f" 3)" 'BEGIN{print x/1e6}')" \
			"$(awk -v x="$(col "$f" 4)" 'BEGIN{print x/1048576}')" "$(awk -v x="$(col "$f" 5)" 'BEGIN{print x/1048576}')" \
			"$(sum "$f" 6)" "$(sum "$f" 7)"
	done
done
echo "  (restore ms: from 'kcr restore' to the first new acknowledged result; missing and dups summed over all runs)"
