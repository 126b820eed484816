#!/usr/bin/env bash
# Compares the hot path of kafkahooks.Writer / Reader with bare kafka-go:
# runs the Bare and Wrapper benchmarks RUNS times each, every run in a fresh
# process and in alternating order (bare, wrapper, wrapper, bare, …), and
# prints the median ns/op of each side by side.
#
#   scripts/bench-kafkahooks.sh [RUNS [BENCHTIME]]        # default 10 runs of 1s
#   KCR_KAFKA_BROKERS=host:9092 scripts/bench-kafkahooks.sh  # against real brokers
#   BENCH=Produce scripts/bench-kafkahooks.sh                # only the produce cases
#   scripts/bench-kafkahooks.sh paired [PAIRS]               # paired blocks, see below
#   scripts/bench-kafkahooks.sh hot [COUNT [BENCHTIME]]      # BenchmarkHotPath, -cpu 1,2
#
# On a busy machine independent runs are noisy; "paired" runs
# TestPairedOverhead instead: bare and wrapped writers take turns writing
# short blocks against the same broker, and the median of the per-pair
# ratios is printed, with its interquartile range.
#
# Output columns: case, bare median, wrapper median, difference in percent
# (positive: the wrapper is slower), and the spread (max-min)/median of the
# bare runs, a hint at how much of the difference is noise.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
if [ "${1:-}" = hot ]; then
	# BenchmarkHotPath: the real methods, bare and wrapped side by side, at
	# -cpu 1,2, COUNT runs; prints the median ns/op of each and kcr/bare
	# (and benchstat's table, if benchstat is on PATH).
	cd "$(dirname "$0")/../kafkahooks"
	out=$(mktemp)
	trap 'rm -f "$out"' EXIT
	go test -run '^$' -bench '^BenchmarkHotPath$' -cpu 1,2 -count "${2:-6}" -benchtime "${3:-300ms}" . >"$out"
	if command -v benchstat >/dev/null 2>&1; then benchstat "$out"; fi
	# One line per run: case, side (bare or kcr), ns/op.
	rows=$(awk '/^BenchmarkHotPath\// && $4 == "ns/op" {
		cpu = 1; name = $1
		if (match(name, /-[0-9]+$/)) { cpu = substr(name, RSTART + 1); name = substr(name, 1, RSTART - 1) }
		n = split(name, parts, "/")
		print parts[2] "/cpu" cpu, parts[n], $3
	}' "$out")
	printf "%-24s %12s %12s %10s %9s %5s\n" "case" "bare ns/op" "kcr ns/op" "kcr-bare" "kcr/bare" "runs"
	mapfile -t cases < <(awk '!seen[$1]++ {print $1}' <<<"$rows")
	for c in "${cases[@]}"; do
		mapfile -t bare < <(awk -v c="$c" '$1 == c && $2 == "bare" {print $3}' <<<"$rows")
		mapfile -t kcr < <(awk -v c="$c" '$1 == c && $2 == "kcr" {print $3}' <<<"$rows")
		b=$(median "${bare[@]}")
		k=$(median "${kcr[@]}")
		awk -v c="$c" -v b="$b" -v k="$k" -v n="${#bare[@]}" \
			'BEGIN { printf "%-24s %12.1f %12.1f %+10.1f %9.3f %5d\n", c, b, k, k - b, k / b, n }'
	done
	exit
fi
if [ "${1:-}" = paired ]; then
	cd "$(dirname "$0")/../kafkahooks"
	KCR_BENCH_PAIRED=${2:-40} go test -v -count 1 -cpu 1,2 -run '^TestPairedOverhead$' . | grep '^paired'
	exit
fi
runs=${1:-10}
benchtime=${2:-1s}
kinds=${BENCH:-'Produce|Fetch'}
dir=$(cd "$(dirname "$0")/../kafkahooks" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$dir" && go test -c -o "$tmp/kafkahooks.test" .)
run() {
	"$tmp/kafkahooks.test" -test.run '^$' -test.bench "^Benchmark($kinds)$1\$" -test.benchtime "$benchtime" -test.count 1 >>"$tmp/out.txt"
}
i=0
while [ "$i" -lt "$runs" ]; do
	if [ $((i % 2)) -eq 0 ]; then run Bare; run Wrapper; else run Wrapper; run Bare; fi
	i=$((i + 1))
done
# One line per run: case (kind/size), side (bare or wrapper), ns/op.
awk '/^Benchmark(Produce|Fetch)(Bare|Wrapper)\// && $4 == "ns/op" {
	name = $1; sub(/-[0-9]+$/, "", name)
	split(name, parts, "/")
	side = (parts[1] ~ /Wrapper$/) ? "wrapper" : "bare"
	kind = parts[1]; sub(/(Bare|Wrapper)$/, "", kind); sub(/^Benchmark/, "", kind)
	print kind "/" parts[2], side, $3
}' "$tmp/out.txt" >"$tmp/runs.txt"
# runs CASE SIDE: that side's ns/op values of CASE, one a line.
runs() { awk -v c="$1" -v s="$2" '$1 == c && $2 == s {print $3}' "$tmp/runs.txt"; }
printf "%-22s %14s %14s %8s %8s %5s\n" "case" "bare ns/op" "wrapper ns/op" "diff" "spread" "runs"
mapfile -t cases < <(awk '!seen[$1]++ {print $1}' "$tmp/runs.txt")
for c in "${cases[@]}"; do
	mapfile -t bare < <(runs "$c" bare | sort -g)
	mapfile -t wrapper < <(runs "$c" wrapper)
	b=$(median "${bare[@]}")
	w=$(median "${wrapper[@]}")
	awk -v c="$c" -v b="$b" -v w="$w" -v lo="${bare[0]}" -v hi="${bare[${#bare[@]} - 1]}" -v n="${#bare[@]}" \
		'BEGIN { printf "%-22s %14.0f %14.0f %+7.1f%% %7.1f%% %5d\n", c, b, w, 100 * (w - b) / b, 100 * (hi - lo) / b, n }'
done
