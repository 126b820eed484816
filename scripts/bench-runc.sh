#!/usr/bin/env bash
# Checkpoint and restore times of a container with plain runc against runc
# with kcr's CRIU hook, side by side: the same service (test/apps/kafkaapp,
# static, producing to an embedded kfake broker) in three containers that
# differ only in the CRIU configuration their org.criu.config annotation
# names: "tcp-close" alone, or kcr's block (kcr install-runtime-hook
# --tcp-close) whose script runs the small kcr-hook program ("kcr"), or
# "kcr criu-hook" ("full": no kcr-hook beside that kcr). Rounds alternate
# them. Prints medians, and what the hook adds beyond its hooks' own time
# (from the "took" kcr logs in CRIU's logs).
#
#   sudo scripts/bench-runc.sh [ROUNDS]     # default 10
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
rounds=${1:-10}
port=${KCR_BENCH_PORT:-19392}
need_root
need_go
need_jq
command -v runc >/dev/null || die "no runc: run scripts/install-runc.sh"

work=$(mktemp -d /tmp/kcr-bench-runc-XXXXXX)
root="$work/runc"
cleanup() {
	for id in plain-$$ kcr-$$ full-$$; do runc --root "$root" kill "$id" KILL 2>/dev/null || true; done
	sleep 0.2
	for id in plain-$$ kcr-$$ full-$$; do runc --root "$root" delete -f "$id" 2>/dev/null || true; done
	if [ -n "${broker:-}" ]; then kill "$broker" 2>/dev/null || true; fi
	if [ -n "${KCR_BENCH_KEEP:-}" ]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT

hook_bench_start "$work" "$port"
CGO_ENABLED=0 go build -o "$work/kafkaapp" \
	./test/apps/kafkaapp
mkdir -p "$work/full" && cp "$work/kcr" "$work/full/kcr"
quiet "$work/kcr.err" "$work/full/kcr" install-runtime-hook --config "$work/full.conf" --hook "$work/full/kcr-criu-hook" --tcp-close

for mode in plain kcr full; do
	b="$work/bundle-$mode"
	mkdir -p "$b/rootfs"
	cp "$work/kafkaapp" "$b/rootfs/"
	runc spec --bundle "$b"
	# No rlimits: root here lacks CAP_SYS_RESOURCE. The host's network, to
	# reach the broker on loopback.
	jq --arg port "$port" --arg conf "$work/$mode.conf" '
		.process.terminal = false
		| .process.args = ["/kafkaapp", "-brokers", "127.0.0.1:" + $port, "-topic", "bench", "-produce-rate", "200"]
		| .process.env += ["GODEBUG=multipathtcp=0"]
		| del(.process.rlimits)
		| .root.readonly = false
		| .linux.namespaces |= map(select(.type != "network"))
		| .annotations = {"org.criu.config": $conf}' "$b/config.json" >"$b/config.json.new"
	mv "$b/config.json.new" "$b/config.json"
	# The container's output goes through a pipe: a host file would be
	# outside its mount namespace.
	(: | runc --root "$root" run -d --bundle "$b" "$mode-$$" 2>&1 | cat >>"$work/$mode.log" &)
done
running() { runc --root "$root" state "$1" 2>/dev/null | jq -e '.status == "running"' >/dev/null; }
for mode in plain kcr full; do wait_until 10 "container $mode-$$ to run" running "$mode-$$"; done
sleep 1 # let the services connect and produce

declare -a pc pr kc kr hc hr sc fc fr fhc fhr fsc
for i in $(seq 1 "$rounds"); do
	for mode in plain kcr full; do
		img="$work/img-$mode-$i"
		t0=$(now_ns)
		if ! runc --root "$root" checkpoint --image-path "$img" --work-path "$img" "$mode-$$"; then
			grep -m3 'Error' "$img/dump.log" | grep -v rlimit >&2 || true
			exit 1
		fi
		t1=$(now_ns)
		# The restored tree gets a new pipe for its output (a process
		# substitution), so that runc restore -d is timed alone.
		: | runc --root "$root" restore -d --image-path "$img" --work-path "$img" --bundle "$work/bundle-$mode" "$mode-$$" > >(cat >>"$work/$mode.log") 2>&1
		t2=$(now_ns)
		if [ "$mode" = plain ]; then
			pc+=("$(elapsed_us "$t0" "$t1")")
			pr+=("$(elapsed_us "$t1" "$t2")")
		else
			if [ "$mode" = kcr ]; then
				kc+=("$(elapsed_us "$t0" "$t1")")
				kr+=("$(elapsed_us "$t1" "$t2")")
			else
				fc+=("$(elapsed_us "$t0" "$t1")")
				fr+=("$(elapsed_us "$t1" "$t2")")
			fi
			hook=$(grep -o 'pre-dump: before-checkpoint hooks done.*took=[0-9.]*[mµ]s' "$img/dump.log" | sed 's/.*took=//')
			after=$(grep -o 'post-resume: restored.*took=[0-9.]*[mµ]s' "$img/restore.log" | sed 's/.*took=//')
			# The script's own time in CRIU's log: from CRIU starting it to
			# CRIU's next line.
			script=$(awk '/Running pre-dump scripts/ {p=1} p && /kcr-criu-hook\]/ {s=substr($1,2)+0; n=1; next} n && /^\(/ {printf "%.3fms", (substr($1,2)+0-s)*1000; exit}' "$img/dump.log")
			{ [ -n "$hook" ] && [ -n "$after" ]; } || die "no kcr hook timings in $img's CRIU logs: is the hook configured?"
			if [ "$mode" = kcr ]; then
				hc+=("$(duration_us "$hook")")
				hr+=("$(duration_us "$after")")
				[ -z "$script" ] || sc+=("$(duration_us "$script")")
			else
				fhc+=("$(duration_us "$hook")")
				fhr+=("$(duration_us "$after")")
				[ -z "$script" ] || fsc+=("$(duration_us "$script")")
			fi
		fi
		sleep 0.5 # let the service produce between cycles
	done
done

row() { # label plain kcr hooks
	local a b h
	a=$(median_ms "$2") b=$(median_ms "$3") h=$(median_ms "$4")
	printf '%-36s %11s %11s %8.1f %8s %14.1f\n' "$1" "$a" "$b" "$(awk -v a="$a" -v b="$b" 'BEGIN { print b - a }')" "$h" "$(awk -v a="$a" -v b="$b" -v h="$h" 'BEGIN { print b - a - h }')"
}
echo "${#pc[@]} rounds; medians in ms"
printf '%-36s %11s %11s %8s %8s %14s\n' "" "runc alone" "runc + kcr" added hooks "added - hooks"
row "checkpoint, kcr-hook" pc kc hc
row "restore (to running), kcr-hook" pr kr hr
row "checkpoint, kcr criu-hook" pc fc fhc
row "restore (to running), kcr criu-hook" pr fr fhr
script_line() { # label scripts hooks
	local -n scripts=$2
	[ "${#scripts[@]}" -gt 0 ] || return 0
	local s h
	s=$(median_ms "$2") h=$(median_ms "$3")
	echo "pre-dump script in CRIU's log, $1: $s ms, of which the app's hooks $h ms: kcr adds $(awk -v s="$s" -v h="$h" 'BEGIN { printf "%.1f", s - h }') ms"
}
script_line kcr-hook sc hc
script_line "kcr criu-hook" fsc fhc
