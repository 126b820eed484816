#!/usr/bin/env bash
# The cost of kcr standby --log - (the service's stdout and stderr through
# pipes to kcr standby's own) against --log FILE, for a service that logs
# 10,000 lines a second, as root:
#
#   sudo scripts/bench-standby-logpipe.sh [cycles] [rate]   # default: 10 10000
#
# For each mode it starts test/apps/testapp -listen-fds -log-rate RATE
# (numbered lines, 9 in 10 on stdout, 1 in 10 on stderr, 1 in 1,000 of
# 8 KiB) under kcr standby --idle 1s --listen, and runs CYCLES sleep/wake
# cycles: once the service sleeps, a connection wakes it, and the time
# from the connect to the service's answer is taken (wake → 1st answer),
# with kcr standby's own restored_ms (last_wake). After SIGTERM it reads
# every line the service wrote (kcr standby's stdout and stderr, or the
# file) and counts those lost (a number missing below the last one),
# repeated, and cut (not whole). It prints medians per mode. No Kafka
# broker is needed. KCR_BENCH_KEEP=1 keeps the work directory.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_root
need_go
need_jq

cycles="${1:-10}"
rate="${2:-10000}"
sb_pid=""
stop_all() { stop_standby "$sb_pid" "$work"/*/img; }
start_work kcr-bench-standby-logpipe "${KCR_BENCH_KEEP:-}" stop_all
bin="$work/bin"
build_bins "$bin" cmd/kcr test/apps/testapp

asleep() { [ "$("$bin/kcr" standby status --image-dir "$1" --json 2>/dev/null | jq -r .state)" = standby ]; }

# lines FILE...: "lines lost repeated cut" over testapp's numbered lines.
lines() {
	cat "$@" | awk -v x="$(printf 'x%.0s' {1..80})" '
		/logline/ {
			if ($1 != "logline" || NF != 4 || ($4 != x && length($4) != 8192)) { cut++; next }
			if (seen[$2]++) rep++
			if ($2 + 0 > max) max = $2 + 0
			n++
		}
		END { lost = 0; for (i = 0; i <= max; i++) if (!(i in seen)) lost++; printf "%d %d %d %d\n", n, lost, rep + 0, cut + 0 }'
}

rows=()
for mode in file pipe; do
	run="$work/$mode"
	mkdir -p "$run"
	port=$((20000 + RANDOM % 20000))
	logflag=(--log "$run/service.log")
	[ "$mode" = pipe ] && logflag=(--log -)
	setsid "$bin/kcr" standby --image-dir "$run/img" --idle 1s --listen "127.0.0.1:$port" "${logflag[@]}" \
		-- "$bin/testapp" -listen-fds -log-rate "$rate" </dev/null >"$run/stdout" 2>"$run/stderr" &
	sb_pid=$!
	wakes=() restored=()
	for ((c = 1; c <= cycles; c++)); do
		wait_until 120 "the service to sleep" asleep "$run/img"
		t0=$(now_ns)
		{ exec 3<>"/dev/tcp/127.0.0.1/$port"; } 2>/dev/null || die "$mode cycle $c: connect failed"
		read -r -t 60 ans <&3 || die "$mode cycle $c: no answer"
		exec 3<&-
		wakes+=("$(elapsed_us "$t0" "$(now_ns)")")
		r=$("$bin/kcr" standby status --image-dir "$run/img" --json | jq -r '.last_wake.restored_ms // 0')
		restored+=("$(awk -v r="$r" 'BEGIN{printf "%d", r*1000}')")
		echo "$mode cycle $c: wake → 1st answer $((${wakes[-1]} / 1000)) ms, restored_ms $r" >&2
	done
	wait_until 120 "the service to sleep" asleep "$run/img"
	kill -TERM "$sb_pid"
	wait "$sb_pid" || true
	sb_pid=""
	if [ "$mode" = pipe ]; then
		read -r n lost rep cut < <(lines "$run/stdout" "$run/stderr")
	else
		read -r n lost rep cut < <(lines "$run/service.log")
	fi
	grep -q '"msg":"standby: restore failed' "$run/stderr" && die "$mode: a restore failed: see $run/stderr"
	rows+=("$mode|$(median "${wakes[@]}")|$(median "${restored[@]}")|$n|$lost|$rep|$cut")
done

echo "kcr standby --log FILE vs --log -, testapp -log-rate $rate: $(date -u +%F), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), load $(cut -d' ' -f1-3 /proc/loadavg); medians of $cycles cycles (ms)"
printf '%-6s %22s %12s %9s %6s %9s %5s\n' log "wake → 1st answer" restored_ms lines lost repeated cut
for r in "${rows[@]}"; do
	IFS='|' read -r m w rs n l rp ct <<<"$r"
	awk -v m="$m" -v w="$w" -v rs="$rs" -v n="$n" -v l="$l" -v rp="$rp" -v ct="$ct" \
		'BEGIN { printf "%-6s %22.1f %12.1f %9d %6d %9d %5d\n", m, w/1000, rs/1000, n, l, rp, ct }'
done
