#!/usr/bin/env bash
# Share groups (KIP-932) under kcr, measured on a real broker with
# production group settings:
#
#   sudo scripts/bench-share.sh [cycles]     (default 10)
#
# 1. Wake → first result: a worker (test/apps/kgoapp, 0 ms a record) under
#    `kcr standby --idle 1s`; each cycle produces one record while it
#    sleeps and times the record's send → the worker's "proc" event for it
#    (the worker's clock: the same host). The same worker on a share group
#    (--share-group, the backlog read every --poll: 250 ms by default, and
#    50 ms), a
#    KIP-848 consumer group and a classic one (--group: the long-polled lag
#    and, for classic, the group hold).
# 2. 0 → N replicas: scripts/demo-share.sh on the broker (1-partition topic,
#    20 ms a job, --scale-up-after 2s) with KCR_BENCH_REPLICAS (default 3)
#    replicas and with one, on KCR_BENCH_JOBS jobs (default 1500): when
#    each replica ran, and the time to do the jobs against one replica.
# 3. Checkpoint with acquired records in hand → restore → first record: a
#    share worker (100 ms a record, 20 records a poll) checkpointed by
#    `kcr checkpoint` mid-batch, then restored; the checkpoint's wall time,
#    the records its report says were held and released, and restore
#    start → the first records the restored copy's new member polls (its
#    handler first finishes the released batch it was in: the poll comes
#    after it, docs/share-groups.md).
#
# Environment: KCR_KAFKA_PROD_BROKERS (default 127.0.0.1:9094,
# `KCR_KAFKA_PROD=1 scripts/kafka-up.sh`'s), KCR_BENCH_SKIP (any of
# "wake replicas ckpt" to leave out), KCR_BENCH_KEEP=1 keeps the work
# directory.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

cycles="${1:-10}"
[[ $cycles =~ ^[0-9]+$ ]] && ((cycles >= 1)) || die "cycles must be a positive number (got '$cycles')"
brokers="${KCR_KAFKA_PROD_BROKERS:-127.0.0.1:9094}"
skip=" ${KCR_BENCH_SKIP:-} "
need_build_run

sb="" sbdir="" runpid=""
stop_all() {
	stop_standby "$sb" "$sbdir"
	[ -n "$runpid" ] && kill -TERM "$runpid" 2>/dev/null && { wait_gone "$runpid" 10 || kill -KILL "$runpid" 2>/dev/null || true; }
	return 0
}
start_work kcr-bench-share "${KCR_BENCH_KEEP:-}" stop_all
bin="$work/bin"
lib_t0=$(now_ns)
fail() { fail_logs "$*" standby.log worker.log ckpt.err; }
say "building kcr and the worker"
GOFLAGS="${GOFLAGS:-} -buildvcs=false" go build -o "$bin/" ./cmd/kcr ./test/apps/kgoapp ./test/apps/wakeprobe
export GODEBUG=multipathtcp=0
port_open "${brokers##*:}" "${brokers%:*}" || die "no broker on $brokers: start one (KCR_KAFKA_PROD=1 scripts/kafka-up.sh) or set KCR_KAFKA_PROD_BROKERS"
echo "bench-share: $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), broker $brokers, $(nproc) cores"

# pct P NUMBER...: the P-th percentile (nearest rank).
pct() {
	local p=$1
	shift
	printf '%s\n' "$@" | sort -g | awk -v p="$p" '{a[NR] = $1} END { i = int((p * NR + 99) / 100); if (i < 1) i = 1; print a[i] }'
}
state_is() { [ "$("$bin/kcr" standby status --image-dir "$sbdir" --json 2>/dev/null | jq -r .state)" = "$1" ]; }
# proc_after NS: the first "proc" event's time (ns) in the worker log
# after NS; has_proc_after NS: there is one.
proc_after() { jq -R --argjson t "$1" 'fromjson? | select(.ev == "proc" and .t > $t) | .t' "$work/worker.log" 2>/dev/null | head -n1; }
has_proc_after() { [ -n "$(proc_after "$1")" ]; }
# polled_after NS: the first poll with records after NS (ns); has_polled_after.
polled_after() { jq -R --argjson t "$1" 'fromjson? | select(.ev == "polled" and .records > 0 and .t > $t) | .t' "$work/worker.log" 2>/dev/null | head -n1; }
has_polled_after() { [ -n "$(polled_after "$1")" ]; }
# procs: the "proc" events in the worker log; procs_ge N: N at least.
procs() { jq -R 'fromjson? | select(.ev == "proc")' "$work/worker.log" 2>/dev/null | jq -s length; }
procs_ge() { [ "$(procs)" -ge "$1" ]; }
# burst N: produce N records to $topic; prints when they were sent (ns).
burst() { "$bin/kgoapp" -brokers "$brokers" -topic "$topic" -burst "$1" -client-id bench-producer | jq -r 'select(.ev == "burst") | .sent_ns'; }

# wake MODE: cycles of one record → first result under kcr standby.
wake() {
	local mode=$1 tag topic flags svc i sent first
	local -a lat=()
	tag=bench-share-$mode-$(date +%s%N) topic=$tag-t
	"$bin/wakeprobe" -brokers "$brokers" -create 1 -orders "$topic" -results "$tag-r" || fail "cannot create $topic"
	case $mode in
	share) flags=(--share-group "$tag") svc=(-share -share-max 10) ;;
	share-poll50) flags=(--share-group "$tag" --poll 50ms) svc=(-share -share-max 10) ;;
	kip848) flags=(--group "$tag") svc=(-consume -balancer server) ;;
	classic) flags=(--group "$tag") svc=(-consume) ;;
	esac
	[[ $mode == share* ]] && { "$bin/kgoapp" -brokers "$brokers" -topic "$topic" -group "$tag" -share-earliest || fail "cannot set share.auto.offset.reset"; }
	sbdir="$work/sb-$mode"
	rm -f "$work/worker.log"
	setsid "$bin/kcr" standby --image-dir "$sbdir" --idle 1s --brokers "$brokers" --topics "$topic" "${flags[@]}" --log "$work/worker.log" \
		-- "$bin/kgoapp" -brokers "$brokers" -topic "$topic" -group "$tag" "${svc[@]}" -client-id "bench-$mode" </dev/null >"$work/standby.log" 2>&1 &
	sb=$!
	# A first record, so that the group has offsets on the topic.
	burst 1 >/dev/null
	wait_until 90 "the $mode worker to sleep" state_is standby || fail "the $mode worker did not sleep"
	for ((i = 1; i <= cycles; i++)); do
		sent=$(burst 1)
		wait_until 60 "the $mode worker's result" has_proc_after "$sent" || fail "cycle $i: no result"
		first=$(proc_after "$sent")
		lat+=($(((first - sent) / 1000)))
		wait_until 60 "the $mode worker to sleep" state_is standby || fail "the $mode worker did not sleep again"
	done
	stop_standby "$sb" "$sbdir"
	sb=""
	wakes=$(jq -c -R 'fromjson? | select(.msg == "standby: running" and .source == "kafka")' "$work/standby.log" | wc -l)
	printf '  %-28s p50 %6.1f ms  p95 %6.1f ms  max %6.1f ms  (%d cycles, %d warm wakes)\n' "$mode" \
		"$(awk -v x="$(median "${lat[@]}")" 'BEGIN{print x/1000}')" "$(awk -v x="$(pct 95 "${lat[@]}")" 'BEGIN{print x/1000}')" \
		"$(awk -v x="$(pct 100 "${lat[@]}")" 'BEGIN{print x/1000}')" "$cycles" "$wakes"
}

if [[ $skip != *" wake "* ]]; then
	say "1. wake → first result under kcr standby --idle 1s (one record per cycle, sent while the worker sleeps)"
	for mode in share share-poll50 kip848 classic; do wake "$mode"; done
fi

if [[ $skip != *" replicas "* ]]; then
	jobs=${KCR_BENCH_JOBS:-1500} n=${KCR_BENCH_REPLICAS:-3}
	say "2. 0 → $n replicas on a 1-partition topic: scripts/demo-share.sh, $jobs jobs (20 ms each)"
	for r in 1 "$n"; do
		KCR_DEMO_BROKER=kafka KCR_KAFKA_PROD_BROKERS="$brokers" KCR_DEMO_REPLICAS=$r KCR_DEMO_JOBS=$jobs scripts/demo-share.sh >"$work/demo-$r.txt" 2>&1 ||
			{ tail -n 20 "$work/demo-$r.txt"; fail "demo-share.sh with $r replica(s) failed"; }
		done_ms=$(sed -n 's/.*all [0-9]* jobs done \([0-9]*\) ms after.*/\1/p' "$work/demo-$r.txt")
		eval "done_$r=$done_ms"
		printf '  %d replica(s): jobs done in %d ms (%.1f jobs/s); %s\n' "$r" "$done_ms" "$(awk -v j="$jobs" -v t="$done_ms" 'BEGIN{print j*1000/t}')" \
			"$(grep -o 'replica [0-9]* of [0-9]* restored [0-9]* ms' "$work/demo-$r.txt" | tr '\n' ';' | sed 's/;$//; s/;/, /g')"
	done
	printf '  throughput, %d replicas against one: %.2fx\n' "$n" "$(awk -v a="$done_1" -v b="$(eval echo "\$done_$n")" 'BEGIN{print a/b}')"
fi

if [[ $skip != *" ckpt "* ]]; then
	say "3. a share worker checkpointed with acquired records in hand, restored → first record ($cycles cycles)"
	tag=bench-share-ckpt-$(date +%s%N) topic=$tag-t
	"$bin/wakeprobe" -brokers "$brokers" -create 1 -orders "$topic" -results "$tag-r" || fail "cannot create $topic"
	burst $((cycles * 40 + 100)) >/dev/null
	rm -f "$work/worker.log"
	"$bin/kgoapp" -brokers "$brokers" -topic "$topic" -group "$tag" -share-earliest || fail "cannot set share.auto.offset.reset"
	"$bin/kcr" run --json --log "$work/worker.log" -- "$bin/kgoapp" -brokers "$brokers" -topic "$topic" -group "$tag" -share \
		-share-max 20 -proc-delay 100ms -held-wait 100ms -client-id bench-ckpt >"$work/run.json" || fail "kcr run failed"
	runpid=$(jq -r .pid "$work/run.json")
	declare -a ck rs rp held rel
	for ((i = 1; i <= cycles; i++)); do
		# 5 records into a batch of 20: records in hand.
		n0=$(procs)
		wait_until 60 "records processed" procs_ge $((n0 + 25)) || fail "the worker does not process"
		t0=$(now_ns)
		"$bin/kcr" checkpoint --json -o "$work/img$i" "$runpid" >"$work/ckpt.json" 2>"$work/ckpt.err" || fail "kcr checkpoint failed"
		t1=$(now_ns)
		ck+=($(((t1 - t0) / 1000)))
		rep=$(jq -c '[.. | objects | select(has("records_held"))][0]' "$work/img$i/manifest.json")
		held+=("$(jq .records_held <<<"$rep")") rel+=("$(jq .records_released <<<"$rep")")
		t0=$(now_ns)
		"$bin/kcr" restore --json "$work/img$i" >"$work/restore.json" 2>>"$work/ckpt.err" || fail "kcr restore failed"
		runpid=$(jq -r '.restores[0].pid' "$work/restore.json")
		wait_until 60 "the restored worker's first record" has_polled_after "$t0" || fail "no record after the restore"
		rs+=($((($(polled_after "$t0") - t0) / 1000)))
		rp+=($((($(proc_after "$t0") - t0) / 1000)))
	done
	printf '  checkpoint (hooks + dump):      p50 %.1f ms, max %.1f ms; records held %s, released %s\n' "$(median_ms ck)" \
		"$(awk -v x="$(pct 100 "${ck[@]}")" 'BEGIN{print x/1000}')" "${held[*]}" "${rel[*]}"
	printf '  restore start → first record processed (the image'"'"'s handler, in its released batch): p50 %.1f ms, max %.1f ms\n' "$(median_ms rp)" \
		"$(awk -v x="$(pct 100 "${rp[@]}")" 'BEGIN{print x/1000}')"
	printf '  restore start → first records fetched by the new member: p50 %.1f ms, max %.1f ms\n' "$(median_ms rs)" "$(awk -v x="$(pct 100 "${rs[@]}")" 'BEGIN{print x/1000}')"
fi
