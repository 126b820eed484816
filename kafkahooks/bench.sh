#!/usr/bin/env bash
# Compares the hot path of kafkahooks.Writer / Reader with bare kafka-go:
# runs the Bare and Wrapper benchmarks RUNS times each, every run in a fresh
# process and in alternating order (bare, wrapper, wrapper, bare, …), and
# prints the median ns/op of each side by side.
#
#   kafkahooks/bench.sh [RUNS [BENCHTIME]]        # default 10 runs of 1s
#   KCR_KAFKA_BROKERS=host:9092 kafkahooks/bench.sh  # against real brokers
#   BENCH=Produce kafkahooks/bench.sh                # only the produce cases
#   kafkahooks/bench.sh paired [PAIRS]               # paired blocks, see below
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
. "$(dirname "$0")/../scripts/lib.sh"
if [ "${1:-}" = paired ]; then
	cd "$(dirname "$0")"
	KCR_BENCH_PAIRED=${2:-40} go test -v -count 1 -run '^TestPairedOverhead$' . | grep '^paired'
	exit
fi
runs=${1:-10}
benchtime=${2:-1s}
kinds=${BENCH:-'Produce|Fetch'}
dir=$(cd "$(dirname "$0")" && pwd)
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
