#!/usr/bin/env bash
# What kcr's CRIU action script costs at pre-dump, while CRIU waits before it
# freezes the tree, piece by piece and side by side for two builds: BASE (a
# git revision, default main) and this worktree. The same service
# (test/apps/kafkaapp with a kcr socket, producing to an embedded kfake
# broker) runs on the host; the script is called as CRIU calls it, with
# CRTOOLS_SCRIPT_ACTION and CRTOOLS_INIT_PID, but without CRIU: it runs in a
# sh that exits after it, so the resume watcher finds its "CRIU" gone and
# resumes the app. Times are bash's $EPOCHREALTIME around each command (no
# fork for the clock); "spawn /bin/true" is the cost of a spawn itself.
# Rounds alternate the variants. Prints medians.
#
#   scripts/bench-hook.sh [ROUNDS] [BASE]     # default 21 main
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
rounds=${1:-21}
base=${2:-main}
port=${KCR_BENCH_PORT:-19493}
need_go

work=$(mktemp -d /tmp/kcr-bench-hook-XXXXXX)
cleanup() {
	if [ -n "${sleeper:-}" ]; then kill "$sleeper" 2>/dev/null || true; fi
	if [ -n "${app:-}" ]; then kill "$app" 2>/dev/null || true; fi
	if [ -n "${broker:-}" ]; then kill "$broker" 2>/dev/null || true; fi
	if [ -n "${KCR_BENCH_KEEP:-}" ]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT

export GOFLAGS="${GOFLAGS:-} -buildvcs=false"
mkdir -p "$work/base/src" "$work/head" "$work/sock" "$work/state"
git archive "$base" | tar -x -C "$work/base/src"
(cd "$work/base/src" && go build -o "$work/base/kcr" ./cmd/kcr &&
	if [ -d cmd/kcr-hook ]; then CGO_ENABLED=0 go build -o "$work/base/kcr-hook" ./cmd/kcr-hook; fi)
go build -o "$work/head/kcr" ./cmd/kcr
CGO_ENABLED=0 go build -o "$work/head/kcr-hook" ./cmd/kcr-hook
go build -o "$work/broker" ./examples/broker
go build -o "$work/kafkaapp" ./test/apps/kafkaapp
for b in base head; do
	quiet "$work/kcr.err" "$work/$b/kcr" install-runtime-hook --config "$work/$b.conf" --hook "$work/$b/kcr-criu-hook"
done

"$work/broker" -addr "127.0.0.1:$port" -topics bench:1 >"$work/broker.log" 2>&1 &
broker=$!
wait_until 10 "the broker to start" port_open "$port"
KCR_SOCKET_DIR="$work/sock" GODEBUG=multipathtcp=0 setsid "$work/kafkaapp" -brokers "127.0.0.1:$port" -topic bench -produce-rate 200 </dev/null >"$work/app.log" 2>&1 &
app=$!
wait_until 10 "the app's control socket" test -S "$work/sock/kcr-$app.sock"
sleep 1 # let it connect and produce
sleep 3600 &
sleeper=$! # a tree without a kcr socket

export KCR_HOOK_STATE_DIR="$work/state"
# prog B: what B's script starts at pre-dump, made to exit at once.
prog() {
	local run
	run=$(sed -n "s/^pre-dump|post-resume) exec \(.*\) ;;$/\1/p" "$work/$1/kcr-criu-hook" | tr -d "'")
	case $run in
	*" criu-hook") echo "${run% criu-hook} version" ;;
	*) echo "$run" ;; # kcr-hook without CRIU's environment: a usage error
	esac
}
# t NAME COMMAND...: run COMMAND once, stderr to a file as CRIU's log (the
# watcher keeps it open), and append the µs it took to the array NAME.
t() {
	local -n acc=$1
	shift
	local s e
	s=${EPOCHREALTIME/./}
	"$@" >/dev/null 2>"$work/err.log" || true
	e=${EPOCHREALTIME/./}
	acc+=($((e - s)))
}
# hooks B: the app's hooks' time in B's last pre-dump, from its log, in µs.
hooks() {
	local d
	d=$(grep -o 'hooks done.*took=[0-9.]*[mµ]s' "$work/err.log" | sed 's/.*took=//') || die "no hooks in $1's pre-dump log: $(tail -3 "$work/err.log")"
	duration_us "$d"
}
# shellcheck disable=SC2034 # filled through namerefs (t, hooks)
declare -a spawn=() shc=() shw=()
# shellcheck disable=SC2034
declare -a base_noop=() base_go=() base_nosock=() base_app=() base_hooks=()
# shellcheck disable=SC2034
declare -a head_noop=() head_go=() head_nosock=() head_app=() head_hooks=()
for _ in $(seq 1 "$rounds"); do
	t spawn /bin/true
	t shc /bin/sh -c :
	t shw /bin/sh -c '/bin/true; :'
	for b in base head; do
		# shellcheck disable=SC2046 # prog prints a command line
		t "${b}_go" $(prog "$b")
		t "${b}_noop" env CRTOOLS_SCRIPT_ACTION=post-dump CRTOOLS_INIT_PID="$app" "$work/$b/kcr-criu-hook"
		t "${b}_nosock" env CRTOOLS_SCRIPT_ACTION=pre-dump CRTOOLS_INIT_PID="$sleeper" "$work/$b/kcr-criu-hook"
		t "${b}_app" env CRTOOLS_SCRIPT_ACTION=pre-dump CRTOOLS_INIT_PID="$app" /bin/sh -c "$work/$b/kcr-criu-hook; :"
		declare -n hk="${b}_hooks"
		hk+=("$(hooks "$b")")
		sleep 0.3 # the watcher resumes the app
	done
done

med() { median_ms "$1" 2; } # NAME: the median of the array NAME, in ms
echo "$rounds rounds; medians in ms"
printf '  %-44s %7s\n' "spawn /bin/true" "$(med spawn)" "sh -c :" "$(med shc)" "sh -c '/bin/true; :'" "$(med shw)"
for b in base head; do
	name=$base
	[ "$b" = head ] && name="this tree"
	printf '  %-44s %7s\n' "$name: script at a no-op stage" "$(med "${b}_noop")" \
		"$name: Go start of $(prog "$b" | awk '{print $1}' | xargs basename)" "$(med "${b}_go")" \
		"$name: pre-dump, no socket in the tree" "$(med "${b}_nosock")" \
		"$name: pre-dump with the app (in sh)" "$(med "${b}_app")"
done
for b in base head; do
	name=$base
	[ "$b" = head ] && name="this tree"
	total=$(awk -v a="$(med "${b}_app")" -v w="$(med shw)" -v s="$(med spawn)" 'BEGIN { printf "%.2f", a - w + s }')
	h=$(med "${b}_hooks")
	added=$(awk -v t="$total" -v h="$h" 'BEGIN { printf "%.2f", t - h }')
	printf '%10s: pre-dump with the app %6s, of which the app'"'"'s hooks %5s: the script adds %6s\n' "$name" "$total" "$h" "$added"
	if [ "$b" = base ]; then added_base=$added; else added_head=$added; fi
done
awk -v b="$added_base" -v h="$added_head" 'BEGIN { printf "added by the script: %.2f -> %.2f ms (%+.2f ms, %.2fx)\n", b, h, h - b, h / b }'
