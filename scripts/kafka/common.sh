# Helpers shared by scripts/kafka-up.sh and scripts/kafka-down.sh (sourced).
# shellcheck shell=bash
# Expect KHOME (absolute) and PIDFILE to be set by the caller.

# alive, port_open
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

# is_our_broker <pid>: a live kafka.Kafka JVM started by kafka-up.sh for this KHOME.
is_our_broker() {
	alive "$1" || return 1
	local args
	args=$(tr '\0' '\n' <"/proc/$1/cmdline" 2>/dev/null) || return 1
	grep -Fxq -- "kafka.Kafka" <<<"$args" && grep -Fxq -- "-Dkcr.kafka.home=$KHOME" <<<"$args"
}

# our_pids: the pid from the pid file, then any orphan started for this KHOME
# (e.g. if the pid file was lost). Matches the exact -Dkcr.kafka.home=<KHOME> arg.
our_pids() {
	local pid f p
	pid=$(cat "$PIDFILE" 2>/dev/null || true)
	if is_our_broker "$pid"; then echo "$pid"; fi
	while IFS= read -r f; do
		p=${f#/proc/}
		p=${p%/cmdline}
		[[ $p == "$pid" ]] && continue
		if is_our_broker "$p"; then echo "$p"; fi
	done < <(grep -lzFx -- "-Dkcr.kafka.home=$KHOME" /proc/[0-9]*/cmdline 2>/dev/null || true)
}

# stop_pids <pid>...: SIGTERM, wait up to KCR_KAFKA_STOP_TIMEOUT (20 s), then SIGKILL.
stop_pids() {
	local pids=("$@") left i p
	((${#pids[@]})) || return 0
	kill -TERM "${pids[@]}" 2>/dev/null || true
	local n=$((${KCR_KAFKA_STOP_TIMEOUT:-20} * 10))
	for ((i = 0; i < n; i++)); do
		left=()
		for p in "${pids[@]}"; do alive "$p" && left+=("$p"); done
		((${#left[@]})) || return 0
		sleep 0.1
	done
	echo "kafka: pid(s) ${left[*]} ignored SIGTERM for ${KCR_KAFKA_STOP_TIMEOUT:-20}s; sending SIGKILL" >&2
	kill -KILL "${left[@]}" 2>/dev/null || true
	for ((i = 0; i < 50; i++)); do
		left=()
		for p in "${pids[@]}"; do alive "$p" && left+=("$p"); done
		((${#left[@]})) || return 0
		sleep 0.1
	done
	echo "kafka: pid(s) ${left[*]} still alive after SIGKILL" >&2
	return 1
}

