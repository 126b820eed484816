#!/usr/bin/env bash
# Restore time of 1, 3 and 8 clones of one image (kcr run + kcr restore
# --count N), medians over several rounds in one run.
#
#   sudo scripts/bench-clones.sh [rounds]    (default 5)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-5}"
[ "$(id -u)" = 0 ] || { echo "bench-clones.sh: run as root" >&2; exit 1; }
scripts/install-criu.sh >/dev/null

work=$(mktemp -d /var/tmp/kcr-bench-clones.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
go build -o "$work/kcr" ./cmd/kcr
go build -o "$work/testapp" ./test/e2e/testapp
export KCR_SOCKET_DIR="$work/sock"

pid=$("$work/kcr" run --log "$work/app.log" -- "$work/testapp" 2>/dev/null)
pids+=("$pid")
sleep 0.5
rss=$(awk '/VmRSS/{print $2}' "/proc/$pid/status")
"$work/kcr" checkpoint -o "$work/img" "$pid" 2>/dev/null

median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END{ if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2 }'; }
now() { date +%s%N; }

echo "kcr restore --count N of one image (RSS $((rss / 1024)) MiB), $rounds rounds, medians"
printf '  %-8s %14s %18s %16s\n' clones "wall (ms)" "per clone (ms)" "wall/clone (ms)"
for n in 1 3 8; do
	walls=() per=()
	for _ in $(seq "$rounds"); do
		t0=$(now)
		out=$("$work/kcr" restore --json --count "$n" "$work/img" 2>/dev/null)
		t1=$(now)
		walls+=($(( (t1 - t0) / 1000 )))
		# restore phase of each clone, in µs
		while read -r ns; do per+=($(( ns / 1000 ))); done < <(printf '%s' "$out" | tr -d '\n ' | grep -o '"name":"restore","duration_ns":[0-9]*' | grep -o '[0-9]*$')
		for p in $(printf '%s' "$out" | tr -d '\n ' | grep -o '"pid":[0-9]*' | grep -o '[0-9]*'); do kill -9 "$p" 2>/dev/null || true; done
		sleep 0.3
	done
	mw=$(median "${walls[@]}"); mp=$(median "${per[@]}")
	printf '  %-8s %14.1f %18.1f %16.1f\n' "$n" "$(awk -v x="$mw" 'BEGIN{print x/1000}')" "$(awk -v x="$mp" 'BEGIN{print x/1000}')" "$(awk -v x="$mw" -v n="$n" 'BEGIN{print x/1000/n}')"
done
