#!/usr/bin/env bash
# The wake of a large service under kcr standby, plain and lazy (--lazy,
# userfaultfd), as root:
#
#   sudo scripts/bench-standby-large.sh [sizes-in-MiB] [wakes]   # default: 64,512,2048 3
#
# For each heap size and mode it runs test/apps/lazyheap -notify (a service
# holding that much touched memory, each page stamped) under kcr standby,
# lets it go to sleep, and wakes it `wakes` times with
# "kcr standby wake". Per wake it takes: kcr standby's own wake (signal →
# restored, signal → hooks done, from status --json), the time from the wake
# command to the service's first answer ("ping", touching little memory),
# and then what the service pays after the wake: a checksum of its whole
# heap ("sum", every page read and checked; lazy pages not copied yet fault
# in from the lazy-pages daemon). Every page must check out (bad 0). It
# prints medians per size and mode, with lazy/plain ratios.
#
# After each checkpoint it copies that image's pages with dd to a file on
# the same disk (conv=fdatasync): the median of checkpoint/dd over the
# pairs, and where the checkpoints' time went (from each image's manifest:
# the hooks, CRIU's frozen time, its collection of the pages and its page
# writes, the pages' hash and sync at post-dump, the rest of the image's
# write), with collection/checkpoint: the share of a checkpoint CRIU spends
# reading every page, whatever a parent image holds. With
# KCR_BENCH_ABANDON=N (default 0) it then wakes the service N times at a
# random moment of a checkpoint (within the last checkpoint's duration after
# it began): wake → first answer, apart for the checkpoints the wake
# abandoned (the service resumed) and for those it came too late for (the
# service restored).
#
# KCR_BENCH_IDLE is --idle (default 2s). KCR_BENCH_FLAGS adds kcr standby flags (e.g. "--kdat-cache=false
# --prepare-restore=false" to measure what they save); KCR_BENCH_MODES
# (default "plain lazy") picks the modes.
#
# Images go under /var/tmp and stay in the
# page cache (warm: the machine that dumped restores). KCR_BENCH_KEEP=1 keeps
# the work directory.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_root
need_go
need_jq

sizes="${1:-64,512,2048}"
wakes="${2:-3}"
read -r -a extra <<<"${KCR_BENCH_FLAGS:-}"
modes="${KCR_BENCH_MODES:-plain lazy}"
idle="${KCR_BENCH_IDLE:-2s}"
abandon="${KCR_BENCH_ABANDON:-0}"
sb_pid=""
stop_all() { stop_standby "$sb_pid" "$work"/*/img; }
start_work kcr-bench-standby-large "${KCR_BENCH_KEEP:-}" stop_all
bin="$work/bin"
build_bins "$bin" cmd/kcr test/apps/lazyheap

# dd_beside IMAGE WORK: copies IMAGE's pages (in the page cache, as the
# dump's were in memory) to a file on the same disk with dd, synced, and
# prints the milliseconds it took.
dd_beside() {
	local pages t0 ms
	pages=$(find "$1/criu" -name 'pages-*.img' -printf '%s %p\n' | sort -n | tail -n1 | cut -d' ' -f2)

	[ -n "$pages" ] || { echo 0; return; }
	sync
	t0=$(now_ns)
	dd if="$pages" of="$2/dd.out" bs=1M conv=fdatasync status=none
	ms=$(($(elapsed_us "$t0" "$(now_ns)") / 1000))
	rm -f "$2/dd.out"
	echo "$ms"
}

# phases IMAGE CKPT_MS: the image's checkpoint phases (ms) as "hooks frozen
# memwrite prehash rest collect", from its manifest; rest is what CKPT_MS
# leaves (the image's write after CRIU, kcr standby's own steps); collect is
# CRIU's memory dump less its page writes (reading the pagemap, the
# parasite's vmsplice of every page into pipes): what CRIU spends on the
# pages before a byte reaches the page server, with or without a parent.
phases() {
	jq -r --argjson ck "$2" '[(.phases | map({(.name): (.duration_ns / 1e6)}) | add) as $p
		| ($p.hooks // 0), (.criu_stats.frozen_time_us // 0) / 1000, (.criu_stats.memwrite_time_us // 0) / 1000,
		  ($p["prehash pages"] // 0), $ck - ($p.hooks // 0) - (.criu_stats.frozen_time_us // 0) / 1000,
		  ((.criu_stats.memdump_time_us // 0) - (.criu_stats.memwrite_time_us // 0)) / 1000] | map(floor) | join(" ")' "$1/manifest.json"
}

# abandon_wakes MB MODE PORT CKPT_MS: KCR_BENCH_ABANDON wakes, each at a
# random moment within the last checkpoint's duration (CKPT_MS at first)
# after a checkpoint's start; sets ab_row to
# "abandoned median µs|count|too-late median µs|count".
abandon_wakes() {
	local i t0 d d2 n0 n1 ckl how lat=() late=()
	ab_row="|0||0"
	[ "$abandon" -gt 0 ] || return 0
	for ((i = 0; i < abandon; i++)); do
		if [ "$($status 2>/dev/null | jq -r .state)" = standby ]; then
			# Asleep: woken (not measured), it goes idle again.
			"$bin/kcr" standby wake --image-dir "$run/img" >/dev/null
			until ans=$(tcp_ask "$3" ping) && [[ $ans == pong* ]]; do sleep 0.01; done
		fi
		until [ "$($status 2>/dev/null | jq -r .state)" = checkpointing ]; do sleep 0.05; done
		# Within the last complete checkpoint's duration: they vary with
		# the disk's load.
		ckl=$(jq -r 'select(.msg == "standby: checkpointed") | .duration_ms' "$run/standby.log" | tail -n1)
		ckl=${ckl%.*}
		d=$((RANDOM * 32768 + RANDOM))
		d=$((d % (${ckl:-$4} > 0 ? ${ckl:-$4} : 1)))
		sleep "$(awk -v d="$d" 'BEGIN { printf "%.3f", d/1000 }')"
		n0=$(grep -c 'checkpoint abandoned for a wake' "$run/standby.log" || true)
		t0=$(now_ns)
		"$bin/kcr" standby wake --image-dir "$run/img" >/dev/null || true
		until ans=$(tcp_ask "$3" ping) && [[ $ans == pong* ]]; do sleep 0.001; done
		d2=$(elapsed_us "$t0" "$(now_ns)")
		# kcr standby logs the abandon (or the restore) before it says
		# the service runs.
		until [ "$($status 2>/dev/null | jq -r .state)" = running ]; do sleep 0.05; done
		n1=$(grep -c 'checkpoint abandoned for a wake' "$run/standby.log" || true)
		if [ "$n1" -gt "$n0" ]; then lat+=("$d2"); how=abandoned; else late+=("$d2"); how=restored; fi
		echo "$1 MiB $2 wake $d ms into a checkpoint: $how, → first answer $((d2 / 1000)) ms" >&2
	done
	ab_row="$([ ${#lat[@]} -eq 0 ] || median "${lat[@]}")|${#lat[@]}|$([ ${#late[@]} -eq 0 ] || median "${late[@]}")|${#late[@]}"
}

rows=() breakdown=()
IFS=',' read -r -a mbs <<<"$sizes"
for mb in "${mbs[@]}"; do
	for mode in $modes; do
		run="$work/$mb-$mode"
		mkdir -p "$run"
		port=$((20000 + RANDOM % 20000))
		lazy=false
		[ "$mode" = lazy ] && lazy=true
		status="$bin/kcr standby status --image-dir $run/img --json"
		setsid "$bin/kcr" standby --image-dir "$run/img" --idle "$idle" --lazy="$lazy" "${extra[@]}" \
			-- "$bin/lazyheap" -notify -mb "$mb" -listen "127.0.0.1:$port" </dev/null >"$run/standby.log" 2>&1 &
		sb_pid=$!
		sigs=() hooks=() pings=() sums=() starts=() ratios=() dds=() ph_hooks=() ph_frozen=() ph_mw=() ph_pre=() ph_iw=() ph_col=() colr=()
		for ((w = 0; w <= wakes; w++)); do
			for ((i = 0; i < 3000; i++)); do
				[ "$($status 2>/dev/null | jq -r .state)" = standby ] && break
				sleep 0.2
			done
			[ "$i" -lt 3000 ] || { tail -n 20 "$run/standby.log" >&2; die "kcr standby ($mb MiB, $mode) did not put the service to sleep within 600 s"; }
			img="$run/img/$($status | jq -r .image)"
			ck=$(jq -r 'select(.msg == "standby: checkpointed") | .duration_ms' "$run/standby.log" | tail -n1)
			dd=$(dd_beside "$img" "$run")
			ratios+=("$(awk -v c="$ck" -v d="$dd" 'BEGIN { printf "%.3f", (d > 0 ? c / d : 0) }')")
			read -r ph_h ph_f ph_m ph_p ph_i ph_c <<<"$(phases "$img" "$ck")"
			ph_hooks+=("$ph_h") ph_frozen+=("$ph_f") ph_mw+=("$ph_m") ph_pre+=("$ph_p") ph_iw+=("$ph_i") ph_col+=("$ph_c") dds+=("$dd")
			colr+=("$(awk -v c="$ph_c" -v k="$ck" 'BEGIN { printf "%.3f", (k > 0 ? c / k : 0) }')")
			echo "$mb MiB $mode checkpoint $((w + 1)): ${ck%.*} ms (hooks $ph_h, CRIU frozen $ph_f of which page collection $ph_c and page writes $ph_m, pages hashed+synced $ph_p; the rest $ph_i), dd of its pages $dd ms, load $(cut -d' ' -f1 /proc/loadavg)" >&2
			[ "$w" -lt "$wakes" ] || break
			t0=$(now_ns)
			"$bin/kcr" standby wake --image-dir "$run/img" >/dev/null
			until ans=$(tcp_ask "$port" ping) && [[ $ans == pong* ]]; do sleep 0.001; done
			t1=$(now_ns)
			# At once: the service must not go back to sleep first.
			sum=$(tcp_ask "$port" sum)
			pings+=("$(elapsed_us "$t0" "$t1")")
			[[ $sum =~ bad\ 0\ ms\ ([0-9]+) ]] || die "$mb MiB $mode wake $w: heap check failed: $sum"
			sums+=("$((BASH_REMATCH[1] * 1000))")
			st=$($status)
			sigs+=("$(jq '.last_wake.restored_ms * 1000 | floor' <<<"$st")")
			hooks+=("$(jq '.last_wake.hooks_done_ms * 1000 | floor' <<<"$st")")
			starts+=("$(jq '.last_wake.restore["criu: start"] // 0 | . * 1000 | floor' <<<"$st")")
			echo "$mb MiB $mode wake $((w + 1)): signal → restored $((${sigs[-1]} / 1000)) ms, wake → first answer $((${pings[-1]} / 1000)) ms, whole heap read $((${sums[-1]} / 1000)) ms" >&2
		done
		mapfile -t cl < <(jq -r 'select(.msg == "standby: checkpointed") | .duration_ms' "$run/standby.log")
		ddms="$(median "${dds[@]}")|$(median "${ratios[@]}")"
		breakdown+=("$mb MiB $mode checkpoint medians (ms): hooks $(median "${ph_hooks[@]}"), CRIU frozen $(median "${ph_frozen[@]}") (page collection $(median "${ph_col[@]}"), page writes $(median "${ph_mw[@]}")), collection/checkpoint $(median "${colr[@]}") (median of pairs), pages hashed+synced at post-dump $(median "${ph_pre[@]}"), the rest $(median "${ph_iw[@]}")")
		abandon_wakes "$mb" "$mode" "$port" "${cl[-1]%.*}"
		stop_standby "$sb_pid" "$run/img"
		sb_pid=""
		rss=$(jq -r 'select(.msg == "standby: checkpointed") | .image_bytes' "$run/standby.log" | tail -n1)
		rows+=("$mb|$mode|$(median "${sigs[@]}")|$(median "${hooks[@]}")|$(median "${pings[@]}")|$(median "${sums[@]}")|$(median "${cl[@]%.*}")|$rss|$(median "${starts[@]}")|$ddms|$ab_row")
	done
done

echo "kcr standby ${extra[*]}, large services: $(date -u +%F), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), load $(cut -d' ' -f1-3 /proc/loadavg); medians of $wakes wakes (ms)"
echo "  → restored, → hooks: kcr standby's wake signal to CRIU done / after-restore hooks done; → 1st answer: the wake command to the first ping answered;"
echo "  heap read after: the service's first read of its whole heap after the wake; checkpoint: kcr standby's checkpoint (after a lazy wake it waits for the daemon);"
echo "  criu start: CRIU's start to its first notification (its kernel probe, reading the image), inside → restored"
echo "  dd: each image's pages copied with dd to the same disk (conv=fdatasync) right after its checkpoint; ckpt/dd: median of the pairs;"
echo "  wake in ckpt: kcr standby wake at a random moment of a checkpoint → first answer (median, count): abandoned (resumed) / too late (restored)"
printf '%-9s %-6s %12s %12s %14s %16s %12s %10s %11s %8s %8s %18s %18s\n' heap mode "→ restored" "→ hooks" "→ 1st answer" "heap read after" checkpoint "image MiB" "criu start" "dd" "ckpt/dd" "wake: abandoned" "wake: too late"
for r in "${rows[@]}"; do
	IFS='|' read -r mb mode sig hook ping sum ck img cs dd ratio abl abn lal lan <<<"$r"
	awk -v mb="$mb MiB" -v mode="$mode" -v a="$sig" -v b="$hook" -v c="$ping" -v d="$sum" -v e="${ck:-0}" -v f="${img:-0}" -v g="${cs:-0}" \
		-v h="${dd:-0}" -v r="${ratio:-0}" -v i="${abl:-0}" -v j="${abn:-0}" -v k="${lal:-0}" -v l="${lan:-0}" \
		'BEGIN { printf "%-9s %-6s %12.0f %12.0f %14.0f %16.0f %12.0f %10.0f %11.1f %8.0f %8.2f %13.0f (%2d) %13.0f (%2d)\n", mb, mode, a/1000, b/1000, c/1000, d/1000, e, f/1048576, g/1000, h, r, i/1000, j, k/1000, l }'
done
printf '%s\n' "${breakdown[@]}"
for mb in "${mbs[@]}"; do
	p="" l=""
	for r in "${rows[@]}"; do
		IFS='|' read -r m mode sig hook ping sum ck img cs _ <<<"$r"
		[ "$m" = "$mb" ] || continue
		[ "$mode" = plain ] && p="$ping|$sum" || l="$ping|$sum"
	done
	[ -n "$p" ] && [ -n "$l" ] || continue
	awk -v mb="$mb" -v p="$p" -v l="$l" 'BEGIN { split(p, a, "|"); split(l, b, "|");
		printf "%s MiB lazy/plain: wake → 1st answer %.2f, heap read after %.2f\n", mb, b[1]/a[1], b[2]/a[2] }'
done
