#!/usr/bin/env bash
# The clones' figures in one run: the restore time of 1, 3 and 8 clones of one
# image (kcr run + kcr restore --count N); image and archive size against
# RSS; and restore time against RSS, plain and lazy (scripts/bench-lazy.sh).
# Medians over several rounds.
#
#   sudo scripts/bench-clones.sh [rounds]    (default 5)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
rounds="${1:-5}"
need_root
need_go
need_jq
scripts/install-criu.sh >/dev/null

work=$(mktemp -d /var/tmp/kcr-bench-clones.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
go build -o "$work/kcr" ./cmd/kcr
go build -o "$work/testapp" ./test/apps/testapp
export KCR_SOCKET_DIR="$work/sock"

pid=$(quiet "$work/kcr.err" "$work/kcr" run --log "$work/app.log" -- "$work/testapp")
pids+=("$pid")
wait_socket "$pid" 10
rss=$(awk '/VmRSS/{print $2}' "/proc/$pid/status")
quiet "$work/kcr.err" "$work/kcr" checkpoint -o "$work/img" "$pid"

echo "kcr restore --count N of one image (RSS $((rss / 1024)) MiB), $rounds rounds, medians"
printf '  %-8s %14s %18s %16s\n' clones "wall (ms)" "per clone (ms)" "wall/clone (ms)"
for n in 1 3 8; do
	walls=() per=()
	for _ in $(seq "$rounds"); do
		t0=$(now_ns)
		quiet "$work/kcr.err" "$work/kcr" restore --json --count "$n" "$work/img" >"$work/restore.json"
		t1=$(now_ns)
		walls+=($(((t1 - t0) / 1000)))
		# One object for one clone, an array for several.
		clones='.restores[]'
		# restore phase of each clone, in µs
		while read -r us; do per+=("$us"); done < <(jq "$clones | .phases[] | select(.name == \"restore\") | .duration_ns / 1000 | floor" "$work/restore.json")
		for p in $(jq "$clones | .pid" "$work/restore.json"); do
			pids+=("$p")
			kill -9 "$p" 2>/dev/null || true
		done
		for p in $(jq "$clones | .pid" "$work/restore.json"); do wait_until 5 "clone $p to exit" dead "$p"; done
	done
	mw=$(median "${walls[@]}"); mp=$(median "${per[@]}")
	printf '  %-8s %14.1f %18.1f %16.1f\n' "$n" "$(awk -v x="$mw" 'BEGIN{print x/1000}')" "$(awk -v x="$mp" 'BEGIN{print x/1000}')" "$(awk -v x="$mw" -v n="$n" 'BEGIN{print x/1000/n}')"
done

# Image and archive size against RSS: the test app above, and heaps of
# 64 and 256 MiB (lazyheap, dumped without hooks).
go build -o "$work/lazyheap" ./test/apps/lazyheap
echo
echo "image and archive size against RSS"
printf '  %-22s %10s %12s %14s %10s\n' program "RSS (MiB)" "image (MiB)" "archive (MiB)" "archive/RSS"
row() { # name rss_kib image
	quiet "$work/kcr.err" "$work/kcr" export "$3" -o "$3.tar.zst"
	local img arc
	img=$(du -sb --exclude=verified --exclude=restores "$3" | awk '{print $1}')
	arc=$(stat -c %s "$3.tar.zst")
	printf '  %-22s %10.1f %12.1f %14.2f %10.3f\n' "$1" "$(awk -v x="$2" 'BEGIN{print x/1024}')" "$(awk -v x="$img" 'BEGIN{print x/1048576}')" "$(awk -v x="$arc" 'BEGIN{print x/1048576}')" "$(awk -v a="$arc" -v r="$2" 'BEGIN{print a/(r*1024)}')"
}
row testapp "$rss" "$work/img"
for mb in 64 256; do
	GODEBUG=multipathtcp=0 setsid "$work/lazyheap" -mb "$mb" -portfile "$work/port$mb" </dev/null >>"$work/heap.log" 2>&1 &
	hp=$!
	disown "$hp" # the dump kills it: no "Killed" from bash
	pids+=("$hp")
	wait_until 30 "lazyheap -mb $mb to fill its heap" test -s "$work/port$mb"
	hrss=$(awk '/VmRSS/{print $2}' "/proc/$hp/status")
	quiet "$work/kcr.err" "$work/kcr" checkpoint --no-hooks -o "$work/heap$mb" "$hp"
	row "lazyheap -mb $mb" "$hrss" "$work/heap$mb"
done

echo
scripts/bench-lazy.sh 64,256,1024 "$rounds" | sed -n '/^medians/,$p'
