#!/usr/bin/env bash
# Times "kcr checkpoint" against a plain "criu dump", and "kcr restore"
# against a plain "criu restore", alternating on the same process in one run,
# and prints medians and ratios. A checkpoint with the test app's hooks
# (--leave-running) is timed too, for the time the app stays quiesced.
#
#   sudo scripts/bench.sh [rounds] [heap MiB]    (default 15 rounds, 0 MiB)
#
# With KCR_BENCH_BASE=REV (a git revision, e.g. main) a kcr built from REV
# the way the README said then (plain go build) is timed in the same rounds,
# for a before/after comparison. kcr itself is built as the README says
# (CGO_ENABLED=0: a static binary, no dynamic loader at each start).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
rounds="${1:-15}"
heap_mb="${2:-0}"
need_root
# KCR_BENCH_RUN_TMPFS=1: run in a private mount namespace with a tmpfs on
# /run, as systemd hosts have, so that CRIU keeps its kernel probe in
# /run/criu.kdat instead of probing on every run (it caches only on tmpfs).
if [ "${KCR_BENCH_RUN_TMPFS:-}" = 1 ] && [ -z "${KCR_BENCH_IN_NS:-}" ]; then
	exec env KCR_BENCH_IN_NS=1 unshare --mount --propagation private "$0" "$@"
fi
if [ -n "${KCR_BENCH_IN_NS:-}" ]; then
	mount -t tmpfs -o mode=0755 tmpfs /run
	# An fd inherited from outside points into the host's mounts, which
	# CRIU cannot find in this namespace: the target must not inherit one.
	for fd in /proc/$$/fd/*; do
		fd=${fd##*/}
		if [ "$fd" -gt 2 ] && [ "$fd" -lt 255 ]; then eval "exec $fd>&-"; fi
	done
fi
need_go
need_jq
scripts/install-criu.sh >/dev/null
criu="${KCR_CRIU:-$(command -v criu || echo /usr/local/sbin/criu)}"

work=$(mktemp -d /var/tmp/kcr-bench.XXXXXX)
trap 'kill -9 $(cat "$work"/pid 2>/dev/null) 2>/dev/null || true; rm -rf "$work"' EXIT
CGO_ENABLED=0 go build -o "$work/kcr" ./cmd/kcr
go build -o "$work/kcr-cgo" ./cmd/kcr
go build -o "$work/testapp" ./test/apps/testapp
base="${KCR_BENCH_BASE:-}"
if [ -n "$base" ]; then
	mkdir "$work/base"
	git archive "$base" | tar -x -C "$work/base"
	(cd "$work/base" && go build -o "$work/kcr-base" ./cmd/kcr)
fi
# Times are microseconds read from $EPOCHREALTIME, without forking: a "date"
# per reading would add its own start to every interval.

GODEBUG=multipathtcp=0 KCR_SOCKET_DIR="$work/sock" setsid "$work/testapp" -heap-mb "$heap_mb" </dev/null >>"$work/app.log" 2>&1 &
pid=$!
echo "$pid" >"$work/pid"
wait_socket "$pid" 10
[ "$heap_mb" = 0 ] || sleep 1
rss=$(awk '/VmRSS/{print $2}' "/proc/$pid/status")

declare -a kc cd cs kr cr fz pp dm cw wd iw ce rs vs gv bc bv br hq hw bq bw
# phase NAME: that phase of the last "kcr checkpoint --json", in µs.
phase() { jq --arg n "$1" '[.phases[] | select(.name == $n) | .duration_ns][0] // 0 | . / 1000 | floor' "$work/k.json"; }
# rphase NAME: that phase of the last "kcr restore --json", in µs.
rphase() { jq --arg n "$1" '[.restores[0].phases[] | select(.name == $n) | .duration_ns][0] // 0 | . / 1000 | floor' "$work/r.json"; }
declare -a rv rcv rg rc rcs rct rca rps
run_kcr() {
	local t0 t1
	t0=${EPOCHREALTIME/./}
	quiet "$work/kcr.err" "$work/kcr" checkpoint --json --no-hooks --leave-running -o "$work/k" "$pid" >"$work/k.json"
	t1=${EPOCHREALTIME/./}
	kwall=$((t1 - t0))
	kc+=("$kwall")
}
run_criu() {
	local t0 t1 t2
	t0=${EPOCHREALTIME/./}
	"$criu" dump -t "$pid" -D "$work/c" --leave-running --file-locks -o dump.log
	t1=${EPOCHREALTIME/./}
	sync -f "$work/c"
	t2=${EPOCHREALTIME/./}
	cd+=($((t1 - t0)))
	cs+=($((t2 - t0)))
}
# quiesced FILE: hooks, draft manifest and freeze+dump of a hooked
# checkpoint's --json, in µs: from the app's hooks to the dump's end, the
# time the app's resources stay quiesced (CRIU's preparation before the
# hooks is not in it).
quiesced() { jq '[.phases[] | select(.name == "hooks" or .name == "draft manifest" or .name == "freeze+dump") | .duration_ns] | add / 1000 | floor' "$1"; }
# run_hooked BINARY WALL QUIESCED: a checkpoint with the test app's hooks.
run_hooked() {
	local t0 t1
	rm -rf "$work/h"
	t0=${EPOCHREALTIME/./}
	quiet "$work/kcr.err" "$1" checkpoint --json --leave-running -o "$work/h" "$pid" >"$work/h.json"
	t1=${EPOCHREALTIME/./}
	eval "$2+=($((t1 - t0)))"
	eval "$3+=($(quiesced "$work/h.json"))"
}
run_hooks() { run_hooked "$work/kcr" hw hq; }
run_hooksbase() { run_hooked "$work/kcr-base" bw bq; }
run_base() {
	local t0 t1
	t0=${EPOCHREALTIME/./}
	quiet "$work/kcr.err" "$work/kcr-base" checkpoint --no-hooks --leave-running -o "$work/b" "$pid" >/dev/null
	t1=${EPOCHREALTIME/./}
	bc+=($((t1 - t0)))
}
# start_exit ARRAY BINARY: a start and exit alone (Go runtime, package init,
# cobra), appended to ARRAY.
start_exit() {
	local t0 t1
	t0=${EPOCHREALTIME/./}
	"$2" version >/dev/null
	t1=${EPOCHREALTIME/./}
	eval "$1+=($((t1 - t0)))"
}
# The dumps run in a rotated order, so that none always comes first after
# the restore that ends the previous round.
if [ -n "$base" ]; then
	orders=("kcr criu base hooks hooksbase" "criu base kcr hooksbase hooks" "base kcr criu hooks hooksbase")
else
	orders=("kcr criu hooks" "criu kcr hooks")
fi
for i in $(seq "$rounds"); do
	rm -rf "$work/k" "$work/c" "$work/b" "$work/h"
	mkdir -p "$work/c"
	for step in ${orders[$((i % ${#orders[@]}))]}; do "run_$step"; done
	start_exit vs "$work/kcr"
	start_exit gv "$work/kcr-cgo"
	[ -z "$base" ] || start_exit bv "$work/kcr-base"
	# The app's pause: CRIU's own frozen time (freeze → resume of the tree),
	# from the manifest; what a --leave-running user feels.
	fz+=("$(jq '.manifest.criu_stats.frozen_time_us // 0' "$work/k.json")")
	pp+=("$(phase prepare)")
	dm+=("$(phase "draft manifest")")
	cw+=("$(phase "criu ready wait")")
	wd+=("$(phase "freeze+dump")")
	iw+=("$(phase "image write")")
	ce+=("$(phase "criu exit")")
	rs+=($((kwall - $(phase total))))

	# Restores need the PID free: kill the original (outside the timing).
	kill -9 "$pid"
	wait "$pid" 2>/dev/null || true
	wait_gone "$pid"
	t0=${EPOCHREALTIME/./}
	quiet "$work/kcr.err" "$work/kcr" restore --json "$work/k" >"$work/r.json"
	t1=${EPOCHREALTIME/./}
	kr+=($((t1 - t0)))
	rv+=("$(rphase verify)")
	rcv+=("$(rphase "criu version wait")")
	rg+=("$(rphase generation)")
	rc+=("$(rphase restore)")
	rcs+=("$(rphase "criu: start")")
	rct+=("$(rphase "criu: tasks")")
	rca+=("$(rphase "criu: answer")")
	rps+=($((t1 - t0 - $(rphase total))))
	kill -9 "$pid"
	wait_gone "$pid"
	if [ -n "$base" ]; then
		t0=${EPOCHREALTIME/./}
		quiet "$work/kcr.err" "$work/kcr-base" restore "$work/k" >/dev/null
		t1=${EPOCHREALTIME/./}
		br+=($((t1 - t0)))
		kill -9 "$pid"
		wait_gone "$pid"
	fi
	t0=${EPOCHREALTIME/./}
	"$criu" restore -D "$work/c" -d --file-locks -o restore.log
	t1=${EPOCHREALTIME/./}
	cr+=($((t1 - t0)))
	wait_socket "$pid"
	sleep 0.5 # the restored app notices its restore by itself; let it settle
done

ms_() { awk -v x="$1" 'BEGIN{printf "%8.1f", x/1000}'; }
# med NAME: the median of the array NAME (µs), as ms_ prints it.
med() {
	local -n med_a=$1
	ms_ "$(median "${med_a[@]}")"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a/b}'; }
mk=$(median "${kc[@]}")
mc=$(median "${cd[@]}")
ms=$(median "${cs[@]}")
mkr=$(median "${kr[@]}")
mcr=$(median "${cr[@]}")
runfs="/run is $(stat -f -c %T /run)"
[ -z "${KCR_BENCH_IN_NS:-}" ] || runfs="/run is a private tmpfs (KCR_BENCH_RUN_TMPFS=1): CRIU's kernel probe is cached"
echo "kcr bench: $rounds rounds, one process (RSS $((rss / 1024)) MiB), medians in ms; load average $(cut -d' ' -f1-3 /proc/loadavg); $runfs"
echo "  kcr checkpoint --no-hooks --leave-running  $(ms_ "$mk")"
echo "    prepare (process, CRIU start, image dir, dump request sent) $(med pp)"
echo "    (preflight, socket, version, hooks run while CRIU prepares)"
echo "    draft manifest (for kcr recover)         $(med dm)"
echo "    wait for CRIU's own preparation          $(med cw)"
echo "      (its start and kernel probing, left after kcr's)"
echo "    freeze+dump (from CRIU's pre-dump stage) $(med wd)"
echo "    image write (hash, syncfs, publish)      $(med iw)"
echo "    CRIU's exit, left after the image write  $(med ce)"
echo "    process start, flags, output, exit       $(med rs)"
echo "    (a bare 'kcr version' start+exit)        $(med vs)"
echo "    (the same, kcr built with cgo)           $(med gv)"
echo "    (phase medians need not add up to the wall-time median)"
echo "  app pause (CRIU frozen time)               $(med fz)"
echo "  kcr checkpoint --leave-running (with hooks) $(med hw)"
echo "    app quiesced: hooks to the dump's end    $(med hq)"
echo "  criu dump --leave-running                  $(ms_ "$mc")"
echo "  criu dump --leave-running + syncfs         $(ms_ "$ms")"
echo "  kcr restore                                $(ms_ "$mkr")"
echo "    verify (CRIU's start runs alongside)     $(med rv)"
echo "    wait for CRIU's version check            $(med rcv)"
echo "    CRIU's restore request                   $(med rc)"
echo "      request to first notification          $(med rcs)"
echo "      (kernel probing, reading the images)"
echo "      the tasks, first to last notification  $(med rct)"
echo "      last notification to CRIU's answer     $(med rca)"
echo "    restore counter (while CRIU restores)    $(med rg)"
echo "    process start, flags, output, exit       $(med rps)"
echo "  criu restore -d                            $(ms_ "$mcr")"
echo "  ratio checkpoint kcr/criu dump:            $(ratio "$mk" "$mc")   (goal <= 1.15)"
echo "  ratio checkpoint kcr/(criu dump + syncfs): $(ratio "$mk" "$ms")   (goal <= 1.05)"
echo "  ratio restore kcr/criu:                    $(ratio "$mkr" "$mcr")"
if [ -n "$base" ]; then
	mb=$(median "${bc[@]}")
	mbr=$(median "${br[@]}")
	echo "  before: kcr from $base (plain go build), same rounds"
	echo "    kcr checkpoint --no-hooks --leave-running $(ms_ "$mb")"
	echo "    a bare 'kcr version' start+exit          $(med bv)"
	echo "    kcr restore                              $(ms_ "$mbr")"
	echo "    kcr checkpoint --leave-running (hooks)   $(med bw)"
	echo "      app quiesced: hooks to the dump's end  $(med bq)"
	echo "    ratio checkpoint kcr/criu dump:          $(ratio "$mb" "$mc")"
	echo "    ratio checkpoint kcr/(criu dump + syncfs): $(ratio "$mb" "$ms")"
	echo "  ratio checkpoint after/before:             $(ratio "$mk" "$mb")"
	echo "  ratio restore after/before:                $(ratio "$mkr" "$mbr")"
	echo "  ratio app quiesced after/before:           $(ratio "$(median "${hq[@]}")" "$(median "${bq[@]}")")"
fi
