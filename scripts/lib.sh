# Helpers shared by kcr's scripts. Sourced, never run:
#
#   . "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
# The caller sets `set -euo pipefail` itself. Messages go to stderr and are
# prefixed with the calling script's name.
# shellcheck shell=bash

lib_script=${0##*/}

# die MESSAGE...: print one line and exit 1.
die() {
	echo "$lib_script: $*" >&2
	exit 1
}

# need_root: exit unless run as root (CRIU needs it).
need_root() {
	[ "$(id -u)" = 0 ] || die "run as root: CRIU needs it (sudo $0)"
}

# need_go: exit unless the Go toolchain is on PATH.
need_go() {
	command -v go >/dev/null 2>&1 || die "the Go toolchain is needed (https://go.dev/dl/): go not found on PATH"
}

# need_pkg COMMAND PACKAGE: make COMMAND available, installing the Debian
# PACKAGE (without its recommends) when it is missing; exit with the way to
# install it by hand when that cannot be done here.
need_pkg() {
	command -v "$1" >/dev/null 2>&1 && return 0
	[ "$(id -u)" = 0 ] || die "$1 not found: install it (Debian: sudo apt-get install $2)"
	command -v apt-get >/dev/null 2>&1 || die "$1 not found and no apt-get: install $2 with your package manager"
	echo "$lib_script: installing $2 (apt-get)" >&2
	{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$2"; } >/dev/null ||
		die "apt-get install $2 failed: install it by hand (apt-get install $2)"
	command -v "$1" >/dev/null 2>&1 || die "$2 is installed but $1 is not on PATH"
}

# need_jq: the scripts read kcr's --json output with jq.
need_jq() { need_pkg jq jq; }

# now_ns, now_ms: wall-clock time in nanoseconds and milliseconds.
now_ns() { date +%s%N; }
now_ms() { echo $(($(now_ns) / 1000000)); }

# median NUMBER...: the median of the arguments; the mean of the two middle
# values for an even count. Fails when given none.
median() {
	[ $# -gt 0 ] || { echo "$lib_script: median of no values" >&2; return 1; }
	printf '%s\n' "$@" | sort -g | awk '{a[NR] = $1} END {
		printf "%.15g\n", (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2
	}'
}

# elapsed_us T0 T1: the microseconds from T0 to T1, both in nanoseconds
# (now_ns).
elapsed_us() { echo $((($2 - $1) / 1000)); }

# median_ms NAME [DECIMALS]: the median of the bash array NAME, in µs,
# printed in ms with DECIMALS decimals (default 1).
median_ms() {
	local -n median_ms_a=$1
	awk -v x="$(median "${median_ms_a[@]}")" -v d="${2:-1}" 'BEGIN { printf "%.*f", d, x / 1000 }'
}

# duration_us DURATION: a Go duration in ms or µs, as kcr logs it
# ("took=1.5ms"), in µs.
duration_us() {
	awk -v s="$1" 'BEGIN { if (sub(/ms$/, "", s)) print s * 1000; else { sub(/µs$/, "", s); print s + 0 } }'
}

# alive PID: the process exists and is not a zombie.
alive() {
	local s
	[[ $1 =~ ^[0-9]+$ ]] || return 1
	# read, not $(<file): under set -e bash 5.2 exits on the latter's failed
	# redirection even when it is guarded with ||.
	read -r s 2>/dev/null <"/proc/$1/stat" || return 1
	s=${s##*) }
	[[ ${s:0:1} != Z ]]
}

# dead PID: the process has exited (it may still be a zombie).
dead() { ! alive "$1"; }

# wait_until SECONDS WHAT COMMAND [ARG...]: run COMMAND every 10 ms until it
# succeeds; after SECONDS, print that WHAT did not happen and fail.
wait_until() {
	local secs=$1 what=$2 i
	shift 2
	for ((i = 0; i < secs * 100; i++)); do
		"$@" && return 0
		sleep 0.01
	done
	echo "$lib_script: timed out after ${secs}s waiting for $what" >&2
	return 1
}

# wait_gone PID [SECONDS]: wait until the process is gone, reaped and not
# just a zombie (CRIU restores at the same PID); fails after SECONDS
# (default 5).
wait_gone() { wait_until "${2:-5}" "PID $1 to go away" gone "$1"; }
gone() { [ ! -e "/proc/$1" ]; }

# has_kcr_socket PID: the process holds a Unix socket bound to a kcr control
# socket path (its own, not another process's in the same namespace).
has_kcr_socket() {
	local inodes
	inodes=$(find "/proc/$1/fd" -lname 'socket:*' -printf '%l\n' 2>/dev/null | tr -dc '0-9\n') || return 1
	[ -n "$inodes" ] || return 1
	# /proc/net/unix: Num RefCount Protocol Flags Type St Inode Path
	awk -v inodes="$inodes" 'BEGIN { n = split(inodes, a, "\n"); for (i = 1; i <= n; i++) own[a[i]] = 1 }
		$8 ~ /\/kcr-[^\/]*\.sock$/ && ($7 in own) { found = 1 } END { exit !found }' "/proc/$1/net/unix"
}

# wait_socket PID [SECONDS]: wait until the process serves its kcr control
# socket; fails after SECONDS (default 5), or at once if it dies.
wait_socket() { wait_until "${2:-5}" "PID $1 to serve its kcr control socket" socket_or_dead "$1" && alive "$1"; }
socket_or_dead() { has_kcr_socket "$1" || { dead "$1" && echo "$lib_script: PID $1 died before serving its kcr control socket" >&2; }; }

# port_open PORT [HOST]: something accepts TCP connections on HOST:PORT
# (HOST defaults to 127.0.0.1).
port_open() { (exec 3<>"/dev/tcp/${2:-127.0.0.1}/$1") 2>/dev/null; }

# quiet LOG COMMAND [ARG...]: run COMMAND with its stderr in the file LOG, so
# that a table is not interleaved with progress lines; on failure print LOG
# (kcr's one-line error is in it) and exit with the command's status.
quiet() {
	local log=$1 rc=0
	shift
	"$@" 2>"$log" || rc=$?
	if [ "$rc" != 0 ]; then
		echo "$lib_script: $* failed (exit $rc):" >&2
		cat "$log" >&2
		exit "$rc"
	fi
}

# hook_bench_start WORK PORT: the start of the benches of kcr's CRIU hook
# in a container runtime (bench-runc.sh, bench-runtimes.sh): kcr, kcr-hook
# and the kfake broker built into WORK; the broker serving topic "bench" on
# 127.0.0.1:PORT, its PID in $broker for the caller's cleanup; and the two
# CRIU configurations the containers' org.criu.config annotation names:
# WORK/plain.conf ("tcp-close" alone) and WORK/kcr.conf (kcr's block, whose
# script WORK/kcr-criu-hook runs WORK/kcr-hook). Exports GOFLAGS with
# -buildvcs=false for the caller's own builds.
hook_bench_start() {
	local work=$1 port=$2
	export GOFLAGS="${GOFLAGS:-} -buildvcs=false"
	go build -o "$work/kcr" ./cmd/kcr
	CGO_ENABLED=0 go build -o "$work/kcr-hook" ./cmd/kcr-hook
	go build -o "$work/broker" ./examples/broker
	"$work/broker" -addr "127.0.0.1:$port" -topics bench:1 >"$work/broker.log" 2>&1 &
	broker=$!
	wait_until 10 "the broker to start" port_open "$port" || die "the broker did not start: $(tail -3 "$work/broker.log")"
	printf 'tcp-close\n' >"$work/plain.conf"
	quiet "$work/kcr.err" "$work/kcr" install-runtime-hook --config "$work/kcr.conf" --hook "$work/kcr-criu-hook" --tcp-close
	grep -q "exec '$work/kcr-hook'" "$work/kcr-criu-hook" || die "the installed script does not run $work/kcr-hook"
}

# --- kcr standby's scripts (demo-standby.sh, bench-standby.sh, standby-runc.sh)

# need_build_run: what a script that builds kcr and runs it needs: root
# (CRIU), Go and jq.
need_build_run() {
	need_root
	need_go
	need_jq
}

# build_bins DIR PKG...: build each of the module's packages PKG (a main
# package's path, such as cmd/kcr) into DIR, named after its last element.
build_bins() {
	local dir=$1 p
	shift
	mkdir -p "$dir"
	for p; do
		GOFLAGS=-buildvcs=false go build -o "$dir/$(basename "$p")" "./$p"
	done
}

# tcp_ask PORT LINE: send LINE to 127.0.0.1:PORT and print the answer's
# first line (test/apps/lazyheap's protocol); fails if nothing listens.
tcp_ask() {
	local l
	{ exec 3<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null || return 1
	echo "$2" >&3
	read -r l <&3 || true
	exec 3<&-
	echo "$l"
}

# start_work NAME KEEP [STOP]: make a new work directory /var/tmp/NAME.XXXXXX
# in $work, and at exit (also on SIGINT or SIGTERM, as 130 and 143) run the
# function STOP, to stop what the script started, and then finish_work.
start_work() {
	work=$(mktemp -d "/var/tmp/$1.XXXXXX")
	lib_keep=$2 lib_stop=${3:-true}
	trap lib_exit EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
}
lib_exit() {
	local rc=$?
	trap - EXIT INT TERM
	"$lib_stop" || true
	finish_work "$rc" "$lib_keep"
	exit "$rc"
}

# finish_work RC KEEP: remove the work directory $work when the script
# passed or was interrupted (RC 0, 130, 143) and KEEP is empty; otherwise
# (it failed: its logs are there) say where it is kept.
finish_work() {
	[ -n "${work:-}" ] && [ -d "$work" ] || return 0
	if [[ $1 =~ ^(0|130|143)$ ]] && [ -z "$2" ]; then
		rm -rf "$work"
	else
		echo "$lib_script: work directory kept: $work" >&2
	fi
}

# pipeline_client_args SETUP: examples/pipeline's flags for a client setup:
# franz (franz-go, classic group), franz-848 (franz-go, KIP-848 group:
# kgo.ServerSideBalancer), kafka-go, kafka-go-handover
# (kafkahooks.WithGroupHandover).
pipeline_client_args() {
	case "$1" in
	franz | kafka-go) echo "-client $1" ;;
	franz-848) echo "-client franz -kgo-balancer server" ;;
	kafka-go-handover) echo "-client kafka-go -group-handover" ;;
	*)
		echo "$lib_script: unknown client setup '$1' (franz, franz-848, kafka-go, kafka-go-handover)" >&2
		return 1
		;;
	esac
}

# stop_standby PID DIR...: stop kcr standby (PID; may be empty or gone) and
# then the service it leaves running, as each image directory DIR's state
# file names it: SIGTERM, SIGKILL after 10 s.
stop_standby() {
	local sb=$1 d p pids=()
	shift
	if alive "$sb"; then
		kill -TERM "$sb" 2>/dev/null || true
		wait_until 10 "kcr standby (PID $sb) to stop" dead "$sb" || kill -KILL "$sb" 2>/dev/null || true
	fi
	for d; do
		[ -e "$d/standby.json" ] || continue
		p=$(jq -r 'select(.state == "running") | .pid // empty' "$d/standby.json" 2>/dev/null) || continue
		alive "$p" && pids+=("$p") && kill -TERM "$p" 2>/dev/null || true
	done
	for p in "${pids[@]}"; do
		wait_until 10 "the service (PID $p) to stop" dead "$p" || kill -KILL "$p" 2>/dev/null || true
	done
}

# bench_cold_starts PROBE BROKERS ORDERS RESULTS CYCLES PREFIX RUN KCR CMD...:
# the cold-start side of the standby benchmarks (bench-standby.sh,
# bench-standby-replicas.sh). wakeprobe (PROBE) creates the topics ORDERS
# and RESULTS on BROKERS (topics of their own: a cold service must not start
# with the standby runs' orders), then for each of CYCLES cycles produces
# one order (ids PREFIX-…), starts the service cold with
# `KCR run --log RUN/cold.log -- CMD...` (its PID in $work/cold.pid, for the
# script's stop function), times the order's result and stops the service.
# wakeprobe's JSON lines go to RUN/cold.jsonl, its summary last.
bench_cold_starts() {
	local probe=$1 brokers=$2 orders=$3 results=$4 cycles=$5 prefix=$6 run=$7 kcr=$8 pidfile cold stop
	shift 8
	pidfile=$(printf '%q' "$work/cold.pid")
	"$probe" -brokers "$brokers" -create 2 -orders "$orders" -results "$results" || return 1
	cold="$(printf '%q ' "$kcr" run --log "$run/cold.log" -- "$@")> $pidfile"
	stop="p=\$(cat $pidfile); kill -TERM \$p; while [ -e /proc/\$p ]; do sleep 0.05; done"
	"$probe" -brokers "$brokers" -orders "$orders" -results "$results" -cycles "$cycles" -cold "$cold" -stop "$stop" \
		-prefix "$prefix" >"$run/cold.jsonl" || return 1
	rm -f "$work/cold.pid"
}

# --- the demos' output (demo.sh, demo-standby.sh)

lib_t0=$(now_ns)
# say MESSAGE: print MESSAGE after the seconds since the script began.
say() { printf '[%5.1fs] %s\n' "$(awk -v a="$(now_ns)" -v b="$lib_t0" 'BEGIN{print (a-b)/1e9}')" "$*"; }
# detail: stdin, indented under say's lines.
detail() { sed 's/^/          /'; }
# fail_logs MESSAGE LOG...: say FAIL: MESSAGE, print the last lines of each
# LOG (a file in $work) that is not empty, and exit 1.
fail_logs() {
	local f
	say "FAIL: $1"
	shift
	for f; do
		[ -s "$work/$f" ] && { echo "--- last lines of $f"; tail -n 8 "$work/$f"; }
	done
	exit 1
}

# kube_module V STAGING: makes the current directory a throw-away Go module
# that requires k8s.io/kubernetes@V, each of its staging modules (which its
# own go.mod replaces with directories of its tree) replaced by the
# published STAGING (v0.MINOR.PATCH). What install-kubelet.sh and
# install-kube-control-plane.sh build from.
kube_module() {
	local v=$1 staging=$2 gomod mods m
	local args=(-require "k8s.io/kubernetes@$v")
	go mod init kcr.local/kube-build >/dev/null 2>&1
	gomod=$(go mod download -json "k8s.io/kubernetes@$v" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
	[ -r "$gomod" ] || die "could not download k8s.io/kubernetes@$v from the Go module proxy"
	mods=$(sed -n 's#^\t\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\1#p' "$gomod")
	[ -n "$mods" ] || die "k8s.io/kubernetes@$v's go.mod has no staging replaces: kcr's scripts do not know how to build it"
	for m in $mods; do args+=(-replace "$m=$m@$staging"); done
	go mod edit "${args[@]}"
}
