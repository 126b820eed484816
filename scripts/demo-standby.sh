#!/usr/bin/env bash
# kcr standby's demo (scale to zero), on a fresh Linux machine as root:
#
#   sudo scripts/demo-standby.sh
#
# Runs the demo pipeline (examples/pipeline: a Kafka service with a 3 s
# warm-up and a 64 MiB cache) under `kcr standby --idle 1s` on an embedded
# Kafka broker (franz-go's kfake). Idle, the pipeline is checkpointed: its
# process is gone, its image is on disk, and kcr standby watches its
# group's lag. Then bursts of orders arrive; each wakes it: it is restored
# warm, answers, and goes back to sleep. Prints each wake's latency (orders
# produced → first result read back), a cold start of the same service for
# comparison, and PASS when every order has exactly one result (else FAIL,
# exit 1).
#
# Environment: KCR_DEMO_CLIENT (franz-848, the default: franz-go with a
# KIP-848 group; franz: classic group; kafka-go; kafka-go-handover),
# KCR_DEMO_BURSTS (default 3), KCR_DEMO_BURST_SIZE (orders per burst,
# default 3), KCR_DEMO_KEEP=1 keeps the work directory. KCR_DEMO_BROKER=kafka
# uses a real Apache Kafka broker with production group settings instead, as
# scripts/demo.sh does: $KCR_KAFKA_PROD_BROKERS, else the one
# `KCR_KAFKA_PROD=1 scripts/kafka-up.sh` starts (left running).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

client="${KCR_DEMO_CLIENT:-franz-848}"
bursts="${KCR_DEMO_BURSTS:-3}"
size="${KCR_DEMO_BURST_SIZE:-3}"
broker_kind="${KCR_DEMO_BROKER:-kfake}"
case "$broker_kind" in kfake | kafka) ;; *) die "KCR_DEMO_BROKER must be kfake or kafka (got '$broker_kind')" ;; esac
read -r -a cargs <<<"$(pipeline_client_args "$client")" || die "KCR_DEMO_CLIENT: see above"
need_build_run

sb="" broker=""
stop_all() {
	stop_standby "$sb" "$img"
	[ -s "$work/cold.pid" ] && kill -TERM "$(cat "$work/cold.pid")" 2>/dev/null && { wait_gone "$(cat "$work/cold.pid")" 10 || true; }
	[ -n "$broker" ] && kill -TERM "$broker" 2>/dev/null && { wait "$broker" 2>/dev/null || true; }
}
start_work kcr-demo-standby "${KCR_DEMO_KEEP:-}" stop_all
bin="$work/bin" img="$work/img"

lib_t0=$(now_ns)
fail() { fail_logs "$*" standby.log pipeline.log broker.log; }
# sblog FILTER: kcr standby's JSON log lines the jq FILTER selects.
sblog() { jq -cR "fromjson? | select($1)" "$work/standby.log"; }
status="$bin/kcr standby status --image-dir $img --json"
state_is() { [ "$($status 2>/dev/null | jq -r .state)" = "$1" ]; }

echo "kcr standby demo: a Kafka service scaled to zero when idle, restored warm when orders arrive"
scripts/install-criu.sh | detail
say "building kcr and the examples (a first build takes a minute or two)"
GOFLAGS="${GOFLAGS:-} -buildvcs=false" go build -o "$bin/" ./cmd/kcr ./examples/broker ./examples/pipeline ./test/apps/wakeprobe

export GODEBUG=multipathtcp=0
tag=demo-$(date +%s%N)
if [ "$broker_kind" = kafka ]; then
	brokers=${KCR_KAFKA_PROD_BROKERS:-}
	[ -n "$brokers" ] || { KCR_KAFKA_PROD=1 scripts/kafka-up.sh 2>&1 | detail && brokers="127.0.0.1:${KCR_KAFKA_PORT:-9094}"; }
	say "Apache Kafka broker with production group settings on $brokers"
else
	port=19092
	while port_open "$port"; do port=$((port + 1)); done
	brokers="127.0.0.1:$port"
	"$bin/broker" -addr "$brokers" -topics "" >"$work/broker.log" 2>&1 &
	broker=$!
	wait_until 10 "the broker" port_open "$port" || fail "the broker did not start"
	say "embedded Kafka broker (kfake) on $brokers"
fi
probe() { "$bin/wakeprobe" -brokers "$brokers" "$@"; }
probe -create 3 -orders "$tag-orders" -results "$tag-results" || fail "cannot create the topics"
probe -create 3 -orders "$tag-cold-orders" -results "$tag-cold-results" || fail "cannot create the topics"

svc=("$bin/pipeline" -brokers "$brokers" -in "$tag-orders" -out "$tag-results" "${cargs[@]}" -warmup 3s -cache-mb 64 -stats-every 0)
say "kcr standby --idle 1s -- pipeline ($client, 3 s warm-up, 64 MiB cache)"
setsid "$bin/kcr" standby --image-dir "$img" --idle 1s --poll 100ms --brokers "$brokers" --group "$tag" --topics "$tag-orders" \
	--log "$work/pipeline.log" -- "${svc[@]}" -group "$tag" </dev/null >"$work/standby.log" 2>&1 &
sb=$!
wait_until 60 "the pipeline to start" state_is running || fail "the pipeline did not start"
pid=$($status | jq -r .pid)
say "pipeline started cold, PID $pid; idle, it is checkpointed after 1 s"
wait_until 60 "the pipeline to sleep" state_is standby || fail "the pipeline did not go to sleep"
ck=$(sblog '.msg == "standby: checkpointed"' | tail -n1)
alive "$pid" && fail "PID $pid still runs after the checkpoint"
rss=$(awk '/^VmRSS/{printf "%.1f", $2/1024}' "/proc/$sb/status")
image=$(jq -r '.image_bytes / 1048576 | . * 10 | round / 10' <<<"$ck")
say "asleep: PID $pid is gone; image $image MiB on disk (checkpoint $(jq '.duration_ms | round' <<<"$ck") ms); kcr standby $rss MiB RSS"

say "sending $bursts bursts of $size orders, each once the pipeline sleeps"
probe -orders "$tag-orders" -results "$tag-results" -status "$status" -cycles "$bursts" -burst "$size" -prefix "$tag" \
	>"$work/warm.jsonl" 2>>"$work/probe.log" || fail "the bursts were not all answered: $(tail -n1 "$work/probe.log")"
mapfile -t kwake < <(sblog '.wake_latency_ms' | jq -r '.wake_latency_ms | round')
i=0
while read -r l; do
	jq -e .cycle >/dev/null <<<"$l" || continue
	echo "  burst $(jq .cycle <<<"$l"): woke the pipeline; first result after $(jq '.latency_ms | round' <<<"$l") ms, all $size after $(jq '.last_ms | round' <<<"$l") ms (kcr: wake → restored ${kwake[$i]:-?} ms)"
	i=$((i + 1))
done <"$work/warm.jsonl"
warm=$(tail -n1 "$work/warm.jsonl")
wait_until 60 "the pipeline to sleep" state_is standby || fail "the pipeline did not go back to sleep"
stop_standby "$sb" "$img"
sb=""
starts=$(sblog '.msg == "standby: starting"' | wc -l)

say "for comparison: the same pipeline started cold when an order arrives (kcr run)"
cold_cmd="$bin/kcr run --log $work/cold.log -- ${svc[*]} -group $tag-cold -in $tag-cold-orders -out $tag-cold-results >$work/cold.pid"
probe -orders "$tag-cold-orders" -results "$tag-cold-results" -cold "$cold_cmd" -cycles 1 -prefix "$tag-cold" \
	>"$work/cold.jsonl" 2>>"$work/probe.log" || fail "the cold start did not answer: $(tail -n1 "$work/probe.log")"
cold=$(tail -n1 "$work/cold.jsonl")

echo
echo "summary"
printf '  %-36s %s\n' "cold start: order to result" "$(jq '.max_ms | round' <<<"$cold") ms"
printf '  %-36s %s\n' "woken from standby: order to result" "p50 $(jq '.p50_ms | round' <<<"$warm") ms, max $(jq '.max_ms | round' <<<"$warm") ms ($(jq -n "$(jq .max_ms <<<"$cold") / $(jq .p50_ms <<<"$warm") | . * 10 | round / 10")x faster than cold)"
printf '  %-36s %s\n' "asleep" "no process; image $image MiB; kcr standby $rss MiB RSS"
printf '  %-36s %s\n' "wakes / cold starts" "$i / $starts"
printf '  %-36s %s\n' "orders / missing / duplicated" "$((bursts * size)) / $(jq .missing <<<"$warm") / $(jq .duplicated <<<"$warm")"
[ "$i" = "$bursts" ] && [ "${#kwake[@]}" = "$bursts" ] && [ "$starts" = 1 ] &&
	[ "$(jq .missing <<<"$warm")" = 0 ] && [ "$(jq .duplicated <<<"$warm")" = 0 ] || fail "want $bursts warm wakes, 1 cold start, nothing missing or duplicated"
echo "  PASS"
