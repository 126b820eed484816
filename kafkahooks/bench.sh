#!/bin/sh
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
set -eu
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
awk '
function median(key,   n, i, j, t, a) {
	n = cnt[key]
	for (i = 1; i <= n; i++) a[i] = v[key, i]
	for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
	lo[key] = a[1]; hi[key] = a[n]
	return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
/^Benchmark(Produce|Fetch)(Bare|Wrapper)\// && $4 == "ns/op" {
	name = $1; sub(/-[0-9]+$/, "", name)
	split(name, parts, "/")
	side = (parts[1] ~ /Wrapper$/) ? "wrapper" : "bare"
	kind = parts[1]; sub(/(Bare|Wrapper)$/, "", kind); sub(/^Benchmark/, "", kind)
	c = kind "/" parts[2]
	if (!(c in seen)) { seen[c] = 1; order[++nc] = c }
	key = c SUBSEP side
	v[key, ++cnt[key]] = $3
}
END {
	printf "%-22s %14s %14s %8s %8s %5s\n", "case", "bare ns/op", "wrapper ns/op", "diff", "spread", "runs"
	for (i = 1; i <= nc; i++) {
		c = order[i]
		b = median(c SUBSEP "bare"); w = median(c SUBSEP "wrapper")
		printf "%-22s %14.0f %14.0f %+7.1f%% %7.1f%% %5d\n", c, b, w, 100 * (w - b) / b, 100 * (hi[c SUBSEP "bare"] - lo[c SUBSEP "bare"]) / b, cnt[c SUBSEP "bare"]
	}
}' "$tmp/out.txt"
