#!/usr/bin/env bash
# kcr's demo, on a fresh Linux machine as root:
#
#   sudo scripts/demo.sh
#
# Starts an embedded Kafka broker (franz-go's kfake, in memory, loopback), a
# load generator producing 200 orders/s, and a Kafka pipeline service with a
# slow, warm start. Under load it checkpoints the pipeline with kcr (the
# process is gone: scaled to zero), leaves it dead while orders pile up,
# restores it, lets it catch up, and then checks with an independent reader
# that every order has a result. Prints cold-start vs restore time to the
# first result, kcr's phase timings and a PASS/FAIL verdict.
#
# Environment: KCR_DEMO_RATE (orders/s, default 200), KCR_DEMO_WARMUP
# (default 3s), KCR_DEMO_CACHE_MB (default 64), KCR_DEMO_DOWN (seconds the
# service stays dead, default 2), KCR_DEMO_DRAIN=false (the pipeline does
# not finish the orders in hand before the checkpoint: the Kafka hooks alone
# give at-least-once, and some orders get a second result), KCR_DEMO_RESULT
# (append one line of figures to this file, for scripts/bench-kafka.sh), KCR_DEMO_KEEP=1
# keeps the work directory, KCR_DEMO_CLIENT=franz runs the pipeline on
# franz-go (kafkahooks/kgohooks) instead of kafka-go, KCR_DEMO_KGO_BALANCER=server
# runs franz-go's group with kgo.ServerSideBalancer (KIP-848), KCR_DEMO_HANDOVER=1
# keeps kafka-go's group membership across the checkpoint
# (kafkahooks.WithGroupHandover).
#
# KCR_DEMO_BROKER=kafka runs it on a real Apache Kafka broker with Kafka's
# default group settings (group.initial.rebalance.delay.ms=3000, as in
# production) instead of kfake: $KCR_KAFKA_PROD_BROKERS if set, else the one
# `KCR_KAFKA_PROD=1 scripts/kafka-up.sh` starts (or finds running; it is left
# running: stop it with KCR_KAFKA_PROD=1 scripts/kafka-down.sh). Each run
# uses topics and a group of its own.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

rate="${KCR_DEMO_RATE:-200}"
warmup="${KCR_DEMO_WARMUP:-3s}"
cache_mb="${KCR_DEMO_CACHE_MB:-64}"
down="${KCR_DEMO_DOWN:-2}"
drain="${KCR_DEMO_DRAIN:-true}"
client="${KCR_DEMO_CLIENT:-kafka-go}"
broker_kind="${KCR_DEMO_BROKER:-kfake}"
case "$broker_kind" in kfake | kafka) ;; *) die "KCR_DEMO_BROKER must be kfake or kafka (got '$broker_kind')" ;; esac
pipeline_flags=(-kgo-balancer "${KCR_DEMO_KGO_BALANCER:-client}")
[ "${KCR_DEMO_HANDOVER:-0}" = 1 ] && pipeline_flags+=(-group-handover)

need_root
need_go
need_jq

work=$(mktemp -d /var/tmp/kcr-demo.XXXXXX)
bin="$work/bin"
pids=()     # processes to stop at exit: broker, loadgen, pipeline (original, then restored)
ok=0
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	wait_until 5 "the demo's processes to exit" all_dead "${pids[@]}" || true
	for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	if [ "$ok" = 1 ] && [ -z "${KCR_DEMO_KEEP:-}" ]; then
		rm -rf "$work"
	else
		echo "logs and image kept in $work" >&2
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

all_dead() {
	local p
	for p; do alive "$p" && return 1; done
	return 0
}

lib_t0=$(now_ns)
fail() { fail_logs "$*" pipeline.log loadgen.log broker.log; }
ms() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.0f", (a-b)/1e6}'; }
# dur NS: a duration in nanoseconds, for people.
dur() { awk -v x="$1" 'BEGIN{ if (x >= 1e9) printf "%.2fs", x/1e9; else printf "%.1fms", x/1e6 }'; }

# field NAME: the value of a top-level field of the JSON object on stdin.
field() { jq -r --arg f "$1" '.[$f] // empty'; }
# events FILE FILTER: the JSON lines of the log FILE (which may hold other
# lines, such as a panic) that the jq FILTER selects, compacted.
events() { jq -cR "fromjson? | select($2)" "$1"; }
# wait_event FILE SECONDS FILTER: print the first JSON line of FILE that the
# jq FILTER (such as .ev == "start") selects, waiting for it; gives up at
# once when the process $watch (if set) has died.
watch=
wait_event() {
	local line i
	for ((i = 0; i < $2 * 50; i++)); do
		line=$(events "$1" "$3" | head -n1)
		[ -n "$line" ] && { echo "$line"; return 0; }
		[ -n "$watch" ] && dead "$watch" && { echo "scripts/demo.sh: process $watch died" >&2; return 1; }
		sleep 0.02
	done
	return 1
}

echo "kcr demo: checkpoint and restore a Kafka pipeline under load"
scripts/install-criu.sh | detail
say "building kcr and the examples (a first build takes a minute or two)"
t=$(now_ns)
GOFLAGS="${GOFLAGS:-} -buildvcs=false" go build -o "$bin/" ./cmd/kcr ./examples/broker ./examples/loadgen ./examples/pipeline ./examples/verify
say "built in $(ms "$(now_ns)" "$t") ms"

export GODEBUG=multipathtcp=0
orders=orders results=results group=pipeline create=()
if [ "$broker_kind" = kafka ]; then
	if [ -n "${KCR_KAFKA_PROD_BROKERS:-}" ]; then
		brokers=$KCR_KAFKA_PROD_BROKERS
	else
		KCR_KAFKA_PROD=1 scripts/kafka-up.sh 2>&1 | detail
		brokers="127.0.0.1:${KCR_KAFKA_PORT:-9094}"
	fi
	run_id=$(date +%s%N)
	orders=kcr-demo-orders-$run_id results=kcr-demo-results-$run_id group=kcr-demo-$run_id
	create=(-create-topics "$orders:3,$results:3")
	say "Apache Kafka broker with production group settings on $brokers: topics $orders (3 partitions), $results (3)"
else
	port=19092
	while port_open "$port"; do port=$((port + 1)); done
	brokers="127.0.0.1:$port"
	"$bin/broker" -addr "$brokers" -topics orders:3,results:3 >"$work/broker.log" 2>&1 &
	pids+=("$!")
	wait_event "$work/broker.log" 10 '.ev == "ready"' >/dev/null || fail "the broker did not start"
	say "embedded Kafka broker (kfake) on $brokers: topics orders (3 partitions), results (3)"
fi

"$bin/loadgen" -brokers "$brokers" -topic "$orders" "${create[@]}" -rate "$rate/s" -log-every 0 >"$work/loadgen.out" 2>>"$work/loadgen.log" &
loadgen=$!
pids+=("$loadgen")
say "loadgen: $rate orders/s into 'orders'"

# The service runs detached: own session, stdin /dev/null, log opened with
# O_APPEND (>>), as CRIU needs.
log="$work/pipeline.log"
t_start=$(now_ns)
setsid "$bin/pipeline" -brokers "$brokers" -group "$group" -in "$orders" -out "$results" "${pipeline_flags[@]}" \
	-warmup "$warmup" -cache-mb "$cache_mb" -client-id pipeline -drain="$drain" -client "$client" </dev/null >>"$log" 2>&1 &
pid=$!
watch=$pid
disown "$pid" # CRIU's dump kills it: no "Killed" message from bash
pids+=("$pid")
pid=$(wait_event "$log" 10 '.ev == "start"' | field pid) || fail "the pipeline did not start"
pids+=("$pid")
watch=$pid
say "pipeline started cold, PID $pid (warm-up $warmup, $cache_mb MiB cache)"
first=$(wait_event "$log" 60 '.ev == "first-result"') || fail "no first result from the pipeline"
cold_ms=$(ms "$(echo "$first" | field t)" "$t_start")
say "pipeline: first result $cold_ms ms after start"

# Let it run under load for a bit, then make sure it keeps up.
sleep 2
stats=$(events "$log" '.ev == "stats"' | tail -n1)
say "pipeline: $(echo "$stats" | field processed) orders processed so far, lag $(echo "$stats" | field lag)"
alive "$pid" || fail "the pipeline died"

image="$work/pipeline.img"
say "kcr checkpoint $pid  (under load)"
t=$(now_ns)
"$bin/kcr" checkpoint --json -o "$image" "$pid" >"$work/checkpoint.json" 2>"$work/checkpoint.txt" || { cat "$work/checkpoint.txt"; fail "kcr checkpoint failed"; }
ckpt_ms=$(ms "$(now_ns)" "$t")
watch=
t_dead=$(now_ns)
grep -v '^checkpointed' "$work/checkpoint.txt" | sed 's/ {.*}$//' | detail
# hook NAME KEY: a detail of a before-checkpoint hook's report.
hook() { jq -r --arg n "$1" --arg k "$2" '.manifest.resources[] | select(.name | startswith($n)) | .details[$k] // empty' "$work/checkpoint.json"; }
if [ "$client" = franz ]; then
	echo "  kgohooks: consumer left its group: $(hook kgo-in left_group); producer records flushed: $(hook kgo-out records_flushed)" | detail
else
	kept=$(hook kafka-reader member_kept)
	if [ -n "$kept" ]; then
		echo "  kafkahooks: reader kept its group membership (for up to $(hook kafka-reader session_timeout_ms) ms); writer records in flight: $(hook kafka-writer records_pending)" | detail
	else
		echo "  kafkahooks: reader left its group: $(hook kafka-reader left_group); writer records in flight: $(hook kafka-writer records_pending)" | detail
	fi
	warning=$(hook kafka-reader warning)
	[ -z "$warning" ] || echo "  warning: $warning" | detail
fi
alive "$pid" && fail "the pipeline still runs after the checkpoint"
say "pipeline is gone (scaled to zero); orders keep coming for ${down}s"
sleep "$down"

say "kcr restore"
t_restore=$(now_ns)
TMPDIR="$work" "$bin/kcr" restore --json "$image" >"$work/restore.json" 2>"$work/restore.txt" || { cat "$work/restore.txt"; fail "kcr restore failed"; }
restore_cmd_ms=$(ms "$(now_ns)" "$t_restore")
newpid=$(jq -r '.restores[0].pid' "$work/restore.json")
pids+=("$newpid")
watch=$newpid
grep -v '^restored' "$work/restore.txt" | detail
after=$(wait_event "$log" 30 '.ev == "after-restore" and .kind == "restore"') || fail "the restored pipeline did not run its after-restore hooks"
gen=$(echo "$after" | field generation)
inst=$(echo "$after" | field instance)
say "restored as PID $newpid, generation $gen, new instance ${inst:0:8}"
first=$(wait_event "$log" 30 '.ev == "first-result" and .after == "restore"') || fail "no result from the restored pipeline"
restore_ms=$(ms "$(echo "$first" | field t)" "$t_restore")
down_ms=$(ms "$(echo "$first" | field t)" "$t_dead")
say "restored pipeline: first new result $restore_ms ms after 'kcr restore' began"

sleep 3
kill -TERM "$loadgen"
wait "$loadgen" || fail "loadgen failed"
last=$(cat "$work/loadgen.out")
say "loadgen stopped after order $last; waiting for the pipeline to catch up"

"$bin/verify" -brokers "$brokers" -orders "$orders" -results "$results" -wait 20s -json-file "$work/verify.json" >"$work/verify.txt" 2>>"$work/verify.log" && verdict=PASS || verdict=FAIL
alive "$newpid" || verdict=FAIL
say "verify (independent franz-go reader of both topics):"
detail <"$work/verify.txt"

# Summary.
orders=$(field orders <"$work/verify.json")
results=$(field results <"$work/verify.json")
missing=$(field missing <"$work/verify.json")
dups=$(field duplicates <"$work/verify.json")
# phase FILE NAME: that phase's duration in ns in kcr's --json output FILE.
phase() { jq --arg n "$2" '[.phases[] | select(.name == $n) | .duration_ns][0] // 0' "$1"; }
hooks=$(dur "$(phase "$work/checkpoint.json" hooks)")
dump=$(dur "$(phase "$work/checkpoint.json" freeze+dump)")
ckpt_total=$(dur "$(phase "$work/checkpoint.json" total)")
restore_total=$(dur "$(jq '[.restores[0].phases[] | select(.name == "total") | .duration_ns][0] // 0' "$work/restore.json")")
img_bytes=$(jq '[.manifest.files[].size] | add' "$work/checkpoint.json")
rss=$(jq '.manifest.process.rss_bytes' "$work/checkpoint.json")
size=$(awk -v i="$img_bytes" -v r="$rss" 'BEGIN{printf "%.1f MiB (RSS %.1f MiB)", i/1048576, r/1048576}')
echo
echo "summary"
printf '  %-34s %s\n' "cold start to first result" "$cold_ms ms (warm-up $warmup, $cache_mb MiB cache)"
printf '  %-34s %s\n' "restore to first result" "$restore_ms ms ($(awk -v a="$cold_ms" -v b="$restore_ms" 'BEGIN{printf "%.1f", a/(b>0?b:1)}')x faster; kcr restore itself ${restore_total:-$restore_cmd_ms ms})"
printf '  %-34s %s\n' "checkpoint under load" "${ckpt_total:-$ckpt_ms ms} (hooks ${hooks:-?}, freeze+dump ${dump:-?})"
printf '  %-34s %s\n' "image vs memory" "${size:-?}"
printf '  %-34s %s\n' "service down (scaled to zero)" "$down_ms ms, from the dump to the first new result"
printf '  %-34s %s\n' "orders / results / missing / dups" "$orders / $results / $missing / $dups"
echo "  $verdict"
if [ -n "${KCR_DEMO_RESULT:-}" ]; then
	# One line for scripts/bench-kafka.sh: cold_ms restore_ms pause_ns image_bytes rss_bytes missing dups
	pause_ns=$(($(phase "$work/checkpoint.json" hooks) + $(phase "$work/checkpoint.json" freeze+dump)))
	echo "$cold_ms $restore_ms $pause_ns $img_bytes $rss $missing $dups" >>"$KCR_DEMO_RESULT"
fi
[ "$verdict" = PASS ] || exit 1
ok=1
