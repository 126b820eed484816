#!/usr/bin/env bash
# Times "kcr checkpoint" against a plain "criu dump", and "kcr restore"
# against a plain "criu restore", alternating on the same process in one run,
# and prints medians and ratios.
#
#   sudo scripts/bench.sh [rounds] [heap MiB]    (default 15 rounds, 0 MiB)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
rounds="${1:-15}"
heap_mb="${2:-0}"
need_root
need_go
need_jq
scripts/install-criu.sh >/dev/null
criu="${KCR_CRIU:-$(command -v criu || echo /usr/local/sbin/criu)}"

work=$(mktemp -d /var/tmp/kcr-bench.XXXXXX)
trap 'kill -9 $(cat "$work"/pid 2>/dev/null) 2>/dev/null || true; rm -rf "$work"' EXIT
go build -o "$work/kcr" ./cmd/kcr
go build -o "$work/testapp" ./test/e2e/testapp

GODEBUG=multipathtcp=0 KCR_SOCKET_DIR="$work/sock" setsid "$work/testapp" -heap-mb "$heap_mb" </dev/null >>"$work/app.log" 2>&1 &
pid=$!
echo "$pid" >"$work/pid"
wait_socket "$pid" 10
[ "$heap_mb" = 0 ] || sleep 1
rss=$(awk '/VmRSS/{print $2}' "/proc/$pid/status")

declare -a kc cd cs kr cr fz pp dm wd iw ce rs vs
# phase NAME: that phase of the last "kcr checkpoint --json", in µs.
phase() { jq --arg n "$1" '[.phases[] | select(.name == $n) | .duration_ns][0] // 0 | . / 1000 | floor' "$work/k.json"; }
for _ in $(seq "$rounds"); do
	rm -rf "$work/k" "$work/c"
	mkdir -p "$work/c"
	t0=$(now_ns)
	quiet "$work/kcr.err" "$work/kcr" checkpoint --json --no-hooks --leave-running -o "$work/k" "$pid" >"$work/k.json"
	t1=$(now_ns)
	"$criu" dump -t "$pid" -D "$work/c" --leave-running --file-locks -o dump.log
	t2=$(now_ns)
	sync -f "$work/c"
	t3=$(now_ns)
	# A kcr start and exit alone: the Go runtime, cobra, the dynamic loader.
	t4=$(now_ns)
	"$work/kcr" version >/dev/null
	t5=$(now_ns)
	kc+=($(((t1 - t0) / 1000)))
	cd+=($(((t2 - t1) / 1000)))
	cs+=($(((t3 - t1) / 1000)))
	vs+=($(((t5 - t4) / 1000)))
	# The app's pause: CRIU's own frozen time (freeze → resume of the tree),
	# from the manifest; what a --leave-running user feels.
	fz+=("$(jq '.manifest.criu_stats.frozen_time_us // 0' "$work/k.json")")
	pp+=("$(phase prepare)")
	dm+=("$(phase "draft manifest")")
	wd+=("$(phase "freeze+dump")")
	iw+=("$(phase "image write")")
	ce+=("$(phase "criu exit")")
	rs+=($(((t1 - t0) / 1000 - $(phase total))))

	# Restores need the PID free: kill the original (outside the timing).
	kill -9 "$pid"
	wait "$pid" 2>/dev/null || true
	wait_gone "$pid"
	t0=$(now_ns)
	quiet "$work/kcr.err" "$work/kcr" restore "$work/k" >/dev/null
	t1=$(now_ns)
	kr+=($(((t1 - t0) / 1000)))
	kill -9 "$pid"
	wait_gone "$pid"
	t0=$(now_ns)
	"$criu" restore -D "$work/c" -d --file-locks -o restore.log
	t1=$(now_ns)
	cr+=($(((t1 - t0) / 1000)))
	wait_socket "$pid"
done

ms_() { awk -v x="$1" 'BEGIN{printf "%8.1f", x/1000}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a/b}'; }
mk=$(median "${kc[@]}")
mc=$(median "${cd[@]}")
ms=$(median "${cs[@]}")
mkr=$(median "${kr[@]}")
mcr=$(median "${cr[@]}")
echo "kcr bench: $rounds rounds, one process (RSS $((rss / 1024)) MiB), medians in ms"
echo "  kcr checkpoint --no-hooks --leave-running  $(ms_ "$mk")"
echo "    prepare (process, CRIU start+version, preflight, socket, image dir) $(ms_ "$(median "${pp[@]}")")"
echo "    draft manifest (for kcr recover)         $(ms_ "$(median "${dm[@]}")")"
echo "    CRIU's dump request (swrk)               $(ms_ "$(median "${wd[@]}")")"
echo "    image write (hash, syncfs, publish)      $(ms_ "$(median "${iw[@]}")")"
echo "    CRIU's exit, left after the image write  $(ms_ "$(median "${ce[@]}")")"
echo "    process start, flags, output, exit       $(ms_ "$(median "${rs[@]}")")"
echo "    (a bare 'kcr version' start+exit)        $(ms_ "$(median "${vs[@]}")")"
echo "    (phase medians need not add up to the wall-time median)"
echo "  app pause (CRIU frozen time)               $(ms_ "$(median "${fz[@]}")")"
echo "  criu dump --leave-running                  $(ms_ "$mc")"
echo "  criu dump --leave-running + syncfs         $(ms_ "$ms")"
echo "  kcr restore                                $(ms_ "$mkr")"
echo "  criu restore -d                            $(ms_ "$mcr")"
echo "  ratio checkpoint kcr/criu dump:            $(ratio "$mk" "$mc")   (goal <= 1.15)"
echo "  ratio checkpoint kcr/(criu dump + syncfs): $(ratio "$mk" "$ms")   (goal <= 1.05)"
echo "  ratio restore kcr/criu:                    $(ratio "$mkr" "$mcr")"
