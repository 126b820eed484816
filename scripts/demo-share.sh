#!/usr/bin/env bash
# kcr standby on a share group (KIP-932, queues for Kafka), on a fresh Linux
# machine as root:
#
#   sudo scripts/demo-share.sh
#
# Three replicas of a share-group worker (test/apps/kgoapp -share: a
# kgohooks.ShareConsumer that spends 20 ms on each job, 50 jobs/s) each run
# under their own `kcr standby --share-group --replicas`, on a topic of ONE
# partition. Idle, all three are checkpointed: no worker process runs. Then
# a burst of jobs lands: the share group's backlog wakes one replica warm,
# and as the oldest job waits longer than --scale-up-after the others wake
# too, one at a time, and all of them take jobs from the one partition (a
# consumer group would leave all but one idle). When the jobs are done, all
# sleep again. Prints when each replica woke, how many jobs each did, the
# time to finish against one replica's pace, and PASS when every job was
# done, more than one replica shared the partition, every job done twice
# had been released by a checkpoint and delivered again (its delivery
# count says so), and all replicas sleep at the end (else FAIL, exit 1).
#
# Environment: KCR_DEMO_REPLICAS (default 3; 1 measures one replica's pace:
# then it alone does the jobs), KCR_DEMO_JOBS (default 600:
# 12 s of one replica's work), KCR_DEMO_KEEP=1 keeps the work directory.
# KCR_DEMO_BROKER=kafka uses a real Apache Kafka broker (4.2+) with
# production group settings instead of the embedded one (franz-go's kfake):
# $KCR_KAFKA_PROD_BROKERS, else the one `KCR_KAFKA_PROD=1
# scripts/kafka-up.sh` starts (left running).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

replicas="${KCR_DEMO_REPLICAS:-3}"
jobs="${KCR_DEMO_JOBS:-600}"
broker_kind="${KCR_DEMO_BROKER:-kfake}"
case "$broker_kind" in kfake | kafka) ;; *) die "KCR_DEMO_BROKER must be kfake or kafka (got '$broker_kind')" ;; esac
[[ $replicas =~ ^[0-9]+$ ]] && ((replicas >= 1)) || die "KCR_DEMO_REPLICAS must be a positive number (got '$replicas')"
[[ $jobs =~ ^[0-9]+$ ]] && ((jobs >= 1)) || die "KCR_DEMO_JOBS must be a positive number (got '$jobs')"
need_build_run

sbs=() dirs=() broker=""
stop_all() {
	local i
	for i in "${!sbs[@]}"; do stop_standby "${sbs[$i]}" "${dirs[$i]}"; done
	[ -n "$broker" ] && kill -TERM "$broker" 2>/dev/null && { wait "$broker" 2>/dev/null || true; }
}
start_work kcr-demo-share "${KCR_DEMO_KEEP:-}" stop_all
bin="$work/bin"

lib_t0=$(now_ns)
fail() { fail_logs "$*" r0.standby.log r0.worker.log r1.standby.log broker.log; }
state_of() { "$bin/kcr" standby status --image-dir "${dirs[$1]}" --json 2>/dev/null | jq -r .state; }
count_state() {
	local i n=0
	for i in "${!dirs[@]}"; do [ "$(state_of "$i")" = "$1" ] && n=$((n + 1)); done
	echo "$n"
}
all_asleep() { [ "$(count_state standby)" = "$replicas" ]; }
# procs: every job done, as "offset delivery-count replica" lines.
procs() {
	local i
	for i in "${!dirs[@]}"; do
		jq -r --arg r "$i" 'fromjson? | select(.ev == "proc") | "\(.from) \(.dc) \($r)"' -R "$work/r$i.worker.log" 2>/dev/null || true
	done
}
done_jobs() { procs | awk '{print $1}' | sort -un | wc -l; }

echo "kcr standby demo: a share group's burst of jobs fanned out to warm-woken replicas, beyond the partition count"
scripts/install-criu.sh | detail
say "building kcr and the worker (a first build takes a minute or two)"
GOFLAGS="${GOFLAGS:-} -buildvcs=false" go build -o "$bin/" ./cmd/kcr ./examples/broker ./test/apps/kgoapp ./test/apps/wakeprobe

export GODEBUG=multipathtcp=0
tag=demo-share-$(date +%s%N)
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
topic="$tag-jobs"
"$bin/wakeprobe" -brokers "$brokers" -create 1 -orders "$topic" -results "$tag-results" || fail "cannot create the topic"

# The group reads the jobs that land while every replica sleeps.
"$bin/kgoapp" -brokers "$brokers" -topic "$topic" -group "$tag" -share-earliest || fail "cannot set the share group's share.auto.offset.reset"
worker=("$bin/kgoapp" -brokers "$brokers" -topic "$topic" -group "$tag" -share -share-max 10 -proc-delay 20ms -client-id worker)
say "$replicas x kcr standby --share-group $tag --replicas --idle 2s --scale-up-after 2s -- worker (20 ms a job), on 1 partition"
for ((i = 0; i < replicas; i++)); do
	dirs[i]="$work/r$i"
	setsid "$bin/kcr" standby --image-dir "${dirs[$i]}" --idle 2s --poll 100ms --brokers "$brokers" --share-group "$tag" --topics "$topic" \
		--replicas --replicas-topic "$tag-claims" --scale-up-after 2s --log "$work/r$i.worker.log" -- "${worker[@]}" \
		</dev/null >"$work/r$i.standby.log" 2>&1 &
	sbs[i]=$!
done
wait_until 120 "every replica to start and sleep" all_asleep || fail "the replicas did not all go to sleep"
say "all $replicas replicas asleep: checkpointed, no worker process runs"

say "a burst of $jobs jobs (one replica alone: $((jobs / 50)) s of work)"
sent=$("$bin/kgoapp" -brokers "$brokers" -topic "$topic" -burst "$jobs" -client-id demo-producer | jq -r 'select(.ev == "burst") | .sent_ns') ||
	fail "the burst was not produced"
t0=$(now_ms)
max_run=0
while [ "$(done_jobs)" -lt "$jobs" ]; do
	n=$(($(count_state running) + $(count_state restoring)))
	((n > max_run)) && max_run=$n
	(($(now_ms) - t0 < 180000)) || fail "$(done_jobs) of $jobs jobs done after 180 s"
	sleep 0.2
done
# The times, from the workers' own events (ns): each replica's restore
# (its after-restore hook) and first job after the burst was sent, and the
# last job.
since() { jq -R --argjson t "$sent" --arg ev "$1" 'fromjson? | select(.ev == $ev and .t > $t) | (.t - $t) / 1e6 | round' "$2" 2>/dev/null | head -n1; }
mapfile -t woke < <(for ((i = 0; i < replicas; i++)); do since after "$work/r$i.worker.log"; done | sort -n)
took=$(for ((i = 0; i < replicas; i++)); do
	jq -R --argjson t "$sent" 'fromjson? | select(.ev == "proc" and .t > $t) | (.t - $t) / 1e6 | round' "$work/r$i.worker.log"
done | sort -n | tail -n1)
for k in "${!woke[@]}"; do say "  replica $((k + 1)) of $replicas restored ${woke[$k]} ms after the burst was sent"; done
say "all $jobs jobs done ${took} ms after the burst was sent"
wait_until 120 "every replica to sleep again" all_asleep || fail "the replicas did not all go back to sleep"
say "all $replicas replicas asleep again"

procs >"$work/procs.txt"
mapfile -t per < <(for ((i = 0; i < replicas; i++)); do awk -v r="$i" '$3 == r' "$work/procs.txt" | wc -l; done)
shared=0
for n in "${per[@]}"; do ((n > 0)) && shared=$((shared + 1)); done
# A job done twice must have a delivery count of its own each time.
twice=$(awk '{n[$1]++} END {c=0; for (o in n) if (n[o] > 1) c++; print c}' "$work/procs.txt")
unexplained=$(sort -k1,1n -k2,2n "$work/procs.txt" | awk '$1 == po && $2 == pd {c++} {po = $1; pd = $2} END {print c + 0}')
missing=$((jobs - $(done_jobs)))
warm=0 cold=0
for ((i = 0; i < replicas; i++)); do
	grep -q '"share.auto.offset.reset"' "$work/r$i.standby.log" && fail "replica $i did not see the group's share.auto.offset.reset=earliest"
	warm=$((warm + $(jq -c -R 'fromjson? | select(.msg == "standby: running" and .source == "kafka")' "$work/r$i.standby.log" | wc -l)))
	cold=$((cold + $(jq -c -R 'fromjson? | select(.msg == "standby: starting")' "$work/r$i.standby.log" | wc -l)))
done

echo
echo "summary"
printf '  %-40s %s\n' "partitions / replicas that did jobs" "1 / $shared of $replicas (jobs by replica: ${per[*]})"
printf '  %-40s %s\n' "replicas woken / most running at once" "${#woke[@]} / $max_run (seen every 0.2 s or so)"
printf '  %-40s %s\n' "burst done in" "$took ms (one replica alone: $((jobs * 20)) ms of work; $(awk -v a="$((jobs * 20))" -v b="$took" 'BEGIN{printf "%.1f", a/b}')x)"
printf '  %-40s %s\n' "warm wakes / cold starts" "$warm / $cold (one cold start per replica, at its first start)"
printf '  %-40s %s\n' "jobs / missing / done twice (released)" "$jobs / $missing / $twice"
want=$((replicas > 1 ? 2 : 1))
[ "$missing" = 0 ] && ((shared >= want)) && [ "$unexplained" = 0 ] && [ "$cold" = "$replicas" ] && ((warm >= want)) ||
	fail "want every job done, 2 replicas or more sharing the partition, warm wakes, every job done twice delivered again ($unexplained were not)"
echo "  PASS"
