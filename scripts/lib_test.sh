#!/usr/bin/env bash
# Tests of scripts/lib.sh, run by .ci/run: scripts/lib_test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

failed=0
fail() {
	echo "lib_test: FAIL: $*" >&2
	failed=1
}
# check WANT COMMAND...: COMMAND prints WANT.
check() {
	local want=$1 got
	shift
	got=$("$@" 2>/dev/null) || got="(exit $?)"
	[ "$got" = "$want" ] || fail "$*: got '$got', want '$want'"
}

check 2 median 3 1 2
check 2.5 median 4 1 3 2
check 10 median 9 100 10
check 30000000.5 median 30000001 30000000
check 0.875 median 1.5 0.25
check "(exit 1)" median

# A live process, a zombie (its parent, an exec'd sleep, never reaps it) and
# a process that is gone. alive must answer, not end this set -e script, for
# a PID that no longer exists.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sleep 30 &
live=$!
sh -c 'sleep 0 & echo $! >"$0"; exec sleep 30' "$tmp/zombie" &
parent=$!
wait_until 5 "the zombie's PID" test -s "$tmp/zombie" || fail "no zombie"
zombie=$(cat "$tmp/zombie")
# shellcheck disable=SC2317 # called through wait_until
is_zombie() { [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" = Z ]; }
wait_until 5 "PID $zombie to be a zombie" is_zombie "$zombie" || fail "PID $zombie is not a zombie"
sh -c 'exit 0' &
reaped=$!
wait "$reaped"
alive "$live" || fail "alive $live (running) is false"
alive "$zombie" && fail "alive $zombie (a zombie) is true"
dead "$zombie" || fail "dead $zombie (a zombie) is false"
gone "$zombie" && fail "gone $zombie (a zombie) is true"
alive "$reaped" && fail "alive $reaped (reaped) is true"
gone "$reaped" || fail "gone $reaped (reaped) is false"
alive notapid && fail "alive notapid is true"
kill "$parent"

# wait_until and the waits built on it fail on timeout.
wait_until 1 "true" true || fail "wait_until true failed"
wait_until 0 "false" false 2>/dev/null && fail "wait_until false succeeded"
wait_gone "$live" 0 2>/dev/null && fail "wait_gone succeeded for a live process"
wait_socket "$live" 0 2>/dev/null && fail "wait_socket succeeded for a process without a control socket"
kill "$live"
wait "$live" || true
wait_socket "$live" 1 2>/dev/null && fail "wait_socket succeeded for a dead process"

# quiet shows the command's stderr only when it fails.
out=$(quiet "$tmp/err" sh -c 'echo progress >&2; echo result' 2>&1) || fail "quiet of a succeeding command failed"
[ "$out" = result ] || fail "quiet printed '$out', want 'result'"
out=$( (quiet "$tmp/err" sh -c 'echo "kcr: the reason" >&2; exit 3') 2>&1) && fail "quiet of a failing command succeeded"
[[ $out == *"kcr: the reason"* ]] || fail "quiet hid the error: '$out'"

check 1500 elapsed_us 1000000 2500000
check 0 elapsed_us 5 5
# shellcheck disable=SC2034 # read by median_ms through its nameref
odd=(3000 1000 2000) even=(1000 2000 2500 4000) one=(1234)
check 2.0 median_ms odd
check 2.25 median_ms even 2
check 1.234 median_ms one 3
check 1500 duration_us 1.5ms
check 450 duration_us 450µs
check 0.75 duration_us 0.75µs

# hook_bench_start builds and starts what the hook benches share; the
# broker is stopped here.
port=$((20000 + $$ % 10000))
hook_bench_start "$tmp" "$port"
port_open "$port" || fail "hook_bench_start: no broker on port $port"
alive "$broker" || fail "hook_bench_start: \$broker ($broker) is not alive"
kill "$broker"
wait "$broker" 2>/dev/null || true
for f in kcr kcr-hook broker kcr-criu-hook; do
	[ -x "$tmp/$f" ] || fail "hook_bench_start: no executable $f"
done
[ "$(cat "$tmp/plain.conf")" = tcp-close ] || fail "hook_bench_start: plain.conf holds '$(cat "$tmp/plain.conf")'"
grep -q "$tmp/kcr-criu-hook" "$tmp/kcr.conf" || fail "hook_bench_start: kcr.conf does not name $tmp/kcr-criu-hook"
grep -q tcp-close "$tmp/kcr.conf" || fail "hook_bench_start: kcr.conf lacks tcp-close"

[ "$failed" = 0 ] && echo "lib_test: ok"
exit "$failed"
