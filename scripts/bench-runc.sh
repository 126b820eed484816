#!/usr/bin/env bash
# Checkpoint and restore times of a container with plain runc against runc
# with kcr's CRIU hook, side by side: the same service (test/e2e/kafkaapp,
# static, producing to an embedded kfake broker) in two containers that
# differ only in the CRIU configuration their org.criu.config annotation
# names: "tcp-close" alone, or kcr's block (kcr install-runtime-hook
# --tcp-close). Rounds alternate the two. Prints medians, and what the hook
# adds beyond its hooks' own time (from the "took" kcr logs in CRIU's logs).
#
#   sudo scripts/bench-runc.sh [ROUNDS]     # default 10
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-10}
port=${KCR_BENCH_PORT:-19392}
[ "$(id -u)" = 0 ] || { echo "bench-runc.sh: run as root" >&2; exit 1; }
command -v runc >/dev/null || { echo "bench-runc.sh: no runc (scripts/install-runc.sh)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "bench-runc.sh: needs python3 to edit config.json" >&2; exit 1; }

work=$(mktemp -d /tmp/kcr-bench-runc-XXXXXX)
root="$work/runc"
cleanup() {
	for id in plain-$$ kcr-$$; do runc --root "$root" kill "$id" KILL 2>/dev/null || true; done
	sleep 0.2
	for id in plain-$$ kcr-$$; do runc --root "$root" delete -f "$id" 2>/dev/null || true; done
	[ -n "${broker:-}" ] && kill "$broker" 2>/dev/null || true
	[ -n "${KCR_BENCH_KEEP:-}" ] && echo "kept $work" >&2 || rm -rf "$work"
}
trap cleanup EXIT

export GOFLAGS="${GOFLAGS:-} -buildvcs=false"
go build -o "$work/kcr" ./cmd/kcr
go build -o "$work/broker" ./examples/broker
CGO_ENABLED=0 go build -o "$work/kafkaapp" ./test/e2e/kafkaapp
"$work/broker" -addr "127.0.0.1:$port" -topics bench:1 >"$work/broker.log" 2>&1 &
broker=$!
sleep 0.5

printf 'tcp-close\n' >"$work/plain.conf"
"$work/kcr" install-runtime-hook --config "$work/kcr.conf" --hook "$work/kcr-criu-hook" --tcp-close 2>/dev/null

for mode in plain kcr; do
	b="$work/bundle-$mode"
	mkdir -p "$b/rootfs"
	cp "$work/kafkaapp" "$b/rootfs/"
	runc spec --bundle "$b"
	python3 - "$b/config.json" "$port" "$work/$mode.conf" <<'PY'
import json, sys
p, port, conf = sys.argv[1:]
c = json.load(open(p))
c["process"].update(terminal=False, args=["/kafkaapp", "-brokers", "127.0.0.1:" + port, "-topic", "bench", "-produce-rate", "200"])
c["process"]["env"].append("GODEBUG=multipathtcp=0")
c["process"].pop("rlimits", None)
c["root"]["readonly"] = False
c["linux"]["namespaces"] = [n for n in c["linux"]["namespaces"] if n["type"] != "network"]
c["annotations"] = {"org.criu.config": conf}
json.dump(c, open(p, "w"))
PY
	# The container's output goes through a pipe: a host file would be
	# outside its mount namespace.
	(: | runc --root "$root" run -d --bundle "$b" "$mode-$$" 2>&1 | cat >>"$work/$mode.log" &)
done
sleep 2

ms() { echo $(( ($2 - $1) / 1000 )); } # µs
for i in $(seq 1 "$rounds"); do
	for mode in plain kcr; do
		img="$work/img-$mode-$i"
		t0=$(date +%s%N)
		if ! runc --root "$root" checkpoint --image-path "$img" --work-path "$img" "$mode-$$"; then
			grep -m3 'Error' "$img/dump.log" | grep -v rlimit >&2 || true
			exit 1
		fi
		t1=$(date +%s%N)
		# The restored tree gets a new pipe for its output (a process
		# substitution), so that runc restore -d is timed alone.
		: | runc --root "$root" restore -d --image-path "$img" --work-path "$img" --bundle "$work/bundle-$mode" "$mode-$$" > >(cat >>"$work/$mode.log") 2>&1
		t2=$(date +%s%N)
		echo "$mode $(ms "$t0" "$t1") $(ms "$t1" "$t2")" >>"$work/times"
		if [ "$mode" = kcr ]; then
			hook=$(grep -o 'pre-dump: before-checkpoint hooks done.*took=[0-9.]*[mµ]s' "$img/dump.log" | sed 's/.*took=//')
			after=$(grep -o 'post-resume: restored.*took=[0-9.]*[mµ]s' "$img/restore.log" | sed 's/.*took=//')
			# The script's own time in CRIU's log: from CRIU starting it to
			# CRIU's next line.
			script=$(awk '/Running pre-dump scripts/ {p=1} p && /kcr-criu-hook\]/ {s=substr($1,2)+0; n=1; next} n && /^\(/ {printf "%.3fms", (substr($1,2)+0-s)*1000; exit}' "$img/dump.log")
			echo "hooks $hook $after $script" >>"$work/times"
		fi
		sleep 0.5 # let the service produce between cycles
	done
done

python3 - "$work/times" <<'PY'
import statistics, sys
def us(s):
    return float(s[:-2]) * (1000 if s.endswith("ms") else 1)
rows = [l.split() for l in open(sys.argv[1])]
med = lambda xs: statistics.median(xs) / 1000
pc = [int(r[1]) for r in rows if r[0] == "plain"]; pr = [int(r[2]) for r in rows if r[0] == "plain"]
kc = [int(r[1]) for r in rows if r[0] == "kcr"]; kr = [int(r[2]) for r in rows if r[0] == "kcr"]
hc = [us(r[1]) for r in rows if r[0] == "hooks"]; hr = [us(r[2]) for r in rows if r[0] == "hooks"]
print(f"{len(pc)} rounds; medians in ms")
print(f"{'':22} {'runc alone':>11} {'runc + kcr':>11} {'added':>8} {'hooks':>8} {'added - hooks':>14}")
for name, a, b, h in (("checkpoint", pc, kc, hc), ("restore (to running)", pr, kr, hr)):
    print(f"{name:22} {med(a):11.1f} {med(b):11.1f} {med(b)-med(a):8.1f} {med(h):8.1f} {med(b)-med(a)-med(h):14.1f}")
sc = [us(r[3]) for r in rows if r[0] == "hooks" and len(r) > 3]
if sc:
    print(f"pre-dump script in CRIU's log: {med(sc):.1f} ms, of which the app's hooks {med(hc):.1f} ms: kcr adds {med(sc)-med(hc):.1f} ms")
PY
