#!/usr/bin/env bash
# Stop the Kafka broker started by scripts/kafka-up.sh (same KCR_KAFKA_HOME;
# KCR_KAFKA_PROD=1 for the production-defaults broker's default home).
# SIGTERM, wait up to KCR_KAFKA_STOP_TIMEOUT seconds (default 20), then SIGKILL.
# KCR_KAFKA_BROKERS_N=3: the cluster's three nodes in parallel, SIGKILL after
# 5 s (KCR_KAFKA_NODE=N: node N only, as above; see scripts/kafka/cluster.sh).
# Idempotent: succeeds (and removes the pid file) when nothing is running.
# Keeps the jar cache and the last broker.log / data dir for post-mortems.
set -euo pipefail

t_start=${EPOCHREALTIME:-$(date +%s.%N)}
script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/kafka/common.sh
. "$script_dir/kafka/common.sh"
# shellcheck source=scripts/kafka/cluster.sh
. "$script_dir/kafka/cluster.sh"

if ((CLUSTER_N > 1)); then
	# Cluster mode: node KCR_KAFKA_NODE, or the three in parallel.
	cluster_defaults
	if [[ -n $CLUSTER_NODE ]]; then
		KHOME=$CBASE/node$CLUSTER_NODE
	else
		# The last node standing has no quorum to shut down cleanly and
		# waits in vain: the whole cluster's stop waits 5 s, not 20.
		export KCR_KAFKA_STOP_TIMEOUT=${KCR_KAFKA_STOP_TIMEOUT:-5}
		pids=()
		for i in 1 2 3; do
			KCR_KAFKA_NODE=$i "$0" &
			pids+=($!)
		done
		status=0
		for p in "${pids[@]}"; do wait "$p" || status=1; done
		exit $status
	fi
elif [[ ${KCR_KAFKA_PROD:-0} == 1 ]]; then
	KHOME=${KCR_KAFKA_HOME:-/var/tmp/kcr-kafka-prod}
else
	KHOME=${KCR_KAFKA_HOME:-/var/tmp/kcr-kafka}
fi
if [[ ! -d $KHOME ]]; then
	echo "kafka: no broker running ($KHOME does not exist)"
	exit 0
fi
KHOME=$(cd "$KHOME" && pwd)
PIDFILE=$KHOME/kafka.pid

exec 9>"$KHOME/.lock"
if command -v flock >/dev/null 2>&1; then
	flock -w 120 9 || echo "kafka-down: $KHOME/.lock is busy; stopping anyway" >&2
fi

mapfile -t pids < <(our_pids)
if ((${#pids[@]} == 0)); then
	rm -f "$PIDFILE"
	echo "kafka: no broker running (home $KHOME)"
	exit 0
fi
status=0
stop_pids "${pids[@]}" || status=1
rm -f "$PIDFILE"
now=${EPOCHREALTIME:-$(date +%s.%N)}
echo "kafka: stopped broker pid ${pids[*]} in $(awk -v a="$t_start" -v b="$now" 'BEGIN { printf "%.1fs", b - a }')"
exit $status
