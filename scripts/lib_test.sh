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

# pipeline_client_args knows the four client setups, and nothing else.
check "-client franz -kgo-balancer server" pipeline_client_args franz-848
check "-client kafka-go -group-handover" pipeline_client_args kafka-go-handover
check "-client franz" pipeline_client_args franz
check "(exit 1)" pipeline_client_args sarama

# start_work's directory goes when the script passes or is interrupted,
# stays when it fails or KEEP is set; its STOP function runs in every case.
# run_work KEEP RC: a script that starts work and exits with RC (a signal
# name for an interruption); prints the directory, and "stopped" once the
# STOP function ran.
run_work() {
	bash -c '. scripts/lib.sh
		stop() { echo stopped; }
		start_work kcr-lib-test "$1" stop
		echo "$work"
		case $2 in INT | TERM) kill -s "$2" $$; sleep 5 ;; *) exit "$2" ;; esac' lib_test "$@" 2>/dev/null || true
}
for c in ":0:gone" ":INT:gone" ":TERM:gone" ":1:kept" "1:0:kept"; do
	IFS=: read -r keep rc want <<<"$c"
	out=$(run_work "$keep" "$rc")
	dir=$(head -n1 <<<"$out")
	[[ $dir == /var/tmp/kcr-lib-test.* ]] || { fail "start_work (keep '$keep', exit $rc): no work directory: '$out'"; continue; }
	[[ $out == *stopped ]] || fail "start_work (keep '$keep', exit $rc): STOP did not run: '$out'"
	got=gone
	[ -d "$dir" ] && got=kept
	[ "$got" = "$want" ] || fail "start_work (keep '$keep', exit $rc): work directory $got, want $want"
	rm -rf "$dir"
done

# stop_standby stops kcr standby, then the service its state file says runs,
# and leaves alone one the state file does not name.
mkdir -p "$tmp/img" "$tmp/img2"
sleep 30 &
sb=$!
sleep 30 &
svc=$!
sleep 30 &
other=$!
# Signalled before it execs sleep, the forked shell would run this
# script's EXIT trap.
# shellcheck disable=SC2317 # called through wait_until
is_sleep() { [ "$(cat "/proc/$1/comm" 2>/dev/null)" = sleep ]; }
for p in "$sb" "$svc" "$other"; do wait_until 5 "PID $p to exec sleep" is_sleep "$p" || fail "PID $p does not run sleep"; done
echo "{\"state\":\"running\",\"pid\":$svc}" >"$tmp/img/standby.json"
echo '{"state":"standby","image":"img-000001"}' >"$tmp/img2/standby.json"
stop_standby "$sb" "$tmp/img" "$tmp/img2" "$tmp/none"
alive "$sb" && fail "stop_standby left kcr standby (PID $sb) running"
alive "$svc" && fail "stop_standby left the running service (PID $svc) running"
alive "$other" || fail "stop_standby stopped a process no state file names"
kill "$other"
stop_standby "" "$tmp/img" || fail "stop_standby without kcr standby failed"
wait 2>/dev/null || true

# bench_cold_starts has the probe create the topics, then start the service
# through `kcr run` (its arguments intact, its PID in $work/cold.pid) and
# stop it again. A fake probe runs its -cold and -stop commands as wakeprobe
# does (sh -c); a fake kcr records its arguments and starts a sleep.
work=$tmp
mkdir -p "$tmp/cold"
cat >"$tmp/probe" <<'PROBE'
#!/usr/bin/env bash
echo "$*" >>"${0%/*}/probe.calls"
while [ $# -gt 0 ]; do
	case $1 in -cold) cold=$2 ;; -stop) stop=$2 ;; esac
	shift
done
[ -n "${cold:-}" ] || exit 0
sh -c "$cold" || exit 1
echo "started $(cat "${0%/*}/cold.pid")"
sh -c "$stop" || exit 1
echo '{"p50_ms":1}'
PROBE
cat >"$tmp/kcr" <<'KCR'
#!/usr/bin/env bash
printf '%s\n' "$@" >"${0%/*}/kcr.args"
setsid sleep 30 </dev/null >/dev/null 2>&1 &
echo $!
KCR
chmod +x "$tmp/probe" "$tmp/kcr"
bench_cold_starts "$tmp/probe" b:9 o-cold r-cold 1 t-cold "$tmp/cold" "$tmp/kcr" svc -name "two words" -n 3 ||
	fail "bench_cold_starts failed"
check "$(printf '%s\n' run --log "$tmp/cold/cold.log" -- svc -name "two words" -n 3)" cat "$tmp/kcr.args"
grep -qx -- "-brokers b:9 -create 2 -orders o-cold -results r-cold" "$tmp/probe.calls" || fail "bench_cold_starts: no -create call: $(cat "$tmp/probe.calls")"
grep -q -- "-cycles 1 .*-prefix t-cold" "$tmp/probe.calls" || fail "bench_cold_starts: no -cold call: $(cat "$tmp/probe.calls")"
pid=$(awk '/^started/{print $2}' "$tmp/cold/cold.jsonl")
[[ $pid =~ ^[0-9]+$ ]] && ! alive "$pid" || fail "bench_cold_starts: the service '$pid' was not started and stopped"
check '{"p50_ms":1}' tail -n1 "$tmp/cold/cold.jsonl"
[ -e "$tmp/cold.pid" ] && fail "bench_cold_starts left $tmp/cold.pid"
work=

# say prefixes the time since lib_t0; detail indents; fail_logs says FAIL,
# shows the tail of the non-empty logs it is given, and exits 1.
lib_t0=$(($(now_ns) - 2500000000))
[[ $(say hello) =~ ^\[\ +2\.[5-9]s\]\ hello$ ]] || fail "say printed '$(say hello)'"
check "          a" detail <<<"a"
work=$tmp
printf 'line1\nline2\n' >"$tmp/a.log"
: >"$tmp/empty.log"
out=$( (fail_logs "it broke" a.log empty.log none.log) 2>&1) && fail "fail_logs exited 0"
[[ $out == *"FAIL: it broke"*"--- last lines of a.log"*line2* ]] || fail "fail_logs printed '$out'"
[[ $out == *empty.log* ]] && fail "fail_logs showed an empty log: '$out'"
work=

[ "$failed" = 0 ] && echo "lib_test: ok"
exit "$failed"
