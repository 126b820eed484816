#!/usr/bin/env bash
# kcr standby's shutdown with the default --on-term checkpoint, for a
# service holding much memory, as root:
#
#   sudo scripts/bench-standby-term.sh [sizes-in-MiB] [runs]   # default: 64,512 5
#
# Per heap size and run it starts test/apps/lazyheap -notify (a service that
# touches its whole heap, each page stamped, before it listens) under a new
# kcr standby on an empty image directory (--idle 1h: only SIGTERM
# checkpoints it) and takes:
#   cold:  kcr standby started → the service's first answer ("ping");
#   term:  SIGTERM to kcr standby → kcr standby exited, the service
#          checkpointed (its image kept, the state file "standby");
#   image: the image's size on disk;
#   warm:  a new kcr standby started on that image directory, woken with
#          "kcr standby wake" as soon as it takes it → the service's first
#          answer; the whole heap is then read and must check out (bad 0).
# It prints medians per size, and warm/cold. No Kafka broker is needed.
# Images go under /var/tmp (warm page cache). KCR_BENCH_KEEP=1 keeps the
# work directory.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_root
need_go
need_jq

sizes="${1:-64,512}"
runs="${2:-5}"
sb_pid=""
stop_all() { stop_standby "$sb_pid" "$work"/*/img; }
start_work kcr-bench-standby-term "${KCR_BENCH_KEEP:-}" stop_all
bin="$work/bin"
build_bins "$bin" cmd/kcr test/apps/lazyheap

# first_answer PORT T0: wait (up to 600 s) for lazyheap's first pong on
# PORT and print the µs since T0.
first_answer() {
	local i ans
	for ((i = 0; i < 600000; i++)); do
		ans=$(tcp_ask "$1" ping) && [[ $ans == pong* ]] && { elapsed_us "$2" "$(now_ns)"; return; }
		sleep 0.001
	done
	die "no answer on port $1 within 600 s"
}

# standby RUN LOG PORT MB: start kcr standby on RUN/img, its log in LOG.
standby() {
	setsid "$bin/kcr" standby --image-dir "$1/img" --idle 1h \
		-- "$bin/lazyheap" -notify -mb "$4" -listen "127.0.0.1:$3" </dev/null >"$2" 2>&1 &
	sb_pid=$!
}

rows=()
IFS=',' read -r -a mbs <<<"$sizes"
for mb in "${mbs[@]}"; do
	colds=() terms=() imgs=() warms=()
	for ((r = 1; r <= runs; r++)); do
		run="$work/$mb-$r"
		mkdir -p "$run"
		port=$((20000 + RANDOM % 20000))
		t0=$(now_ns)
		standby "$run" "$run/cold.log" "$port" "$mb"
		colds+=("$(first_answer "$port" "$t0")")
		# SIGTERM once kcr standby has the service running (it answers
		# just before it registers with kcr standby).
		for ((i = 0; i < 6000; i++)); do
			[ "$("$bin/kcr" standby status --image-dir "$run/img" --json 2>/dev/null | jq -r .state)" = running ] && break
			sleep 0.01
		done
		t0=$(now_ns)
		kill -TERM "$sb_pid"
		rc=0
		wait "$sb_pid" || rc=$?
		terms+=("$(elapsed_us "$t0" "$(now_ns)")")
		sb_pid=""
		[ "$rc" = 0 ] || { tail -n 20 "$run/cold.log" >&2; die "$mb MiB run $r: kcr standby exited $rc at SIGTERM"; }
		st=$(jq -r '.state + " " + (.image // "")' "$run/img/standby.json")
		[[ $st == standby\ ?* ]] || { tail -n 20 "$run/cold.log" >&2; die "$mb MiB run $r: no image after SIGTERM (state: $st)"; }
		imgs+=("$(du -sb "$run/img/${st#standby }" | cut -f1)")
		t0=$(now_ns)
		standby "$run" "$run/warm.log" "$port" "$mb"
		for ((i = 0; i < 60000; i++)); do
			"$bin/kcr" standby wake --image-dir "$run/img" >/dev/null 2>&1 && break
			sleep 0.001
		done
		warms+=("$(first_answer "$port" "$t0")")
		sum=$(tcp_ask "$port" sum)
		[[ $sum =~ bad\ 0 ]] || die "$mb MiB run $r: heap check after the restore failed: $sum"
		grep -q '"msg":"standby: starting"' "$run/warm.log" && die "$mb MiB run $r: the next start was cold"
		echo "$mb MiB run $r: cold start → 1st answer $((${colds[-1]} / 1000)) ms, SIGTERM → kcr exited $((${terms[-1]} / 1000)) ms, image $((${imgs[-1]} / 1048576)) MiB, next start → 1st answer $((${warms[-1]} / 1000)) ms" >&2
		stop_standby "$sb_pid" "$run/img"
		sb_pid=""
		rm -rf "$run/img"
	done
	rows+=("$mb|$(median "${colds[@]}")|$(median "${terms[@]}")|$(median "${imgs[@]}")|$(median "${warms[@]}")")
done

echo "kcr standby --on-term checkpoint (default), lazyheap -notify: $(date -u +%F), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), load $(cut -d' ' -f1-3 /proc/loadavg); medians of $runs runs (ms)"
printf '%-9s %18s %22s %10s %26s %10s\n' heap "cold → 1st answer" "SIGTERM → kcr exited" "image MiB" "next start → 1st answer" warm/cold
for r in "${rows[@]}"; do
	IFS='|' read -r mb c t i w <<<"$r"
	awk -v mb="$mb MiB" -v c="$c" -v t="$t" -v i="$i" -v w="$w" \
		'BEGIN { printf "%-9s %18.0f %22.0f %10.0f %26.0f %10.2f\n", mb, c/1000, t/1000, i/1048576, w/1000, w/c }'
done
