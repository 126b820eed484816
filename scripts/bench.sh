#!/usr/bin/env bash
# Times "kcr checkpoint" against a plain "criu dump", and "kcr restore"
# against a plain "criu restore", alternating on the same process in one run,
# and prints medians and ratios.
#
#   sudo scripts/bench.sh [rounds] [heap MiB]    (default 15 rounds, 0 MiB)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-15}"
heap_mb="${2:-0}"
[ "$(id -u)" = 0 ] || { echo "bench.sh: run as root" >&2; exit 1; }
scripts/install-criu.sh >/dev/null
criu="${KCR_CRIU:-$(command -v criu || echo /usr/local/sbin/criu)}"

work=$(mktemp -d /var/tmp/kcr-bench.XXXXXX)
trap 'kill -9 $(cat "$work"/pid 2>/dev/null) 2>/dev/null || true; rm -rf "$work"' EXIT
go build -o "$work/kcr" ./cmd/kcr
go build -o "$work/testapp" ./test/e2e/testapp

now() { date +%s%N; }
wait_gone() { for _ in $(seq 500); do [ -e "/proc/$1" ] || return 0; sleep 0.01; done; echo "PID $1 did not go away" >&2; exit 1; }
wait_socket() { for _ in $(seq 500); do ls /proc/"$1"/fd >/dev/null 2>&1 && grep -q kcr- /proc/"$1"/net/unix 2>/dev/null && return 0; sleep 0.01; done; }

GODEBUG=multipathtcp=0 KCR_SOCKET_DIR="$work/sock" setsid "$work/testapp" -heap-mb "$heap_mb" </dev/null >>"$work/app.log" 2>&1 &
pid=$!
echo "$pid" >"$work/pid"
sleep 0.5
wait_socket "$pid"
[ "$heap_mb" = 0 ] || sleep 1
rss=$(awk '/VmRSS/{print $2}' /proc/$pid/status)

declare -a kc cd cs hk kr cr fz wd
for i in $(seq "$rounds"); do
	rm -rf "$work/k" "$work/c"; mkdir -p "$work/c"
	t0=$(now); "$work/kcr" checkpoint --no-hooks --leave-running -o "$work/k" "$pid" 2>/dev/null; t1=$(now)
	"$criu" dump -t "$pid" -D "$work/c" --leave-running --file-locks -o dump.log; t2=$(now)
	sync -f "$work/c"; t3=$(now)
	kc+=($(( (t1 - t0) / 1000 ))); cd+=($(( (t2 - t1) / 1000 ))); cs+=($(( (t3 - t1) / 1000 )))
	hooks_us=$(sed -n 's/.*"name": "hooks",[^0-9]*\([0-9]*\).*/\1/p' <("$work/kcr" inspect --json --no-verify "$work/k" | tr -d '\n'))
	hk+=($(( ${hooks_us:-0} / 1000 )))
	# The app's pause: CRIU's own frozen time (freeze → resume of the tree),
	# from the manifest; what a --leave-running user feels.
	json=$("$work/kcr" inspect --json --no-verify "$work/k" | tr -d '\n ')
	frozen_us=$(sed -n 's/.*"frozen_time_us":\([0-9]*\).*/\1/p' <<<"$json")
	fz+=(${frozen_us:-0})
	dump_ns=$(sed -n 's/.*"name":"freeze+dump","duration_ns":\([0-9]*\).*/\1/p' <<<"$json")
	wd+=($(( ${dump_ns:-0} / 1000 )))

	# Restores need the PID free: kill the original (outside the timing).
	kill -9 "$pid"; wait "$pid" 2>/dev/null || true; wait_gone "$pid"
	t0=$(now); "$work/kcr" restore "$work/k" >/dev/null 2>&1; t1=$(now)
	kr+=($(( (t1 - t0) / 1000 )))
	kill -9 "$pid"; wait_gone "$pid"
	t0=$(now); "$criu" restore -D "$work/c" -d --file-locks -o restore.log; t1=$(now)
	cr+=($(( (t1 - t0) / 1000 )))
	wait_socket "$pid"
done

median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END{ if (NR%2) print a[(NR+1)/2]; else print int((a[NR/2]+a[NR/2+1])/2) }'; }
mk=$(median "${kc[@]}"); mc=$(median "${cd[@]}"); ms=$(median "${cs[@]}"); mh=$(median "${hk[@]}")
mkr=$(median "${kr[@]}"); mcr=$(median "${cr[@]}")
mfz=$(median "${fz[@]}"); mwd=$(median "${wd[@]}")
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a/b}'; }
echo "kcr bench: $rounds rounds, one process (RSS $((rss / 1024)) MiB), medians in ms"
printf '  %-34s %8.1f\n' "kcr checkpoint --no-hooks -R" "$(awk -v x="$mk" 'BEGIN{print x/1000}')"
printf '  %-34s %8.1f\n' "  of which app hooks (protocol incl.)" "$(awk -v x="$mh" 'BEGIN{print x/1000}')"
printf '  %-34s %8.1f\n' "  of which CRIU's dump request" "$(awk -v x="$mwd" 'BEGIN{print x/1000}')"
printf '  %-34s %8.1f\n' "  rest: start, preflight, image" "$(awk -v x="$((mk - mh - mwd))" 'BEGIN{print x/1000}')"
printf '  %-34s %8.1f\n' "app pause (CRIU frozen time)" "$(awk -v x="$mfz" 'BEGIN{print x/1000}')"
printf '  %-34s %8.1f\n' "criu dump --leave-running" "$(awk -v x="$mc" 'BEGIN{print x/1000}')"
printf '  %-34s %8.1f\n' "criu dump --leave-running + syncfs" "$(awk -v x="$ms" 'BEGIN{print x/1000}')"
printf '  %-34s %8.1f\n' "kcr restore" "$(awk -v x="$mkr" 'BEGIN{print x/1000}')"
printf '  %-34s %8.1f\n' "criu restore -d" "$(awk -v x="$mcr" 'BEGIN{print x/1000}')"
echo "  ratio checkpoint kcr/criu:            $(ratio "$mk" "$mc")"
echo "  ratio checkpoint (kcr - hooks)/criu:  $(ratio "$((mk - mh))" "$mc")"
echo "  ratio checkpoint (kcr - hooks)/(criu + syncfs): $(ratio "$((mk - mh))" "$ms")"
echo "  ratio restore kcr/criu:               $(ratio "$mkr" "$mcr")"
